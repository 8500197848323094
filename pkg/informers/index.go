package informers

import (
	"context"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

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

// Volume is the index entry of one PersistentVolume of this driver. Values
// handed out by the index are never modified afterwards.
type Volume struct {
	PVName      string
	Handle      string // spec.csi.volumeHandle; empty until the PV is seen
	AccessModes []corev1.PersistentVolumeAccessMode
	Block       bool
	ClaimRef    *corev1.ObjectReference // the bound PVC, for events
	// ResourceVersion of the PV the claims were read from: publish
	// commits its claim conditionally on it.
	ResourceVersion string
	Claims          map[string]time.Time // node -> claimed at
	Attachments     map[string]Attachment
}

// Holders merges attachments and claims into the policy's view: a node
// holds the volume while a claim for it is committed or a VolumeAttachment
// for it is attached (or detaching after being attached).
func (v *Volume) Holders() []fencing.Holder {
	if v == nil {
		return nil
	}
	byNode := map[string]fencing.Holder{}
	for node, at := range v.Claims {
		byNode[node] = fencing.Holder{Node: node, Since: at}
	}
	for _, a := range v.Attachments {
		if _, claimed := v.Claims[a.Node]; !claimed && !a.Attached {
			// A VolumeAttachment that never attached is a request, not a
			// hold: a refused second node's VA must not block the holder
			// (or anyone after it).
			continue
		}
		h, ok := byNode[a.Node]
		if !ok || a.Since.Before(h.Since) {
			h.Since = a.Since
		}
		h.Node = a.Node
		// A claimed node is not detaching until its unpublish releases the
		// claim; the VA's deletion alone does not end the claim.
		if _, claimed := v.Claims[a.Node]; !claimed {
			h.DetachingSince = a.DetachingSince
		}
		byNode[a.Node] = h
	}
	out := make([]fencing.Holder, 0, len(byNode))
	for _, h := range byNode {
		out = append(out, h)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out
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
	_, ok := v.Claims[node]
	return ok
}

// Ref names the volume for events.
func (v *Volume) Ref() fencing.VolumeRef {
	return fencing.VolumeRef{PV: v.PVName, Handle: v.Handle, Claim: v.ClaimRef}
}

// NodeState is the index's view of a node.
type NodeState = fencing.NodeState

// AttachmentIndex maps volume handles to their attachments and knows every
// node's state. Only the controller's worker writes it; readers get
// immutable values.
type AttachmentIndex struct {
	mu       sync.RWMutex
	volumes  map[string]*Volume // by PV name
	byHandle map[string]string  // handle -> PV name
	vaToPV   map[string]string  // VA name -> PV name
	nodes    map[string]NodeState
	// changed is closed (and replaced) on every change of a volume entry,
	// so a reader can wait for the index to catch up with the API.
	changed chan struct{}
}

// NewAttachmentIndex returns an empty index.
func NewAttachmentIndex() *AttachmentIndex {
	return &AttachmentIndex{
		volumes:  map[string]*Volume{},
		byHandle: map[string]string{},
		vaToPV:   map[string]string{},
		nodes:    map[string]NodeState{},
		changed:  make(chan struct{}),
	}
}

// Volume returns the entry of a volume handle, or nil. O(1), no API call.
func (x *AttachmentIndex) Volume(handle string) *Volume {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if pv, ok := x.byHandle[handle]; ok {
		return x.volumes[pv]
	}
	return nil
}

// WaitForChange waits until the entry of handle is no longer the one read
// at resourceVersion (the index has seen a later write to the PV, or the
// PV is gone), or ctx is done, and returns the entry as it then is.
func (x *AttachmentIndex) WaitForChange(ctx context.Context, handle, resourceVersion string) *Volume {
	for {
		x.mu.RLock()
		var v *Volume
		if pv, ok := x.byHandle[handle]; ok {
			v = x.volumes[pv]
		}
		changed := x.changed
		x.mu.RUnlock()
		if v == nil || v.ResourceVersion != resourceVersion {
			return v
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return v
		}
	}
}

// volumeByPV returns the entry of a PersistentVolume by name, or nil.
func (x *AttachmentIndex) volumeByPV(name string) *Volume {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.volumes[name]
}

// Node returns a node's state; a node the index has not seen does not
// exist.
func (x *AttachmentIndex) Node(name string) NodeState {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.nodes[name]
}

// VolumesOnNode returns the volumes a node holds by claim or
// VolumeAttachment, ordered by handle.
func (x *AttachmentIndex) VolumesOnNode(node string) []*Volume {
	x.mu.RLock()
	defer x.mu.RUnlock()
	var out []*Volume
	for _, v := range x.volumes {
		if v.Handle == "" {
			continue
		}
		if _, attached := v.Attachments[node]; attached || v.HasClaim(node) {
			out = append(out, v)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Handle < out[j].Handle })
	return out
}

// HolderNodes returns every node that holds some volume (by claim or
// VolumeAttachment), including nodes that no longer exist.
func (x *AttachmentIndex) HolderNodes() []string {
	x.mu.RLock()
	defer x.mu.RUnlock()
	seen := map[string]bool{}
	for _, v := range x.volumes {
		for n := range v.Claims {
			seen[n] = true
		}
		for n := range v.Attachments {
			seen[n] = true
		}
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
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

// The mutators below are called by the controller's worker only. Each
// replaces an entry with a modified copy, so readers never see a change.

func (x *AttachmentIndex) setPV(pvName string, update func(v *Volume)) {
	x.mu.Lock()
	defer x.mu.Unlock()
	old := x.volumes[pvName]
	v := old.clone(pvName)
	update(v)
	if old != nil && old.Handle != "" && old.Handle != v.Handle {
		delete(x.byHandle, old.Handle)
	}
	if v.Handle != "" {
		x.byHandle[v.Handle] = pvName
	}
	x.volumes[pvName] = v
	x.notify()
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
	if old.Handle != "" {
		delete(x.byHandle, old.Handle)
	}
	x.notify()
	if len(old.Attachments) == 0 {
		delete(x.volumes, pvName)
		return
	}
	// VolumeAttachments outlive their PV only briefly; keep them, without
	// PV data, until they go.
	v := &Volume{PVName: pvName, Attachments: old.Attachments}
	x.volumes[pvName] = v
}

func (x *AttachmentIndex) setAttachment(vaName, pvName string, a Attachment) {
	if prev, ok := x.pvOfVA(vaName); ok && prev != pvName {
		x.deleteAttachment(vaName)
	}
	x.setPV(pvName, func(v *Volume) {
		v.Attachments = cloneAttachments(v.Attachments)
		v.Attachments[a.Node] = a
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
	v.Attachments = map[string]Attachment{}
	for n, a := range old.Attachments {
		if a.VAName != vaName {
			v.Attachments[n] = a
		}
	}
	if v.Handle == "" && len(v.Attachments) == 0 {
		delete(x.volumes, pvName)
	} else {
		x.volumes[pvName] = v
	}
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
		return &Volume{PVName: pvName, Attachments: map[string]Attachment{}}
	}
	c := *v
	return &c
}

func cloneAttachments(m map[string]Attachment) map[string]Attachment {
	c := make(map[string]Attachment, len(m)+1)
	for k, v := range m {
		c[k] = v
	}
	return c
}
