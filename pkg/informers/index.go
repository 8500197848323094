package informers

import (
	"context"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/fencing"
)

// Attachment is one VolumeAttachment of a volume.
type Attachment struct {
	Node     string
	VAName   string
	Attached bool      // status.attached
	Since    time.Time // creation time of the VolumeAttachment
	// DetachingSince is the VolumeAttachment's deletion timestamp.
	DetachingSince time.Time
}

// Volume is the index entry of a volume handle. A handle usually has one
// PersistentVolume; a Retained volume whose PV was re-created under a new
// name has two for a while, and the entry then merges them: the claims of
// all (a claim is written to every PV of the handle), the attachments of
// all, and the PV data of the primary one. Values handed out by the index
// are never modified afterwards.
type Volume struct {
	PVName      string         // the primary PV: bound to a claim, else the newest
	PVs         []claims.PVRef // every PV of the handle, by name
	Handle      string         // spec.csi.volumeHandle; empty until the PV is seen
	AccessModes []corev1.PersistentVolumeAccessMode
	ClaimRef    *corev1.ObjectReference // the bound PVC, for events
	// ResourceVersion of the primary PV.
	ResourceVersion string
	Claims          claims.Set
	// Attachments: one per VolumeAttachment, ordered by node and name
	// (AttachmentOn picks a node's).
	// A slice, not a map: a volume has one or two, and a Go map of one
	// entry costs several hundred bytes.
	Attachments []Attachment
	// Retiring: released attachments whose export change after the
	// release is not known to be made (claims.RetiringAnnotation), of every PV;
	// claims.PVRef.Retiring has them by PV.
	Retiring []claims.Retiring

	// Of one PV's entry only.
	created time.Time
	bound   bool

	// Block: the PV's volumeMode is Block. Declared beside bound so the
	// two share a word (the entry stays in a smaller size class).
	Block bool
}

// Indexed reports whether the entry has a PersistentVolume: only then can
// claims be committed, and only then is the volume's PV data known.
func (v *Volume) Indexed() bool { return v != nil && len(v.PVs) > 0 }

// Version identifies the API state the entry was built from: it changes
// whenever any PV of the handle changes.
func (v *Volume) Version() string {
	if v == nil {
		return ""
	}
	parts := make([]string, 0, len(v.PVs))
	for _, p := range v.PVs {
		parts = append(parts, p.Name+"@"+p.ResourceVersion)
	}
	return strings.Join(parts, ",")
}

// Holders merges attachments and claims into the policy's view: a node
// holds the volume while a claim for it is committed or a VolumeAttachment
// for it is attached (also while that VolumeAttachment is being deleted:
// only a completed detach, attached=false, ends a hold).
func (v *Volume) Holders() []fencing.Holder {
	if v == nil {
		return nil
	}
	byNode := map[string]fencing.Holder{}
	for node, c := range v.Claims.All() {
		byNode[node] = fencing.Holder{Node: node, UID: c.NodeUID, Since: c.At}
	}
	standing := map[string]bool{} // a node with a counted attachment not being deleted
	for _, a := range v.Attachments {
		if !v.HasClaim(a.Node) && !a.Attached {
			// A VolumeAttachment that is not attached is a request, or a
			// completed detach: a refused second node's VA must not block
			// the holder (or anyone after it).
			continue
		}
		h, ok := byNode[a.Node]
		if !ok || a.Since.Before(h.Since) {
			h.Since = a.Since
		}
		h.Node = a.Node
		// Detaching only while every attachment of the node is.
		switch {
		case a.DetachingSince.IsZero():
			standing[a.Node] = true
		case h.DetachingSince.IsZero() || a.DetachingSince.Before(h.DetachingSince):
			h.DetachingSince = a.DetachingSince
		}
		byNode[a.Node] = h
	}
	for node := range standing {
		h := byNode[node]
		h.DetachingSince = time.Time{}
		byNode[node] = h
	}
	out := make([]fencing.Holder, 0, len(byNode))
	for _, h := range byNode {
		out = append(out, h)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out
}

// AttachmentOn returns the VolumeAttachment of the volume on node, if
// the index has one: of several (a hand-made one beside the attacher's),
// the one that stands most (attached, then not being deleted).
func (v *Volume) AttachmentOn(node string) (Attachment, bool) {
	var best Attachment
	found := false
	rank := func(a Attachment) int {
		r := 0
		if a.Attached {
			r += 2
		}
		if a.DetachingSince.IsZero() {
			r++
		}
		return r
	}
	for _, a := range v.Attachments {
		if a.Node == node && (!found || rank(a) > rank(best)) {
			best, found = a, true
		}
	}
	return best, found
}

// compareAttachments orders attachments by node, then VolumeAttachment.
func compareAttachments(a, b Attachment) int {
	if c := strings.Compare(a.Node, b.Node); c != 0 {
		return c
	}
	return strings.Compare(a.VAName, b.VAName)
}

// withAttachment returns a copy of as with a in place of the attachment
// of its VolumeAttachment (or added), ordered by node and name: a node
// may have several VolumeAttachments of one PV (hand-made names), and
// each stands until it goes.
func withAttachment(as []Attachment, a Attachment) []Attachment {
	out := make([]Attachment, 0, len(as)+1)
	for _, o := range as {
		if o.VAName != a.VAName {
			out = append(out, o)
		}
	}
	i, _ := slices.BinarySearchFunc(out, a, compareAttachments)
	return slices.Insert(out, i, a)
}

// Grants reports whether the PV lists the access mode.
func (v *Volume) Grants(mode corev1.PersistentVolumeAccessMode) bool {
	for _, m := range v.AccessModes {
		if m == mode {
			return true
		}
	}
	return false
}

// HasClaim reports whether node has a committed claim on the volume.
func (v *Volume) HasClaim(node string) bool {
	return v.Claims.Has(node)
}

// Ref names the volume for events and fencing.
func (v *Volume) Ref() fencing.VolumeRef {
	ref := fencing.VolumeRef{PV: v.PVName, Handle: v.Handle, Claim: v.ClaimRef}
	for _, p := range v.PVs {
		ref.PVs = append(ref.PVs, p.Name)
	}
	return ref
}

// NodeState is the index's view of a node.
type NodeState = fencing.NodeState

// AttachmentIndex maps volume handles to their attachments and knows every
// node's state. Only the controller's worker writes it; readers get
// immutable values.
type AttachmentIndex struct {
	mu       sync.RWMutex
	volumes  map[string]*Volume  // by PV name: one PV's entry
	byHandle map[string][]string // handle -> PV names, sorted
	vaToPV   map[string]string   // VA name -> PV name
	nodes    map[string]NodeState
	// live, when set, times the nodes' health on this controller's clock
	// (Node returns its view).
	live *fencing.Liveness
	// changed is closed (and replaced) on every change of a volume entry,
	// so a reader can wait for the index to catch up with the API.
	changed chan struct{}
}

// NewAttachmentIndex returns an empty index.
func NewAttachmentIndex() *AttachmentIndex {
	return &AttachmentIndex{
		volumes:  map[string]*Volume{},
		byHandle: map[string][]string{},
		vaToPV:   map[string]string{},
		nodes:    map[string]NodeState{},
		changed:  make(chan struct{}),
	}
}

// Volume returns the entry of a volume handle, or nil. No API call; O(1)
// for a handle with one PV.
func (x *AttachmentIndex) Volume(handle string) *Volume {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.volumeLocked(handle)
}

func (x *AttachmentIndex) volumeLocked(handle string) *Volume {
	names := x.byHandle[handle]
	switch len(names) {
	case 0:
		return nil
	case 1:
		return x.volumes[names[0]]
	}
	entries := make([]*Volume, 0, len(names))
	for _, n := range names {
		entries = append(entries, x.volumes[n])
	}
	return merge(handle, entries)
}

// merge builds the entry of a handle with several PVs (or a PV and the
// attachments of a deleted one).
func merge(handle string, entries []*Volume) *Volume {
	m := &Volume{Handle: handle}
	held := map[string]claims.Claim{}
	var primary *Volume
	for _, e := range entries {
		if e.ResourceVersion != "" {
			m.PVs = append(m.PVs, claims.PVRef{Name: e.PVName, ResourceVersion: e.ResourceVersion, Claims: e.Claims, Retiring: e.Retiring})
			m.Retiring = append(m.Retiring, e.Retiring...)
			if primary == nil || better(e, primary) {
				primary = e
			}
		}
		for n, c := range e.Claims.All() {
			if prev, ok := held[n]; ok {
				// The same claim mirrored, or a claim one PV has not been
				// given yet: keep the latest write and the earliest start.
				if prev.Gen > c.Gen {
					c = prev
				}
				if prev.At.Before(c.At) {
					c.At = prev.At
				}
			}
			held[n] = c
		}
		for _, a := range e.Attachments {
			m.Attachments = withAttachment(m.Attachments, a)
		}
	}
	if primary != nil {
		m.PVName, m.ResourceVersion = primary.PVName, primary.ResourceVersion
		m.AccessModes, m.Block, m.ClaimRef = primary.AccessModes, primary.Block, primary.ClaimRef
	}
	m.Claims = claims.NewSet(held)
	return m
}

// better: the PV bound to a claim, else the newer, else the first by name.
func better(a, b *Volume) bool {
	if a.bound != b.bound {
		return a.bound
	}
	if !a.created.Equal(b.created) {
		return a.created.After(b.created)
	}
	return a.PVName < b.PVName
}

// WaitForChange waits until the entry of handle is no longer the one read
// at version (Volume.Version: the index has seen a later write to one of
// its PVs, or they are gone), or ctx is done, and returns the entry as it
// then is.
func (x *AttachmentIndex) WaitForChange(ctx context.Context, handle, version string) *Volume {
	for {
		x.mu.RLock()
		v := x.volumeLocked(handle)
		changed := x.changed
		x.mu.RUnlock()
		if v == nil || v.Version() != version {
			return v
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return v
		}
	}
}

// volumeByPV returns the entry of the handle of a PersistentVolume, or
// nil.
func (x *AttachmentIndex) volumeByPV(name string) *Volume {
	x.mu.RLock()
	defer x.mu.RUnlock()
	e := x.volumes[name]
	if e == nil {
		return nil
	}
	if e.Handle == "" {
		return e
	}
	return x.volumeLocked(e.Handle)
}

// Node returns a node's state, timed by the controller's fencing.Liveness; a
// node the index has not seen does not exist.
func (x *AttachmentIndex) Node(name string) NodeState {
	x.mu.RLock()
	s, live := x.nodes[name], x.live
	x.mu.RUnlock()
	return live.Decorate(name, s)
}

// setLiveness makes Node timed by l.
func (x *AttachmentIndex) setLiveness(l *fencing.Liveness) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.live = l
}

// VolumesOnNode returns the volumes a node holds by claim or
// VolumeAttachment, ordered by handle.
func (x *AttachmentIndex) VolumesOnNode(node string) []*Volume {
	x.mu.RLock()
	defer x.mu.RUnlock()
	handles := map[string]bool{}
	for _, v := range x.volumes {
		if v.Handle == "" {
			continue
		}
		if _, attached := v.AttachmentOn(node); attached || v.HasClaim(node) {
			handles[v.Handle] = true
		}
	}
	out := make([]*Volume, 0, len(handles))
	for h := range handles {
		out = append(out, x.volumeLocked(h))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Handle < out[j].Handle })
	return out
}

// Volumes returns every volume handle's entry, ordered by handle.
func (x *AttachmentIndex) Volumes() []*Volume {
	x.mu.RLock()
	defer x.mu.RUnlock()
	out := make([]*Volume, 0, len(x.byHandle))
	for h := range x.byHandle {
		out = append(out, x.volumeLocked(h))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Handle < out[j].Handle })
	return out
}

// Retiring returns the entries with a released attachment whose export
// change after the release is not known to be made (Volume.Retiring),
// sorted by handle. No API call.
func (x *AttachmentIndex) Retiring() []*Volume {
	x.mu.RLock()
	defer x.mu.RUnlock()
	var out []*Volume
	for h, names := range x.byHandle {
		for _, n := range names {
			if len(x.volumes[n].Retiring) > 0 {
				out = append(out, x.volumeLocked(h))
				break
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Handle < out[j].Handle })
	return out
}

// Stats is the index's size.
type Stats struct{ Volumes, Attachments, Nodes int }

// Stats counts the index's content in O(1): one attachment per indexed
// VolumeAttachment.
func (x *AttachmentIndex) Stats() Stats {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return Stats{Volumes: len(x.byHandle), Attachments: len(x.vaToPV), Nodes: len(x.nodes)}
}

func (x *AttachmentIndex) setPV(pvName string, update func(v *Volume)) {
	x.mu.Lock()
	defer x.mu.Unlock()
	old := x.volumes[pvName]
	v := old.clone(pvName)
	update(v)
	v.PVs = nil
	if v.ResourceVersion != "" {
		v.PVs = []claims.PVRef{{Name: pvName, ResourceVersion: v.ResourceVersion, Claims: v.Claims, Retiring: v.Retiring}}
	}
	if old != nil && old.Handle != v.Handle {
		x.unlinkHandle(old.Handle, pvName)
	}
	x.linkHandle(v.Handle, pvName)
	x.volumes[pvName] = v
	x.notify()
}

// linkHandle and unlinkHandle keep byHandle sorted; x.mu must be held.
func (x *AttachmentIndex) linkHandle(handle, pvName string) {
	if handle == "" {
		return
	}
	names := x.byHandle[handle]
	i := sort.SearchStrings(names, pvName)
	if i < len(names) && names[i] == pvName {
		return
	}
	names = append(names[:i:i], append([]string{pvName}, names[i:]...)...)
	x.byHandle[handle] = names
}

func (x *AttachmentIndex) unlinkHandle(handle, pvName string) {
	names := x.byHandle[handle]
	i := sort.SearchStrings(names, pvName)
	if i == len(names) || names[i] != pvName {
		return
	}
	rest := append(names[:i:i], names[i+1:]...)
	if len(rest) == 0 {
		delete(x.byHandle, handle)
		return
	}
	x.byHandle[handle] = rest
}

// notify wakes WaitForChange; x.mu must be held for writing.
func (x *AttachmentIndex) notify() {
	close(x.changed)
	x.changed = make(chan struct{})
}

func (x *AttachmentIndex) deletePV(pvName string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	old := x.volumes[pvName]
	if old == nil {
		return
	}
	x.notify()
	if len(old.Attachments) == 0 {
		x.unlinkHandle(old.Handle, pvName)
		delete(x.volumes, pvName)
		return
	}
	// VolumeAttachments outlive their PV only briefly; keep them, under
	// the handle (another PV of it may still exist) but without PV data,
	// until they go.
	x.volumes[pvName] = &Volume{PVName: pvName, Handle: old.Handle, Attachments: old.Attachments}
}

func (x *AttachmentIndex) setAttachment(vaName, pvName string, a Attachment) {
	if prev, ok := x.pvOfVA(vaName); ok && prev != pvName {
		x.deleteAttachment(vaName)
	}
	x.setPV(pvName, func(v *Volume) {
		v.Attachments = withAttachment(v.Attachments, a)
	})
	x.mu.Lock()
	x.vaToPV[vaName] = pvName
	x.mu.Unlock()
}

func (x *AttachmentIndex) pvOfVA(vaName string) (string, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	pv, ok := x.vaToPV[vaName]
	return pv, ok
}

// deleteAttachment removes a VolumeAttachment by name and returns the PV
// it was for (empty when unknown).
func (x *AttachmentIndex) deleteAttachment(vaName string) (pv string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	pvName, ok := x.vaToPV[vaName]
	if !ok {
		return ""
	}
	delete(x.vaToPV, vaName)
	old := x.volumes[pvName]
	if old == nil {
		return pvName
	}
	v := old.clone(pvName)
	v.Attachments = nil
	for _, a := range old.Attachments {
		if a.VAName != vaName {
			v.Attachments = append(v.Attachments, a)
		}
	}
	if v.ResourceVersion == "" && len(v.Attachments) == 0 {
		// Neither a PV nor an attachment is left.
		x.unlinkHandle(v.Handle, pvName)
		delete(x.volumes, pvName)
	} else {
		x.volumes[pvName] = v
	}
	x.notify()
	return pvName
}

func (x *AttachmentIndex) setNode(name string, s NodeState) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.nodes[name] = s
}

func (x *AttachmentIndex) deleteNode(name string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.nodes, name)
}

func (v *Volume) clone(pvName string) *Volume {
	if v == nil {
		return &Volume{PVName: pvName}
	}
	c := *v
	return &c
}
