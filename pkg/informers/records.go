package informers

import (
	"slices"
	"sync"
	"time"
	"unique"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/nodelease"
)

// The informers' caches hold these records instead of API objects: what
// the sync functions read of each object and nothing else (at 100k
// volumes a trimmed PersistentVolume still cost about 2 KB, a record a
// few hundred bytes). A record satisfies client-go's key functions
// through metav1.ObjectMetaAccessor, which is all a SharedIndexInformer
// and its store need of a stored object. Records are never modified once
// stored; strings that repeat across objects (node names, the driver
// name, access modes) are stored once.

// objectName gives a record of a cluster-scoped object the metadata the
// informers' key functions read (cache.MetaNamespaceKeyFunc): its name.
type objectName struct{ name string }

// GetObjectMeta implements metav1.ObjectMetaAccessor (meta.Accessor).
func (o *objectName) GetObjectMeta() metav1.Object { return &metav1.ObjectMeta{Name: o.name} }

// vaRecord is a VolumeAttachment as syncVA reads it.
type vaRecord struct {
	objectName
	// attacher and node are interned: the handle keeps the one copy of
	// each string alive while any record uses it.
	attacher unique.Handle[string]
	node     unique.Handle[string]
	pv       string // spec.source.persistentVolumeName
	created  time.Time
	deleting time.Time // deletionTimestamp; zero while not being deleted
	hasPV    bool      // false: an inline volume, not of a PV
	attached bool
}

// pvRecord is a PersistentVolume as syncPV reads it; a PV of another
// driver keeps its name only (foreign).
type pvRecord struct {
	objectName
	resourceVersion string
	handle          string
	// claims and retiring are the raw claims.ClaimsAnnotation and
	// claims.RetiringAnnotation: decoding them is syncPV's decision.
	claims, retiring string
	accessModes      []corev1.PersistentVolumeAccessMode // interned, shared
	claimRef         *corev1.ObjectReference             // kind, namespace, name, UID
	created          time.Time
	foreign          bool // not a CSI volume of this driver
	block            bool
	bound            bool // claimRef set and phase Bound
}

// nodeRecord is a Node as syncNode reads it.
type nodeRecord struct {
	objectName
	state       NodeState
	driverTaint bool // carries the driver's out-of-service taint
}

// leaseRecord is a heartbeat Lease, a kubelet's or a node plugin's: that
// it changed, and its duration (the writer's cadence), are what fencing.Liveness
// reads.
type leaseRecord struct {
	name, namespace, resourceVersion string
	duration                         time.Duration // 0: not stated
	// nodePlugin: labelled as a node plugin's Lease (pkg/nodelease).
	nodePlugin bool
}

// GetObjectMeta implements metav1.ObjectMetaAccessor (meta.Accessor).
func (l *leaseRecord) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Name: l.name, Namespace: l.namespace}
}

// sameRecord: the update of a PersistentVolume or VolumeAttachment
// from old to new changes nothing the index reads. That is what a relist
// delivers for every object after a watch expired (kube-apiserver
// restarted, etcd compacted past the watch): queued, 200 000 keys at 100k
// volumes would pass through the work queue, whose sets keep that size
// for good, and be indexed again to no effect. A PV is the same at the
// same resourceVersion; a VolumeAttachment record holds only what
// syncVA reads, so equal records index alike. Nodes are always queued:
// their sync also times heartbeats and wake-ups.
func sameRecord(old, new any) bool {
	switch o := old.(type) {
	case *pvRecord:
		n, ok := new.(*pvRecord)
		return ok && o.resourceVersion != "" && o.sameAs(n)
	case *vaRecord:
		n, ok := new.(*vaRecord)
		return ok && *o == *n
	}
	return false
}

// sameAs: r and o hold the same values. The resourceVersion alone would
// do against an API server (every write changes it); the values are
// compared too, so that a writer that keeps it (a test's fake) is seen.
// The index keeps the resourceVersion (claims are written conditional
// on it), so a new one alone is an update too.
func (r *pvRecord) sameAs(o *pvRecord) bool {
	return r.resourceVersion == o.resourceVersion && r.name == o.name && r.handle == o.handle &&
		r.claims == o.claims && r.retiring == o.retiring && slices.Equal(r.accessModes, o.accessModes) &&
		(r.claimRef == nil) == (o.claimRef == nil) && (r.claimRef == nil || *r.claimRef == *o.claimRef) &&
		r.created.Equal(o.created) && r.foreign == o.foreign && r.block == o.block && r.bound == o.bound
}

// recordMaker turns API objects into records (the informers' transform).
// It is called from every informer's goroutine at once.
type recordMaker struct {
	driver unique.Handle[string]
	mu     sync.Mutex
	// modes: the access-mode lists seen, each stored once. The API
	// allows four modes, so there are few distinct lists; past maxModes
	// (an API server that allows more) lists are copied, not interned.
	modes map[string][]corev1.PersistentVolumeAccessMode
}

const maxModes = 64

func newRecordMaker(driver string) *recordMaker {
	return &recordMaker{driver: unique.Make(driver), modes: map[string][]corev1.PersistentVolumeAccessMode{}}
}

// pvcKind is the kind of every claimRef the PV controller writes.
const pvcKind = "PersistentVolumeClaim"

// record is the informers' transform: it returns the record of an API
// object, and a record or anything else unchanged (a transform must be
// idempotent: client-go may pass it an object it already transformed).
func (m *recordMaker) record(obj any) (any, error) {
	switch o := obj.(type) {
	case *storagev1.VolumeAttachment:
		r := &vaRecord{
			objectName: objectName{name: o.Name},
			attacher:   unique.Make(o.Spec.Attacher),
			node:       unique.Make(o.Spec.NodeName),
			attached:   o.Status.Attached,
			created:    o.CreationTimestamp.Time,
		}
		if p := o.Spec.Source.PersistentVolumeName; p != nil {
			r.pv, r.hasPV = *p, true
		}
		if o.DeletionTimestamp != nil {
			r.deleting = o.DeletionTimestamp.Time
		}
		return r, nil
	case *corev1.PersistentVolume:
		r := &pvRecord{objectName: objectName{name: o.Name}, resourceVersion: o.ResourceVersion}
		if o.Spec.CSI == nil || unique.Make(o.Spec.CSI.Driver) != m.driver {
			r.foreign = true
			return r, nil
		}
		r.handle = o.Spec.CSI.VolumeHandle
		if r.handle == r.name {
			r.handle = r.name // one copy of the string (the usual case)
		}
		r.claims, r.retiring = o.Annotations[claims.ClaimsAnnotation], o.Annotations[claims.RetiringAnnotation]
		r.accessModes = m.accessModes(o.Spec.AccessModes)
		r.block = o.Spec.VolumeMode != nil && *o.Spec.VolumeMode == corev1.PersistentVolumeBlock
		if ref := o.Spec.ClaimRef; ref != nil {
			kind := ref.Kind
			if kind == pvcKind {
				kind = pvcKind
			}
			r.claimRef = &corev1.ObjectReference{Kind: kind, Namespace: ref.Namespace, Name: ref.Name, UID: ref.UID}
		}
		r.bound = o.Spec.ClaimRef != nil && o.Status.Phase == corev1.VolumeBound
		r.created = o.CreationTimestamp.Time
		return r, nil
	case *corev1.Node:
		return &nodeRecord{objectName: objectName{name: o.Name}, state: fencing.NodeStateOf(o), driverTaint: fencing.HasDriverTaint(o)}, nil
	case *coordinationv1.Lease:
		ns := o.Namespace
		if ns == fencing.NodeLeaseNamespace {
			ns = fencing.NodeLeaseNamespace // one copy
		}
		return &leaseRecord{name: o.Name, namespace: ns, resourceVersion: o.ResourceVersion, duration: fencing.LeaseDuration(o),
			nodePlugin: o.Labels[nodelease.Label] == nodelease.LabelValue}, nil
	}
	return obj, nil
}

// accessModes returns the one stored copy of an access-mode list; callers
// must not modify it.
func (m *recordMaker) accessModes(modes []corev1.PersistentVolumeAccessMode) []corev1.PersistentVolumeAccessMode {
	if len(modes) == 0 {
		return nil
	}
	k := ""
	for _, mode := range modes {
		k += string(mode) + ","
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if s, ok := m.modes[k]; ok {
		return s
	}
	s := append([]corev1.PersistentVolumeAccessMode(nil), modes...)
	if len(m.modes) < maxModes {
		m.modes[k] = s
	}
	return s
}
