package main

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// heldLease is the lock of the controller's election: client-go's
// LeaseLock, except that it releases the Lease (writes a record without a
// holder, what ReleaseOnCancel does when the renewal loop ends) only when
// the read just before names this replica. client-go decides the release
// by the record it last observed itself, so a replica whose renewals
// failed (paused, cut off from the API server) and that then reads the
// Lease of the replica that took over would clear that replica's Lease,
// and take it again at once: two leaders until the other's next renewal
// failed (3.5 s in TestPausedReplicaMidPublish). The write is
// preconditioned on that read's resourceVersion, as every Lease write.
type heldLease struct {
	*resourcelock.LeaseLock
	mu         sync.Mutex
	readHolder *string // the holder of the last successful read; nil: none since a failed one
}

var _ resourcelock.Interface = (*heldLease)(nil)

// errLeaseNotHeld refuses a release of a Lease another replica holds.
var errLeaseNotHeld = errors.New("the Lease is not this replica's to release")

func (l *heldLease) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	rec, raw, err := l.LeaseLock.Get(ctx)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.readHolder = nil
	if err == nil {
		holder := rec.HolderIdentity
		l.readHolder = &holder
	}
	return rec, raw, err
}

func (l *heldLease) Update(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if rec.HolderIdentity == "" && (l.readHolder == nil || *l.readHolder != l.Identity()) {
		held := "unknown (no read since a failed one)"
		if l.readHolder != nil {
			held = fmt.Sprintf("%q", *l.readHolder)
		}
		return fmt.Errorf("%w: its holder is %s, this replica is %q; left as it is", errLeaseNotHeld, held, l.Identity())
	}
	if err := l.LeaseLock.Update(ctx, rec); err != nil {
		return err
	}
	holder := rec.HolderIdentity
	l.readHolder = &holder
	return nil
}
