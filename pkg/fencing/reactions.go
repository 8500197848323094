package fencing

import (
	"context"
	"errors"
	"fmt"
	"time"

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

// StaleClaimReleaser drops a node's claim on a PersistentVolume only if a
// live read of the Node, made after the PV was read, shows the claimed
// incarnation stale under the policy; other nodes' claims are left alone.
type StaleClaimReleaser interface {
	ReleaseIfStale(ctx context.Context, pvName, node string, policy Config, now func() time.Time) (bool, FenceReason, error)
}

// Fencer reacts to node failures without waiting for a publish: it releases
// the stale node's claims so the index and every replica see the volume
// free, and reports each fence. Only the leader acts; the others' indexes
// learn the result from the API server. The index only triggers a fence:
// each release is backed by a live read of the node, so a replica whose
// Node cache lags (a node not seen yet, a taint since removed, a node
// re-created) never fences a live holder.
type Fencer struct {
	tainter  NodeTainter
	claims   StaleClaimReleaser
	reporter *Reporter
	isLeader func() bool
	policy   Config
	now      func() time.Time
}

// NewFencer returns a Fencer. isLeader nil means always act (a single
// replica without leader election); now nil means time.Now.
func NewFencer(claims StaleClaimReleaser, reporter *Reporter, isLeader func() bool, policy Config, now func() time.Time) *Fencer {
	if now == nil {
		now = time.Now
	}
	return &Fencer{claims: claims, reporter: reporter, isLeader: isLeader, policy: policy, now: now}
}

// ErrNotLeader: the Fencer does not act on this replica (it does not lead);
// what it was told stays unreported, and the next leader looks again.
var ErrNotLeader = errors.New("not the leader: background actions run on the leading replica")

// ErrNotTainted: the node was left without the out-of-service taint on
// purpose (it recovered, or it has volumes the driver cannot cut off).
var ErrNotTainted = errors.New("not tainted out of service")

// NodeTainter declares a node out of service (node.kubernetes.io/out-of-service).
type NodeTainter interface {
	TaintOutOfService(ctx context.Context, node string) error
}

// TaintAfterFence makes the Fencer taint a node out of service once a
// NotReady fence has released (and, with storage fencing, cut off) every
// volume it held: Kubernetes then deletes its pods and detaches its
// volumes at once, so they move with no operator. Only with storage
// fencing, which makes the node unable to write whatever it still runs.
func (f *Fencer) TaintAfterFence(t NodeTainter) { f.tainter = t }

// NodeStale fences every volume s's node holds. It returns the first
// error after trying all volumes, so the caller can retry the node.
func (f *Fencer) NodeStale(ctx context.Context, s StaleHolder) error {
	if f.isLeader != nil && !f.isLeader() {
		return nil
	}
	logger := klog.FromContext(ctx)
	var errs []error
	for _, v := range s.Volumes {
		pvs := v.PVs
		if len(pvs) == 0 {
			pvs = []string{v.PV}
		}
		fenced := false
		var reason FenceReason
		for _, pv := range pvs {
			released, why, err := f.claims.ReleaseIfStale(ctx, pv, s.Node, f.policy, f.now)
			if err != nil {
				errs = append(errs, fmt.Errorf("releasing the claim of node %s on PV %s: %w", s.Node, pv, err))
				continue
			}
			if released {
				fenced, reason = true, why
			}
		}
		if !fenced {
			continue
		}
		f.reporter.Fenced(v, s.Node, reason)
		logger.Info("fenced stale attachment", "volume", v.Handle, "pv", v.PV, "node", s.Node, "reason", reason)
	}
	if len(errs) > 0 || f.tainter == nil || (s.Reason != FenceNotReady && s.Reason != FenceHeartbeatLost) {
		return errors.Join(errs...)
	}
	err := f.tainter.TaintOutOfService(ctx, s.Node)
	switch {
	case errors.Is(err, ErrNotTainted):
		logger.Info("fenced node left without the out-of-service taint", "node", s.Node, "why", err.Error())
		return nil
	case err != nil:
		return fmt.Errorf("tainting node %s out of service: %w", s.Node, err)
	}
	logger.Info("fenced node tainted out of service", "node", s.Node, "taint", "node.kubernetes.io/out-of-service:NoExecute")
	return nil
}

// OrphanedClaim reports a claim without a VolumeAttachment (leader only,
// so each is reported once).
func (f *Fencer) OrphanedClaim(ctx context.Context, v VolumeRef, node string, age time.Duration) error {
	if f.isLeader != nil && !f.isLeader() {
		return ErrNotLeader
	}
	f.reporter.OrphanedClaim(v, node, age)
	klog.FromContext(ctx).Info("claim without a VolumeAttachment", "volume", v.Handle, "pv", v.PV, "node", node, "age", age)
	return nil
}

// MigrationTimedOut reports a live migration past its timeout (leader
// only). The driver cannot detach a node by itself; it refuses the
// target's further publishes (Decide) and says so where operators look.
func (f *Fencer) MigrationTimedOut(ctx context.Context, v VolumeRef, m Migration) error {
	if f.isLeader != nil && !f.isLeader() {
		return ErrNotLeader
	}
	f.reporter.MigrationTimedOut(v, m)
	klog.FromContext(ctx).Info("live migration past its timeout", "volume", v.Handle, "pv", v.PV, "source", m.Source, "target", m.Target)
	return nil
}
