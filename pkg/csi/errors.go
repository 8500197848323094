package csi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/srvlab/rds-csi/pkg/backends"
	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/nvme"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// toStatus is the one place where internal errors become gRPC status codes.
// Errors that already carry a status (request validation in the RPCs) pass
// through unchanged.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := codes.Internal
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, rds.ErrNotFound):
		code = codes.NotFound
	case errors.Is(err, rds.ErrNoSpace):
		code = codes.ResourceExhausted
	case errors.Is(err, rds.ErrAlreadyExists):
		code = codes.AlreadyExists
	case errors.Is(err, rds.ErrInvalidArgument):
		code = codes.InvalidArgument
	case errors.Is(err, rds.ErrExportChanged):
		// Another replica or an operator changed the export meanwhile:
		// the CO retries against the new state.
		code = codes.Aborted
	case errors.Is(err, rds.ErrTransient), errors.Is(err, rds.ErrHostKey), errors.Is(err, rds.ErrCopyPending):
		// The RDS is unreachable or not the one we pinned: the CO retries.
		code = codes.Unavailable
	case kubeAPIUnavailable(err):
		// The Kubernetes API server failed or could not be reached: a
		// write may or may not have landed, and the CO retries.
		code = codes.Unavailable
	case errors.Is(err, backends.ErrUnknownBox):
		// An ID of a box missing from the configuration: nothing is done
		// until it is back (never another box's volume of that slot).
		code = codes.FailedPrecondition
	case errors.Is(err, claims.ErrUnreadable):
		// An annotation of the driver's that cannot be read: nothing
		// changes until someone fixes it.
		code = codes.FailedPrecondition
	case errors.Is(err, nvme.ErrSubsystemNotFound):
		code = codes.NotFound
	case errors.Is(err, nvme.ErrTargetUnreachable):
		code = codes.Unavailable
	case errors.Is(err, nvme.ErrInUse), errors.Is(err, nvme.ErrAuthFailed), errors.Is(err, nvme.ErrAuthUnsupported), errors.Is(err, nvme.ErrOtherTarget):
		// Refused authentication: the attachment's secret is not the
		// export's (a fence replaced it); only a new publish changes that.
		code = codes.FailedPrecondition
	case errors.Is(err, nvme.ErrInvalidArgument), errors.Is(err, nvme.ErrForeignNQN):
		code = codes.InvalidArgument
	}
	return status.Error(code, err.Error())
}

// kubeAPIUnavailable: err is the Kubernetes API server's own failure
// (a 5xx, a timeout, too many requests) or a failure to reach it.
func kubeAPIUnavailable(err error) bool {
	var urlErr *url.Error
	var opErr *net.OpError
	switch {
	case apierrors.IsInternalError(err), apierrors.IsServerTimeout(err), apierrors.IsTimeout(err),
		apierrors.IsTooManyRequests(err), apierrors.IsServiceUnavailable(err), apierrors.IsUnexpectedServerError(err):
		return true
	case errors.As(err, &urlErr), errors.As(err, &opErr):
		// A request that did not reach the API server (client-go's
		// transport errors). Not any net.Error: a bare errno has its
		// methods too, and the kernel's refusal of a connect or a mount
		// is no API failure.
		return true
	}
	return false
}

// statusf builds a status error for request validation at the top of an RPC.
func statusf(code codes.Code, format string, args ...any) error {
	return status.Error(code, fmt.Sprintf(format, args...))
}
