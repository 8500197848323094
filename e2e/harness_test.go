//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/srvlab/rds-csi/e2e/framework"
)

// The fake kubelets are what the node-failure scenarios stand on: a node
// whose Lease is renewed stays Ready; once Fail stops the renewals,
// kube-controller-manager's node lifecycle controller marks it Unknown and
// taints it unreachable after the grace period; Recover brings it back.
func TestFakeKubeletFailAndRecover(t *testing.T) {
	t.Parallel()
	const grace = 8 * time.Second
	e := framework.NewEnv(t, framework.EnvOptions{ControlPlane: framework.ControlPlaneOptions{NodeMonitorGracePeriod: grace}})
	ctx, c, tl := e.Ctx, e.Client, e.TL
	a := e.NewNode("node-a")
	e.NewNode("node-b")

	// Registered as a kubelet would be: controller-managed attach/detach,
	// the driver in its CSINode, the topology label.
	n, err := c.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n.Annotations[framework.ControllerManagedAttachAnnotation] != "true" || n.Labels[framework.TopologyKey] != framework.RDSName {
		t.Errorf("node-a annotations %v labels %v", n.Annotations, n.Labels)
	}
	csiNode, err := c.StorageV1().CSINodes().Get(ctx, "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if d := csiNode.Spec.Drivers; len(d) != 1 || d[0].Name != framework.DriverName || d[0].NodeID != "node-a" {
		t.Errorf("CSINode node-a drivers %+v", d)
	}
	for _, name := range []string{"node-a", "node-b"} {
		if _, err := framework.WaitFor(ctx, tl, time.Minute, name+" Ready without the not-ready taint", nodeReadyUntainted(c, name)); err != nil {
			t.Fatal(err)
		}
	}

	a.Fail()
	if _, err := framework.WaitFor(ctx, tl, grace+time.Minute, "node-a Unknown and tainted unreachable", nodeTainted(c, "node-a", corev1.ConditionUnknown, corev1.TaintNodeUnreachable)); err != nil {
		t.Fatal(err)
	}
	// node-b's kubelet still renews: it must still be Ready.
	if done, state, err := framework.NodeReady(c, "node-b", corev1.ConditionTrue)(ctx); err != nil || !done {
		t.Errorf("node-b: %s %v, want Ready=True while its lease is renewed", state, err)
	}

	if err := a.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "node-a Ready again without taints", nodeReadyUntainted(c, "node-a")); err != nil {
		t.Fatal(err)
	}

	if err := a.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "node-a's CSINode garbage-collected with its Node", func(ctx context.Context) (bool, string, error) {
		_, err := c.StorageV1().CSINodes().Get(ctx, "node-a", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, "", nil
		}
		return false, fmt.Sprintf("get: %v", err), nil
	}); err != nil {
		t.Fatal(err)
	}
}

func nodeTainted(c kubernetes.Interface, name string, ready corev1.ConditionStatus, taint string) framework.Condition {
	return func(ctx context.Context) (bool, string, error) {
		done, state, err := framework.NodeReady(c, name, ready)(ctx)
		if err != nil || !done {
			return false, state, err
		}
		n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		keys := taintKeys(n)
		return slices.Contains(keys, taint), fmt.Sprintf("%s taints %v", state, keys), nil
	}
}

func nodeReadyUntainted(c kubernetes.Interface, name string) framework.Condition {
	return func(ctx context.Context) (bool, string, error) {
		done, state, err := framework.NodeReady(c, name, corev1.ConditionTrue)(ctx)
		if err != nil || !done {
			return false, state, err
		}
		n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		keys := taintKeys(n)
		return len(keys) == 0, fmt.Sprintf("%s taints %v", state, keys), nil
	}
}

func taintKeys(n *corev1.Node) []string {
	var keys []string
	for _, t := range n.Spec.Taints {
		keys = append(keys, t.Key)
	}
	return keys
}
