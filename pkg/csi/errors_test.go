package csi

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/srvlab/rds-csi/pkg/nvme"
	"github.com/srvlab/rds-csi/pkg/rds"
)

func TestToStatus(t *testing.T) {
	tests := []struct {
		err  error
		want codes.Code
	}{
		{fmt.Errorf("disk x: %w", rds.ErrNotFound), codes.NotFound},
		{fmt.Errorf("create: %w", rds.ErrNoSpace), codes.ResourceExhausted},
		{rds.ErrAlreadyExists, codes.AlreadyExists},
		{rds.ErrInvalidArgument, codes.InvalidArgument},
		{fmt.Errorf("dial: %w", rds.ErrTransient), codes.Unavailable},
		{rds.ErrHostKey, codes.Unavailable},
		{rds.ErrBadOutput, codes.Internal},
		{fmt.Errorf("connect: %w", nvme.ErrTargetUnreachable), codes.Unavailable},
		{fmt.Errorf("connect: %w", nvme.ErrSubsystemNotFound), codes.NotFound},
		{fmt.Errorf("disconnect: %w", nvme.ErrInUse), codes.FailedPrecondition},
		{nvme.ErrForeignNQN, codes.InvalidArgument},
		{nvme.ErrConnectFailed, codes.Internal},
		{fmt.Errorf("volume x: connecting: %w", nvme.ErrAuthFailed), codes.FailedPrecondition},
		{fmt.Errorf("volume x: %w", nvme.ErrAuthUnsupported), codes.FailedPrecondition},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
		{context.Canceled, codes.Canceled},
		{errors.New("boom"), codes.Internal},
		{status.Error(codes.Aborted, "busy"), codes.Aborted},
	}
	for _, tc := range tests {
		if got := status.Code(toStatus(tc.err)); got != tc.want {
			t.Errorf("toStatus(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
	if toStatus(nil) != nil {
		t.Error("toStatus(nil) != nil")
	}
}
