package claims

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/util/retry"
)

// conflictAttempts bounds RetryConflicts: as client-go's retry.DefaultRetry.
const conflictAttempts = 5

// RetryConflicts runs fn again while it fails with a Conflict (a
// resourceVersion-preconditioned write that lost a race: fn re-reads and
// decides again), at most conflictAttempts times, and returns fn's last
// error as it is. It replaces client-go's retry.RetryOnConflict, which
// before client-go v0.37 returned nil when fn failed with an error wrapping
// context.DeadlineExceeded or context.Canceled (it took that for its own
// backoff running out): a release whose live read timed out then counted as
// done, and ControllerUnpublishVolume answered OK with the claim left on the
// PV. Whether a claim is released must not depend on that detail of the
// library version.
func RetryConflicts(ctx context.Context, fn func() error) error {
	b := retry.DefaultRetry
	b.Steps = conflictAttempts
	for {
		err := fn()
		if !apierrors.IsConflict(err) || b.Steps <= 1 {
			return err
		}
		t := time.NewTimer(b.Step())
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}
