package fencing

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/klog/v2"
)

// StaleHolder is a node that became stale (deleted, out of service,
// NotReady past the threshold) while holding volumes. The attachment index
// reports it the moment the node's state changes.
type StaleHolder struct {
	Node    string
	Reason  FenceReason
	Volumes []VolumeRef
}

// ClaimReleaser drops nodes' claims on a PersistentVolume, leaving other
// nodes' claims alone.
type ClaimReleaser interface {
	Release(ctx context.Context, pvName string, nodes ...string) error
}

// Fencer reacts to node failures without waiting for a publish: it releases
// the stale node's claims so the index and every replica see the volume
// free, and reports each fence. Only the leader acts; the others' indexes
// learn the result from the API server.
type Fencer struct {
	claims   ClaimReleaser
	reporter *Reporter
	isLeader func() bool
}

// NewFencer returns a Fencer. isLeader nil means always act (a single
// replica without leader election).
func NewFencer(claims ClaimReleaser, reporter *Reporter, isLeader func() bool) *Fencer {
	return &Fencer{claims: claims, reporter: reporter, isLeader: isLeader}
}

// NodeStale fences every volume s's node holds. It returns the first
// error after trying all volumes, so the caller can retry the node.
func (f *Fencer) NodeStale(ctx context.Context, s StaleHolder) error {
	if f.isLeader != nil && !f.isLeader() {
		return nil
	}
	logger := klog.FromContext(ctx)
	var errs []error
	for _, v := range s.Volumes {
		if err := f.claims.Release(ctx, v.PV, s.Node); err != nil {
			errs = append(errs, fmt.Errorf("releasing the claim of node %s on PV %s: %w", s.Node, v.PV, err))
			continue
		}
		f.reporter.Fenced(v, s.Node, s.Reason)
		logger.Info("fenced stale attachment", "volume", v.Handle, "pv", v.PV, "node", s.Node, "reason", s.Reason)
	}
	return errors.Join(errs...)
}

// MigrationTimedOut reports a live migration past its timeout (leader
// only). The driver cannot detach a node by itself; it refuses the
// target's further publishes (Decide) and says so where operators look.
func (f *Fencer) MigrationTimedOut(ctx context.Context, v VolumeRef, m Migration) error {
	if f.isLeader != nil && !f.isLeader() {
		return nil
	}
	f.reporter.MigrationTimedOut(v, m)
	klog.FromContext(ctx).Info("live migration past its timeout", "volume", v.Handle, "pv", v.PV, "source", m.Source, "target", m.Target)
	return nil
}
