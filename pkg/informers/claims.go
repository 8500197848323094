package informers

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
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

// RetiringAnnotation on a PersistentVolume (storage fencing) lists the
// attachments whose claims were released there and whose export has not
// been known to change since, as a JSON list of Retiring:
//
//	[{"node":"node-a","uid":"5f0c…","n":"…","at":"2026-11-22T10:00:00Z"}]
//
// An entry is written in the same merge patch as the release, so a
// replica that stops between the release and the export change after it
// (which makes any open of the retired attachment still in flight on the
// RDS fail or be undone) leaves it behind. The leader makes that change
// and then removes the entry (pkg/csi RetireMarked); an unpublish that
// finds its node's entry (a retry after the replica that released the
// claim died) makes it before it answers.
const RetiringAnnotation = "rds.csi.srvlab.io/retiring"

// Retiring names one released attachment (RetiringAnnotation).
type Retiring struct {
	Node    string `json:"node"`
	NodeUID string `json:"uid,omitempty"`
	Nonce   string `json:"n,omitempty"`
	// At is the released claim's time: with NodeUID it names a claim
	// made before per-attachment nonces.
	At time.Time `json:"at"`
	// PVs: the claim's PVs (Claim.PVs), where it may still be shown.
	PVs []string `json:"pvs,omitempty"`
}

// RetiringOf names node's claim c once it is released.
func RetiringOf(node string, c Claim) Retiring {
	return Retiring{Node: node, NodeUID: c.NodeUID, Nonce: c.Nonce, At: c.At, PVs: c.PVs}
}

// Retired reports whether node's claim c is one of the retired
// attachments rs.
func Retired(rs []Retiring, node string, c Claim) bool {
	for _, r := range rs {
		if r.Is(node, c) {
			return true
		}
	}
	return false
}

// Is reports whether node's claim c is the released attachment r (a claim
// another PV of the handle still shows until its own release). A new
// attachment of the same node (a new nonce) is not.
func (r Retiring) Is(node string, c Claim) bool {
	if r.Node != node {
		return false
	}
	if r.Nonce != "" || c.Nonce != "" {
		return r.Nonce == c.Nonce
	}
	return r.NodeUID == c.NodeUID && r.At.Equal(c.At)
}

func (r Retiring) same(o Retiring) bool {
	return r.Node == o.Node && r.NodeUID == o.NodeUID && r.Nonce == o.Nonce && r.At.Equal(o.At)
}

// In reports whether rs names the same attachment as r.
func (r Retiring) In(rs []Retiring) bool {
	return slices.ContainsFunc(rs, r.same)
}

// ParseRetiring reads the value of RetiringAnnotation (empty: none).
func ParseRetiring(raw string) ([]Retiring, error) {
	if raw == "" {
		return nil, nil
	}
	var out []Retiring
	if err := json.Unmarshal([]byte(raw), &out); err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrUnreadable, RetiringAnnotation, err)
	}
	return out, nil
}

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
	// Auth: the attachment was made with authenticated exports on
	// (pkg/csi, --export-auth): its export gets a password, so a publish
	// of it answers the secret or fails, never success without one.
	// False for attachments made before the mode was on, which keep
	// working unauthenticated until they move.
	Auth bool `json:"auth,omitempty"`
	// PVs: every PersistentVolume of the handle the claim was committed
	// to, when there are several (a Retained volume's PV re-created): a
	// release on a replica whose index has not seen one of them yet
	// releases it there too. Empty with one PV.
	PVs []string `json:"pvs,omitempty"`
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
		return fmt.Errorf("a claim is an RFC 3339 time or an object with its time (\"at\"), not %s", b)
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
		return nil, fmt.Errorf("%w %s: %w", ErrUnreadable, ClaimsAnnotation, err)
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
	// is retried) and settles the storage after the release; and every
	// release records the attachment in RetiringAnnotation.
	fence StorageFence
	// live, when set, times live reads of nodes (TimeWith).
	live *Liveness
	// written: what this replica's own writes left on each PV (Fresher).
	written writes
}

// writes remembers, per PV, the state the API server answered this
// replica's last claim write with, so that the next decision on that PV
// need not wait for the PV watch to deliver the replica's own write (a
// repeated publish right after the first would otherwise conflict with
// it: an extra round trip and a wait, 36-40 % of repeats in the e2e
// benchmark). It only ever stands for states the API server answered.
type writes struct {
	mu   sync.Mutex
	byPV map[string]pvWrite
}

// pvWrite is a PV as a chain of this replica's writes left it: each write
// was conditional on the resourceVersion the previous one produced, so no
// other writer came between them, and an index at any resourceVersion of
// the chain (over) is behind only by these writes.
type pvWrite struct {
	handle   string // the PV's volume handle (a name may be reused)
	rv       string
	over     []string // the resourceVersions the chain replaced, oldest first
	claims   ClaimSet
	retiring []Retiring
}

// maxWrites bounds the PVs remembered (an entry goes as soon as the index
// catches up; this bounds the ones never decided on again).
const maxWrites = 1024

// maxChain bounds the writes of one chain remembered.
const maxChain = 8

// record notes that a write conditional on base left pv at its
// resourceVersion; a response it cannot read forgets the PV.
func (w *writes) record(base string, pv *corev1.PersistentVolume) {
	w.mu.Lock()
	defer w.mu.Unlock()
	claims, err := DecodeClaims(pv)
	retiring, rerr := ParseRetiring(pv.Annotations[RetiringAnnotation])
	if err != nil || rerr != nil || base == "" || pv.ResourceVersion == "" {
		delete(w.byPV, pv.Name)
		return
	}
	over := []string{base}
	if prev, ok := w.byPV[pv.Name]; ok && prev.rv == base {
		over = append(prev.over[max(0, len(prev.over)-maxChain+1):len(prev.over):len(prev.over)], base)
	}
	if w.byPV == nil {
		w.byPV = map[string]pvWrite{}
	}
	if prev, ok := w.byPV[pv.Name]; ok && prev.rv != base && slices.Contains(prev.over, pv.ResourceVersion) {
		return // a later write of the chain was recorded first
	}
	if _, ok := w.byPV[pv.Name]; !ok && len(w.byPV) >= maxWrites {
		for name := range w.byPV {
			delete(w.byPV, name)
			break
		}
	}
	handle := ""
	if pv.Spec.CSI != nil {
		handle = pv.Spec.CSI.VolumeHandle
	}
	w.byPV[pv.Name] = pvWrite{handle: handle, rv: pv.ResourceVersion, over: over, claims: NewClaimSet(claims), retiring: retiring}
}

// forget drops what is remembered of pvName (a write on it conflicted:
// someone else wrote).
func (w *writes) forget(pvName string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.byPV, pvName)
}

// newer returns what this replica's writes left on pvName when the index,
// at resourceVersion seen, is behind only by them; otherwise nothing (and
// an entry the index has caught up with, or that is of no use any more,
// is dropped).
func (w *writes) newer(pvName, handle, seen string) (pvWrite, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e, ok := w.byPV[pvName]
	if !ok {
		return pvWrite{}, false
	}
	if e.handle == handle && slices.Contains(e.over, seen) {
		return e, true
	}
	delete(w.byPV, pvName)
	return pvWrite{}, false
}

// Fresher returns v as the API server holds it after this replica's own
// latest claim writes on v's PV when v's index entry is behind only by
// those (a copy of v with that PV's claims, retiring records and
// resourceVersion as the API server answered the last of them);
// otherwise v. A decision on it that is committed conditional on its
// resourceVersion is as safe as one on the index entry: the write
// conflicts if anything changed since. Only for a handle with one PV.
func (c *Claims) Fresher(v *Volume) *Volume {
	if !v.Indexed() || len(v.PVs) != 1 {
		return v
	}
	pv := v.PVs[0]
	w, ok := c.written.newer(pv.Name, v.Handle, pv.ResourceVersion)
	if !ok {
		return v
	}
	f := *v
	f.PVs = []PVRef{{Name: pv.Name, ResourceVersion: w.rv, Claims: w.claims, Retiring: w.retiring}}
	f.Claims, f.Retiring = w.claims, w.retiring
	if f.PVName == pv.Name {
		f.ResourceVersion = w.rv
	}
	return &f
}

// TimeWith makes every live read of a node timed by l, the controller's
// view of node health on its own clock (Liveness.Decorate); a node whose
// heartbeat looks lost there is confirmed by a live read of its Lease
// (a renewal this controller has not seen yet clears it). Without it a
// live read is never timed out (no NotReady or heartbeat fence).
func (c *Claims) TimeWith(l *Liveness) { c.live = l }

// StorageFence is storage fencing as a fence release needs it.
type StorageFence interface {
	// CutOff cuts the attachment off the storage, as if its claim on
	// pvName were already gone; run before the release. A newer
	// attachment of the same node is left alone.
	CutOff(ctx context.Context, pvName, handle string, attachment Retiring) error
	// Settle brings the storage in line with the live claims after a
	// cut, with the released attachment (zero: none was released)
	// treated as gone on every PV: another PV of the handle may still
	// show it until its own release.
	Settle(ctx context.Context, pvName, handle string, released Retiring) error
}

// CutStorageOnFence makes every fence release cut the storage first and
// settle it after, and every release (a fence's, an unpublish's, a
// withdrawal's, a publish's fenced claims) record the released attachment
// in RetiringAnnotation with the same write.
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
	// made: the PVs this call gave a new attachment (a claim the PV did
	// not hold); a commit that fails part-way takes it back from them.
	var made []string
	for _, pv := range v.PVs {
		own := pv.Claims
		if own.Len() == 0 && len(v.PVs) == 1 {
			own = v.Claims
		}
		next := make(map[string]Claim, own.Len()+1)
		for n, cl := range own.All() {
			next[n] = cl
		}
		retiring := pv.Retiring
		for _, n := range fenced {
			if cl, ok := next[n]; ok && c.fence != nil {
				retiring = append(retiring[:len(retiring):len(retiring)], RetiringOf(n, cl))
			}
			delete(next, n)
		}
		if len(v.PVs) > 1 || len(claim.PVs) > 0 {
			claim.PVs = pvNames(v, claim.PVs)
		}
		if old, ok := next[node]; ok && c.fence != nil && !RetiringOf(node, old).Is(node, claim) {
			// The node's own earlier attachment (another incarnation, or
			// one a stale PV showed) is replaced: retired like a fenced one.
			retiring = append(retiring[:len(retiring):len(retiring)], RetiringOf(node, old))
		}
		old, had := next[node]
		next[node] = claim
		if len(retiring) == len(pv.Retiring) {
			retiring = nil // unchanged: not written
		}
		err := c.patch(ctx, pv.Name, pv.ResourceVersion, next, retiring)
		isNew := !had || old.Nonce != claim.Nonce || old.NodeUID != claim.NodeUID
		if err != nil && isNew && !errors.Is(err, ErrConflict) {
			made = append(made, pv.Name) // it may have landed
		}
		if err != nil {
			return c.takeBack(ctx, made, node, claim, err)
		}
		if isNew {
			made = append(made, pv.Name)
		}
	}
	return nil
}

// takeBack withdraws a new attachment's claim from the PVs a failed commit
// gave it, and returns cause (joined with any failure to withdraw).
// Otherwise it would stand on some PVs of the handle, unanswered, beside
// the node's answered attachment on another PV that this replica's index
// had not shown it: two attachments of one node, and nothing to tell which
// the node staged.
func (c *Claims) takeBack(ctx context.Context, made []string, node string, claim Claim, cause error) error {
	errs := []error{cause}
	for _, pv := range made {
		if _, err := c.Withdraw(ctx, pv, node, claim); err != nil {
			errs = append(errs, fmt.Errorf("taking node %s's new claim back from PV %s after a failed commit: %w", node, pv, err))
		}
	}
	return errors.Join(errs...)
}

// pvNames is the sorted union of v's PV names and more.
func pvNames(v *Volume, more []string) []string {
	set := map[string]bool{}
	for _, pv := range v.PVs {
		set[pv.Name] = true
	}
	for _, n := range more {
		set[n] = true
	}
	out := make([]string, 0, len(set))
	for n := range set {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// ReleaseUnpublished drops node's claim on pvName for an unpublish, unless
// a live VolumeAttachment of handle on node that is not being deleted
// still stands on it: then the unpublish is a late one from an earlier
// attachment, and the claim belongs to the current one. Reads the PV, then
// the VolumeAttachment, then writes conditional on the PV read, so a
// publish that lands in between makes the write conflict and the check
// run again. before, when not nil, runs once the claim is to go and before
// it goes, with the claim (storage fencing: shut that attachment's host
// out); its error keeps the claim. Reports whether a claim was dropped, and (storage fencing) the
// attachments of node retiring on the PV: released now, or before by a
// replica that may have stopped before the export change after the
// release (RetiringAnnotation).
func (c *Claims) ReleaseUnpublished(ctx context.Context, pvName, handle, node string, before func(context.Context, Claim) error) (released bool, retiring []Retiring, err error) {
	released, err = c.releaseIf(ctx, pvName, handle, node, func(ctx context.Context, pv *corev1.PersistentVolume, cl Claim, remaining map[string]Claim) (bool, error) {
		va, _, err := c.readAttachment(ctx, handle, node, append(cl.PVs[:len(cl.PVs):len(cl.PVs)], pvName))
		switch {
		case err != nil:
			return false, err
		case va != nil && va.DeletionTimestamp == nil:
			return false, nil
		}
		if before != nil {
			if err := before(ctx, cl); err != nil {
				return false, err
			}
		}
		return true, nil
	}, func(r []Retiring) {
		retiring = nil
		for _, e := range r {
			if e.Node == node && c.fence != nil {
				retiring = append(retiring, e)
			}
		}
	})
	return released, retiring, err
}

// ReleaseIfStale drops node's claim on pvName if a live read of the Node,
// made after the PV was read, shows the claimed incarnation stale under
// policy (deleted, re-created, out of service, NotReady past the
// threshold). A node that recovered, or re-published meanwhile, keeps its
// claim. Reports whether a claim was dropped and why.
func (c *Claims) ReleaseIfStale(ctx context.Context, pvName, node string, policy fencing.Config, now func() time.Time) (bool, fencing.FenceReason, error) {
	var reason fencing.FenceReason
	var handle string
	var fenced Retiring
	cut := false
	released, err := c.releaseIf(ctx, pvName, "", node, func(ctx context.Context, pv *corev1.PersistentVolume, cl Claim, remaining map[string]Claim) (bool, error) {
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
		handle, fenced = pv.Spec.CSI.VolumeHandle, RetiringOf(node, cl)
		cut = true
		if err := c.fence.CutOff(ctx, pvName, handle, fenced); err != nil {
			return false, fmt.Errorf("cutting node %s off volume %s on the storage: %w", node, handle, err)
		}
		return true, nil
	}, nil)
	if !cut {
		return released, reason, err
	}
	// Every cut is followed by a settle on the live claims, released or
	// not: a fence that gave up (the node recovered and published again
	// while its cut was in flight) must let the holder back in at once.
	// After a release the settle changes the state once more, so that
	// an open of the fenced attachment that was in flight cannot land.
	settled := Retiring{}
	if released {
		settled = fenced
	}
	if serr := c.fence.Settle(ctx, pvName, handle, settled); serr != nil {
		return released, reason, errors.Join(err, fmt.Errorf("settling volume %s on the storage after a fence of node %s (released: %t): %w", handle, node, released, serr))
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

// LiveState reads a PV's claims and retiring attachments from the API
// server (not a cache); a PV that does not exist, or is of another volume
// handle (its name reused), has none.
func (c *Claims) LiveState(ctx context.Context, pvName, handle string) (map[string]Claim, []Retiring, error) {
	pv, err := c.client.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("reading PV %s: %w", pvName, err)
	}
	if pv.Spec.CSI == nil || pv.Spec.CSI.VolumeHandle != handle {
		return nil, nil, nil
	}
	claims, err := DecodeClaims(pv)
	if err != nil {
		return nil, nil, err
	}
	retiring, err := ParseRetiring(pv.Annotations[RetiringAnnotation])
	if err != nil {
		return nil, nil, fmt.Errorf("PV %s: %w", pvName, err)
	}
	return claims, retiring, nil
}

// ReleaseRetired drops the claim of r's node on pvName if it is the
// attachment r, retired on another PV of the handle (a release that did
// not reach every PV: a replica stopped between them, or did not know
// this one), recording it like any release; a PV of another handle is
// left alone.
func (c *Claims) ReleaseRetired(ctx context.Context, pvName, handle string, r Retiring) (bool, error) {
	return c.releaseIf(ctx, pvName, handle, r.Node, func(_ context.Context, _ *corev1.PersistentVolume, cl Claim, _ map[string]Claim) (bool, error) {
		return r.Is(r.Node, cl), nil
	}, nil)
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
	return c.live.confirmLive(ctx, c.client, name, nodeState(n))
}

// releaseIf drops node's claim on pvName when drop, called after every
// read of the PV, says so; the write is conditional on that read. With
// storage fencing the write also records the released attachment in
// RetiringAnnotation. seen, when not nil, is given the retiring
// attachments of the last read (with the one released). With handle, a PV
// of another volume handle is left alone.
func (c *Claims) releaseIf(ctx context.Context, pvName, handle, node string, drop func(ctx context.Context, pv *corev1.PersistentVolume, cl Claim, remaining map[string]Claim) (bool, error), seen func([]Retiring)) (bool, error) {
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
		var retiring []Retiring
		if c.fence != nil {
			// Without storage fencing records are neither written nor
			// read: an unreadable one must not block a detach.
			if retiring, err = ParseRetiring(pv.Annotations[RetiringAnnotation]); err != nil {
				return fmt.Errorf("PV %s: %w", pvName, err)
			}
		}
		if seen != nil {
			seen(retiring)
		}
		cl, ok := claims[node]
		if !ok {
			return nil
		}
		if handle != "" && (pv.Spec.CSI == nil || pv.Spec.CSI.VolumeHandle != handle) {
			// A PV of another volume under a name a claim or record
			// named (deleted, and the name reused): not this release's.
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
		var marked []Retiring
		if c.fence != nil {
			marked = append(retiring[:len(retiring):len(retiring)], RetiringOf(node, cl))
			if seen != nil {
				seen(marked)
			}
		}
		err = c.patch(ctx, pvName, pv.ResourceVersion, remaining, marked)
		if errors.Is(err, ErrConflict) {
			return apierrors.NewConflict(corev1.Resource("persistentvolumes"), pvName, err)
		}
		released = err == nil
		return err
	})
	return released, err
}

// patch writes claims, and retiring unless it is nil, to pvName,
// conditional on resourceVersion.
func (c *Claims) patch(ctx context.Context, pvName, resourceVersion string, claims map[string]Claim, retiring []Retiring) error {
	annotations := map[string]any{}
	if err := annotate(annotations, ClaimsAnnotation, claims, len(claims)); err != nil {
		return err
	}
	if retiring != nil {
		if err := annotate(annotations, RetiringAnnotation, retiring, len(retiring)); err != nil {
			return err
		}
	}
	_, err := c.patchAnnotations(ctx, pvName, resourceVersion, annotations)
	return err
}

// annotate sets key in a merge patch's annotations to v as JSON, or to
// null (which deletes the annotation) when v has no entries.
func annotate(annotations map[string]any, key string, v any, entries int) error {
	if entries == 0 {
		annotations[key] = nil
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	annotations[key] = string(b)
	return nil
}

// patchAnnotations merge-patches pvName's annotations conditional on
// resourceVersion and returns the PV as the API server answered.
func (c *Claims) patchAnnotations(ctx context.Context, pvName, resourceVersion string, annotations map[string]any) (*corev1.PersistentVolume, error) {
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"resourceVersion": resourceVersion,
		"annotations":     annotations,
	}})
	if err != nil {
		return nil, err
	}
	pv, err := c.client.CoreV1().PersistentVolumes().Patch(ctx, pvName, types.MergePatchType, body, metav1.PatchOptions{})
	switch {
	case apierrors.IsConflict(err):
		c.written.forget(pvName)
		return nil, fmt.Errorf("%w: PV %s changed after resourceVersion %s", ErrConflict, pvName, resourceVersion)
	case apierrors.IsNotFound(err):
		// The handle's set of PVs changed since the decision.
		c.written.forget(pvName)
		return nil, fmt.Errorf("%w: PV %s was deleted", ErrConflict, pvName)
	case err != nil:
		// The write may have landed or not: nothing is known.
		c.written.forget(pvName)
		return nil, err
	case pv == nil || pv.Name != pvName:
		c.written.forget(pvName)
		return nil, fmt.Errorf("writing PV %s: the API server answered with another object", pvName)
	}
	c.written.record(resourceVersion, pv)
	return pv, nil
}

// LiveAttachment reads from the API server whether a VolumeAttachment of
// handle on node exists and is not being deleted: what a claim must stand
// on (a publish from a replica that woke up after the attachment was
// detached must not leave a claim behind). pvs are the handle's
// PersistentVolumes the caller knows (readAttachment); one whose
// PersistentVolume is gone does not count.
func (c *Claims) LiveAttachment(ctx context.Context, handle, node string, pvs []string) (bool, error) {
	va, pvGone, err := c.readAttachment(ctx, handle, node, pvs)
	return va != nil && !pvGone && va.DeletionTimestamp == nil, err
}

// readAttachment reads the VolumeAttachment of handle on node from the API
// server; nil when there is none. An object under that name counts only
// when it is one: this driver's, on node, of a PersistentVolume of handle
// (one of pvs, the PVs the caller knows of the handle, or one read live
// and found to be of the handle); anything else (a hand-made object, a
// name reused) is none. pvGone: its PersistentVolume does not exist (any
// more): it may still be attached, so it keeps a claim from a release,
// but nothing new stands on it.
func (c *Claims) readAttachment(ctx context.Context, handle, node string, pvs []string) (va *storagev1.VolumeAttachment, pvGone bool, err error) {
	va, err = c.client.StorageV1().VolumeAttachments().Get(ctx, VolumeAttachmentName(handle, c.driver, node), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("reading the VolumeAttachment of volume %s on node %s: %w", handle, node, err)
	}
	pv := va.Spec.Source.PersistentVolumeName
	if va.Spec.Attacher != c.driver || va.Spec.NodeName != node || pv == nil || *pv == "" {
		return nil, false, nil
	}
	if slices.Contains(pvs, *pv) {
		return va, false, nil
	}
	// A PV the caller does not know (yet): its handle tells.
	p, err := c.client.CoreV1().PersistentVolumes().Get(ctx, *pv, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return va, true, nil
	case err != nil:
		return nil, false, fmt.Errorf("reading PV %s of the VolumeAttachment of volume %s on node %s: %w", *pv, handle, node, err)
	case p.Spec.CSI == nil || p.Spec.CSI.Driver != c.driver || p.Spec.CSI.VolumeHandle != handle:
		return nil, false, nil
	}
	return va, false, nil
}

// Withdraw drops node's claim on pvName if it is still the very claim a
// publish committed (same attachment nonce and publish count): that
// publish found, after committing, that it must not stand (its
// VolumeAttachment or Node is gone) and takes it back. A newer claim is
// left alone.
func (c *Claims) Withdraw(ctx context.Context, pvName, node string, committed Claim) (bool, error) {
	return c.releaseIf(ctx, pvName, "", node, func(_ context.Context, _ *corev1.PersistentVolume, cl Claim, _ map[string]Claim) (bool, error) {
		return cl.Nonce == committed.Nonce && cl.Gen == committed.Gen && cl.NodeUID == committed.NodeUID, nil
	}, nil)
}

// ClearRetiring removes the done entries from pvName's RetiringAnnotation
// (each export change after their release has been made), conditional on
// the PV read; entries added meanwhile stay.
func (c *Claims) ClearRetiring(ctx context.Context, pvName string, done []Retiring) error {
	return retryConflicts(ctx, func() error {
		pv, err := c.client.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading PV %s: %w", pvName, err)
		}
		cur, err := ParseRetiring(pv.Annotations[RetiringAnnotation])
		if err != nil {
			return fmt.Errorf("PV %s: %w", pvName, err)
		}
		left := cur[:0:0]
		for _, r := range cur {
			if !slices.ContainsFunc(done, r.same) {
				left = append(left, r)
			}
		}
		if len(left) == len(cur) {
			return nil
		}
		annotations := map[string]any{}
		if err := annotate(annotations, RetiringAnnotation, left, len(left)); err != nil {
			return err
		}
		_, err = c.patchAnnotations(ctx, pvName, pv.ResourceVersion, annotations)
		if errors.Is(err, ErrConflict) {
			return apierrors.NewConflict(corev1.Resource("persistentvolumes"), pvName, err)
		}
		return err
	})
}

// AttachmentExists reads from the API server whether a VolumeAttachment of
// handle on node exists, being deleted or not (until its detach completes
// the node may still use the volume). pvs as for LiveAttachment.
func (c *Claims) AttachmentExists(ctx context.Context, handle, node string, pvs []string) (bool, error) {
	va, pvGone, err := c.readAttachment(ctx, handle, node, pvs)
	return va != nil && !pvGone, err
}
