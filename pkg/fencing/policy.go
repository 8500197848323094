package fencing

import (
	"fmt"
	"sort"
	"time"
)

// AccessMode is how a volume may be shared, as far as publishing goes.
type AccessMode int

const (
	// SingleNode: SINGLE_NODE_WRITER, SINGLE_NODE_SINGLE_WRITER,
	// SINGLE_NODE_MULTI_WRITER (RWO, RWOP). One node at a time.
	SingleNode AccessMode = iota
	// MultiNodeReadOnly: MULTI_NODE_READER_ONLY (ROX). Any number of nodes,
	// all read-only.
	MultiNodeReadOnly
	// MultiNodeMultiWriter: MULTI_NODE_MULTI_WRITER on raw block (KubeVirt
	// live migration). At most two nodes, for at most the migration timeout.
	MultiNodeMultiWriter
)

func (m AccessMode) String() string {
	switch m {
	case SingleNode:
		return "single-node"
	case MultiNodeReadOnly:
		return "multi-node-read-only"
	case MultiNodeMultiWriter:
		return "multi-node-multi-writer"
	}
	return fmt.Sprintf("AccessMode(%d)", int(m))
}

// Holder is a node that holds the volume: this driver committed a claim
// for it, or a VolumeAttachment for it is attached, or both.
type Holder struct {
	Node string
	// UID is the node's UID recorded in its claim: the incarnation of the
	// node the volume was published to. Empty when unknown (a claim written
	// before UIDs were recorded, or a VolumeAttachment without a claim).
	UID string
	// Since is when the holding began: the VolumeAttachment's creation time
	// or the claim's time, whichever is earlier. It comes from API objects,
	// so it survives a controller restart.
	Since time.Time
	// DetachingSince is set when the holder's VolumeAttachment has a
	// deletion timestamp. It is informative only: the holder holds until
	// its claim is released and its VolumeAttachment is no longer attached.
	DetachingSince time.Time
}

// NodeState is what the API server says about a node.
type NodeState struct {
	Exists bool
	// UID of the Node object: a node deleted and re-created under the same
	// name is another incarnation.
	UID string
	// Ready is the node's Ready condition; NotReadySince is when it last
	// stopped being Ready (zero when Ready or unknown), as the condition's
	// LastTransitionTime says: written by another machine (the kubelet or
	// kube-controller-manager, which stamps every node at once after an
	// API server outage), so it is shown to operators and never timed.
	Ready         bool
	NotReadySince time.Time
	// NotReadySeen is when this controller first saw this incarnation
	// not Ready since it last saw it Ready, on its own clock (zero when
	// Ready); RenewedSeen is when it last saw the node's heartbeat (its
	// kubelet's Lease) renewed, on its own clock (zero: no heartbeat
	// known). Both are never earlier than the moment this controller's
	// view of the API was last restored (a restart, a reconnect) or its
	// mass-outage guard last let go (Liveness). Only these
	// are timed.
	NotReadySeen time.Time
	RenewedSeen  time.Time
	// HeartbeatFloor is the shortest heartbeat threshold this node's own
	// kubelet cadence allows (two of its Lease renewals; pkg/informers.
	// Liveness): a shorter Config.HeartbeatThreshold is raised to it for
	// this node, so a node still renewing every 10 s is never timed out by
	// a threshold meant for faster kubelets. Zero: none known.
	HeartbeatFloor time.Duration
	// OutOfService: the node carries the node.kubernetes.io/out-of-service
	// taint, the operator's statement that it is down.
	OutOfService bool
}

// Config of the policy.
type Config struct {
	// NotReadyThreshold: a holder whose node has been NotReady for longer is
	// fenced. Zero disables the rule (the default): NotReady alone may be a
	// partition with the node still writing.
	NotReadyThreshold time.Duration
	// HeartbeatThreshold: a holder whose node's heartbeat has not been seen
	// renewed for longer is fenced. Zero disables the rule (the default);
	// only storage fencing turns it on, since the fence then cuts the node
	// off the RDS first.
	HeartbeatThreshold time.Duration
	// MigrationTimeout: how long two nodes may hold a multi-writer volume.
	MigrationTimeout time.Duration
}

// HeartbeatThresholdOf is the heartbeat threshold of node n: the
// configured one, raised to the node's HeartbeatFloor (zero: off).
func (c Config) HeartbeatThresholdOf(n NodeState) time.Duration {
	if c.HeartbeatThreshold <= 0 {
		return 0
	}
	return max(c.HeartbeatThreshold, n.HeartbeatFloor)
}

// DefaultConfig is the policy's default configuration.
func DefaultConfig() Config {
	return Config{MigrationTimeout: 5 * time.Minute}
}

// Request is a publish of a volume to a node.
type Request struct {
	VolumeID string
	Node     string
	Mode     AccessMode
	ReadOnly bool
}

// Verdict is the outcome of a decision.
type Verdict int

const (
	// Allow: publish (committing a claim first) and return success.
	Allow Verdict = iota
	// AlreadyPublished: the node already holds the volume; return success
	// with the same publish context, change nothing.
	AlreadyPublished
	// Refuse: FAILED_PRECONDITION; the volume is held elsewhere.
	Refuse
)

func (v Verdict) String() string {
	return [...]string{"allow", "already-published", "refuse"}[v]
}

// FenceReason says why a holder is stale.
type FenceReason string

const (
	FenceNodeDeleted  FenceReason = "NodeDeleted"
	FenceOutOfService FenceReason = "OutOfService"
	FenceNotReady     FenceReason = "NotReady"
	// FenceHeartbeatLost: the node's heartbeat (its kubelet's Lease) has
	// not been seen renewed for longer than the threshold.
	FenceHeartbeatLost FenceReason = "HeartbeatLost"
	// FenceNodeRecreated: the Node object of that name has another UID
	// than the one the claim recorded: the incarnation that held the
	// volume is gone.
	FenceNodeRecreated FenceReason = "NodeRecreated"
)

// Fence is a stale holder the caller must fence before publishing.
type Fence struct {
	Node   string
	Reason FenceReason
}

// Decision is what Decide concluded.
type Decision struct {
	Verdict Verdict
	// Reason is a sentence for the operator: who blocks, or why it is fine.
	Reason string
	// Blocking is the node that caused a refusal.
	Blocking string
	// Fence lists stale holders to fence (release their claims, record a
	// metric and an event) before the publish proceeds. The caller must
	// confirm each with a live read of the node before acting on it.
	Fence []Fence
	// MigrationStart: this publish makes a second node hold a multi-writer
	// volume.
	MigrationStart bool
}

// Decide returns the publish decision for req given the volume's holders.
// nodes returns the state of a node by name.
func Decide(req Request, holders []Holder, nodes func(string) NodeState, now time.Time, cfg Config) Decision {
	d, live, self := classify(req.Node, holders, nodes, now, cfg)

	switch req.Mode {
	case MultiNodeReadOnly:
		// The access mode is the read-only promise: Kubernetes passes
		// readonly=false for most ROX volumes (it follows spec.csi.readOnly),
		// and the node service mounts MULTI_NODE_READER_ONLY read-only.
		return allowOrRepeat(d, self, fmt.Sprintf("read-only volume %s may be published on any number of nodes", req.VolumeID))

	case MultiNodeMultiWriter:
		if len(live) >= 2 {
			// Whether or not the requesting node already has a
			// VolumeAttachment, committing it would make a third holder.
			return refuse(d, live[len(live)-1].Node, fmt.Sprintf(
				"volume %s is already held by %s and %s; a live migration allows two nodes at most",
				req.VolumeID, live[0].Node, live[1].Node))
		}
		if self != nil {
			// The newer holder is the migration target. Holders' times have
			// one-second resolution (VolumeAttachment creation, claims), so
			// two nodes that started in the same second tie: neither is
			// provably the source, and both count as the target, or the
			// timeout would never apply to them.
			if len(live) == 1 && !self.Since.Before(live[0].Since) && now.Sub(self.Since) > cfg.MigrationTimeout {
				return refuse(d, live[0].Node, fmt.Sprintf(
					"volume %s has been held by %s and %s for %s, longer than the migration timeout of %s; detach it from one of them",
					req.VolumeID, live[0].Node, req.Node, now.Sub(self.Since).Round(time.Second), cfg.MigrationTimeout))
			}
			return allowOrRepeat(d, self, "")
		}
		if len(live) == 0 {
			d.Reason = fmt.Sprintf("volume %s is free", req.VolumeID)
			return d
		}
		d.MigrationStart = true
		d.Reason = fmt.Sprintf("volume %s: live migration from %s to %s", req.VolumeID, live[0].Node, req.Node)
		return d

	default: // SingleNode
		if len(live) > 0 {
			h := live[0]
			why := "attached"
			if !h.DetachingSince.IsZero() {
				why = fmt.Sprintf("still attached (its VolumeAttachment has been deleting for %s, but the detach has not completed)", now.Sub(h.DetachingSince).Round(time.Second))
			}
			return refuse(d, h.Node, fmt.Sprintf(
				"volume %s is %s on node %s, %s; it can move once that node detaches it, is deleted, or is tainted node.kubernetes.io/out-of-service",
				req.VolumeID, why, h.Node, holderState(nodes(h.Node), now)))
		}
		return allowOrRepeat(d, self, "")
	}
}

// classify sorts the holders other than node by age into stale ones (to
// fence) and live ones that still count; self is node's own holding, if
// any. A holder that is detaching still counts: only the completed detach
// (the claim released and the VolumeAttachment no longer attached) ends a
// holding, because until then the node may still be writing.
func classify(node string, holders []Holder, nodes func(string) NodeState, now time.Time, cfg Config) (d Decision, live []Holder, self *Holder) {
	sorted := append([]Holder(nil), holders...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Since.Before(sorted[j].Since) })
	for i := range sorted {
		h := sorted[i]
		if h.Node == node {
			self = &sorted[i]
			continue
		}
		if reason, stale := HolderStale(h, nodes(h.Node), now, cfg); stale {
			d.Fence = append(d.Fence, Fence{Node: h.Node, Reason: reason})
			continue
		}
		live = append(live, h)
	}
	return d, live, self
}

// Migration describes a multi-writer volume held by two live nodes.
type Migration struct {
	Source, Target string    // the older and the newer holder
	Deadline       time.Time // Target's start plus the migration timeout
}

// MigrationOf reports whether the holders form a live migration (two live
// holders) and when it times out. The controller uses it to report an
// overdue migration without waiting for a publish.
func MigrationOf(holders []Holder, nodes func(string) NodeState, now time.Time, cfg Config) (Migration, bool) {
	_, live, _ := classify("", holders, nodes, now, cfg)
	if len(live) != 2 {
		return Migration{}, false
	}
	return Migration{Source: live[0].Node, Target: live[1].Node, Deadline: live[1].Since.Add(cfg.MigrationTimeout)}, true
}

func allowOrRepeat(d Decision, self *Holder, reason string) Decision {
	if self != nil {
		d.Verdict = AlreadyPublished
		d.Reason = "already published to this node"
		return d
	}
	d.Verdict = Allow
	d.Reason = reason
	return d
}

// holderState describes a holder's node in a refusal, so the operator
// sees whether it is up or only not fenced yet.
func holderState(n NodeState, now time.Time) string {
	switch {
	case n.Ready:
		return "which is Ready"
	case !n.Exists:
		return "which this controller does not know yet"
	}
	if n.NotReadySince.IsZero() {
		return "which is not Ready, but not fenced (NotReady alone may be a network partition with the node still writing)"
	}
	return fmt.Sprintf("which has been NotReady for %s, but is not fenced (NotReady alone may be a network partition with the node still writing; --not-ready-threshold sets when it is)",
		now.Sub(n.NotReadySince).Round(time.Second))
}

func refuse(d Decision, blocking, reason string) Decision {
	return Decision{Verdict: Refuse, Blocking: blocking, Reason: reason}
}

// Stale says whether a holder on a node in state n may be fenced at now.
// Decide uses it per holder, and the controller to react to node failures
// without waiting for a publish.
func Stale(n NodeState, now time.Time, cfg Config) (FenceReason, bool) {
	switch {
	case !n.Exists:
		return FenceNodeDeleted, true
	case n.OutOfService:
		return FenceOutOfService, true
	case cfg.NotReadyThreshold > 0 && !n.Ready && !n.NotReadySeen.IsZero() && now.Sub(n.NotReadySeen) > cfg.NotReadyThreshold:
		return FenceNotReady, true
	case cfg.HeartbeatThreshold > 0 && !n.RenewedSeen.IsZero() && now.Sub(n.RenewedSeen) > cfg.HeartbeatThresholdOf(n):
		return FenceHeartbeatLost, true
	}
	return "", false
}

// HolderStale is Stale for one holding: besides the node's own state, a
// holding recorded for another incarnation of the node (a UID other than
// the Node object's) is stale, since that incarnation is gone.
func HolderStale(h Holder, n NodeState, now time.Time, cfg Config) (FenceReason, bool) {
	if h.UID != "" && n.Exists && n.UID != "" && n.UID != h.UID {
		return FenceNodeRecreated, true
	}
	return Stale(n, now, cfg)
}
