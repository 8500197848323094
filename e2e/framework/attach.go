package framework

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
)

// ClaimsAnnotation is the driver's record, on the PV, of the nodes its
// publish decisions committed (docs/attachments.md). The harness tests the
// binary, so it names the annotation instead of importing pkg/informers.
const ClaimsAnnotation = "rds.csi.srvlab.io/claims"

// Event reasons the driver records on the PV and its claim
// (pkg/fencing/report.go); part of the operator's interface.
const (
	ReasonAttachConflict   = "AttachConflict"
	ReasonFenced           = "StaleAttachmentFenced"
	ReasonDetached         = "Detached"
	ReasonMigrationStarted = "LiveMigrationStarted"
)

// BlockPodOnNode is PodOnNode for a raw block claim: the claim is a
// device of the container (volumeDevices), as a KubeVirt launcher pod
// uses it.
func BlockPodOnNode(ns, name, node, claim string) *corev1.Pod {
	p := PodOnNode(ns, name, node, claim)
	c := &p.Spec.Containers[0]
	c.VolumeMounts = nil
	c.VolumeDevices = []corev1.VolumeDevice{{Name: "data", DevicePath: "/dev/data"}}
	return p
}

// Claims reads the PV's claims annotation: node name -> the time of the
// claim, RFC 3339 (a claim is an object with "at", "uid", ...; older
// drivers wrote the bare time).
func Claims(ctx context.Context, c kubernetes.Interface, pvName string) (map[string]string, error) {
	pv, err := c.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	raw, ok := pv.Annotations[ClaimsAnnotation]
	if !ok || raw == "" {
		return map[string]string{}, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		return nil, fmt.Errorf("PV %s annotation %s=%q: %w", pvName, ClaimsAnnotation, raw, err)
	}
	claims := map[string]string{}
	for n, v := range m {
		var at string
		if err := json.Unmarshal(v, &at); err != nil {
			var obj struct {
				At string `json:"at"`
			}
			if err := json.Unmarshal(v, &obj); err != nil {
				return nil, fmt.Errorf("PV %s: claim of %s %s: %w", pvName, n, v, err)
			}
			at = obj.At
		}
		claims[n] = at
	}
	return claims, nil
}

// ClaimsAre holds when the PV's claims name exactly nodes.
func ClaimsAre(c kubernetes.Interface, pvName string, nodes ...string) Condition {
	want := append([]string(nil), nodes...)
	sort.Strings(want)
	return func(ctx context.Context) (bool, string, error) {
		claims, err := Claims(ctx, c, pvName)
		if err != nil {
			return false, err.Error(), nil
		}
		got := make([]string, 0, len(claims))
		for n := range claims {
			got = append(got, n)
		}
		sort.Strings(got)
		return fmt.Sprint(got) == fmt.Sprint(want), fmt.Sprintf("claims %v", claims), nil
	}
}

// EventOn holds once an event with reason whose message contains every
// one of substrings is recorded on the object kind ns/name (ns "default"
// for cluster-scoped objects); it yields the event.
func EventOn(c kubernetes.Interface, ns, kind, name, reason string, out *corev1.Event, substrings ...string) Condition {
	return func(ctx context.Context) (bool, string, error) {
		evs, err := c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.kind=" + kind + ",involvedObject.name=" + name,
		})
		if err != nil {
			return false, err.Error(), nil
		}
		var seen []string
	next:
		for _, ev := range evs.Items {
			seen = append(seen, ev.Reason)
			if ev.Reason != reason {
				continue
			}
			for _, s := range substrings {
				if !strings.Contains(ev.Message, s) {
					continue next
				}
			}
			if out != nil {
				*out = ev
			}
			return true, "", nil
		}
		return false, fmt.Sprintf("%s %s/%s events %v", kind, ns, name, seen), nil
	}
}

// EventCount is how many times events with reason were recorded on the
// object (the sum of the events' counts: the recorder folds repeats into
// one event with a count).
func EventCount(ctx context.Context, c kubernetes.Interface, ns, kind, name, reason string) (int32, error) {
	evs, err := c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.kind=" + kind + ",involvedObject.name=" + name + ",reason=" + reason,
	})
	if err != nil {
		return 0, err
	}
	var n int32
	for _, ev := range evs.Items {
		n += max(ev.Count, 1)
	}
	return n, nil
}

// AttachRefused holds when the PV's VolumeAttachment for node is not
// attached and carries an attach error (the external-attacher records the
// driver's ControllerPublish error there) containing every one of
// substrings; it yields the VolumeAttachment. An attached VolumeAttachment
// for node is an error: the refusal this waits for can no longer come.
func AttachRefused(c kubernetes.Interface, pvName, node string, out *storagev1.VolumeAttachment, substrings ...string) Condition {
	return func(ctx context.Context) (bool, string, error) {
		vas, err := VolumeAttachmentsFor(ctx, c, pvName)
		if err != nil {
			return false, err.Error(), nil
		}
		for _, va := range vas {
			if va.Spec.NodeName != node {
				continue
			}
			if va.Status.Attached {
				return false, "", fmt.Errorf("VolumeAttachment %s of %s is attached to %s", va.Name, pvName, node)
			}
			e := va.Status.AttachError
			if e == nil {
				return false, "VolumeAttachment " + va.Name + " has no attach error yet", nil
			}
			for _, s := range substrings {
				if !strings.Contains(e.Message, s) {
					return false, fmt.Sprintf("VolumeAttachment %s attach error %q lacks %q", va.Name, e.Message, s), nil
				}
			}
			if out != nil {
				*out = va
			}
			return true, "", nil
		}
		return false, fmt.Sprintf("no VolumeAttachment of %s for node %s", pvName, node), nil
	}
}

// NotAttachedTo checks, at the moment it is called, that nothing reports
// pvName attached to node: neither a VolumeAttachment nor the Node's
// status.volumesAttached (which names the volume handle).
func NotAttachedTo(ctx context.Context, c kubernetes.Interface, pvName, handle, node string) error {
	vas, err := VolumeAttachmentsFor(ctx, c, pvName)
	if err != nil {
		return err
	}
	for _, va := range vas {
		if va.Spec.NodeName == node && va.Status.Attached {
			return fmt.Errorf("VolumeAttachment %s reports %s attached to %s", va.Name, pvName, node)
		}
	}
	n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return err
	}
	for _, av := range n.Status.VolumesAttached {
		if strings.HasSuffix(string(av.Name), "^"+handle) {
			return fmt.Errorf("node %s status lists %s attached", node, av.Name)
		}
	}
	return nil
}

// CreateVolumeAttachment asks for pvName on node the way the attach/detach
// controller does, but directly: a second attacher in the cluster, or one
// that raced Kubernetes' own Multi-Attach check. The external-attacher
// then calls ControllerPublishVolume and the driver's policy alone decides.
func CreateVolumeAttachment(ctx context.Context, c kubernetes.Interface, name, pvName, node string) (*storagev1.VolumeAttachment, error) {
	return c.StorageV1().VolumeAttachments().Create(ctx, &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: DriverName,
			NodeName: node,
			Source:   storagev1.VolumeAttachmentSource{PersistentVolumeName: ptr.To(pvName)},
		},
	}, metav1.CreateOptions{})
}

// RepublishAttachment marks an attached VolumeAttachment not attached
// (status subresource), which makes the external-attacher call
// ControllerPublishVolume for it again: the CSI re-publish a CO does when
// it has lost track of an attachment (the attacher's own reconciler does
// the same when ListVolumes disagrees with the VA). Whatever the driver
// answers ends up in the VolumeAttachment's status.
func RepublishAttachment(ctx context.Context, c kubernetes.Interface, vaName string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		va, err := c.StorageV1().VolumeAttachments().Get(ctx, vaName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		va.Status.Attached = false
		va.Status.AttachmentMetadata = nil
		_, err = c.StorageV1().VolumeAttachments().UpdateStatus(ctx, va, metav1.UpdateOptions{})
		return err
	})
}

// AttachmentFor returns the PV's VolumeAttachment for node, if any.
func AttachmentFor(ctx context.Context, c kubernetes.Interface, pvName, node string) (*storagev1.VolumeAttachment, error) {
	vas, err := VolumeAttachmentsFor(ctx, c, pvName)
	if err != nil {
		return nil, err
	}
	for i := range vas {
		if vas[i].Spec.NodeName == node {
			return &vas[i], nil
		}
	}
	return nil, nil
}

// PodGone holds once the pod no longer exists.
func PodGone(c kubernetes.Interface, ns, name string) Condition {
	return func(ctx context.Context) (bool, string, error) {
		p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) {
				return true, "", nil
			}
			return false, err.Error(), nil
		}
		return false, fmt.Sprintf("pod %s/%s deleting=%t", ns, name, p.DeletionTimestamp != nil), nil
	}
}

// PodTerminating holds once the pod has a deletion timestamp (evicted or
// deleted, not yet confirmed by a kubelet) or is gone.
func PodTerminating(c kubernetes.Interface, ns, name string) Condition {
	return func(ctx context.Context) (bool, string, error) {
		p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) {
				return true, "gone", nil
			}
			return false, err.Error(), nil
		}
		return p.DeletionTimestamp != nil, "not deleting", nil
	}
}

// FirstAttachedAt is the first moment after since at which the monitor saw
// pvName attached to node.
func (m *AttachmentMonitor) FirstAttachedAt(pvName, node string, since time.Time) (time.Time, bool) {
	for _, h := range m.History(pvName) {
		if !h.At.Before(since) && contains(h.Nodes, node) {
			return h.At, true
		}
	}
	return time.Time{}, false
}

// SeenAttached holds once the monitor has seen pvName attached to node at
// or after since, and sets *at to that moment. A wait on the API (a GET,
// VolumeAttached) can see the attachment before the monitor's watch
// delivers it; on a loaded machine (tests side by side) the watch was
// seen to lag, so read the monitor through this, not right after.
func (m *AttachmentMonitor) SeenAttached(pvName, node string, since time.Time, at *time.Time) Condition {
	return func(context.Context) (bool, string, error) {
		t, ok := m.FirstAttachedAt(pvName, node, since)
		if !ok {
			return false, fmt.Sprintf("the VolumeAttachment watch has not seen %s attached to %s; history %+v", pvName, node, m.History(pvName)), nil
		}
		*at = t
		return true, "", nil
	}
}

// AnyOf holds as soon as one of conds holds.
func AnyOf(conds ...Condition) Condition {
	return func(ctx context.Context) (bool, string, error) {
		var states []string
		for _, cond := range conds {
			done, state, err := cond(ctx)
			if err != nil {
				// The world may have moved on between the conditions (a
				// VolumeAttachment attached after VolumeAttached looked and
				// before AttachRefused did): one that holds now wins over
				// the error.
				for _, again := range conds {
					if done, state, err := again(ctx); err == nil && done {
						return true, state, nil
					}
				}
				return false, state, err
			}
			if done {
				return true, state, nil
			}
			states = append(states, state)
		}
		return false, strings.Join(states, "; "), nil
	}
}

// ReportNodeStatus posts the node's status as its kubelet would after a
// pod left: Ready with a fresh heartbeat and no volumesInUse (the fake
// kubelet mounts nothing). The attach/detach controller assumes a volume
// whose attach it started is mounted until a status update of the node
// says otherwise; without one it waits 6 minutes
// (maxWaitForUnmountDuration) before detaching, e.g. a refused
// VolumeAttachment whose pod was deleted.
func ReportNodeStatus(ctx context.Context, c kubernetes.Interface, node string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		for i := range n.Status.Conditions {
			if n.Status.Conditions[i].Type == corev1.NodeReady {
				n.Status.Conditions[i].LastHeartbeatTime = now
			}
		}
		n.Status.VolumesInUse = nil
		_, err = c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
}
