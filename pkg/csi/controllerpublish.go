package csi

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
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
	// ReleaseUnpublished drops node's claim on a PV unless a live,
	// non-deleting VolumeAttachment of the handle on node stands on it.
	// before (may be nil) runs just before the claim goes.
	ReleaseUnpublished(ctx context.Context, pvName, handle, node string, before informers.StorageCut) (bool, error)
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
	Clock    clock.PassiveClock
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
	case s.d.opts.AllowHostFencing() && ident.HostNQN == "":
		return nil, statusf(codes.FailedPrecondition, "volume %s: node %s registered no NVMe host NQN (its node ID is %q), and storage fencing (--storage-fencing=allow-host) opens an export only to a host NQN: run a node plugin of this version with the NVMe/TCP connector", id, node, req.GetNodeId())
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
	// The volume first (a missing volume is NOT_FOUND whatever the node),
	// then the node. A volume with a PV in the index exists; only one
	// without is looked up on the RDS, so the usual publish makes no SSH
	// round trip.
	v := s.pub.Index.Volume(id)
	if !v.Indexed() {
		if _, err := s.getVolume(ctx, id); err != nil {
			return nil, err
		}
	}
	// The requester is read live: its UID goes into the claim (a claim of
	// another incarnation of the node is stale), and a node the cache has
	// not seen yet is not refused as missing.
	self, err := s.liveNode(ctx, id, node)
	if err != nil {
		return nil, err
	}
	if !self.Exists {
		return nil, statusf(codes.NotFound, "volume %s: node %s does not exist in the API server", id, node)
	}
	if !v.Indexed() {
		// Kubernetes creates the PV before any VolumeAttachment; this
		// replica's informer has not seen it yet.
		return nil, statusf(codes.Aborted, "volume %s: its PersistentVolume is not in the attachment index yet; the request is retried", id)
	}
	mode := accessMode(req.GetVolumeCapability())
	if err := modeAllowed(v, mode); err != nil {
		return nil, statusf(codes.InvalidArgument, "volume %s on node %s: %v", id, node, err)
	}
	p := &publishing{s: s, req: req, ident: ident, mode: mode, self: self, live: map[string]fencing.NodeState{node: self}}
	for attempt := 1; ; attempt++ {
		resp, err := p.decideAndCommit(ctx, v)
		if !errors.Is(err, informers.ErrConflict) {
			return resp, err
		}
		if attempt == publishAttempts {
			s.pub.Reporter.PublishFailed("conflict")
			return nil, statusf(codes.Aborted, "volume %s: its attachment state kept changing while deciding (another controller replica or a concurrent detach); the request is retried against the new state", id)
		}
		catchUp, cancel := context.WithTimeout(ctx, s.pub.CatchUp)
		seen := v.Version()
		v = s.pub.Index.WaitForChange(catchUp, id, seen)
		cancel()
		switch {
		case !v.Indexed():
			return nil, statusf(codes.Aborted, "volume %s: its PersistentVolume left the attachment index while publishing; the request is retried", id)
		case v.Version() == seen:
			// This replica's PV watch is behind; deciding again on the
			// same state would conflict again.
			s.pub.Reporter.PublishFailed("conflict")
			return nil, statusf(codes.Aborted, "volume %s: this controller replica's view of the volume is behind the API server (its PV changed); the request is retried", id)
		}
	}
}

// publishing is one ControllerPublishVolume call's state across attempts.
type publishing struct {
	s     *ControllerServer
	req   *csi.ControllerPublishVolumeRequest
	ident NodeIdentity
	mode  fencing.AccessMode
	self  fencing.NodeState
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
	claim, claimed := v.Claims[node]
	if claimed && claim.NodeUID == p.self.UID && claim.Capability != "" && (claim.Capability != capability || claim.ReadOnly != req.GetReadonly()) {
		return nil, statusf(codes.AlreadyExists, "volume %s is already published to node %s as %s (read-only %t); this request asks for %s (read-only %t): unpublish it first",
			id, node, claim.Capability, claim.ReadOnly, capability, req.GetReadonly())
	}
	if !claimed || claim.NodeUID != p.self.UID {
		// A first claim, or one of an earlier incarnation of this node.
		claim = informers.Claim{At: now.UTC().Truncate(time.Second)}
	}
	claim.NodeUID, claim.Capability, claim.ReadOnly = p.self.UID, capability, req.GetReadonly()
	if s.d.opts.AllowHostFencing() {
		claim.HostNQN = p.ident.HostNQN
	}
	// Every success is a write, a repeated publish too: a concurrent
	// release (a late unpublish on another replica) then conflicts with it
	// instead of dropping a claim this call is about to answer on.
	claim.Gen++
	var fenced []string
	for _, f := range decision.Fence {
		fenced = append(fenced, f.Node)
	}
	// Storage fencing: the RDS lets the node in (and everyone else out)
	// before the node is told it may write. A fenced node's claim goes only
	// once its host is cut off, so then the export moves first (a failure
	// leaves the claim, and the fence to retry); otherwise the claim is
	// committed first, so a publish that loses the race for the claim never
	// moves the export away from the winner. On a failure after the commit
	// the claim stays, as for any publish that fails after recording it:
	// the attacher retries, or its detach releases it.
	export, err := p.plannedExport(v, claim, fenced)
	if err != nil {
		return nil, err
	}
	if export != nil && len(fenced) > 0 {
		if err := export(ctx); err != nil {
			return nil, err
		}
	}
	if err := s.pub.Claims.Commit(ctx, v, node, claim, fenced); err != nil {
		if errors.Is(err, informers.ErrConflict) {
			return nil, err
		}
		s.pub.Reporter.PublishFailed("error")
		return nil, fmt.Errorf("volume %s: recording the attachment to node %s on PV %s: %w", id, node, v.PVName, err)
	}
	if export != nil && len(fenced) == 0 {
		if err := export(ctx); err != nil {
			return nil, err
		}
	}
	s.pub.Reporter.Published(v.Ref(), node, decision)
	logger.Info("published", "reason", decision.Reason, "verdict", decision.Verdict.String(), "fenced", fenced, "migration", decision.MigrationStart, "gen", claim.Gen)
	return &csi.ControllerPublishVolumeResponse{PublishContext: s.publishContext(id)}, nil
}

// plannedExport is, with storage fencing, the export change this publish
// makes (nil without storage fencing). With one holder the export moves to
// it, dropping every other connection. With two (a live migration) it
// moves to the target without dropping the source's connection; a publish
// that would also fence a third node is ABORTED until the fence reaction
// has cut that node off (a drop now would cut off the source too).
func (p *publishing) plannedExport(v *informers.Volume, claim informers.Claim, fenced []string) (func(context.Context) error, error) {
	s, id, node := p.s, p.req.GetVolumeId(), p.ident.Name
	if !s.d.opts.AllowHostFencing() {
		return nil, nil
	}
	committed := map[string]informers.Claim{node: claim}
	for n, cl := range v.Claims {
		if n != node && !slices.Contains(fenced, n) {
			committed[n] = cl
		}
	}
	single := len(committed) == 1
	if !single && len(fenced) > 0 {
		s.pub.Reporter.PublishFailed("storage")
		return nil, statusf(codes.Aborted, "volume %s: node(s) %v must be cut off the RDS before %s joins %d other holder(s); the fence is under way and the request is retried", id, fenced, node, len(committed)-1)
	}
	mv := exportMove{newest: node, drop: single, cut: len(fenced) > 0}
	return func(ctx context.Context) error {
		if err := s.fenceExport(ctx, id, committed, mv); err != nil {
			s.pub.Reporter.PublishFailed("storage")
			return storageError(id, node, err)
		}
		return nil
	}, nil
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
		// CSI: an empty node_id unpublishes from every node.
		nodes = nodes[:0]
		for n := range v.Claims {
			nodes = append(nodes, n)
		}
		sort.Strings(nodes)
	}
	holders := v.Holders()
	var before informers.StorageCut
	if s.d.opts.AllowHostFencing() {
		// The node's host is shut out before its claim goes: a failure
		// keeps the claim (and the request is retried), never a released
		// claim with the host still let in.
		before = s.shutOutDeparting
	}
	for _, n := range nodes {
		// The release reads the PV live, so a claim committed a moment ago
		// that this index has not seen yet is released too.
		released := false
		for _, pv := range v.PVs {
			// The claims are mirrored on every PV of the handle: once the
			// host is shut out for one, the others' releases need not do
			// it again (another drop of the remaining holder).
			shutOut := before
			if released {
				shutOut = nil
			}
			ok, err := s.pub.Claims.ReleaseUnpublished(ctx, pv.Name, id, n, shutOut)
			if err != nil {
				s.pub.Reporter.UnpublishFailed("error")
				return nil, fmt.Errorf("volume %s: releasing node %s's attachment on PV %s: %w", id, n, pv.Name, err)
			}
			released = released || ok
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

// shutOutDeparting brings the export in line with the claims an
// unpublish leaves (informers.StorageCut, run before the claim goes):
// closed when none is left; with one, moved to that holder. Connections
// are dropped unless a live read shows the departing node Ready and not
// out of service: Kubernetes detaches from such a node only after its
// kubelet unstaged the volume (disconnected). From any other node (a
// force-detach after 6 minutes or on the out-of-service taint, a node
// that is gone) the departing host may still be connected, so the export
// is turned off and on again and the remaining holder reconnects. With
// two others left (a migration, whose export is its target's) nothing
// changes.
func (s *ControllerServer) shutOutDeparting(ctx context.Context, handle, node string, departing informers.Claim, remaining map[string]informers.Claim) error {
	if len(remaining) > 1 {
		return nil
	}
	cut := true
	if len(remaining) > 0 {
		n, err := s.pub.Claims.LiveNode(ctx, node)
		if err != nil {
			return err
		}
		cut = !(n.Exists && n.Ready && !n.OutOfService)
	}
	err := s.fenceExport(ctx, handle, remaining, exportMove{departing: departing.HostNQN, drop: cut, cut: cut})
	if errors.Is(err, rds.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("storage fencing could not shut node %s's host out on the RDS: %w", node, err)
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

func holds(holders []fencing.Holder, node string) bool {
	for _, h := range holders {
		if h.Node == node {
			return true
		}
	}
	return false
}
