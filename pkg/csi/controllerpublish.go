package csi

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/informers"
	"github.com/srvlab/rds-csi/pkg/storagefence"
)

// Keys of publish_context: the same as volume_context, so NodeStageVolume
// can connect from either.
const (
	PublishContextNVMeAddress = VolumeContextNVMeAddress
	PublishContextNVMePort    = VolumeContextNVMePort
	PublishContextNQN         = VolumeContextNQN
)

// AttachmentIndex is what publishing reads: the live index kept by the
// informers (pkg/informers.AttachmentIndex). Lookups make no API call.
type AttachmentIndex interface {
	Volume(handle string) *informers.Volume
	Node(name string) fencing.NodeState
	// WaitForChange waits until the index has seen a write to one of the
	// volume's PVs after version (Volume.Version), or ctx is done.
	WaitForChange(ctx context.Context, handle, version string) *informers.Volume
}

// A publish whose conditional write conflicts waits for the index to see
// the write that beat it and decides again, this many times in all; a
// repeated publish right after the first (the index not yet updated) then
// succeeds instead of answering ABORTED.
const (
	publishAttempts     = 3
	publishCatchUpLimit = 2 * time.Second
)

// Publisher is what ControllerPublish/Unpublish stand on. A
// ControllerServer built without one serves neither (and does not
// advertise PUBLISH_UNPUBLISH_VOLUME).
type Publisher struct {
	Index AttachmentIndex
	// Fence is the storage-fence protocol: every claim is made and
	// released, and every export changed, through it.
	Fence *storagefence.Fence
	// Nodes reads nodes live for the decisions that fence one, timed on
	// this controller's clock (fencing.Liveness).
	Nodes    storagefence.Nodes
	Synced   func() bool // every informer synced: the index is complete
	Policy   fencing.Config
	Reporter *fencing.Reporter // may be nil
	// Malformed: the PVs the index skips as unreadable (may be nil); a
	// volume with one is neither published nor unpublished.
	Malformed *informers.MalformedSet
	// Clock nil: the real clock.
	Clock clock.PassiveClock
	// CatchUp bounds how long a publish whose write conflicted waits for
	// the index to see the newer PV before deciding again; zero means
	// publishCatchUpLimit. (A simulation that feeds the index itself sets
	// it to a nanosecond.)
	CatchUp time.Duration
}

// accessMode maps a CSI access mode to the policy's.
func accessMode(c *csi.VolumeCapability) fencing.AccessMode {
	switch c.GetAccessMode().GetMode() {
	case csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY:
		return fencing.MultiNodeReadOnly
	case csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER:
		return fencing.MultiNodeMultiWriter
	}
	return fencing.SingleNode
}

// claimCapability is how a claim records the capability a volume was
// published with: access type and mode.
func claimCapability(c *csi.VolumeCapability) string {
	access := "mount"
	if c.GetBlock() != nil {
		access = "block"
	}
	return access + "/" + c.GetAccessMode().GetMode().String()
}

// publishContext is where the node connects to volume id: its box's
// NVMe/TCP target (the box the ID names was checked by the publish).
func (s *ControllerServer) publishContext(id string) map[string]string {
	b, _ := s.d.boxOf(id)
	return map[string]string{
		PublishContextNVMeAddress: b.nvmeAddress(),
		PublishContextNVMePort:    strconv.Itoa(b.NVMePort),
		PublishContextNQN:         s.d.nqn(id),
	}
}

// requireSynced refuses to decide on an index that is not complete yet.
func (s *ControllerServer) requireSynced(id string) error {
	if !s.pub.Synced() {
		return statusf(codes.Unavailable, "volume %s: the attachment index is not synced with the API server yet; retry shortly", id)
	}
	return nil
}

// liveNode reads a node from the API server for a decision; failing to
// read it fails the call (closed: no answer that lets a node write rests
// on a read that did not happen).
func (s *ControllerServer) liveNode(ctx context.Context, id, node string) (fencing.NodeState, error) {
	n, err := s.pub.Nodes.LiveNode(ctx, node)
	if err != nil {
		return n, statusf(codes.Unavailable, "volume %s: cannot confirm the state of node %s with the API server (%v); retry", id, node, err)
	}
	return n, nil
}

// ControllerPublishVolume decides from the attachment index whether node
// may have the volume (pkg/fencing.Decide) and backs every answer that
// lets the node write with the API server in the same call: each fence of
// another node by a live read of that node, the success itself by a
// conditional write of the node's claim on the volume's PVs. A replica
// whose informers lag therefore never answers success from its cache.
func (s *ControllerServer) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	id := req.GetVolumeId()
	ident, identErr := ParseNodeID(req.GetNodeId())
	node := ident.Name
	switch {
	case s.pub == nil:
		return nil, statusf(codes.Unimplemented, "ControllerPublishVolume is not served: this controller runs without the attachment index (no Kubernetes API access)")
	case id == "":
		return nil, statusf(codes.InvalidArgument, "ControllerPublishVolume: volume_id is required")
	case req.GetNodeId() == "":
		return nil, statusf(codes.InvalidArgument, "ControllerPublishVolume: volume %s: node_id is required", id)
	case identErr != nil:
		return nil, statusf(codes.NotFound, "ControllerPublishVolume: volume %s: %v; no node of this driver registers such an ID", id, identErr)
	case req.GetVolumeCapability() == nil:
		return nil, statusf(codes.InvalidArgument, "ControllerPublishVolume: volume %s: volume_capability is required", id)
	case s.d.opts.ExportAuthOn() && ident.Key == nil:
		return nil, statusf(codes.FailedPrecondition, "volume %s: node %s registers no node key (its node ID is %q): with --export-auth=%s every attachment's secret is sealed to the key of the node it is published to. The node plugin there is older than this controller, its kernel cannot authenticate NVMe connections, or its key file could not be kept (its log says which): fix the node plugin, and the attach is retried", id, node, req.GetNodeId(), ExportAuthDHCHAP)
	}
	if err := checkCapability(req.GetVolumeCapability()); err != nil {
		return nil, statusf(codes.InvalidArgument, "volume %s: %v", id, err)
	}
	// The volume's box, before anything: its export and publish_context
	// are that box's.
	if _, err := s.d.boxOf(id); err != nil {
		return nil, err
	}
	if err := s.requireSynced(id); err != nil {
		return nil, err
	}
	release, err := s.acquire("volume", id, volumeKey(id))
	if err != nil {
		return nil, err
	}
	defer release()
	if err := s.refuseMalformed("publish", id, node); err != nil {
		s.pub.Reporter.PublishFailed("malformed")
		return nil, err
	}
	// The volume first (a missing volume is NOT_FOUND whatever the node),
	// then the node. A volume with a PV in the index exists; only one
	// without is looked up on the RDS, so the usual publish makes no SSH
	// round trip.
	indexed := s.pub.Index.Volume(id)
	if !indexed.Indexed() {
		if _, err := s.getVolume(ctx, id); err != nil {
			return nil, err
		}
	}
	// The requester's UID goes into the claim (a claim of another
	// incarnation of the node is stale). It comes from the index: the
	// commit's confirmation reads the Node live after the write and
	// answers nothing unless that very incarnation still stands
	// (storagefence.Commit's confirm), so a stale cache costs a retry,
	// never a claim answered for the wrong node. A node the index does not know (yet) is
	// read live, so it is not refused as missing.
	live := map[string]fencing.NodeState{}
	self := s.pub.Index.Node(node)
	if !self.Exists || self.UID == "" {
		var err error
		if self, err = s.liveNode(ctx, id, node); err != nil {
			return nil, err
		}
		live[node] = self
	}
	if !self.Exists {
		return nil, statusf(codes.NotFound, "volume %s: node %s does not exist in the API server", id, node)
	}
	v := s.pub.Fence.Fresher(indexed)
	if !v.Indexed() {
		// Kubernetes creates the PV before any VolumeAttachment; this
		// replica's informer has not seen it yet.
		return nil, statusf(codes.Aborted, "volume %s: its PersistentVolume is not in the attachment index yet; the request is retried", id)
	}
	mode := accessMode(req.GetVolumeCapability())
	if err := modeAllowed(v, mode); err != nil {
		return nil, statusf(codes.InvalidArgument, "volume %s on node %s: %v", id, node, err)
	}
	p := &publishing{s: s, req: req, ident: ident, mode: mode, self: self, live: live}
	return p.run(ctx, indexed, v)
}

// run makes attempts until one is not beaten by a concurrent write: a
// publish whose conditional write conflicts waits for the index to see the
// write that beat it and decides again (publishAttempts in all). v is the
// state of the first attempt: indexed, or fresher by this replica's own
// writes.
func (p *publishing) run(ctx context.Context, indexed, v *informers.Volume) (*csi.ControllerPublishVolumeResponse, error) {
	s, id := p.s, p.id()
	for attempt := 1; ; attempt++ {
		resp, err := p.attempt(ctx, v)
		if !errors.Is(err, claims.ErrConflict) {
			return resp, err
		}
		if attempt == publishAttempts {
			s.pub.Reporter.PublishFailed("conflict")
			return nil, statusf(codes.Aborted, "volume %s: its attachment state kept changing while deciding (another controller replica or a concurrent detach); the request is retried against the new state", id)
		}
		// The retry decides on what changed: a node read live before the
		// conflict may have recovered since (the conflict may be its own
		// repeated publish), so a fence stands on a fresh read again.
		for n := range p.live {
			if n != p.ident.Name {
				delete(p.live, n)
			}
		}
		if v != indexed {
			// Decided on this replica's own last write, and someone wrote
			// since (that write is forgotten): decide again on the index,
			// which may well have seen it already.
			v = indexed
			continue
		}
		catchUp, cancel := context.WithTimeout(ctx, s.pub.CatchUp)
		seen := indexed.Version()
		indexed = s.pub.Index.WaitForChange(catchUp, id, seen)
		cancel()
		switch {
		case !indexed.Indexed():
			return nil, statusf(codes.Aborted, "volume %s: its PersistentVolume left the attachment index while publishing; the request is retried", id)
		case indexed.Version() == seen:
			// This replica's PV watch is behind; deciding again on the
			// same state would conflict again.
			s.pub.Reporter.PublishFailed("conflict")
			return nil, statusf(codes.Aborted, "volume %s: this controller replica's view of the volume is behind the API server (its PV changed); the request is retried", id)
		}
		v = s.pub.Fence.Fresher(indexed)
	}
}

// publishing is one ControllerPublishVolume call's state across attempts.
type publishing struct {
	s     *ControllerServer
	req   *csi.ControllerPublishVolumeRequest
	ident NodeIdentity
	mode  fencing.AccessMode
	// self: the requester as the index shows it (read live when the
	// index does not know it); the commit's confirm reads it live.
	self fencing.NodeState
	// live: nodes read from the API server during this call. The decision
	// uses them over the index, so a fence stands on a live read.
	live map[string]fencing.NodeState
}

func (p *publishing) node(name string) fencing.NodeState {
	if n, ok := p.live[name]; ok {
		return n
	}
	return p.s.pub.Index.Node(name)
}

func (p *publishing) id() string { return p.req.GetVolumeId() }

// attempt decides on v and commits the decision: decide (the policy, every
// fence backed by a live read), plan (the claim to commit), then the
// storage-fence protocol's Commit (stand, cut, commit, confirm, open),
// then the answer. It returns claims.ErrConflict (not yet a status) when
// a PV changed after v was read.
func (p *publishing) attempt(ctx context.Context, v *informers.Volume) (*csi.ControllerPublishVolumeResponse, error) {
	decision, err := p.decide(ctx, v)
	if err != nil {
		return nil, err
	}
	c, err := p.plan(ctx, v, &decision)
	if err != nil {
		return nil, err
	}
	committed, err := p.s.pub.Fence.Commit(ctx, c)
	if err != nil {
		return nil, p.failed(err)
	}
	return p.answer(ctx, v, decision, c.Claim, committed)
}

// decide makes the decision on v with every fence it contains confirmed
// by a live read of the fenced node: a node that the cache shows stale but
// the API server does not (a Node not seen yet, a taint since removed, a
// node re-created) is decided on as it really is. A refusal is answered
// here (FAILED_PRECONDITION, naming the holder).
func (p *publishing) decide(ctx context.Context, v *informers.Volume) (fencing.Decision, error) {
	pub, id := p.s.pub, p.id()
	now := pub.Clock.Now()
	var d fencing.Decision
	for confirmed := false; !confirmed; {
		d = fencing.Decide(fencing.Request{VolumeID: id, Node: p.ident.Name, Mode: p.mode, ReadOnly: p.req.GetReadonly()},
			v.Holders(), p.node, now, pub.Policy)
		confirmed = true
		for _, f := range d.Fence {
			if _, ok := p.live[f.Node]; ok {
				continue
			}
			n, err := p.s.liveNode(ctx, id, f.Node)
			if err != nil {
				pub.Reporter.Decided(pub.Clock.Since(now))
				pub.Reporter.PublishFailed("unconfirmed")
				return d, err
			}
			p.live[f.Node] = n
			confirmed = false
		}
	}
	pub.Reporter.Decided(pub.Clock.Since(now))
	if d.Verdict == fencing.Refuse {
		pub.Reporter.Refused(v.Ref(), p.ident.Name, d)
		klog.FromContext(ctx).Info("publish refused", "volume", id, "node", p.ident.Name, "pv", v.PVName, "blocking", d.Blocking, "reason", d.Reason)
		return d, statusf(codes.FailedPrecondition, "%s", d.Reason)
	}
	return d, nil
}

// plan is the claim the decision commits: the node's live attachment
// published again (its publish count counted), or a new attachment (with
// its own host NQN under storage fencing) that replaces the node's
// earlier one, if any. A first attach, counted as one, or a migration's
// target joining, is made an Allow here: the policy sees the requester's
// own VolumeAttachment, which exists before every publish, as a holding
// already.
func (p *publishing) plan(ctx context.Context, v *informers.Volume, decision *fencing.Decision) (storagefence.Commit, error) {
	s, id, node := p.s, p.id(), p.ident.Name
	claim, claimed := v.Claims.Get(node)
	if _, read := p.live[node]; claimed && !read && claim.NodeUID != "" && claim.NodeUID != p.self.UID {
		// The claim names another incarnation than the index shows:
		// replacing it (and cutting that attachment off) stands on a
		// live read, as every fence does; the index may be the one
		// behind (the node re-created, and published by another replica).
		self, err := s.liveNode(ctx, id, node)
		if err != nil {
			s.pub.Reporter.PublishFailed("unconfirmed")
			return storagefence.Commit{}, err
		}
		if !self.Exists {
			return storagefence.Commit{}, statusf(codes.NotFound, "volume %s: node %s does not exist in the API server", id, node)
		}
		p.self, p.live[node] = self, self
	}
	sameNode, err := p.sameAttachment(ctx, v, claim, claimed)
	if err != nil {
		return storagefence.Commit{}, err
	}
	capability := claimCapability(p.req.GetVolumeCapability())
	if sameNode && claim.Capability != "" && (claim.Capability != capability || claim.ReadOnly != p.req.GetReadonly()) {
		return storagefence.Commit{}, statusf(codes.AlreadyExists, "volume %s is already published to node %s as %s (read-only %t); this request asks for %s (read-only %t): unpublish it first",
			id, node, claim.Capability, claim.ReadOnly, capability, p.req.GetReadonly())
	}
	if decision.Verdict == fencing.AlreadyPublished && !sameNode {
		p.firstAttach(v, decision)
	}
	c := storagefence.Commit{Volume: v, Node: node, Created: !sameNode, Fenced: decision.Fence}
	if claimed && !sameNode {
		// The node's own earlier attachment (another incarnation, a
		// claim only a stale PV showed) may still be connected: retired
		// like a fenced one.
		old := claims.RetiringOf(node, claim)
		c.Replaces = &old
	}
	if !sameNode {
		// A first claim, or one of an earlier incarnation of this node (a
		// claim without UID, from before UIDs were recorded, is this
		// node's, as everywhere else): a new attachment.
		if claim, err = s.pub.Fence.NewClaim(newClaimTime(s.pub.Clock.Now(), v.Claims)); err != nil {
			return storagefence.Commit{}, statusf(codes.Internal, "volume %s: %v", id, err)
		}
	}
	claim.NodeUID, claim.Capability, claim.ReadOnly = p.self.UID, capability, p.req.GetReadonly()
	if s.pub.Fence.StorageFencing() {
		if err := p.upgradeAttachment(&claim); err != nil {
			return storagefence.Commit{}, err
		}
	}
	// Every success is a write, a repeated publish too: a concurrent
	// release (a late unpublish on another replica) then conflicts with it
	// instead of dropping a claim this call is about to answer on.
	claim.Gen++
	c.Claim = claim
	return c, nil
}

// sameAttachment reports whether node's claim on v (claimed) is the
// node's live attachment, to be published again: this incarnation's (or
// one without UID), on every PV of the handle. Under storage fencing a
// claim the index shows on some PVs only is looked up live (a stale PV
// that still shows a released claim, or a PV made again for the handle
// that was never given it): a live attachment is kept, not replaced under
// its staged node.
func (p *publishing) sameAttachment(ctx context.Context, v *informers.Volume, claim claims.Claim, claimed bool) (bool, error) {
	mine := claimed && (claim.NodeUID == p.self.UID || claim.NodeUID == "")
	if !mine || onEveryPV(v, p.ident.Name, claim) {
		return mine, nil
	}
	if len(v.PVs) < 2 || !p.s.pub.Fence.StorageFencing() {
		return false, nil
	}
	live, ok, err := p.s.pub.Fence.LiveClaim(ctx, p.id(), v.PVName, p.ident.Name)
	if err != nil {
		p.s.pub.Reporter.PublishFailed("unconfirmed")
		return false, statusf(codes.Unavailable, "volume %s: reading its claims to tell whether node %s's attachment stands: %v; retry", p.id(), p.ident.Name, err)
	}
	return ok && live.Nonce == claim.Nonce && live.NodeUID == claim.NodeUID, nil
}

// firstAttach makes an AlreadyPublished decision without the node's claim
// an Allow: a first attach, or a migration's target joining.
func (p *publishing) firstAttach(v *informers.Volume, decision *fencing.Decision) {
	id, node := p.id(), p.ident.Name
	decision.Verdict = fencing.Allow
	decision.Reason = fmt.Sprintf("volume %s attached to node %s", id, node)
	others := make([]string, 0, v.Claims.Len())
	for n := range v.Claims.All() {
		if n != node {
			others = append(others, n)
		}
	}
	if p.mode == fencing.MultiNodeMultiWriter && len(others) > 0 {
		sort.Strings(others)
		decision.MigrationStart = true
		decision.Reason = fmt.Sprintf("volume %s: live migration from %s to %s", id, strings.Join(others, ", "), node)
	}
}

// failed is how a failed step of the protocol's Commit reaches the
// attacher: counted, with the code its outcome calls for.
func (p *publishing) failed(err error) error {
	if errors.Is(err, claims.ErrConflict) {
		return err
	}
	var step *storagefence.StepError
	if !errors.As(err, &step) {
		p.s.pub.Reporter.PublishFailed("error")
		return err
	}
	p.s.pub.Reporter.PublishFailed(step.Step)
	return stepStatus(step)
}

// stepStatus is the gRPC status of a failed protocol step.
func stepStatus(step *storagefence.StepError) error {
	code := codes.Unavailable
	switch step.Outcome {
	case storagefence.Aborted:
		code = codes.Aborted
	case storagefence.Refused:
		code = codes.FailedPrecondition
	}
	return statusf(code, "%v", step.Err)
}

// answer is the publish_context a committed claim is answered with: the
// target, and under storage fencing the attachment's host NQN and, with
// authenticated exports, its secret sealed to the node's key.
func (p *publishing) answer(ctx context.Context, v *informers.Volume, decision fencing.Decision, claim claims.Claim, committed storagefence.Committed) (*csi.ControllerPublishVolumeResponse, error) {
	s, id, node := p.s, p.id(), p.ident.Name
	pc := s.publishContext(id)
	if committed.HostNQN != "" {
		pc[PublishContextHostNQN] = committed.HostNQN
	}
	if s.pub.Fence.StorageFencing() && s.d.opts.ExportAuthOn() {
		if err := p.authenticate(ctx, pc, committed); err != nil {
			s.pub.Reporter.PublishFailed("storage")
			return nil, err
		}
	}
	s.pub.Reporter.Published(v.Ref(), node, decision)
	var fenced []string
	for _, f := range decision.Fence {
		fenced = append(fenced, f.Node)
	}
	klog.FromContext(ctx).Info("published", "volume", id, "node", node, "pv", v.PVName, "reason", decision.Reason, "verdict", decision.Verdict.String(),
		"fenced", fenced, "migration", decision.MigrationStart, "gen", claim.Gen)
	return &csi.ControllerPublishVolumeResponse{PublishContext: pc}, nil
}

// upgradeAttachment settles, under storage fencing, which host NQN an
// attachment uses across the upgrade to per-attachment host NQNs. Node
// plugins of this release register the bare node name as their node ID
// (nodeid.go); one from before registers "name/its own host NQN" and
// connects with that, ignoring publish_context's hostNQN:
//   - an attachment made before the upgrade (a claim without nonce) keeps
//     the node's own NQN recorded in its claim until it ends;
//   - one from before storage fencing was turned on records the NQN the
//     node ID carries, or, from a node plugin of this release, becomes an
//     attachment of its own (a nonce): the export never opens to any host
//     for want of a name;
//   - any other attachment needs a node plugin that connects with the
//     attachment's NQN: an older one would be refused by the export, so
//     the publish is refused up front, retried until the plugin is
//     upgraded.
func (p *publishing) upgradeAttachment(claim *claims.Claim) error {
	id, node := p.req.GetVolumeId(), p.ident.Name
	if claim.Nonce == "" && claim.HostNQN == "" {
		if p.ident.HostNQN != "" {
			claim.HostNQN = p.ident.HostNQN
			return nil
		}
		nonce, err := storagefence.NewNonce()
		if err != nil {
			return statusf(codes.Internal, "volume %s: %v", id, err)
		}
		claim.Nonce = nonce
	}
	if claim.Nonce != "" && p.ident.HostNQN != "" {
		return statusf(codes.FailedPrecondition, "volume %s: node %s runs a node plugin older than this controller (its node ID %q carries the node's own host NQN): it would connect with that NQN, which storage fencing's per-attachment export does not allow; upgrade the node plugin DaemonSet, and the attach is retried", id, node, p.req.GetNodeId())
	}
	return nil
}

// authenticate adds an authenticated attachment's keys to publish_context
// (--export-auth=dhchap): the secret the export was read back with, sealed
// to the requester's node key. An export open to any host (readers only:
// nothing to fence) is answered without. So is one that prints no secret
// for an attachment made before the mode was turned on (claim c without
// Auth), which keeps working until it moves (docs/attachments.md,
// "Turning it on"). An attachment made with the mode on (c.Auth) whose
// export prints no secret fails: its password may be set (a swap that
// landed but whose read back showed no secret, a RouterOS user without
// the sensitive policy), and a node told of no secret could not connect;
// nothing tells that apart from an export without a password. The
// secret never reaches a log line or an error.
func (p *publishing) authenticate(ctx context.Context, pc map[string]string, res storagefence.Committed) error {
	id, node := p.req.GetVolumeId(), p.ident.Name
	switch {
	case res.SecretUnreadable:
		return statusf(codes.Unavailable, "volume %s: its export on the RDS prints a secret in a form this driver cannot read, so node %s could not authenticate; run rdsctl selftest on this RDS (docs/routeros.md, \"The export password\")", id, node)
	case res.Export.Host != "" && res.Secret.IsZero() && res.Claim.Auth:
		return statusf(codes.Unavailable, "volume %s: its export on the RDS prints no secret (nvme-tcp-server-secret), but node %s's attachment was made with --export-auth=%s, so its password may be set and the node could not connect without it; give the controller's RouterOS user the sensitive policy (docs/deploy.md), or, if a controller replica without --export-auth opened it, move the volume (detach and attach again)", id, node, ExportAuthDHCHAP)
	case res.Export.Host == "" || res.Secret.IsZero():
		klog.FromContext(ctx).Info("published without authentication: the export has no password", "volume", id, "node", node, "export", res.Export.String())
		return nil
	}
	sealed, err := sealSecret(p.s.d.opts.AttachmentKey, id, res.Export.Host, *p.ident.Key, res.Secret)
	if err != nil {
		return statusf(codes.Internal, "volume %s: sealing its secret to node %s's key: %v", id, node, err)
	}
	pc[PublishContextAuth], pc[PublishContextSecret] = AuthDHCHAP, sealed
	return nil
}

// onEveryPV: node's claim c (from the index's merged view) stands: no
// record of the handle retires it, and it is on every PV of the handle as
// this replica saw them. A claim only a stale PV still shows was released
// by an answered unpublish: reusing it (its nonce, so its host NQN) would
// let that retired attachment in again. (A PV made again for the handle
// has none yet: with storage fencing the publish then asks the live
// claims.)
func onEveryPV(v *informers.Volume, node string, c claims.Claim) bool {
	if claims.Retired(v.Retiring, node, c) {
		return false
	}
	if len(v.PVs) < 2 {
		return true
	}
	for _, pv := range v.PVs {
		if own, ok := pv.Claims.Get(node); !ok || own.Nonce != c.Nonce || own.NodeUID != c.NodeUID {
			return false
		}
	}
	return true
}

// newClaimTime is when a new claim is made: now, to the second, but
// always after every other claim's time, so that "the newest claim" (the
// one the export goes to, a migration's target) is never a tie.
func newClaimTime(now time.Time, others claims.Set) time.Time {
	at := now.UTC().Truncate(time.Second)
	for _, c := range others.All() {
		if !at.After(c.At) {
			at = c.At.UTC().Add(time.Second)
		}
	}
	return at
}

// ControllerUnpublishVolume releases node's claim on the volume and no
// other, and not while a live VolumeAttachment of that node that is not
// being deleted still stands on it: a late detach from a former
// attachment never disturbs the current one. The release is the
// storage-fence protocol's (storagefence.Release: with storage fencing,
// cut, release, settle). Detaching what is not attached succeeds.
func (s *ControllerServer) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	id := req.GetVolumeId()
	var ident NodeIdentity
	switch {
	case s.pub == nil:
		return nil, statusf(codes.Unimplemented, "ControllerUnpublishVolume is not served: this controller runs without the attachment index (no Kubernetes API access)")
	case id == "":
		return nil, statusf(codes.InvalidArgument, "ControllerUnpublishVolume: volume_id is required")
	case req.GetNodeId() != "":
		var err error
		if ident, err = ParseNodeID(req.GetNodeId()); err != nil {
			// No node of this driver has such an ID, so none holds it.
			return &csi.ControllerUnpublishVolumeResponse{}, nil
		}
	}
	node := ident.Name
	if !isVolumeID(id) {
		return &csi.ControllerUnpublishVolumeResponse{}, nil
	}
	if err := s.requireSynced(id); err != nil {
		return nil, err
	}
	release, err := s.acquire("volume", id, volumeKey(id))
	if err != nil {
		return nil, err
	}
	defer release()
	if err := s.refuseMalformed("unpublish", id, node); err != nil {
		s.pub.Reporter.UnpublishFailed("malformed")
		return nil, err
	}

	v := s.pub.Index.Volume(id)
	if !v.Indexed() {
		// Either the volume is gone (nothing to release), or this
		// replica's PV cache is behind: answering OK then would skip the
		// release and leave the claim for good.
		switch _, err := s.getVolume(ctx, id); status.Code(err) {
		case codes.NotFound:
			return &csi.ControllerUnpublishVolumeResponse{}, nil
		case codes.OK:
			return nil, statusf(codes.Aborted, "volume %s exists, but its PersistentVolume is not in this replica's attachment index yet; the request is retried", id)
		default:
			return nil, err
		}
	}
	nodes := []string{node}
	if node == "" {
		if nodes, err = s.claimingNodes(ctx, v); err != nil {
			s.pub.Reporter.UnpublishFailed("error")
			return nil, err
		}
	}
	holders := v.Holders()
	for _, n := range nodes {
		released, err := s.unpublishFrom(ctx, v, n)
		if err != nil {
			return nil, err
		}
		// One line per answered unpublish (the e2e checker reads them):
		// released=false is no claim, or a live VolumeAttachment of the
		// node still standing on it (a late unpublish).
		klog.FromContext(ctx).Info("unpublished", "volume", id, "node", n, "pv", v.PVName, "released", released)
		if !released && !holds(holders, n) {
			continue
		}
		migrationEnded := v.Block && len(holders) == 2 && v.Grants(corev1.ReadWriteMany)
		s.pub.Reporter.Unpublished(v.Ref(), n, migrationEnded)
	}
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}

// claimingNodes is every node an unpublish without node_id releases (CSI:
// an empty node_id unpublishes from every node). The claims are read
// live: a claim committed a moment ago that this index has not seen yet
// is released too, and, with storage fencing, a node whose release a
// replica recorded and did not finish (its export change after it).
func (s *ControllerServer) claimingNodes(ctx context.Context, v *informers.Volume) ([]string, error) {
	seen := map[string]bool{}
	var nodes []string
	add := func(n string) {
		if !seen[n] {
			seen[n] = true
			nodes = append(nodes, n)
		}
	}
	for _, pv := range v.PVs {
		held, retiring, err := s.pub.Fence.LiveState(ctx, pv.Name, v.Handle)
		if err != nil {
			return nil, statusf(codes.Unavailable, "volume %s: reading the claims on PV %s to unpublish it from every node: %v; retry", v.Handle, pv.Name, err)
		}
		for n := range held {
			add(n)
		}
		if s.pub.Fence.StorageFencing() {
			for _, r := range retiring {
				add(r.Node)
			}
		}
	}
	sort.Strings(nodes)
	return nodes, nil
}

// unpublishFrom releases node's claim on every PV of v (the release reads
// each PV live, so a claim committed a moment ago that this index has not
// seen yet is released too, and so is the claim on a PV of the handle
// this index has not seen yet: the claim names its PVs), unless a live,
// non-deleting VolumeAttachment of the node still stands on it. The cut
// drops the node's connections unless a live read shows it Ready and in
// service: Kubernetes detaches from such a node only after its kubelet
// unstaged the volume; from any other (a force-detach after 6 minutes or
// on the out-of-service taint, a node that is gone) its host may still be
// connected. Once no claim of the node is left, a settle that fails does
// not fail the detach (the attacher's retry, on a replica whose index
// lags, must not find the volume free while the detach is still pending):
// the release record stays and the leader makes the change within
// seconds.
func (s *ControllerServer) unpublishFrom(ctx context.Context, v *informers.Volume, node string) (bool, error) {
	id := v.Handle
	pvs := storagefence.PVNames(v)
	out, err := s.pub.Fence.Release(ctx, storagefence.Release{
		Handle: id, PV: v.PVName, PVs: pvs, Node: node,
		May: func(ctx context.Context, c claims.Claim) (bool, error) {
			keeps, err := s.pub.Fence.KeepsClaim(ctx, id, node, append(pvs, c.PVs...))
			return !keeps, err
		},
		Graceful: func(ctx context.Context) (bool, error) {
			n, err := s.pub.Nodes.LiveNode(ctx, node)
			return n.Exists && n.Ready && !n.OutOfService, err
		},
	})
	if err != nil {
		s.pub.Reporter.UnpublishFailed("error")
		return false, fmt.Errorf("volume %s: %w", id, err)
	}
	if out.Unread && !out.Released {
		// The index names PVs of the volume that are gone (or now
		// another volume's): it is behind, and the node's claim may stand
		// on a PV of the handle made since (a re-created PV). Answering
		// OK would let the attacher delete the attachment with the claim
		// left in place and its release, cut included, never made.
		s.pub.Reporter.UnpublishFailed("error")
		return false, statusf(codes.Aborted, "volume %s: PersistentVolume %s, as this replica's attachment index knows it, is gone or belongs to another volume now; the request is retried once the index has caught up", id, v.PVName)
	}
	if out.SettleErr != nil {
		if len(out.Retiring) == 0 {
			s.pub.Reporter.UnpublishFailed("storage")
			return false, statusf(codes.Unavailable, "%v; the detach is retried", out.SettleErr)
		}
		klog.FromContext(ctx).Error(out.SettleErr, "storage fencing: the export change after the release failed; the leader makes it", "volume", id, "node", node)
	}
	return out.Released, nil
}

// modeAllowed checks a request's sharing mode against the PV: a
// multi-node request on a PV that does not grant it would let a second
// node in where the claim's owner was promised exclusivity.
func modeAllowed(v *informers.Volume, mode fencing.AccessMode) error {
	need := map[fencing.AccessMode]corev1.PersistentVolumeAccessMode{
		fencing.MultiNodeMultiWriter: corev1.ReadWriteMany,
		fencing.MultiNodeReadOnly:    corev1.ReadOnlyMany,
	}[mode]
	if need == "" || len(v.AccessModes) == 0 || v.Grants(need) {
		return nil
	}
	return fmt.Errorf("the request asks for %s, but PersistentVolume %s grants only %v", mode, v.PVName, v.AccessModes)
}

func holds(holders []fencing.Holder, node string) bool {
	for _, h := range holders {
		if h.Node == node {
			return true
		}
	}
	return false
}
