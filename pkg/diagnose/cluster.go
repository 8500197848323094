package diagnose

import (
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/inventory"
)

// OutOfServiceTaint is the taint an operator puts on a node that is really
// down (non-graceful node shutdown); Kubernetes then detaches its volumes
// and the driver fences its claims.
const OutOfServiceTaint = "node.kubernetes.io/out-of-service"

// Cluster is what kubectl rds gathered: the objects a verdict depends on.
type Cluster struct {
	Now        time.Time
	DriverName string

	Pods []corev1.Pod // the pods a question is about (may be all of a namespace)
	// DriverPods are the driver's own pods (DriverPodsSelector), for
	// Check; nil when not gathered.
	DriverPods  []corev1.Pod
	PVCs        []corev1.PersistentVolumeClaim
	PVs         []corev1.PersistentVolume
	Attachments []storagev1.VolumeAttachment
	Nodes       []corev1.Node

	// SnapshotHandles maps each VolumeSnapshotContent's snapshot handle
	// (this driver's) to the content's name; nil when not gathered, and
	// SnapshotsNote says why.
	SnapshotHandles map[string]string
	SnapshotsNote   string

	// Inventory is the driver's disks on the RDS; nil when unavailable,
	// and InventoryNote says why.
	Inventory     *inventory.Inventory
	InventoryNote string

	// RDSHealth is the RDS's own health and load from the controller's
	// /metrics (issue 27); nil when not gathered, and RDSHealthNote says
	// why when a fetch was tried and failed.
	RDSHealth     *RDSHealth
	RDSHealthNote string
}

// NodeFact is what matters about a node for a volume.
type NodeFact struct {
	Name         string    `json:"name"`
	Exists       bool      `json:"exists"`
	UID          string    `json:"uid,omitempty"`
	Ready        string    `json:"ready,omitempty"` // True, False, Unknown
	ReadySince   time.Time `json:"readySince,omitempty"`
	Taints       []string  `json:"taints,omitempty"`
	OutOfService bool      `json:"outOfService,omitempty"`
}

// Healthy: the node exists, is Ready and is not out of service.
func (n NodeFact) Healthy() bool { return n.Exists && n.Ready == "True" && !n.OutOfService }

// AttachmentFact is one VolumeAttachment of a volume.
type AttachmentFact struct {
	Name     string    `json:"name"`
	Node     string    `json:"node"`
	Attached bool      `json:"attached"`
	Deleting bool      `json:"deleting,omitempty"`
	Error    string    `json:"error,omitempty"`
	Created  time.Time `json:"created"`
}

// ClaimFact is one node's claim on a volume.
type ClaimFact struct {
	Node string    `json:"node"`
	At   time.Time `json:"at"`
	UID  string    `json:"uid,omitempty"`
	// Attachment is the node's VolumeAttachment; empty when there is none.
	Attachment string `json:"attachment,omitempty"`
}

func (c *Cluster) node(name string) NodeFact {
	f := NodeFact{Name: name}
	for i := range c.Nodes {
		n := &c.Nodes[i]
		if n.Name != name {
			continue
		}
		f.Exists, f.UID = true, string(n.UID)
		f.Ready = "Unknown"
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				f.Ready, f.ReadySince = string(cond.Status), cond.LastTransitionTime.Time
			}
		}
		for _, t := range n.Spec.Taints {
			s := t.Key
			if t.Value != "" {
				s += "=" + t.Value
			}
			f.Taints = append(f.Taints, s+":"+string(t.Effect))
			if t.Key == OutOfServiceTaint {
				f.OutOfService = true
			}
		}
	}
	return f
}

func (c *Cluster) pv(name string) *corev1.PersistentVolume {
	for i := range c.PVs {
		if c.PVs[i].Name == name {
			return &c.PVs[i]
		}
	}
	return nil
}

func (c *Cluster) pvc(ns, name string) *corev1.PersistentVolumeClaim {
	for i := range c.PVCs {
		if c.PVCs[i].Namespace == ns && c.PVCs[i].Name == name {
			return &c.PVCs[i]
		}
	}
	return nil
}

func (c *Cluster) pod(ns, name string) *corev1.Pod {
	for i := range c.Pods {
		if c.Pods[i].Namespace == ns && c.Pods[i].Name == name {
			return &c.Pods[i]
		}
	}
	return nil
}

// ours: a PV of this driver.
func (c *Cluster) ours(pv *corev1.PersistentVolume) bool {
	return pv.Spec.CSI != nil && pv.Spec.CSI.Driver == c.DriverName
}

// attachments of a PV by this driver, by node name.
func (c *Cluster) attachments(pvName string) []AttachmentFact {
	var out []AttachmentFact
	for i := range c.Attachments {
		va := &c.Attachments[i]
		if va.Spec.Attacher != c.DriverName || va.Spec.Source.PersistentVolumeName == nil || *va.Spec.Source.PersistentVolumeName != pvName {
			continue
		}
		f := AttachmentFact{Name: va.Name, Node: va.Spec.NodeName, Attached: va.Status.Attached,
			Deleting: va.DeletionTimestamp != nil, Created: va.CreationTimestamp.Time}
		if va.Status.AttachError != nil {
			f.Error = va.Status.AttachError.Message
		}
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out
}

// claims of a PV, joined with its attachments.
func claimsOf(pv *corev1.PersistentVolume, atts []AttachmentFact) ([]ClaimFact, error) {
	m, err := ParseClaims(pv.Annotations[claims.ClaimsAnnotation])
	if err != nil {
		return nil, fmt.Errorf("PV %s: %w", pv.Name, err)
	}
	var out []ClaimFact
	for node, cl := range m {
		f := ClaimFact{Node: node, At: cl.At, UID: cl.UID}
		for _, a := range atts {
			if a.Node == node {
				f.Attachment = a.Name
			}
		}
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out, nil
}

// singleNode: the PV may be written by one node only.
func singleNode(pv *corev1.PersistentVolume) bool {
	for _, m := range pv.Spec.AccessModes {
		if m == corev1.ReadWriteMany || m == corev1.ReadOnlyMany {
			return false
		}
	}
	return true
}

func accessModes(pv *corev1.PersistentVolume) string {
	var s []string
	for _, m := range pv.Spec.AccessModes {
		s = append(s, string(m))
	}
	return strings.Join(s, ",")
}

// claimNames are the PVCs a pod mounts (generic ephemeral volumes
// included: their claim is <pod>-<volume>).
func claimNames(pod *corev1.Pod) []string {
	var out []string
	for _, v := range pod.Spec.Volumes {
		switch {
		case v.PersistentVolumeClaim != nil:
			out = append(out, v.PersistentVolumeClaim.ClaimName)
		case v.Ephemeral != nil:
			out = append(out, pod.Name+"-"+v.Name)
		}
	}
	return out
}

// active: a pod that still needs its volumes (not finished).
func active(pod *corev1.Pod) bool {
	return pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed
}

// podsUsing are the active pods in c that mount the claim ns/name.
func (c *Cluster) podsUsing(ns, name string) []*corev1.Pod {
	var out []*corev1.Pod
	for i := range c.Pods {
		p := &c.Pods[i]
		if p.Namespace != ns || !active(p) {
			continue
		}
		for _, cn := range claimNames(p) {
			if cn == name {
				out = append(out, p)
				break
			}
		}
	}
	return out
}

// Ago renders a duration for people: 7m, 2h5m, 40s.
func Ago(d time.Duration) string {
	d = d.Round(time.Second)
	switch {
	case d < time.Minute:
		return d.String()
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	default:
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	}
}
