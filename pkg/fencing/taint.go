package fencing

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/srvlab/rds-csi/pkg/claims"
)

// DriverOutOfServiceValue is the value of the out-of-service taint the
// driver puts on a node it fenced (--out-of-service-taint): Kubernetes
// reads only the key, the value tells the driver's taint from an
// operator's, which the driver never removes.
const DriverOutOfServiceValue = "rds-csi-fenced"

// Tainter puts the out-of-service taint on a node whose volumes storage
// fencing has cut off, so that Kubernetes deletes its pods and detaches
// its volumes at once (non-graceful node shutdown) instead of after 6
// minutes or never, and removes that taint when the node is Ready again.
type Tainter struct {
	client kubernetes.Interface
	driver string
	live   *Liveness
}

// NewTainter returns a Tainter for the CSI driver named driver, judging
// nodes by the controller's view of their heartbeats (live): a node whose
// kubelet stopped renewing its Lease is tainted although its Ready
// condition (kube-controller-manager's, which lags by its grace period)
// still says True.
func NewTainter(client kubernetes.Interface, driver string, live *Liveness) *Tainter {
	return &Tainter{client: client, driver: driver, live: live}
}

// TaintOutOfService taints node out of service, unless it has attachments
// of another driver (their storage is not known to be cut off: declaring
// the node down would let them be written from two nodes) or it is Ready
// again; those are ErrNotTainted.
func (t *Tainter) TaintOutOfService(ctx context.Context, node string) error {
	vas, err := t.client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing VolumeAttachments: %w", err)
	}
	for _, va := range vas.Items {
		if va.Spec.NodeName == node && va.Spec.Attacher != t.driver {
			return fmt.Errorf("%w: node %s also has volumes of %s (VolumeAttachment %s), which rds-csi cannot cut off", ErrNotTainted, node, va.Spec.Attacher, va.Name)
		}
	}
	return t.updateNode(ctx, node, func(n *corev1.Node) (bool, error) {
		s, err := t.live.confirmLive(ctx, t.client, node, NodeStateOf(n))
		if err != nil {
			return false, err
		}
		if s.Ready && !t.live.HeartbeatLost(s) {
			return false, fmt.Errorf("%w: node %s is Ready again", ErrNotTainted, node)
		}
		for _, taint := range n.Spec.Taints {
			if taint.Key == OutOfServiceTaint {
				return false, nil
			}
		}
		now := metav1.Now()
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: OutOfServiceTaint, Value: DriverOutOfServiceValue, Effect: corev1.TaintEffectNoExecute, TimeAdded: &now})
		return true, nil
	})
}

// RemoveTaint removes the driver's out-of-service taint from node once it
// is Ready again (an operator's taint, of another value, stays) and, when
// timed by a Liveness, still recovered: its heartbeat may have lapsed
// again since the worker found it recovered (the removal runs later, on
// the reaction queue), and its Ready condition lags by
// kube-controller-manager's grace period.
func (t *Tainter) RemoveTaint(ctx context.Context, node string) error {
	return t.updateNode(ctx, node, func(n *corev1.Node) (bool, error) {
		s := NodeStateOf(n)
		if !s.Ready || !HasDriverTaint(n) {
			return false, nil
		}
		if t.live != nil {
			// A renewal the watch has not delivered yet counts.
			if _, err := t.live.confirmLive(ctx, t.client, node, s); err != nil {
				return false, err
			}
			if ok, _ := t.live.Recovered(node, s); !ok {
				return false, nil
			}
		}
		kept := n.Spec.Taints[:0:0]
		for _, taint := range n.Spec.Taints {
			if !(taint.Key == OutOfServiceTaint && taint.Value == DriverOutOfServiceValue) {
				kept = append(kept, taint)
			}
		}
		n.Spec.Taints = kept
		return true, nil
	})
}

// updateNode reads node live and writes it back when change says so,
// again on a conflict; a node that is gone needs nothing.
func (t *Tainter) updateNode(ctx context.Context, node string, change func(*corev1.Node) (bool, error)) error {
	return claims.RetryConflicts(ctx, func() error {
		n, err := t.client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if write, err := change(n); err != nil || !write {
			return err
		}
		_, err = t.client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
}
