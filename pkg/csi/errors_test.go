package csi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

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
		// The kernel's refusal carries its errno, which has the methods of a
		// net.Error: still the refusal, never "the API server is down".
		{fmt.Errorf("volume x: %w: connecting: %w: secret rejected", nvme.ErrAuthFailed, syscall.EKEYREJECTED), codes.FailedPrecondition},
		{fmt.Errorf("disconnect: %w: %w", nvme.ErrInUse, syscall.EBUSY), codes.FailedPrecondition},
		{fmt.Errorf("mount: %w", syscall.EIO), codes.Internal},
		{fmt.Errorf("volume x: %w", nvme.ErrAuthUnsupported), codes.FailedPrecondition},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
		{context.Canceled, codes.Canceled},
		{errors.New("boom"), codes.Internal},
		{status.Error(codes.Aborted, "busy"), codes.Aborted},
		{fmt.Errorf("writing PV x: %w", apierrors.NewInternalError(errors.New("etcd"))), codes.Unavailable},
		{fmt.Errorf("writing PV x: %w", apierrors.NewServerTimeout(schema.GroupResource{Resource: "persistentvolumes"}, "patch", 1)), codes.Unavailable},
		{fmt.Errorf("reading node x: %w", &url.Error{Op: "Get", URL: "https://api", Err: &net.OpError{Op: "dial", Err: errors.New("connection refused")}}), codes.Unavailable},
		{apierrors.NewForbidden(schema.GroupResource{Resource: "persistentvolumes"}, "x", errors.New("rbac")), codes.Internal},
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
