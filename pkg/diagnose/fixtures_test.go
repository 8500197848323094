package diagnose

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/inventory"
)

const (
	driver = "rds.csi.srvlab.io"
	ns     = "e2e"
)

var t0 = time.Date(2026, 11, 23, 8, 0, 0, 0, time.UTC)

// world builds a Cluster step by step; every builder returns the world.
type world struct{ c Cluster }

func newWorld() *world {
	return &world{c: Cluster{Now: t0.Add(time.Hour), DriverName: driver}}
}

func (w *world) node(name, ready string, since time.Duration, taints ...string) *world {
	n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)}}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionStatus(ready),
		LastTransitionTime: metav1.NewTime(w.c.Now.Add(-since))}}
	for _, k := range taints {
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: k, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute})
	}
	w.c.Nodes = append(w.c.Nodes, n)
	return w
}

// volume adds PVC ns/<claim> bound to PV <pv> (handle = pv) with the claims
// annotation as given (empty: none).
func (w *world) volume(claim, pv, held string, modes ...corev1.PersistentVolumeAccessMode) *world {
	if len(modes) == 0 {
		modes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	}
	p := corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: pv, ResourceVersion: "42"},
		Spec: corev1.PersistentVolumeSpec{AccessModes: modes,
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: pv}},
			ClaimRef:               &corev1.ObjectReference{Namespace: ns, Name: claim}}}
	if held != "" {
		p.Annotations = map[string]string{claims.ClaimsAnnotation: held}
	}
	w.c.PVs = append(w.c.PVs, p)
	pvc := corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: claim},
		Spec: corev1.PersistentVolumeClaimSpec{VolumeName: pv}, Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound}}
	w.c.PVCs = append(w.c.PVCs, pvc)
	return w
}

func (w *world) pod(name, node, claim string) *world {
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PodSpec{NodeName: node,
		Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}}}
	p.Status.Phase = corev1.PodPending
	w.c.Pods = append(w.c.Pods, p)
	return w
}

func (w *world) va(pv, node string, attached bool, attachErr string) *world {
	v := storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "csi-" + pv + "-" + node},
		Spec:   storagev1.VolumeAttachmentSpec{Attacher: driver, NodeName: node, Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}},
		Status: storagev1.VolumeAttachmentStatus{Attached: attached}}
	if attachErr != "" {
		v.Status.AttachError = &storagev1.VolumeError{Message: attachErr}
	}
	w.c.Attachments = append(w.c.Attachments, v)
	return w
}

// disks gives the world an inventory with these disks (volume slots, or
// snap-* snapshots).
func (w *world) disks(slots ...string) *world {
	inv := &inventory.Inventory{GeneratedAt: w.c.Now}
	for _, s := range slots {
		kind := inventory.KindVolume
		if len(s) > 5 && s[:5] == "snap-" {
			kind = inventory.KindSnapshot
		}
		inv.Disks = append(inv.Disks, inventory.Disk{Slot: s, Kind: kind, SizeBytes: 1 << 30, File: "/p/" + s + ".img", Exported: kind == inventory.KindVolume})
	}
	w.c.Inventory = inv
	return w
}

func (w *world) snapshots(handles ...string) *world {
	w.c.SnapshotHandles = map[string]string{}
	for _, h := range handles {
		w.c.SnapshotHandles[h] = "content-" + h
	}
	return w
}

// held: pv-1 of claim "data" attached to node-a with pod-a there, a claim
// recorded for node-a.
func held(nodeAReady string, since time.Duration, taints ...string) *world {
	return newWorld().node("node-a", nodeAReady, since, taints...).node("node-b", "True", time.Hour).
		volume("data", "pv-1", `{"node-a":"2026-11-23T08:00:00Z"}`).
		pod("pod-a", "node-a", "data").va("pv-1", "node-a", true, "").disks("pv-1")
}
