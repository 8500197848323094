//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/srvlab/rds-csi/e2e/framework"
	"github.com/srvlab/rds-csi/pkg/nodelease"
)

// driverNamespace is manifests/base's namespace, where the node plugins'
// Leases are kept.
const driverNamespace = "rds-csi"

// deployNodePluginIdentity creates what the storage-fencing component
// gives the node plugin for its Lease: its ServiceAccount (manifests/
// base), the Role and RoleBinding, and the admission policy.
func deployNodePluginIdentity(t *testing.T, e *framework.Env) {
	t.Helper()
	for _, f := range []string{"manifests/base/node-rbac.yaml", "manifests/overlays/storage-fencing/node-heartbeat.yaml",
		"manifests/overlays/storage-fencing/node-lease-policy.yaml"} {
		framework.DeployFile(e.Ctx, t, e.TL, e.CP, f)
	}
}

// nodePluginClient is a client of the node plugin's ServiceAccount on
// node, as the kubelet gives it to the node plugin's pod: a token bound to
// a pod on that node (created here, tolerating every taint like the
// DaemonSet's, never run: there is no kubelet), which names the node.
// Unbound: a token bound to nothing, which names no node.
func nodePluginClient(t *testing.T, e *framework.Env, node string, unbound bool) kubernetes.Interface {
	t.Helper()
	tok, err := framework.NodePluginToken(e.Ctx, e.CP, node, unbound)
	if err != nil {
		t.Fatal(err)
	}
	c, err := kubernetes.NewForConfig(&rest.Config{Host: e.CP.Env["KUBE_APISERVER_URL"], BearerToken: tok,
		TLSClientConfig: rest.TLSClientConfig{CAFile: e.CP.Env["KUBE_CA_FILE"]}, UserAgent: "rds-csi-node/e2e"})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// startNodeLease runs the driver's own renewer (pkg/nodelease, what
// --node-lease runs) for node as its node plugin would, until the returned
// func stops it.
func startNodeLease(t *testing.T, e *framework.Env, node string, duration time.Duration) func() {
	t.Helper()
	r, err := nodelease.NewRenewer(nodePluginClient(t, e, node, false), driverNamespace, node, duration, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.Ctx)
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}

// startNodeLeases starts each node's plugin Lease of duration d (none when
// d is zero) and waits until each has been renewed twice; it returns what
// stops each (a no-op when none was started).
func startNodeLeases(t *testing.T, e *framework.Env, d time.Duration, nodes ...string) map[string]func() {
	t.Helper()
	stop := map[string]func(){}
	for _, n := range nodes {
		stop[n] = func() {}
	}
	if d == 0 {
		return stop
	}
	done := e.TL.Step(fmt.Sprintf("every node plugin renews its own Lease (%s, every %s)", d, d/4))
	deployNodePluginIdentity(t, e)
	for _, n := range nodes {
		stop[n] = startNodeLease(t, e, n, d)
	}
	for _, n := range nodes {
		if _, err := framework.WaitFor(e.Ctx, e.TL, 30*time.Second, n+"'s plugin Lease renewed twice", pluginLeaseRenewed(e.Client, n, 2)); err != nil {
			t.Fatal(err)
		}
	}
	done()
	return stop
}

// pluginLeaseRenewed holds once node's plugin Lease has been renewed n
// times since the condition was made (the first read counts as none).
func pluginLeaseRenewed(c kubernetes.Interface, node string, n int) framework.Condition {
	name, _ := nodelease.Name(node)
	seen, last := -1, ""
	return func(ctx context.Context) (bool, string, error) {
		l, err := c.CoordinationV1().Leases(driverNamespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, "no Lease " + name + " yet", nil
		}
		if err != nil {
			return false, "", err
		}
		if l.ResourceVersion != last {
			seen, last = seen+1, l.ResourceVersion
		}
		return seen >= n, fmt.Sprintf("%s renewed %d times", name, max(seen, 0)), nil
	}
}

// Issue 23: a kubelet restart never fences a running node. The fast
// opt-in (kubelets renewing every 2.5 s, --heartbeat-threshold=6s,
// kube-controller-manager's default 40 s grace), three nodes, the volume
// on node-a, each node plugin renewing its own Lease of 10 s with the
// driver's renewer under the node plugin's ServiceAccount, RBAC and
// admission policy. node-a's kubelet stops for 75 s (past the heartbeat
// threshold, past the grace after which node-a turns NotReady, and past
// the NotReady threshold after that) while its node plugin renews: the
// export stays open to node-a's attachment throughout, its claim stays,
// and the driver logs no fence. Then node-a's node plugin stops too (the
// node is dead): it is fenced, cut off the RDS.
func TestNodePluginLeaseKeepsAKubeletRestartFromFencing(t *testing.T) {
	t.Parallel()
	nodes := []string{"node-a", "node-b", "node-c"}
	w, host := startHeartbeatWorld(t, framework.KubeletFastHeartbeatCadence,
		[]string{"--heartbeat-threshold=6s", "--node-lease-namespace=" + driverNamespace}, nodes...)
	e := w.e
	ctx, c, tl := e.Ctx, e.Client, e.TL

	stop := startNodeLeases(t, e, 10*time.Second, nodes...)

	done := tl.Step("node-a's kubelet stops for 75 s; its node plugin renews on")
	w.nodes["node-a"].Fail()
	if err := exportHeldFor(w.sim, w.handle, host, 75*time.Second); err != nil {
		t.Fatalf("with node-a's node plugin renewing: %v", err)
	}
	if _, err := framework.WaitFor(ctx, tl, 5*time.Second, "claims name node-a only", framework.ClaimsAre(c, w.pv, "node-a")); err != nil {
		t.Error(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 5*time.Second, "node-a NotReady (kube-controller-manager's grace passed)", framework.NodeReady(c, "node-a", corev1.ConditionUnknown)); err != nil {
		t.Error(err)
	}
	noFenceLogged(t, e.Dir, "rds-csi-driver")
	done()

	done = tl.Step("node-a's node plugin stops too: the node is dead and is fenced")
	stop["node-a"]()
	stopped := time.Now()
	cut, err := framework.WaitFor(ctx, tl, time.Minute, "node-a cut off the RDS (export closed or moved on)",
		framework.AnyOf(diskExport(w, false, ""), diskExportTo(w, "node-b"), diskExportTo(w, "node-c")))
	if err != nil {
		t.Fatal(err)
	}
	tl.Logf("NODE PLUGIN LEASE: node-a cut off %s after its node plugin's last renewal stopped (%s after its kubelet's stop; plugin Lease 10 s, threshold 6 s)",
		cut.Round(time.Millisecond), time.Since(stopped).Round(time.Second)+75*time.Second)
	done()
}

// Issue 23: the admission policy keeps each node plugin to its own node's
// Lease. With a token bound to a pod on node-a (as the kubelet gives the
// node plugin's pod), the node plugin's ServiceAccount may create and
// renew rds-csi-node-node-a and nothing else: node-b's Lease is refused
// (create and update), by the policy, not only by RBAC (which cannot
// restrict create by name). A token that names no node (not bound to a
// pod) writes no Lease at all. RBAC allows it nothing else either: no
// list, no Lease in kube-node-lease.
func TestNodeLeasePolicyKeepsEachNodePluginToItsOwnLease(t *testing.T) {
	t.Parallel()
	e := framework.NewEnv(t, framework.EnvOptions{})
	ctx, tl := e.Ctx, e.TL
	framework.Deploy(ctx, t, tl, e.CP, e.Dir)
	for _, n := range []string{"node-a", "node-b"} {
		e.NewNode(n)
	}
	deployNodePluginIdentity(t, e)
	a := nodePluginClient(t, e, "node-a", false)
	unbound := nodePluginClient(t, e, "node-a", true)
	leaseNamed := func(name string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: driverNamespace},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("node-a"), LeaseDurationSeconds: ptr.To(int32(40))}}
	}
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}

	done := tl.Step("the policy is in force: node-a's node plugin may not create node-b's Lease")
	refused := func(ctx context.Context) (bool, string, error) {
		_, err := a.CoordinationV1().Leases(driverNamespace).Create(ctx, leaseNamed("rds-csi-node-node-b"), dryRun)
		if err == nil {
			return false, "node-b's Lease accepted (the policy not in force yet)", nil
		}
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "only its own node's Lease") {
			return true, err.Error(), nil
		}
		return false, "", fmt.Errorf("creating node-b's Lease as node-a's node plugin: %v; want Forbidden by the policy", err)
	}
	if _, err := framework.WaitFor(ctx, tl, 30*time.Second, "node-b's Lease refused to node-a's node plugin", refused); err != nil {
		t.Fatal(err)
	}
	done()

	done = tl.Step("node-a's node plugin keeps its own Lease, and only it")
	leases := a.CoordinationV1().Leases(driverNamespace)
	own, err := leases.Create(ctx, leaseNamed("rds-csi-node-node-a"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("node-a's node plugin creating its own Lease: %v", err)
	}
	own.Spec.RenewTime = ptr.To(metav1.NowMicro())
	if _, err := leases.Update(ctx, own, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("node-a's node plugin renewing its own Lease: %v", err)
	}
	// node-b's, created by node-b's node plugin: node-a's may not renew it.
	b, err := nodePluginClient(t, e, "node-b", false).CoordinationV1().Leases(driverNamespace).Create(ctx, leaseNamed("rds-csi-node-node-b"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("node-b's node plugin creating its own Lease: %v", err)
	}
	b.Spec.RenewTime = ptr.To(metav1.NowMicro())
	if _, err := leases.Update(ctx, b, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "only its own node's Lease") {
		t.Errorf("node-a's node plugin renewing node-b's Lease: %v; want Forbidden by the policy", err)
	}
	if _, err := leases.Create(ctx, leaseNamed("rds-csi-controller-x"), dryRun); !apierrors.IsForbidden(err) {
		t.Errorf("node-a's node plugin creating another Lease of the namespace: %v; want Forbidden", err)
	}
	done()

	done = tl.Step("a token that names no node writes no Lease; RBAC grants nothing else")
	if _, err := unbound.CoordinationV1().Leases(driverNamespace).Create(ctx, leaseNamed("rds-csi-node-node-a-x"), dryRun); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "names no node") {
		t.Errorf("an unbound token of the node plugin creating a Lease: %v; want Forbidden, naming no node", err)
	}
	if _, err := leases.List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node-a's node plugin listing Leases: %v; want Forbidden (RBAC)", err)
	}
	kubelets := leaseNamed("node-b")
	kubelets.Namespace = "kube-node-lease"
	if _, err := a.CoordinationV1().Leases("kube-node-lease").Create(ctx, kubelets, dryRun); !apierrors.IsForbidden(err) {
		t.Errorf("node-a's node plugin creating a Lease in kube-node-lease: %v; want Forbidden (RBAC)", err)
	}
	if _, err := a.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node-a's node plugin reading its Node: %v; want Forbidden (RBAC)", err)
	}
	done()
}
