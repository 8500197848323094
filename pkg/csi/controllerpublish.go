package csi

import (
	"context"
	"errors"
	"fmt"
	"slices"
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

	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/informers"
	"github.com/srvlab/rds-csi/pkg/rds"
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
	// Retiring lists the entries with released attachments whose export
	// change after the release is not known to be made.
	Retiring() []*informers.Volume
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

// ClaimStore is where publish decisions are confirmed with the API server
// (pkg/informers.Claims): the conditional writes that commit them and the
// live reads that back a fence or a release.
type ClaimStore interface {
	// Commit sets node's claim (dropping the fenced nodes' claims) on every
	// PV of v, conditional on the resourceVersions the decision saw;
	// informers.ErrConflict when one changed.
	Commit(ctx context.Context, v *informers.Volume, node string, claim informers.Claim, fenced []string) error
	// Fresher is v as the API server answered this replica's own latest
	// claim writes on it, when v's index entry is behind only by those;
	// otherwise v.
	Fresher(v *informers.Volume) *informers.Volume
	// ReleaseUnpublished drops node's claim on a PV unless a live,
	// non-deleting VolumeAttachment of the handle on node stands on it.
	// before (may be nil) runs just before the claim goes; its error
	// keeps the claim. Reports whether it released a claim, and whether
	// an attachment of node is retiring (storage fencing: released now or
	// before, its export change after the release not known to be made).
	ReleaseUnpublished(ctx context.Context, pvName, handle, node string, before func(context.Context, informers.Claim) error) (released bool, retiring []informers.Retiring, err error)
	// ReleaseRetired drops a claim that is the retired attachment r (its
	// release reached another PV of the handle, not this one).
	ReleaseRetired(ctx context.Context, pvName, handle string, r informers.Retiring) (bool, error)
	// LiveState reads a PV's claims and retiring attachments from the
	// API server (none for a PV of another handle).
	LiveState(ctx context.Context, pvName, handle string) (map[string]informers.Claim, []informers.Retiring, error)
	// ClearRetiring removes entries of a PV's retiring attachments once
	// the export change after their release is made.
	ClearRetiring(ctx context.Context, pvName string, done []informers.Retiring) error
	// LiveAttachment reads whether a live, non-deleting VolumeAttachment
	// of handle on node exists.
	LiveAttachment(ctx context.Context, handle, node string, pvs []string) (bool, error)
	// AttachmentExists reads whether a VolumeAttachment of handle on node
	// exists, being deleted or not.
	AttachmentExists(ctx context.Context, handle, node string, pvs []string) (bool, error)
	// Withdraw drops node's claim if it is still the one committed.
	Withdraw(ctx context.Context, pvName, node string, committed informers.Claim) (bool, error)
	// LiveNode reads a node from the API server, not from a cache.
	LiveNode(ctx context.Context, name string) (fencing.NodeState, error)
	// LiveClaims reads a PV's claims from the API server.
	LiveClaims(ctx context.Context, pvName string) (map[string]informers.Claim, error)
}

// Publisher holds what ControllerPublish/Unpublish need.
type Publisher struct {
	Index    AttachmentIndex
	Claims   ClaimStore
	Synced   func() bool // every informer synced: the index is complete
	Policy   fencing.Config
	Reporter *fencing.Reporter // may be nil
	// Malformed: the PVs the index skips as unreadable (may be nil); a
	// volume with one is neither published nor unpublished.
	Malformed *informers.MalformedSet
	Clock     clock.PassiveClock
	// CatchUp bounds how long a publish whose write conflicted waits for
	// the index to see the newer PV before deciding again; zero means
	// publishCatchUpLimit. (A simulation that feeds the index itself sets
	// it to a nanosecond.)
	CatchUp time.Duration
}

// ServePublish enables ControllerPublish/Unpublish (and advertises
// PUBLISH_UNPUBLISH_VOLUME) with p. Call before serving.
func (s *ControllerServer) ServePublish(p *Publisher) *ControllerServer {
	if p.Clock == nil {
		p.Clock = clock.RealClock{}
	}
	if p.CatchUp <= 0 {
		p.CatchUp = publishCatchUpLimit
	}
	s.pub = p
	return s
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

func (s *ControllerServer) publishContext(id string) map[string]string {
	return map[string]string{
		PublishContextNVMeAddress: s.d.opts.NVMeAddress,
		PublishContextNVMePort:    strconv.Itoa(s.d.opts.NVMePort),
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
	n, err := s.pub.Claims.LiveNode(ctx, node)
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
	// (confirmCommitted), so a stale cache costs a retry, never a claim
	// answered for the wrong node. A node the index does not know (yet) is
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
	v := s.pub.Claims.Fresher(indexed)
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
	for attempt := 1; ; attempt++ {
		resp, err := p.decideAndCommit(ctx, v)
		if !errors.Is(err, informers.ErrConflict) {
			return resp, err
		}
		if attempt == publishAttempts {
			s.pub.Reporter.PublishFailed("conflict")
			return nil, statusf(codes.Aborted, "volume %s: its attachment state kept changing while deciding (another controller replica or a concurrent detach); the request is retried against the new state", id)
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
		v = s.pub.Claims.Fresher(indexed)
	}
}

// publishing is one ControllerPublishVolume call's state across attempts.
type publishing struct {
	s     *ControllerServer
	req   *csi.ControllerPublishVolumeRequest
	ident NodeIdentity
	mode  fencing.AccessMode
	// self: the requester as the index shows it (read live when the
	// index does not know it); confirmCommitted reads it live.
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

// decide makes the decision on v with every fence it contains confirmed
// by a live read of the fenced node: a node that the cache shows stale but
// the API server does not (a Node not seen yet, a taint since removed, a
// node re-created) is decided on as it really is.
func (p *publishing) decide(ctx context.Context, v *informers.Volume, now time.Time) (fencing.Decision, error) {
	id := p.req.GetVolumeId()
	for {
		d := fencing.Decide(fencing.Request{VolumeID: id, Node: p.ident.Name, Mode: p.mode, ReadOnly: p.req.GetReadonly()},
			v.Holders(), p.node, now, p.s.pub.Policy)
		confirmed := true
		for _, f := range d.Fence {
			if _, ok := p.live[f.Node]; ok {
				continue
			}
			n, err := p.s.liveNode(ctx, id, f.Node)
			if err != nil {
				return d, err
			}
			p.live[f.Node] = n
			confirmed = false
		}
		if confirmed {
			return d, nil
		}
	}
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
func (p *publishing) upgradeAttachment(claim *informers.Claim) error {
	id, node := p.req.GetVolumeId(), p.ident.Name
	if claim.Nonce == "" && claim.HostNQN == "" {
		if p.ident.HostNQN != "" {
			claim.HostNQN = p.ident.HostNQN
			return nil
		}
		nonce, err := newNonce()
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

// decideAndCommit makes the publish decision on v and commits it. It
// returns informers.ErrConflict (not yet a status) when a PV changed
// after v was read.
func (p *publishing) decideAndCommit(ctx context.Context, v *informers.Volume) (*csi.ControllerPublishVolumeResponse, error) {
	s, req := p.s, p.req
	id, node := req.GetVolumeId(), p.ident.Name
	now := s.pub.Clock.Now()
	decision, err := p.decide(ctx, v, now)
	s.pub.Reporter.Decided(s.pub.Clock.Since(now))
	if err != nil {
		s.pub.Reporter.PublishFailed("unconfirmed")
		return nil, err
	}
	logger := klog.FromContext(ctx).WithValues("volume", id, "node", node, "pv", v.PVName)

	if decision.Verdict == fencing.Refuse {
		s.pub.Reporter.Refused(v.Ref(), node, decision)
		logger.Info("publish refused", "blocking", decision.Blocking, "reason", decision.Reason)
		return nil, statusf(codes.FailedPrecondition, "%s", decision.Reason)
	}
	capability := claimCapability(req.GetVolumeCapability())
	claim, claimed := v.Claims.Get(node)
	if _, read := p.live[node]; claimed && !read && claim.NodeUID != "" && claim.NodeUID != p.self.UID {
		// The claim names another incarnation than the index shows:
		// replacing it (and cutting that attachment off) stands on a
		// live read, as every fence does; the index may be the one
		// behind (the node re-created, and published by another replica).
		self, err := s.liveNode(ctx, id, node)
		if err != nil {
			s.pub.Reporter.PublishFailed("unconfirmed")
			return nil, err
		}
		if !self.Exists {
			return nil, statusf(codes.NotFound, "volume %s: node %s does not exist in the API server", id, node)
		}
		p.self, p.live[node] = self, self
	}
	sameNode := claimed && (claim.NodeUID == p.self.UID || claim.NodeUID == "") && onEveryPV(v, node, claim)
	if !sameNode && claimed && (claim.NodeUID == p.self.UID || claim.NodeUID == "") && len(v.PVs) > 1 && s.d.opts.AllowHostFencing() {
		// The index shows the claim on some PVs of the handle only: a
		// stale PV that still shows a released claim, or a PV made again
		// for the handle that was never given it. The live claims tell
		// (a released attachment is retired by its record for as long as
		// any PV shows it): a live attachment is kept, not replaced
		// under its staged node.
		live, err := s.liveClaims(ctx, id, v.PVName)
		if err != nil {
			s.pub.Reporter.PublishFailed("unconfirmed")
			return nil, statusf(codes.Unavailable, "volume %s: reading its claims to tell whether node %s's attachment stands: %v; retry", id, node, err)
		}
		if lc, ok := live.claims[node]; ok && lc.Nonce == claim.Nonce && lc.NodeUID == claim.NodeUID && !informers.Retired(live.retiring, node, claim) {
			sameNode = true
		}
	}
	if sameNode && claim.Capability != "" && (claim.Capability != capability || claim.ReadOnly != req.GetReadonly()) {
		return nil, statusf(codes.AlreadyExists, "volume %s is already published to node %s as %s (read-only %t); this request asks for %s (read-only %t): unpublish it first",
			id, node, claim.Capability, claim.ReadOnly, capability, req.GetReadonly())
	}
	fencingOn := s.d.opts.AllowHostFencing()
	if decision.Verdict == fencing.AlreadyPublished && !sameNode {
		// The policy sees this node's VolumeAttachment (which exists
		// before every publish) as a holding already; without this
		// node's claim it is a first attach (counted and evented as
		// one), or a migration's target joining.
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
	if !sameNode {
		// A first claim, or one of an earlier incarnation of this node
		// (a claim without UID, from before UIDs were recorded, is this
		// node's, as everywhere else):
		// a new attachment, with its own host NQN under storage fencing.
		claim = informers.Claim{At: newClaimTime(now, v.Claims)}
		if fencingOn {
			if claim.Nonce, err = newNonce(); err != nil {
				return nil, statusf(codes.Internal, "volume %s: %v", id, err)
			}
			// Made authenticated: from now on a publish of it answers its
			// secret or fails (authenticate).
			claim.Auth = s.d.opts.ExportAuthOn()
		}
	}
	claim.NodeUID, claim.Capability, claim.ReadOnly = p.self.UID, capability, req.GetReadonly()
	if fencingOn {
		if err := p.upgradeAttachment(&claim); err != nil {
			return nil, err
		}
	}
	// Every success is a write, a repeated publish too: a concurrent
	// release (a late unpublish on another replica) then conflicts with it
	// instead of dropping a claim this call is about to answer on.
	claim.Gen++
	var fenced []string
	for _, f := range decision.Fence {
		fenced = append(fenced, f.Node)
	}
	if fencingOn {
		holders := 1
		for n := range v.Claims.All() {
			if n != node && !slices.Contains(fenced, n) {
				holders++
			}
		}
		if holders > 1 && len(fenced) > 0 {
			// Joining a holder (a migration) moves the export without a
			// drop, which would leave the fenced node connected.
			s.pub.Reporter.PublishFailed("storage")
			return nil, statusf(codes.Aborted, "volume %s: node(s) %v must be cut off the RDS before %s joins %d other holder(s); the fence is under way and the request is retried", id, fenced, node, holders-1)
		}
	}
	// A claim stands on a live VolumeAttachment: a replica that wakes up
	// after the attachment was detached must not leave one behind. It is
	// read before the commit as well as after it (confirmCommitted): a
	// claim written for an attachment already gone could only be taken
	// back by this call (no attacher calls for a VolumeAttachment that is
	// gone), so every failure of that take-back would leave it for good.
	// Taking the attachment from the index instead saves one round trip;
	// an outside review found four ways it leaves such a claim (issue 24,
	// TestPausedReplicaWritesNoClaim).
	if err := p.requireAttachment(ctx, v); err != nil {
		return nil, err
	}
	// replacesOwn: this publish replaces its node's own earlier
	// attachment (another incarnation of the node, a claim only a stale
	// PV showed); that attachment may still be connected.
	replacesOwn := claimed && !sameNode
	// gone: the attachments this publish retires, as it decided on them:
	// one replaced or released since (another replica's publish of the
	// same node) is not cut again.
	var gone []informers.Retiring
	for _, f := range fenced {
		if c, ok := v.Claims.Get(f); ok {
			gone = append(gone, informers.RetiringOf(f, c))
		}
	}
	if replacesOwn {
		own, _ := v.Claims.Get(node)
		gone = append(gone, informers.RetiringOf(node, own))
	}
	if fencingOn && (len(fenced) > 0 || replacesOwn) {
		// Fenced nodes, and the node's own earlier attachment, are cut off
		// the RDS before their claims go with the commit (as the
		// informers' fencer does): a cut that fails keeps the claims and
		// the publish is retried, never a released claim whose host is
		// still connected with nothing left to cut it.
		if _, err := s.syncExport(ctx, id, exportGoal{pv: v.PVName, gone: gone, retire: true, cut: true}); err != nil && !errors.Is(err, rds.ErrNotFound) {
			s.pub.Reporter.PublishFailed("storage")
			return nil, storageError(id, node, fmt.Errorf("cutting %v off before releasing their claims: %w", gone, err))
		}
	}
	if err := s.pub.Claims.Commit(ctx, v, node, claim, fenced); err != nil {
		if errors.Is(err, informers.ErrConflict) {
			return nil, err
		}
		s.pub.Reporter.PublishFailed("error")
		return nil, fmt.Errorf("volume %s: recording the attachment to node %s on PV %s (nothing was answered; the attach is retried): %w", id, node, v.PVName, err)
	}
	// The commit released the fenced holders' claims: reported now,
	// whatever comes of this publish.
	for _, f := range decision.Fence {
		s.pub.Reporter.Fenced(v.Ref(), f.Node, f.Reason)
	}
	// Confirmed after the commit: the VolumeAttachment is still live, and
	// the node is still the incarnation the claim names (a Node deleted
	// and re-created in between is another node). Otherwise the claim is
	// taken back and nothing is answered.
	if err := p.confirmCommitted(ctx, v, claim, !sameNode); err != nil {
		return nil, err
	}
	pc := s.publishContext(id)
	if fencingOn {
		// The RDS lets the attachment in (and everyone else out) before the
		// node is told it may write; fenced nodes' claims are gone with the
		// commit, so their hosts are dropped.
		// After a publish that fenced others or replaced the node's own
		// earlier attachment (both cut off above), the state changes once
		// more, so that no open of a retired attachment in flight lands.
		res, err := s.syncExport(ctx, id, exportGoal{pv: v.PVName, prefer: node, gone: gone, retire: replacesOwn || len(fenced) > 0, readBack: true})
		if err != nil {
			s.pub.Reporter.PublishFailed("storage")
			return nil, storageError(id, node, err)
		}
		live, ok := res.claims[node]
		if !ok || live.Nonce != claim.Nonce || live.NodeUID != claim.NodeUID {
			s.pub.Reporter.PublishFailed("conflict")
			return nil, statusf(codes.Aborted, "volume %s: node %s's claim was released or replaced while its export was being opened (a concurrent unpublish or fence); the export follows the live claims, and the request is retried", id, node)
		}
		if live.Nonce != "" {
			// Without it (an attachment from before per-attachment host
			// NQNs) the node connects with its own NQN.
			pc[PublishContextHostNQN] = s.d.claimHost(id, node, live)
		}
		if s.d.opts.ExportAuthOn() {
			if err := p.authenticate(ctx, pc, res, live); err != nil {
				s.pub.Reporter.PublishFailed("storage")
				return nil, err
			}
		}
	}
	s.pub.Reporter.Published(v.Ref(), node, decision)
	logger.Info("published", "reason", decision.Reason, "verdict", decision.Verdict.String(), "fenced", fenced, "migration", decision.MigrationStart, "gen", claim.Gen)
	return &csi.ControllerPublishVolumeResponse{PublishContext: pc}, nil
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
func (p *publishing) authenticate(ctx context.Context, pc map[string]string, res exportResult, c informers.Claim) error {
	id, node := p.req.GetVolumeId(), p.ident.Name
	switch {
	case res.secretUnreadable:
		return statusf(codes.Unavailable, "volume %s: its export on the RDS prints a secret in a form this driver cannot read, so node %s could not authenticate; run rdsctl selftest on this RDS (docs/routeros.md, \"The export password\")", id, node)
	case res.state.Host != "" && res.secret.IsZero() && c.Auth:
		return statusf(codes.Unavailable, "volume %s: its export on the RDS prints no secret (nvme-tcp-server-secret), but node %s's attachment was made with --export-auth=%s, so its password may be set and the node could not connect without it; give the controller's RouterOS user the sensitive policy (docs/deploy.md), or, if a controller replica without --export-auth opened it, move the volume (detach and attach again)", id, node, ExportAuthDHCHAP)
	case res.state.Host == "" || res.secret.IsZero():
		klog.FromContext(ctx).Info("published without authentication: the export has no password", "volume", id, "node", node, "export", res.state.String())
		return nil
	}
	sealed, err := sealSecret(p.s.d.opts.AttachmentKey, id, res.state.Host, *p.ident.Key, res.secret)
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
func onEveryPV(v *informers.Volume, node string, c informers.Claim) bool {
	if informers.Retired(v.Retiring, node, c) {
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
func newClaimTime(now time.Time, others informers.ClaimSet) time.Time {
	at := now.UTC().Truncate(time.Second)
	for _, c := range others.All() {
		if !at.After(c.At) {
			at = c.At.UTC().Add(time.Second)
		}
	}
	return at
}

// requireAttachment: a live, non-deleting VolumeAttachment of the volume
// on the node exists (read from the API server).
func (p *publishing) requireAttachment(ctx context.Context, v *informers.Volume) error {
	id, node := p.req.GetVolumeId(), p.ident.Name
	ok, err := p.s.pub.Claims.LiveAttachment(ctx, id, node, pvNamesOf(v))
	if err != nil {
		p.s.pub.Reporter.PublishFailed("unconfirmed")
		return statusf(codes.Unavailable, "volume %s: cannot confirm its VolumeAttachment on node %s with the API server (%v); retry", id, node, err)
	}
	if !ok {
		p.s.pub.Reporter.PublishFailed("no-attachment")
		return statusf(codes.Aborted, "volume %s: no live VolumeAttachment of it on node %s (it was detached or is being deleted, e.g. this request comes from an attacher that lost its lease); nothing was recorded", id, node)
	}
	return nil
}

// confirmCommitted re-reads the VolumeAttachment and the Node after a
// commit (both at once: each read is after the write, so their order does
// not matter); if either no longer stands, nothing is answered, and a
// claim this call created is withdrawn. A claim that was there before (a
// repeated publish of an attachment already answered) stays: its
// attachment's detach releases it, and until then that node may be
// writing.
func (p *publishing) confirmCommitted(ctx context.Context, v *informers.Volume, claim informers.Claim, created bool) error {
	s, id, node := p.s, p.req.GetVolumeId(), p.ident.Name
	var (
		attached bool
		vaErr    error
		read     = make(chan struct{})
	)
	go func() {
		defer close(read)
		attached, vaErr = s.pub.Claims.LiveAttachment(ctx, id, node, pvNamesOf(v))
	}()
	n, nodeErr := s.pub.Claims.LiveNode(ctx, node)
	<-read
	why := ""
	switch {
	case nodeErr != nil:
		// Unconfirmed: a claim this call created must not outlive it.
		why = "its Node could not be read back"
	case !n.Exists:
		why = "its Node was deleted"
	case n.UID != claim.NodeUID:
		why = "its Node was deleted and re-created"
	case vaErr != nil:
		why = "its VolumeAttachment could not be read back"
	case !attached:
		why = "its VolumeAttachment was detached or is being deleted"
	}
	if why == "" {
		return nil
	}
	if !created {
		s.pub.Reporter.PublishFailed("no-attachment")
		return statusf(codes.Aborted, "volume %s: the attachment to node %s no longer stands (%s); nothing was answered, and its detach releases the claim", id, node, why)
	}
	for _, pv := range v.PVs {
		if _, err := s.pub.Claims.Withdraw(ctx, pv.Name, node, claim); err != nil {
			return statusf(codes.Unavailable, "volume %s: the attachment to node %s no longer stands (%s) and taking its claim back on PV %s failed: %v; retry", id, node, why, pv.Name, err)
		}
	}
	s.pub.Reporter.PublishFailed("no-attachment")
	return statusf(codes.Aborted, "volume %s: the attachment to node %s no longer stands (%s); its claim was taken back and nothing was answered", id, node, why)
}

// ControllerUnpublishVolume releases node's claim on the volume and no
// other, and not while a live VolumeAttachment of that node that is not
// being deleted still stands on it: a late detach from a former
// attachment never disturbs the current one. Detaching what is not
// attached succeeds.
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
		// CSI: an empty node_id unpublishes from every node. The claims
		// are read live: a claim committed a moment ago that this index
		// has not seen yet is released too.
		seen := map[string]bool{}
		nodes = nodes[:0]
		for _, pv := range v.PVs {
			claims, retiring, err := s.pub.Claims.LiveState(ctx, pv.Name, id)
			if err != nil {
				s.pub.Reporter.UnpublishFailed("error")
				return nil, statusf(codes.Unavailable, "volume %s: reading the claims on PV %s to unpublish it from every node: %v; retry", id, pv.Name, err)
			}
			add := func(n string) {
				if !seen[n] {
					seen[n] = true
					nodes = append(nodes, n)
				}
			}
			for n := range claims {
				add(n)
			}
			if s.d.opts.AllowHostFencing() {
				// A node whose release a replica recorded and did not
				// finish (its export change after it) is finished too.
				for _, r := range retiring {
					add(r.Node)
				}
			}
		}
		sort.Strings(nodes)
	}
	holders := v.Holders()
	for _, n := range nodes {
		// The release reads each PV live, so a claim committed a moment
		// ago that this index has not seen yet is released too, and so
		// is the claim on a PV of the handle this index has not seen yet
		// (the claim names its PVs).
		released := false
		retiring := map[string][]informers.Retiring{} // by PV
		pvs := make([]string, 0, len(v.PVs))
		for _, pv := range v.PVs {
			pvs = append(pvs, pv.Name)
		}
		seen := map[string]bool{}
		// first: the attachment released on the first PV that had one;
		// the other PVs release that attachment only (another attachment
		// of the node there is a newer one, published since: its own
		// detach releases it, after its own cut).
		var first *informers.Retiring
		for i := 0; i < len(pvs) && len(seen) < maxHandlePVs; i++ {
			pvName := pvs[i]
			if seen[pvName] {
				continue
			}
			seen[pvName] = true
			ok, marked, err := s.pub.Claims.ReleaseUnpublished(ctx, pvName, id, n, s.unpublishBefore(id, pvName, n, first))
			if errors.Is(err, errOtherAttachment) {
				continue
			}
			if ok && first == nil {
				first = releasedOf(n, marked)
			}
			if err != nil {
				s.pub.Reporter.UnpublishFailed("error")
				return nil, fmt.Errorf("volume %s: releasing node %s's attachment on PV %s: %w", id, n, pvName, err)
			}
			released = released || ok
			if len(marked) > 0 {
				retiring[pvName] = marked
			}
			for _, r := range marked {
				pvs = append(pvs, r.PVs...)
			}
		}
		if s.d.opts.AllowHostFencing() {
			// The export follows the claims the release left, and, when
			// an attachment of the node is retiring (released now, or by
			// a replica that failed or stopped before this step: the
			// release recorded it on the PV), its state changes once
			// more, so that no open of the retired attachment that was
			// in flight can land. Once no claim of the node is left, a
			// failure does not fail the detach (the attacher's retry, on
			// a replica whose index lags, must not find the volume free
			// while the detach is still pending: model finding 3); the
			// record stays and the leader makes the change within
			// seconds (RetireMarked).
			if err := s.retireExport(ctx, id, v.PVName, retiring); err != nil {
				if len(retiring) == 0 {
					s.pub.Reporter.UnpublishFailed("storage")
					return nil, err
				}
				klog.FromContext(ctx).Error(err, "storage fencing: the export change after the release failed; the leader makes it", "volume", id, "node", n)
			}
		}
		// One line per answered unpublish (the e2e checker reads them):
		// released=false is no claim, or a live VolumeAttachment of the
		// node still standing on it (a late unpublish).
		klog.FromContext(ctx).Info("unpublished", "volume", id, "node", n, "pv", v.PVName, "released", released)
		if !holds(holders, n) {
			continue
		}
		migrationEnded := v.Block && len(holders) == 2 && v.Grants(corev1.ReadWriteMany)
		s.pub.Reporter.Unpublished(v.Ref(), n, migrationEnded)
	}
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}

// errOtherAttachment: an unpublish found, on another PV of the handle, a
// newer attachment of the node than the one it released.
var errOtherAttachment = errors.New("another attachment of the node")

// unpublishBefore is what an unpublish does with node's claim on pvName
// just before it releases it: once an attachment was released on another
// PV of the handle (first), only that attachment is released (another one
// is newer: errOtherAttachment); otherwise, with storage fencing, the
// attachment's host is shut out first: a failure keeps the claim (and the
// detach is retried), never a released claim with the host still let in.
// The claims are mirrored on every PV: one cut is enough.
func (s *ControllerServer) unpublishBefore(id, pvName, node string, first *informers.Retiring) func(context.Context, informers.Claim) error {
	return func(ctx context.Context, cl informers.Claim) error {
		if first != nil {
			if !first.Is(node, cl) {
				return errOtherAttachment
			}
			return nil
		}
		if !s.d.opts.AllowHostFencing() {
			return nil
		}
		return s.shutOut(ctx, id, pvName, node, cl)
	}
}

// releasedOf is the attachment of node a release just recorded (the last
// of node's records), or nil.
func releasedOf(node string, marked []informers.Retiring) *informers.Retiring {
	for i := len(marked) - 1; i >= 0; i-- {
		if marked[i].Node == node {
			return &marked[i]
		}
	}
	return nil
}

// shutOut cuts node's attachment off the export before its claim is
// released for an unpublish: the export is re-derived from the live
// claims without node's. Connections are dropped unless a live read shows
// the node Ready and not out of service: Kubernetes detaches from such a
// node only after its kubelet unstaged the volume (disconnected). From
// any other node (a force-detach after 6 minutes or on the out-of-service
// taint, a node that is gone) its host may still be connected, so a
// remaining holder's export is dropped and reopened, and it reconnects.
func (s *ControllerServer) shutOut(ctx context.Context, id, pvName, node string, cl informers.Claim) error {
	n, err := s.pub.Claims.LiveNode(ctx, node)
	if err != nil {
		return err
	}
	cut := !(n.Exists && n.Ready && !n.OutOfService)
	_, err = s.syncExport(ctx, id, exportGoal{pv: pvName, gone: []informers.Retiring{informers.RetiringOf(node, cl)}, retire: true, cut: cut})
	if err != nil && !errors.Is(err, rds.ErrNotFound) {
		return fmt.Errorf("storage fencing could not shut node %s's host out on the RDS: %w", node, err)
	}
	return nil
}

// retireExport brings the export in line with the live claims after an
// unpublish, never cutting, and with attachments retiring (their records,
// by PV) changes its state once more when it stays closed (a fresh
// tombstone), so that no open of a retired attachment in flight can land,
// and removes the records it may.
func (s *ControllerServer) retireExport(ctx context.Context, id, pvName string, retiring map[string][]informers.Retiring) error {
	var err error
	if len(retiring) > 0 {
		_, err = s.retire(ctx, id, pvName, retiring)
	} else if _, err = s.syncExport(ctx, id, exportGoal{pv: pvName}); errors.Is(err, rds.ErrNotFound) {
		err = nil
	}
	if err != nil {
		return statusf(codes.Unavailable, "volume %s: storage fencing could not bring its export in line with its claims on the RDS: %v; the detach is retried", id, err)
	}
	return nil
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

// pvNamesOf is the names of v's PersistentVolumes.
func pvNamesOf(v *informers.Volume) []string {
	if v == nil {
		return nil
	}
	names := make([]string, 0, len(v.PVs))
	for _, pv := range v.PVs {
		names = append(names, pv.Name)
	}
	return names
}

func holds(holders []fencing.Holder, node string) bool {
	for _, h := range holders {
		if h.Node == node {
			return true
		}
	}
	return false
}
