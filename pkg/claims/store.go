package claims

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// Store commits and releases claims on PersistentVolumes: every write is
// a merge patch conditional on the resourceVersion it was decided on, and
// every read it makes for a decision is live (never a cache). It keeps
// what the API server answered its own writes with (Newer).
type Store struct {
	client kubernetes.Interface
	driver string
	// record: every release records the released attachment in
	// RetiringAnnotation with the same write (storage fencing), and the
	// records are read; without it they are neither written nor read (an
	// unreadable one must not block a detach).
	record bool
	// written: what this replica's own writes left on each PV (Newer).
	written writes
}

// NewStore returns a Store writing through client for the CSI driver named
// driver; recordReleases as Store.record.
func NewStore(client kubernetes.Interface, driver string, recordReleases bool) *Store {
	return &Store{client: client, driver: driver, record: recordReleases}
}

// Newer returns what this replica's own writes left on pvName when a view
// of it at resourceVersion seen (of volume handle) is behind only by
// them; ok false otherwise. A decision on it that is committed
// conditional on its resourceVersion is as safe as one on the view: the
// write conflicts if anything changed since.
func (c *Store) Newer(pvName, handle, seen string) (PVRef, bool) {
	w, ok := c.written.newer(pvName, handle, seen)
	if !ok {
		return PVRef{}, false
	}
	return PVRef{Name: pvName, ResourceVersion: w.rv, Claims: w.claims, Retiring: w.retiring}, true
}

// Commit writes node's claim set to claim, minus the fenced nodes'
// claims, to every PersistentVolume pvs of the handle (merged: their
// claims as the decision saw them joined), each PV's own claims as
// the decision saw them (PVRef.Claims) and each write conditional on the
// resourceVersion the decision read (one API call per PV, usually one). A
// concurrent change of any of them is ErrConflict; replicas that know
// different subsets of a handle's PVs still meet on a PV they share and
// cannot both commit. A PV is never given a claim only another PV shows:
// when one PV's view is current and another's stale, the first write
// succeeds before the second conflicts, and copying the stale PV's claims
// would bring back a claim an answered unpublish had released.
func (c *Store) Commit(ctx context.Context, handle string, pvs []PVRef, merged Set, node string, claim Claim, created bool, fenced []string) error {
	if len(pvs) == 0 {
		return fmt.Errorf("volume %s has no PersistentVolume to record the claim on", handle)
	}
	// made: the PVs this call gave a new attachment (created: one no
	// earlier publish answered); a commit that fails part-way takes it
	// back from them. The node's live attachment published again is
	// never taken back, even from a PV that did not show it yet (a PV
	// made for the handle while the volume is attached): it was answered,
	// and the node may be writing through it.
	var made []string
	for _, pv := range pvs {
		own := pv.Claims
		if own.Len() == 0 && len(pvs) == 1 {
			own = merged
		}
		next := make(map[string]Claim, own.Len()+1)
		for n, cl := range own.All() {
			next[n] = cl
		}
		retiring := pv.Retiring
		for _, n := range fenced {
			if cl, ok := next[n]; ok && c.record {
				retiring = append(retiring[:len(retiring):len(retiring)], RetiringOf(n, cl))
			}
			delete(next, n)
		}
		if len(pvs) > 1 || len(claim.PVs) > 0 {
			claim.PVs = pvNames(pvs, claim.PVs)
		}
		if old, ok := next[node]; ok && c.record && !RetiringOf(node, old).Is(node, claim) {
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
		isNew := created && (!had || old.Nonce != claim.Nonce || old.NodeUID != claim.NodeUID)
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
func (c *Store) takeBack(ctx context.Context, made []string, node string, claim Claim, cause error) error {
	errs := []error{cause}
	for _, pv := range made {
		if _, err := c.Withdraw(ctx, pv, node, claim); err != nil {
			errs = append(errs, fmt.Errorf("taking node %s's new claim back from PV %s after a failed commit: %w", node, pv, err))
		}
	}
	return errors.Join(errs...)
}

// pvNames is the sorted union of pvs' names and more.
func pvNames(pvs []PVRef, more []string) []string {
	set := map[string]bool{}
	for _, pv := range pvs {
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

// LiveState reads a PV's claims and retiring attachments from the API
// server (not a cache); a PV that does not exist, or is of another volume
// handle (its name reused), has none.
func (c *Store) LiveState(ctx context.Context, pvName, handle string) (map[string]Claim, []Retiring, error) {
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
func (c *Store) ReleaseRetired(ctx context.Context, pvName, handle string, r Retiring) (bool, error) {
	return c.releaseIf(ctx, pvName, handle, r.Node, func(_ context.Context, _ *corev1.PersistentVolume, cl Claim, _ map[string]Claim) (bool, error) {
		return r.Is(r.Node, cl), nil
	}, nil)
}

// ReleaseIf drops node's claim on pvName when may, called after every
// read of the PV with the claim, says so; the write is conditional on
// that read, so a change of the PV in between (a repeated publish)
// conflicts and may is asked again on the fresh read. With handle, a PV
// of another volume handle is left alone. Reports whether it released a
// claim, and (when releases are recorded) node's retiring attachments on
// the PV: released now, or before by a replica that may have stopped
// before the export change after the release.
func (c *Store) ReleaseIf(ctx context.Context, pvName, handle, node string, may func(ctx context.Context, cl Claim) (bool, error)) (released bool, records []Retiring, err error) {
	released, err = c.releaseIf(ctx, pvName, handle, node, func(ctx context.Context, _ *corev1.PersistentVolume, cl Claim, _ map[string]Claim) (bool, error) {
		return may(ctx, cl)
	}, func(r []Retiring) {
		records = nil
		for _, e := range r {
			if e.Node == node {
				records = append(records, e)
			}
		}
	})
	return released, records, err
}

// releaseIf drops node's claim on pvName when drop, called after every
// read of the PV, says so; the write is conditional on that read. With
// storage fencing the write also records the released attachment in
// RetiringAnnotation. seen, when not nil, is given the retiring
// attachments of the last read (with the one released). With handle, a PV
// of another volume handle is left alone.
func (c *Store) releaseIf(ctx context.Context, pvName, handle, node string, drop func(ctx context.Context, pv *corev1.PersistentVolume, cl Claim, remaining map[string]Claim) (bool, error), seen func([]Retiring)) (bool, error) {
	released := false
	err := RetryConflicts(ctx, func() error {
		released = false
		pv, err := c.client.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if handle != "" && (pv.Spec.CSI == nil || pv.Spec.CSI.VolumeHandle != handle) {
			// A PV of another volume under a name a claim or record
			// named (deleted, and the name reused): neither its claims
			// nor its records are this release's.
			return nil
		}
		claims, err := decodeClaims(pv.Annotations)
		if err != nil {
			return fmt.Errorf("PV %s: %w", pvName, err)
		}
		var retiring []Retiring
		if c.record {
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
		if c.record {
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
func (c *Store) patch(ctx context.Context, pvName, resourceVersion string, claims map[string]Claim, retiring []Retiring) error {
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
func (c *Store) patchAnnotations(ctx context.Context, pvName, resourceVersion string, annotations map[string]any) (*corev1.PersistentVolume, error) {
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

// Withdraw drops node's claim on pvName if it is still the very claim a
// publish committed (same attachment nonce and publish count): that
// publish found, after committing, that it must not stand (its
// VolumeAttachment or Node is gone) and takes it back. A newer claim is
// left alone.
func (c *Store) Withdraw(ctx context.Context, pvName, node string, committed Claim) (bool, error) {
	return c.releaseIf(ctx, pvName, "", node, func(_ context.Context, _ *corev1.PersistentVolume, cl Claim, _ map[string]Claim) (bool, error) {
		return cl.Nonce == committed.Nonce && cl.Gen == committed.Gen && cl.NodeUID == committed.NodeUID, nil
	}, nil)
}

// ClearRetiring removes the done entries from pvName's RetiringAnnotation
// (each export change after their release has been made), conditional on
// the PV read; entries added meanwhile stay.
func (c *Store) ClearRetiring(ctx context.Context, pvName string, done []Retiring) error {
	return RetryConflicts(ctx, func() error {
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
