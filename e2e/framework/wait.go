package framework

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// PollInterval is how often the Wait helpers check their condition.
const PollInterval = 200 * time.Millisecond

// Condition reports whether what is awaited holds, and a short description
// of what it saw, which ends up in the failure message of a timeout.
type Condition func(ctx context.Context) (done bool, state string, err error)

// WaitFor polls cond until it holds, fails or timeout passes, and logs on
// the timeline how long it took. An error from cond ends the wait at once.
func WaitFor(ctx context.Context, tl *Timeline, timeout time.Duration, what string, cond Condition) (time.Duration, error) {
	t0 := time.Now()
	var last string
	err := wait.PollUntilContextTimeout(ctx, PollInterval, timeout, true, func(ctx context.Context) (bool, error) {
		done, state, err := cond(ctx)
		if state != "" {
			last = state
		}
		return done, err
	})
	took := time.Since(t0)
	if err != nil {
		tl.Logf("waiting for %s: gave up after %s: %v (last seen: %s)", what, took.Round(time.Millisecond), err, last)
		return took, fmt.Errorf("waiting %s for %s: %w (last seen: %s)", timeout, what, err, last)
	}
	tl.Logf("%s (after %s)", what, took.Round(time.Millisecond))
	return took, nil
}

// PVCBound holds when the claim is Bound; it yields the bound PV's name.
func PVCBound(c kubernetes.Interface, ns, name string, pvName *string) Condition {
	return func(ctx context.Context) (bool, string, error) {
		pvc, err := c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		if pvc.Status.Phase != corev1.ClaimBound {
			return false, fmt.Sprintf("phase %s", pvc.Status.Phase), nil
		}
		if pvName != nil {
			*pvName = pvc.Spec.VolumeName
		}
		return true, "", nil
	}
}

// PVGone holds once the PV no longer exists.
func PVGone(c kubernetes.Interface, name string) Condition {
	return func(ctx context.Context) (bool, string, error) {
		pv, err := c.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, "", nil
		}
		if err != nil {
			return false, err.Error(), nil
		}
		return false, fmt.Sprintf("phase %s, deleting=%t", pv.Status.Phase, pv.DeletionTimestamp != nil), nil
	}
}

// PVCGone holds once the claim no longer exists.
func PVCGone(c kubernetes.Interface, ns, name string) Condition {
	return func(ctx context.Context) (bool, string, error) {
		pvc, err := c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, "", nil
		}
		if err != nil {
			return false, err.Error(), nil
		}
		return false, fmt.Sprintf("phase %s, finalizers %v", pvc.Status.Phase, pvc.Finalizers), nil
	}
}

// VolumeAttachmentsFor lists the VolumeAttachments of a PV.
func VolumeAttachmentsFor(ctx context.Context, c kubernetes.Interface, pvName string) ([]storagev1.VolumeAttachment, error) {
	list, err := c.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []storagev1.VolumeAttachment
	for _, va := range list.Items {
		if p := va.Spec.Source.PersistentVolumeName; p != nil && *p == pvName {
			out = append(out, va)
		}
	}
	return out, nil
}

// AttachedNodes are the nodes a PV's VolumeAttachments report attached.
func AttachedNodes(ctx context.Context, c kubernetes.Interface, pvName string) ([]string, error) {
	vas, err := VolumeAttachmentsFor(ctx, c, pvName)
	if err != nil {
		return nil, err
	}
	var nodes []string
	for _, va := range vas {
		if va.Status.Attached {
			nodes = append(nodes, va.Spec.NodeName)
		}
	}
	return nodes, nil
}

// VolumeAttached holds when the PV's VolumeAttachment for node reports
// attached; it yields that VolumeAttachment.
func VolumeAttached(c kubernetes.Interface, pvName, node string, out *storagev1.VolumeAttachment) Condition {
	return func(ctx context.Context) (bool, string, error) {
		vas, err := VolumeAttachmentsFor(ctx, c, pvName)
		if err != nil {
			return false, err.Error(), nil
		}
		for _, va := range vas {
			if va.Spec.NodeName != node {
				continue
			}
			if !va.Status.Attached {
				state := "VolumeAttachment " + va.Name + " not attached"
				if e := va.Status.AttachError; e != nil {
					state += ": " + e.Message
				}
				return false, state, nil
			}
			if out != nil {
				*out = va
			}
			return true, "", nil
		}
		return false, fmt.Sprintf("no VolumeAttachment of %s for node %s (%d for other nodes)", pvName, node, len(vas)), nil
	}
}

// NoVolumeAttachment holds once the PV has no VolumeAttachment for node.
func NoVolumeAttachment(c kubernetes.Interface, pvName, node string) Condition {
	return func(ctx context.Context) (bool, string, error) {
		vas, err := VolumeAttachmentsFor(ctx, c, pvName)
		if err != nil {
			return false, err.Error(), nil
		}
		for _, va := range vas {
			if va.Spec.NodeName == node {
				return false, fmt.Sprintf("VolumeAttachment %s attached=%t deleting=%t", va.Name, va.Status.Attached, va.DeletionTimestamp != nil), nil
			}
		}
		return true, "", nil
	}
}

// NodeReady holds when the node's Ready condition has status want.
func NodeReady(c kubernetes.Interface, name string, want corev1.ConditionStatus) Condition {
	return func(ctx context.Context) (bool, string, error) {
		n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status == want, "Ready=" + string(cond.Status), nil
			}
		}
		return false, "no Ready condition", nil
	}
}

// NodeTaint holds when the node carries a taint with key (and value,
// unless value is "") exactly when want says so.
func NodeTaint(c kubernetes.Interface, name, key, value string, want bool) Condition {
	return func(ctx context.Context) (bool, string, error) {
		n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		for _, t := range n.Spec.Taints {
			if t.Key == key && (value == "" || t.Value == value) {
				return want, fmt.Sprintf("tainted %s=%s:%s", t.Key, t.Value, t.Effect), nil
			}
		}
		return !want, fmt.Sprintf("no %s taint (taints %v)", key, n.Spec.Taints), nil
	}
}

// AttachmentHost is the host NQN the driver gave node's attachment of PV
// pvName (publish_context "hostNQN", which the attacher keeps in the
// VolumeAttachment's status.attachmentMetadata); "" when none.
func AttachmentHost(ctx context.Context, c kubernetes.Interface, pvName, node string) (string, error) {
	vas, err := VolumeAttachmentsFor(ctx, c, pvName)
	if err != nil {
		return "", err
	}
	for _, va := range vas {
		if va.Spec.NodeName == node && va.DeletionTimestamp == nil {
			return va.Status.AttachmentMetadata["hostNQN"], nil
		}
	}
	return "", nil
}
