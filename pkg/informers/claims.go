package informers

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/srvlab/rds-csi/pkg/fencing"
)

// ClaimsAnnotation on a PersistentVolume records the nodes this driver has
// published the volume to, as a JSON map of node name to Claim:
//
//	{"node-a":{"at":"2026-11-22T10:00:00Z","uid":"5f0c…","cap":"mount/SINGLE_NODE_WRITER","gen":2}}
//
// Every change is a merge patch carrying the resourceVersion the change was
// computed from, which the API server enforces like a conditional update:
// two controller replicas deciding at once cannot both commit. A value that
// is a plain time (written by earlier versions) reads as a claim without
// UID.
const ClaimsAnnotation = "rds.csi.srvlab.io/claims"

// ErrConflict: the PV changed since the decision was made; the caller
// decides again on the fresh state, or answers ABORTED.
var ErrConflict = errors.New("the volume's claims changed concurrently")

// Claim is one node's committed hold on a volume.
type Claim struct {
	// At is when the node first claimed the volume (one-second resolution).
	At time.Time `json:"at"`
	// NodeUID is the UID of the Node object the volume was published to,
	// read live from the API server when the claim was made. A Node of the
	// same name with another UID is another incarnation: this claim is
	// stale. Empty for claims written before UIDs were recorded.
	NodeUID string `json:"uid,omitempty"`
	// Capability and ReadOnly are what the volume was published with; a
	// repeated publish asking for something else is ALREADY_EXISTS.
	Capability string `json:"cap,omitempty"`
	ReadOnly   bool   `json:"ro,omitempty"`
	// Gen counts the publishes answered on this claim. Every publish
	// success writes the claim (bumping Gen), so that no success is ever
	// answered on a claim that a concurrent release may be dropping.
	Gen int64 `json:"gen,omitempty"`
	// HostNQN is the NVMe host NQN the node registered (from its CSI node
	// ID) when storage fencing allowed it on the RDS; what a fence of this
	// claim must cut off there. Empty without storage fencing.
	HostNQN string `json:"nqn,omitempty"`
	// Nonce identifies the attachment (storage fencing): set when the
	// claim is made, kept by every repeated publish. The attachment's own
	// host NQN is derived from it with a key only the controller holds
	// (pkg/csi), so the annotation does not reveal it. Empty for claims
	// made before per-attachment host NQNs: those allow HostNQN.
	Nonce string `json:"n,omitempty"`
}

// UnmarshalJSON accepts a claim object or, as earlier versions wrote, a
// bare RFC 3339 time.
func (c *Claim) UnmarshalJSON(b []byte) error {
	var at time.Time
	if err := json.Unmarshal(b, &at); err == nil {
		*c = Claim{At: at}
		return nil
	}
	type plain Claim
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	if p.At.IsZero() {
		return fmt.Errorf("a claim without its time (\"at\"): %s", b)
	}
	*c = Claim(p)
	return nil
}

// decodeClaims reads the annotation. An unreadable annotation is an error:
// the caller must not treat a corrupted claim as no claim.
func decodeClaims(annotations map[string]string) (map[string]Claim, error) {
	return ParseClaims(annotations[ClaimsAnnotation])
}

// ParseClaims reads the value of the claims annotation (empty: no claims).
// The one decoder of claims, for the driver and for the tools and tests
// that inspect what it committed.
func ParseClaims(raw string) (map[string]Claim, error) {
	if raw == "" {
		return nil, nil
	}
	var m map[string]Claim
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", ClaimsAnnotation, err)
	}
	return m, nil
}

// DecodeClaims reads the claims annotation of a PersistentVolume.
func DecodeClaims(pv *corev1.PersistentVolume) (map[string]Claim, error) {
	return decodeClaims(pv.Annotations)
}

// VolumeAttachmentName is the name Kubernetes gives the VolumeAttachment of
// a CSI volume handle on a node (the attach/detach controller and the
// kubelet derive it the same way), so whether one exists is one GET.
func VolumeAttachmentName(handle, driver, node string) string {
	return fmt.Sprintf("csi-%x", sha256.Sum256([]byte(handle+driver+node)))
}

// Claims commits and releases claims on PersistentVolumes, and makes the
// live reads that back the decisions to release one.
type Claims struct {
	client kubernetes.Interface
	driver string
	// fence, when set, cuts a fenced node off the storage before its
	// stale claim is released (its error keeps the claim, and the fence
	// is retried) and settles the storage after the release.
	fence StorageFence
}

// StorageFence is storage fencing as a fence release needs it.
type StorageFence interface {
	// CutOff cuts node's attachment of handle off the storage, as if its
	// claim on pvName were already gone; run before the release.
	CutOff(ctx context.Context, pvName, handle, node string) error
	// Settle brings the storage in line with the live claims after the
	// release, with the released claim (node, of the node incarnation
	// uid) treated as gone on every PV: another PV of the handle may
	// still show it until its own release.
	Settle(ctx context.Context, pvName, handle, node, uid string) error
}

// CutStorageOnFence makes every fence release cut the storage first and
// settle it after.
func (c *Claims) CutStorageOnFence(f StorageFence) { c.fence = f }

// NewClaims returns a Claims writing through client for the CSI driver
// named driver.
func NewClaims(client kubernetes.Interface, driver string) *Claims {
	return &Claims{client: client, driver: driver}
}

// Commit writes node's claim set to claim, minus the fenced nodes'
// claims, to every PersistentVolume of v's handle, each PV's own claims as
// the decision saw them (PVRef.Claims) and each write conditional on the
// resourceVersion the decision read (one API call per PV, usually one). A
// concurrent change of any of them is ErrConflict; replicas that know
// different subsets of a handle's PVs still meet on a PV they share and
// cannot both commit. A PV is never given a claim only another PV shows:
// when one PV's view is current and another's stale, the first write
// succeeds before the second conflicts, and copying the stale PV's claims
// would bring back a claim an answered unpublish had released.
func (c *Claims) Commit(ctx context.Context, v *Volume, node string, claim Claim, fenced []string) error {
	if len(v.PVs) == 0 {
		return fmt.Errorf("volume %s has no PersistentVolume to record the claim on", v.Handle)
	}
	for _, pv := range v.PVs {
		own := pv.Claims
		if own == nil && len(v.PVs) == 1 {
			own = v.Claims
		}
		next := make(map[string]Claim, len(own)+1)
		for n, cl := range own {
			next[n] = cl
		}
		for _, n := range fenced {
			delete(next, n)
		}
		next[node] = claim
		if err := c.patch(ctx, pv.Name, pv.ResourceVersion, next); err != nil {
			return err
		}
	}
	return nil
}

// ReleaseUnpublished drops node's claim on pvName for an unpublish, unless
// a live VolumeAttachment of handle on node that is not being deleted
// still stands on it: then the unpublish is a late one from an earlier
// attachment, and the claim belongs to the current one. Reads the PV, then
// the VolumeAttachment, then writes conditional on the PV read, so a
// publish that lands in between makes the write conflict and the check
// run again. before, when not nil, runs once the claim is to go and before
// it goes (storage fencing: shut the node's host out); its error keeps the
// claim. Reports whether a claim was dropped.
func (c *Claims) ReleaseUnpublished(ctx context.Context, pvName, handle, node string, before func(context.Context) error) (released bool, err error) {
	return c.releaseIf(ctx, pvName, node, func(ctx context.Context, _ *corev1.PersistentVolume, cl Claim, remaining map[string]Claim) (bool, error) {
		va, err := c.client.StorageV1().VolumeAttachments().Get(ctx, VolumeAttachmentName(handle, c.driver, node), metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return false, fmt.Errorf("reading the VolumeAttachment of node %s: %w", node, err)
		case va.DeletionTimestamp == nil:
			return false, nil
		}
		if before != nil {
			if err := before(ctx); err != nil {
				return false, err
			}
		}
		return true, nil
	})
}

// ReleaseIfStale drops node's claim on pvName if a live read of the Node,
// made after the PV was read, shows the claimed incarnation stale under
// policy (deleted, re-created, out of service, NotReady past the
// threshold). A node that recovered, or re-published meanwhile, keeps its
// claim. Reports whether a claim was dropped and why.
func (c *Claims) ReleaseIfStale(ctx context.Context, pvName, node string, policy fencing.Config, now func() time.Time) (bool, fencing.FenceReason, error) {
	var reason fencing.FenceReason
	var handle, fencedUID string
	released, err := c.releaseIf(ctx, pvName, node, func(ctx context.Context, pv *corev1.PersistentVolume, cl Claim, remaining map[string]Claim) (bool, error) {
		n, err := c.LiveNode(ctx, node)
		if err != nil {
			return false, err
		}
		r, stale := fencing.HolderStale(fencing.Holder{Node: node, UID: cl.NodeUID}, n, now(), policy)
		reason = r
		if !stale || c.fence == nil {
			return stale, nil
		}
		if pv.Spec.CSI == nil {
			return false, fmt.Errorf("PV %s has no CSI volume handle", pv.Name)
		}
		handle, fencedUID = pv.Spec.CSI.VolumeHandle, cl.NodeUID
		if err := c.fence.CutOff(ctx, pvName, handle, node); err != nil {
			return false, fmt.Errorf("cutting node %s off volume %s on the storage: %w", node, handle, err)
		}
		return true, nil
	})
	if err == nil && released && c.fence != nil {
		// Once more after the release: an open of the fenced attachment
		// that was in flight cannot land after this.
		if err := c.fence.Settle(ctx, pvName, handle, node, fencedUID); err != nil {
			return released, reason, fmt.Errorf("settling volume %s on the storage after releasing node %s's claim: %w", handle, node, err)
		}
	}
	return released, reason, err
}

// LiveClaims reads a PV's claims from the API server (not a cache); a PV
// that does not exist has none.
func (c *Claims) LiveClaims(ctx context.Context, pvName string) (map[string]Claim, error) {
	pv, err := c.client.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading PV %s: %w", pvName, err)
	}
	return DecodeClaims(pv)
}

// LiveNode reads a node's state from the API server (not a cache); a node
// that does not exist is NodeState{}.
func (c *Claims) LiveNode(ctx context.Context, name string) (fencing.NodeState, error) {
	n, err := c.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fencing.NodeState{}, nil
	}
	if err != nil {
		return fencing.NodeState{}, fmt.Errorf("reading node %s: %w", name, err)
	}
	return nodeState(n), nil
}

// releaseIf drops node's claim on pvName when drop, called after every
// read of the PV, says so; the write is conditional on that read.
func (c *Claims) releaseIf(ctx context.Context, pvName, node string, drop func(ctx context.Context, pv *corev1.PersistentVolume, cl Claim, remaining map[string]Claim) (bool, error)) (bool, error) {
	released := false
	err := retryConflicts(ctx, func() error {
		released = false
		pv, err := c.client.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		claims, err := decodeClaims(pv.Annotations)
		if err != nil {
			return fmt.Errorf("PV %s: %w", pvName, err)
		}
		cl, ok := claims[node]
		if !ok {
			return nil
		}
		remaining := make(map[string]Claim, len(claims))
		for n, other := range claims {
			if n != node {
				remaining[n] = other
			}
		}
		if ok, err := drop(ctx, pv, cl, remaining); err != nil || !ok {
			return err
		}
		claims = remaining
		err = c.patch(ctx, pvName, pv.ResourceVersion, claims)
		if errors.Is(err, ErrConflict) {
			return apierrors.NewConflict(corev1.Resource("persistentvolumes"), pvName, err)
		}
		released = err == nil
		return err
	})
	return released, err
}

func (c *Claims) patch(ctx context.Context, pvName, resourceVersion string, claims map[string]Claim) error {
	var value any // JSON null deletes the annotation
	if len(claims) > 0 {
		b, err := json.Marshal(claims)
		if err != nil {
			return err
		}
		value = string(b)
	}
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"resourceVersion": resourceVersion,
		"annotations":     map[string]any{ClaimsAnnotation: value},
	}})
	if err != nil {
		return err
	}
	_, err = c.client.CoreV1().PersistentVolumes().Patch(ctx, pvName, types.MergePatchType, body, metav1.PatchOptions{})
	switch {
	case apierrors.IsConflict(err):
		return fmt.Errorf("%w: PV %s changed after resourceVersion %s", ErrConflict, pvName, resourceVersion)
	case apierrors.IsNotFound(err):
		// The handle's set of PVs changed since the decision.
		return fmt.Errorf("%w: PV %s was deleted", ErrConflict, pvName)
	}
	return err
}

// LiveAttachment reads from the API server whether a VolumeAttachment of
// handle on node exists and is not being deleted: what a claim must stand
// on (a publish from a replica that woke up after the attachment was
// detached must not leave a claim behind).
func (c *Claims) LiveAttachment(ctx context.Context, handle, node string) (bool, error) {
	va, err := c.client.StorageV1().VolumeAttachments().Get(ctx, VolumeAttachmentName(handle, c.driver, node), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("reading the VolumeAttachment of volume %s on node %s: %w", handle, node, err)
	}
	return va.DeletionTimestamp == nil, nil
}

// Withdraw drops node's claim on pvName if it is still the very claim a
// publish committed (same attachment nonce and publish count): that
// publish found, after committing, that it must not stand (its
// VolumeAttachment or Node is gone) and takes it back. A newer claim is
// left alone.
func (c *Claims) Withdraw(ctx context.Context, pvName, node string, committed Claim) (bool, error) {
	return c.releaseIf(ctx, pvName, node, func(_ context.Context, _ *corev1.PersistentVolume, cl Claim, _ map[string]Claim) (bool, error) {
		return cl.Nonce == committed.Nonce && cl.Gen == committed.Gen && cl.NodeUID == committed.NodeUID, nil
	})
}
