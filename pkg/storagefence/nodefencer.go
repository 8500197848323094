package storagefence

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/fencing"
)

// NodeFencer reacts to what the attachment index shows without waiting for
// a publish (it is the informers' Reactor): a stale node's claims are
// released through the protocol (Release: cut → release → settle), each
// backed by a live read of the node, so a replica whose Node cache lags (a
// node not seen yet, a taint since removed, a node re-created) never
// fences a live holder; overdue migrations and orphaned claims are
// reported. Only the leader acts; the others' indexes learn the result
// from the API server.
type NodeFencer struct {
	fence    *Fence
	nodes    Nodes
	tainter  NodeTainter
	reporter *fencing.Reporter
	isLeader func() bool
	policy   fencing.Config
	now      func() time.Time
	group    func(handle string) string
}

// NodeTainter declares a node out of service (fencing.Tainter).
type NodeTainter interface {
	TaintOutOfService(ctx context.Context, node string) error
}

// NodeFencerConfig is what a NodeFencer is built with.
type NodeFencerConfig struct {
	Fence *Fence
	// Nodes makes the live reads each fence stands on.
	Nodes  Nodes
	Policy fencing.Config
	// Tainter, when set (--out-of-service-taint, storage fencing only),
	// taints a node out of service once a NotReady or heartbeat fence has
	// released and cut off every volume it held: Kubernetes then deletes
	// its pods and detaches its volumes at once.
	Tainter  NodeTainter
	Reporter *fencing.Reporter
	// IsLeader nil: always act (one replica without leader election).
	IsLeader func() bool
	// Now nil: time.Now.
	Now func() time.Time
	// Group, when set, names the RDS box a volume is on: a node's
	// volumes on different boxes are released side by side, so that a
	// box that hangs delays only its own volumes' fences.
	Group func(handle string) string
}

// NewNodeFencer returns a NodeFencer.
func NewNodeFencer(cfg NodeFencerConfig) *NodeFencer {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &NodeFencer{fence: cfg.Fence, nodes: cfg.Nodes, tainter: cfg.Tainter, reporter: cfg.Reporter,
		isLeader: cfg.IsLeader, policy: cfg.Policy, now: cfg.Now, group: cfg.Group}
}

func (n *NodeFencer) leads() bool { return n.isLeader == nil || n.isLeader() }

// NodeStale fences every volume s's node holds. It returns the first
// error after trying all volumes, so the caller can retry the node.
func (n *NodeFencer) NodeStale(ctx context.Context, s fencing.StaleHolder) error {
	if !n.leads() {
		return nil
	}
	logger := klog.FromContext(ctx)
	// One box's volumes one after the other, the boxes side by side; the
	// taint waits for every box.
	groups := map[string][]fencing.VolumeRef{}
	var order []string
	for _, v := range s.Volumes {
		g := ""
		if n.group != nil {
			g = n.group(v.Handle)
		}
		if _, ok := groups[g]; !ok {
			order = append(order, g)
		}
		groups[g] = append(groups[g], v)
	}
	errsOf := make([][]error, len(order))
	var wg sync.WaitGroup
	for i, g := range order {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, v := range groups[g] {
				if err := n.fenceVolume(ctx, logger, s, v); err != nil {
					errsOf[i] = append(errsOf[i], err)
				}
			}
		}()
	}
	wg.Wait()
	var errs []error
	for _, e := range errsOf {
		errs = append(errs, e...)
	}
	if len(errs) > 0 || n.tainter == nil || (s.Reason != fencing.FenceNotReady && s.Reason != fencing.FenceHeartbeatLost) {
		return errors.Join(errs...)
	}
	err := n.tainter.TaintOutOfService(ctx, s.Node)
	switch {
	case errors.Is(err, fencing.ErrNotTainted):
		logger.Info("fenced node left without the out-of-service taint", "node", s.Node, "why", err.Error())
		return nil
	case err != nil:
		return fmt.Errorf("tainting node %s out of service: %w", s.Node, err)
	}
	logger.Info("fenced node tainted out of service", "node", s.Node, "taint", "node.kubernetes.io/out-of-service:NoExecute")
	return nil
}

// fenceVolume releases node s.Node's claim on v through the protocol, if
// a live read of the node still finds it stale.
func (n *NodeFencer) fenceVolume(ctx context.Context, logger klog.Logger, s fencing.StaleHolder, v fencing.VolumeRef) error {
	var reason fencing.FenceReason
	stale := func(ctx context.Context, c claims.Claim) (bool, error) {
		live, err := n.nodes.LiveNode(ctx, s.Node)
		if err != nil {
			return false, err
		}
		r, ok := fencing.HolderStale(fencing.Holder{Node: s.Node, UID: c.NodeUID}, live, n.now(), n.policy)
		reason = r
		return ok, nil
	}
	out, err := n.fence.Release(ctx, Release{Handle: v.Handle, PV: v.PV, PVs: v.PVs, Node: s.Node, May: stale})
	if err == nil {
		err = out.SettleErr
	}
	if err != nil {
		err = fmt.Errorf("fencing node %s off volume %s: %w", s.Node, v.Handle, err)
	}
	if !out.Released {
		return err
	}
	n.reporter.Fenced(v, s.Node, reason)
	logger.Info("fenced stale attachment", "volume", v.Handle, "pv", v.PV, "node", s.Node, "reason", reason)
	return err
}

// OrphanedClaim reports a claim without a VolumeAttachment (leader only,
// so each is reported once; a follower answers fencing.ErrNotLeader and
// the next leader reports it).
func (n *NodeFencer) OrphanedClaim(ctx context.Context, v fencing.VolumeRef, node string, age time.Duration) error {
	if !n.leads() {
		return fencing.ErrNotLeader
	}
	n.reporter.OrphanedClaim(v, node, age)
	klog.FromContext(ctx).Info("claim without a VolumeAttachment", "volume", v.Handle, "pv", v.PV, "node", node, "age", age)
	return nil
}

// MigrationTimedOut reports a live migration past its timeout (leader
// only, as OrphanedClaim). The driver cannot detach a node by itself; it
// refuses the target's further publishes (fencing.Decide) and says so
// where operators look.
func (n *NodeFencer) MigrationTimedOut(ctx context.Context, v fencing.VolumeRef, m fencing.Migration) error {
	if !n.leads() {
		return fencing.ErrNotLeader
	}
	n.reporter.MigrationTimedOut(v, m)
	klog.FromContext(ctx).Info("live migration past its timeout", "volume", v.Handle, "pv", v.PV, "source", m.Source, "target", m.Target)
	return nil
}
