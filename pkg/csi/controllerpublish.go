package csi

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/informers"
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
	// WaitForChange waits until the index has seen a write to the
	// volume's PV after resourceVersion, or ctx is done.
	WaitForChange(ctx context.Context, handle, resourceVersion string) *informers.Volume
}

// A publish whose conditional write conflicts waits for the index to see
// the write that beat it and decides again, this many times in all; a
// repeated publish right after the first (the index not yet updated) then
// succeeds instead of answering ABORTED.
const (
	publishAttempts     = 3
	publishCatchUpLimit = 5 * time.Second
)

// ClaimStore commits and releases the claims that make a publish decision
// stick across controller replicas (pkg/informers.Claims).
type ClaimStore interface {
	// Commit adds node's claim (dropping the fenced nodes' claims),
	// conditional on the claims the decision saw; informers.ErrConflict
	// when they changed.
	Commit(ctx context.Context, v *informers.Volume, node string, fenced []string, now time.Time) error
	// Release drops the nodes' claims and leaves all others alone.
	Release(ctx context.Context, pvName string, nodes ...string) error
}

// Publisher holds what ControllerPublish/Unpublish need.
type Publisher struct {
	Index    AttachmentIndex
	Claims   ClaimStore
	Synced   func() bool // every informer synced: the index is complete
	Policy   fencing.Config
	Reporter *fencing.Reporter // may be nil
	Clock    clock.PassiveClock
}

// ServePublish enables ControllerPublish/Unpublish (and advertises
// PUBLISH_UNPUBLISH_VOLUME) with p. Call before serving.
func (s *ControllerServer) ServePublish(p *Publisher) *ControllerServer {
	if p.Clock == nil {
		p.Clock = clock.RealClock{}
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

// ControllerPublishVolume decides from the attachment index whether node
// may have the volume (pkg/fencing.Decide), commits the decision as a
// conditional update of the PV's claims, and only then answers success.
func (s *ControllerServer) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	id, node := req.GetVolumeId(), req.GetNodeId()
	switch {
	case s.pub == nil:
		return nil, statusf(codes.Unimplemented, "ControllerPublishVolume is not served: this controller runs without the attachment index (no Kubernetes API access)")
	case id == "":
		return nil, statusf(codes.InvalidArgument, "ControllerPublishVolume: volume_id is required")
	case node == "":
		return nil, statusf(codes.InvalidArgument, "ControllerPublishVolume: volume %s: node_id is required", id)
	case req.GetVolumeCapability() == nil:
		return nil, statusf(codes.InvalidArgument, "ControllerPublishVolume: volume %s: volume_capability is required", id)
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
	indexed := v != nil && v.PVName != ""
	if !indexed {
		if _, err := s.getVolume(ctx, id); err != nil {
			return nil, err
		}
	}
	if !s.pub.Index.Node(node).Exists {
		return nil, statusf(codes.NotFound, "volume %s: node %s does not exist in the API server", id, node)
	}
	if !indexed {
		// Kubernetes creates the PV before any VolumeAttachment; this
		// replica's informer has not seen it yet.
		return nil, statusf(codes.Aborted, "volume %s: its PersistentVolume is not in the attachment index yet; the request is retried", id)
	}
	mode := accessMode(req.GetVolumeCapability())
	if err := modeAllowed(v, mode); err != nil {
		return nil, statusf(codes.InvalidArgument, "volume %s on node %s: %v", id, node, err)
	}
	for attempt := 1; ; attempt++ {
		resp, err := s.decideAndCommit(ctx, req, v, mode)
		if !errors.Is(err, informers.ErrConflict) {
			return resp, err
		}
		if attempt == publishAttempts {
			s.pub.Reporter.PublishFailed("conflict")
			return nil, statusf(codes.Aborted, "volume %s: its attachment state kept changing while deciding (another controller replica or a concurrent detach); the request is retried against the new state", id)
		}
		catchUp, cancel := context.WithTimeout(ctx, publishCatchUpLimit)
		v = s.pub.Index.WaitForChange(catchUp, id, v.ResourceVersion)
		cancel()
		if v == nil || v.PVName == "" {
			return nil, statusf(codes.Aborted, "volume %s: its PersistentVolume left the attachment index while publishing; the request is retried", id)
		}
	}
}

// decideAndCommit makes the publish decision on v and commits it. It
// returns informers.ErrConflict (not yet a status) when the PV changed
// after v was read.
func (s *ControllerServer) decideAndCommit(ctx context.Context, req *csi.ControllerPublishVolumeRequest, v *informers.Volume, mode fencing.AccessMode) (*csi.ControllerPublishVolumeResponse, error) {
	id, node := req.GetVolumeId(), req.GetNodeId()
	now := s.pub.Clock.Now()
	decision := fencing.Decide(fencing.Request{
		VolumeID: id, Node: node, Mode: mode, ReadOnly: req.GetReadonly(),
	}, v.Holders(), s.pub.Index.Node, now, s.pub.Policy)
	s.pub.Reporter.Decided(s.pub.Clock.Since(now))
	logger := klog.FromContext(ctx).WithValues("volume", id, "node", node, "pv", v.PVName)

	switch decision.Verdict {
	case fencing.Refuse:
		s.pub.Reporter.Refused(v.Ref(), node, decision)
		logger.Info("publish refused", "blocking", decision.Blocking, "reason", decision.Reason)
		return nil, statusf(codes.FailedPrecondition, "%s", decision.Reason)
	case fencing.AlreadyPublished:
		if v.HasClaim(node) {
			s.pub.Reporter.Published(v.Ref(), node, decision)
			return &csi.ControllerPublishVolumeResponse{PublishContext: s.publishContext(id)}, nil
		}
		// Attached (a VolumeAttachment exists) but never claimed, e.g.
		// attached before this driver kept claims: claim it now, so the
		// decision is on record for every replica.
	}
	var fenced []string
	for _, f := range decision.Fence {
		fenced = append(fenced, f.Node)
	}
	if err := s.pub.Claims.Commit(ctx, v, node, fenced, now); err != nil {
		if errors.Is(err, informers.ErrConflict) {
			return nil, err
		}
		s.pub.Reporter.PublishFailed("error")
		return nil, fmt.Errorf("volume %s: recording the attachment to node %s on PV %s: %w", id, node, v.PVName, err)
	}
	s.pub.Reporter.Published(v.Ref(), node, decision)
	logger.Info("published", "reason", decision.Reason, "fenced", fenced, "handoffs", decision.Handoffs, "migration", decision.MigrationStart)
	return &csi.ControllerPublishVolumeResponse{PublishContext: s.publishContext(id)}, nil
}

// ControllerUnpublishVolume releases node's claim on the volume and no
// other: a late detach from a former holder never disturbs the current
// one. Detaching what is not attached succeeds.
func (s *ControllerServer) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	id, node := req.GetVolumeId(), req.GetNodeId()
	switch {
	case s.pub == nil:
		return nil, statusf(codes.Unimplemented, "ControllerUnpublishVolume is not served: this controller runs without the attachment index (no Kubernetes API access)")
	case id == "":
		return nil, statusf(codes.InvalidArgument, "ControllerUnpublishVolume: volume_id is required")
	}
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
	if v == nil || v.PVName == "" {
		return &csi.ControllerUnpublishVolumeResponse{}, nil
	}
	nodes := []string{node}
	if node == "" {
		// CSI: an empty node_id unpublishes from every node.
		nodes = nodes[:0]
		for n := range v.Claims {
			nodes = append(nodes, n)
		}
	}
	holders := v.Holders()
	for _, n := range nodes {
		// Release re-reads the PV, so a claim committed a moment ago that
		// this index has not seen yet is released too.
		if err := s.pub.Claims.Release(ctx, v.PVName, n); err != nil {
			s.pub.Reporter.UnpublishFailed("error")
			return nil, fmt.Errorf("volume %s: releasing node %s's attachment on PV %s: %w", id, n, v.PVName, err)
		}
		if !holds(holders, n) {
			continue
		}
		migrationEnded := v.Block && len(holders) == 2 && v.Grants(corev1.ReadWriteMany)
		s.pub.Reporter.Unpublished(v.Ref(), n, migrationEnded)
		klog.FromContext(ctx).Info("unpublished", "volume", id, "node", n, "pv", v.PVName)
	}
	return &csi.ControllerUnpublishVolumeResponse{}, nil
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
