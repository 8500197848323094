package fencing

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	coordinationv1 "k8s.io/api/coordination/v1"

	"github.com/srvlab/rds-csi/pkg/nodelease"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
)

// pluginNamespace holds the node plugins' Leases in these tests.
const pluginNamespace = "rds-csi"

// pluginLeaseOf is node's plugin Lease as pkg/nodelease writes it.
func pluginLeaseOf(node, rv string, duration time.Duration) *coordinationv1.Lease {
	name, err := nodelease.Name(node)
	if err != nil {
		panic(err)
	}
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: pluginNamespace, ResourceVersion: rv,
			Labels: map[string]string{nodelease.Label: nodelease.LabelValue}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To(int32(duration / time.Second))},
	}
}

// observePluginLease is observeLease for the node plugin's Lease, as the
// controller's plugin Lease informer delivers it.
func (l *Liveness) observePluginLease(name, rv string, leaseFor time.Duration) bool {
	return l.Observe(PluginLease, name, rv, leaseFor)
}

// The other side of TestKubeletRestartOnAFastNodeFencesNobody: on the
// same fast pool node a loses power, its kubelet and its node plugin stop
// renewing together. It is fenced for its lost heartbeat at the first
// step past 6 s after the last renewal it was heard from (the plugin's or
// the kubelet's, whichever came last): the same threshold as with the
// kubelet's Lease alone, later only by the renewal that came after the
// kubelet's (at most one plugin interval, 2.5 s).
func TestDeadFastNodeWithAPluginLeaseIsFenced(t *testing.T) {
	clock := clocktesting.NewFakeClock(t0)
	cfg := Config{HeartbeatThreshold: 6 * time.Second}
	l := NewLiveness(LivenessConfig{Clock: clock, Policy: cfg, GuardShare: DefaultGuardShare})
	up := NodeState{Exists: true, UID: "u", Ready: true}
	nodes := []string{"a", "b", "c"}
	for _, n := range nodes {
		l.ObserveNode(n, up)
	}
	died := t0.Add(20 * time.Second)
	rv := 0
	var lastKubelet, lastHeard, fenced time.Time
	// 100 ms steps; kubelets renew every 2.5 s, the plugins too, 1.2 s
	// after their kubelet.
	for step := 1; step <= 400 && fenced.IsZero(); step++ {
		clock.Step(100 * time.Millisecond)
		for i, n := range nodes {
			if n == "a" && clock.Now().After(died) {
				continue
			}
			rv++
			switch (step + i*7) % 25 {
			case 0:
				l.observeLease(n, fmt.Sprint(rv), 10*time.Second)
				if n == "a" {
					lastKubelet, lastHeard = clock.Now(), clock.Now()
				}
			case 12:
				l.observePluginLease(n, fmt.Sprint(rv), 10*time.Second)
				if n == "a" {
					lastHeard = clock.Now()
				}
			}
		}
		if reason, stale := Stale(l.Decorate("a", up), clock.Now(), cfg); stale {
			if reason != FenceHeartbeatLost || !clock.Now().After(died) {
				t.Fatalf("a stale (%s) at %s, before it died", reason, clock.Now().Sub(t0))
			}
			fenced = clock.Now()
		}
		for _, n := range nodes[1:] {
			if _, stale := Stale(l.Decorate(n, up), clock.Now(), cfg); stale {
				t.Fatalf("%s, renewing, stale at %s", n, clock.Now().Sub(t0))
			}
		}
	}
	if fenced.IsZero() || fenced.Sub(lastHeard) != 6100*time.Millisecond {
		t.Fatalf("a fenced %s after it was last heard from (zero: never); want at the first step past 6 s", fenced.Sub(lastHeard))
	}
	if d := fenced.Sub(lastKubelet); d > 6100*time.Millisecond+2500*time.Millisecond {
		t.Fatalf("a fenced %s after its kubelet's last renewal: more than its threshold and one plugin interval", d)
	}
}

// A kubelet away for minutes (a crash loop) on a node that runs on: kube-
// controller-manager marks the node NotReady after its grace, and the
// NotReady threshold would fence it as well as the heartbeat's. While its
// node plugin renews, neither does; once the plugin stops too, the node is
// fenced at the plugin's threshold.
func TestKubeletCrashLoopWithThePluginRenewingFencesNobody(t *testing.T) {
	clock := clocktesting.NewFakeClock(t0)
	cfg := Config{HeartbeatThreshold: 20 * time.Second, NotReadyThreshold: 20 * time.Second}
	l := NewLiveness(LivenessConfig{Clock: clock, Policy: cfg, GuardShare: DefaultGuardShare})
	up := NodeState{Exists: true, UID: "u", Ready: true}
	down := NodeState{Exists: true, UID: "u"}
	renew := leaseRenewer(l, 40*time.Second)
	rv := 0
	plugin := func(nodes ...string) {
		for _, n := range nodes {
			rv++
			l.observePluginLease(n, "p"+fmt.Sprint(rv), 40*time.Second)
		}
	}
	for _, n := range []string{"a", "b", "c"} {
		l.ObserveNode(n, up)
	}
	renew("a", "b", "c")
	plugin("a", "b", "c")
	// a's kubelet is down from here on; NotReady after 40 s.
	for i := 1; i <= 30; i++ { // 5 minutes
		clock.Step(10 * time.Second)
		renew("b", "c")
		plugin("a", "b", "c")
		if i == 4 {
			l.ObserveNode("a", down)
		}
		s := l.Decorate("a", down)
		if i < 4 {
			s = l.Decorate("a", up)
		}
		if reason, stale := Stale(s, clock.Now(), cfg); stale {
			t.Fatalf("a stale (%s) %s into its kubelet's crash loop, its plugin renewing", reason, clock.Now().Sub(t0))
		}
	}
	if l.Holding() {
		t.Fatal("guard holding: one node of three without its kubelet is no mass outage")
	}
	// The node dies: its plugin stops too.
	last := clock.Now()
	for clock.Now().Sub(last) <= 20*time.Second {
		clock.Step(time.Second)
		renew("b", "c")
		plugin("b", "c")
		if reason, stale := Stale(l.Decorate("a", down), clock.Now(), cfg); stale {
			// NotReady is timed from the plugin's last renewal too: both
			// thresholds (20 s) pass at once.
			if got := clock.Now().Sub(last); got != 21*time.Second {
				t.Fatalf("a stale (%s) %s after its plugin's last renewal; want at 21 s (thresholds 20 s)", reason, got)
			}
			return
		}
	}
	t.Fatal("a not fenced 21 s after its plugin and kubelet both went silent")
}

// A node plugin away (a DaemonSet rollout, a crash) while the kubelet
// renews: the node is heard from its kubelet, as it is without a plugin
// Lease.
func TestPluginAwayWithTheKubeletRenewingFencesNobody(t *testing.T) {
	clock := clocktesting.NewFakeClock(t0)
	cfg := Config{HeartbeatThreshold: 20 * time.Second}
	l := NewLiveness(LivenessConfig{Clock: clock, Policy: cfg, GuardShare: DefaultGuardShare})
	up := NodeState{Exists: true, UID: "u", Ready: true}
	renew := leaseRenewer(l, 40*time.Second)
	for _, n := range []string{"a", "b", "c"} {
		l.ObserveNode(n, up)
		l.observePluginLease(n, "p", 40*time.Second)
	}
	for i := 0; i < 12; i++ { // 2 minutes, no plugin renewing anywhere
		clock.Step(10 * time.Second)
		renew("a", "b", "c")
		for _, n := range []string{"a", "b", "c"} {
			if reason, stale := Stale(l.Decorate(n, up), clock.Now(), cfg); stale {
				t.Fatalf("%s stale (%s) with its kubelet renewing and its plugin away", n, reason)
			}
		}
	}
}

// An API server outage silences both heartbeats of every node: the guard
// holds and nobody is fenced, as with the kubelets' Leases alone.
func TestOutageSilencesBothHeartbeatsFencesNobody(t *testing.T) {
	clock := clocktesting.NewFakeClock(t0)
	cfg := Config{HeartbeatThreshold: 20 * time.Second, NotReadyThreshold: 20 * time.Second}
	l := NewLiveness(LivenessConfig{Clock: clock, Policy: cfg, GuardShare: DefaultGuardShare})
	up := NodeState{Exists: true, UID: "u", Ready: true}
	nodes := []string{"a", "b", "c"}
	for i, n := range nodes {
		l.ObserveNode(n, up)
		l.observeLease(n, fmt.Sprint(i), 40*time.Second)
		clock.Step(3 * time.Second)
		l.observePluginLease(n, fmt.Sprint(i), 40*time.Second)
	}
	for i := 0; i < 600; i++ { // 60 s of silence
		clock.Step(100 * time.Millisecond)
		for _, n := range nodes {
			if reason, stale := Stale(l.Decorate(n, up), clock.Now(), cfg); stale {
				t.Fatalf("%s stale (%s) %s into the outage", n, reason, clock.Now().Sub(t0))
			}
		}
	}
	if !l.Holding() {
		t.Fatal("guard not holding with every heartbeat of every node silent for 60 s")
	}
}

// The fence's live read reads the node plugin's Lease too: a renewal the
// plugin Lease watch has not delivered yet (a paused controller, a slow
// watch) cancels the fence of a node whose kubelet is away. A plugin Lease
// the live read does not find is forgotten, and the node is decided on
// its kubelet's alone.
func TestLivePluginLeaseReadCancelsTheFence(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Now())
	cfg := Config{HeartbeatThreshold: 20 * time.Second}
	l := NewLiveness(LivenessConfig{Clock: clock, Policy: cfg, GuardShare: 0})
	l.pluginNamespace = pluginNamespace // as LivenessConfig.PluginLeaseNamespace sets it
	client := fake.NewClientset(node("node-a", true, t0), lease("node-a", "7"), pluginLeaseOf("node-a", "9", 40*time.Second))
	l.ObserveNode("node-a", NodeStateOf(node("node-a", true, t0)))
	l.observeLease("node-a", "7", 0)
	l.observePluginLease("node-a", "8", 40*time.Second)
	clock.Step(21 * time.Second)
	l.client = client
	s, err := l.LiveNode(context.Background(), "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if reason, stale := Stale(s, clock.Now(), cfg); stale {
		t.Fatalf("stale (%s) although the live plugin Lease shows a renewal the watch had not delivered", reason)
	}
	// The plugin uninstalled: its Lease gone; the kubelet still silent.
	name, _ := nodelease.Name("node-a")
	if err := client.CoordinationV1().Leases(pluginNamespace).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	clock.Step(21 * time.Second)
	if s, err = l.LiveNode(context.Background(), "node-a"); err != nil {
		t.Fatal(err)
	}
	if reason, stale := Stale(s, clock.Now(), cfg); !stale || reason != FenceHeartbeatLost {
		t.Fatalf("Stale %q %t with the kubelet silent for 42 s and no plugin Lease; want HeartbeatLost", reason, stale)
	}
}

// A plugin Lease that cannot be read (the controller has no access to the
// namespace, an API error) does not stop the fence of a node that has no
// plugin Lease known: it is decided on its kubelet's alone. Before, every
// such fence failed its live read and was retried for ever: a dead node
// was never fenced (e2e TestUnattendedFailoverKubeletCadence, the driver
// outside a pod, reading the Leases in "default"). A node whose plugin
// Lease is known stays unconfirmed: its plugin may have renewed. So does
// every node before the plugin Leases were first listed: the cache knows
// nothing then, and a node whose kubelet restarts while its plugin renews
// was fenced on the kubelet's silence for one failed GET (a controller
// just started, a new leader whose plugin Lease list is slow or failing).
func TestUnreadablePluginLease(t *testing.T) {
	cfg := Config{HeartbeatThreshold: 20 * time.Second}
	for _, tc := range []struct {
		name          string
		listed, known bool
		unconfirmed   bool
		readErr       error
	}{
		{"listed, none known: decided on the kubelet's", true, false, false, apierrors.NewForbidden(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, "rds-csi-node-node-a", errors.New("no access"))},
		{"listed, known: unconfirmed", true, true, true, apierrors.NewForbidden(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, "rds-csi-node-node-a", errors.New("no access"))},
		{"not listed yet: unconfirmed", false, false, true, apierrors.NewInternalError(errors.New("etcdserver: request timed out"))},
	} {
		clock := clocktesting.NewFakeClock(time.Now())
		l := NewLiveness(LivenessConfig{Clock: clock, Policy: cfg, GuardShare: 0})
		l.pluginNamespace = pluginNamespace // as LivenessConfig.PluginLeaseNamespace sets it
		if tc.listed {
			l.PluginLeasesListed()
		}
		client := fake.NewClientset(node("node-a", true, t0), lease("node-a", "7"), pluginLeaseOf("node-a", "9", 40*time.Second))
		client.PrependReactor("get", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
			if a.GetNamespace() == pluginNamespace {
				return true, nil, tc.readErr
			}
			return false, nil, nil
		})
		l.ObserveNode("node-a", NodeStateOf(node("node-a", true, t0)))
		l.observeLease("node-a", "7", 0)
		if tc.known {
			l.observePluginLease("node-a", "p1", 40*time.Second)
		}
		clock.Step(21 * time.Second)
		l.client = client
		s, err := l.LiveNode(context.Background(), "node-a")
		if tc.unconfirmed {
			if err == nil {
				t.Errorf("%s, the plugin Lease unreadable: confirmed (%+v); want an error (no fence)", tc.name, s)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s, the plugin Lease unreadable: %v; want the node decided on its kubelet's Lease", tc.name, err)
		}
		if reason, stale := Stale(s, clock.Now(), cfg); !stale || reason != FenceHeartbeatLost {
			t.Fatalf("%s, kubelet silent 21 s: Stale %q %t; want HeartbeatLost", tc.name, reason, stale)
		}
	}
}

// Issue 38: why each Lease is not timed against its own cadence. A node's
// kubelet is away (a restart, a crash loop) while the node runs on, its
// node plugin renewing every 5 s (a Lease of 20 s); one of the plugin's
// renewals comes 6 s late, 11 s after the one before (as late as
// TestLateRenewalFencesNobody's kubelet renewal, 16 s after its last at
// 10 s). Timed against the threshold (20 s), the node is heard from
// throughout. Timed against two of the plugin's own renewals (10 s), so
// that a dead node would be fenced as soon as with the kubelet's Lease
// alone, it was fenced 10.1 s after that renewal: a running node's disks
// cut for seconds of failover. Once the plugin stops too (the node dies),
// the node is fenced at the first step past the threshold after its last
// sign of life.
func TestLatePluginRenewalDuringAKubeletRestartFencesNobody(t *testing.T) {
	clock := clocktesting.NewFakeClock(t0)
	cfg := Config{HeartbeatThreshold: 20 * time.Second}
	l := NewLiveness(LivenessConfig{Clock: clock, Policy: cfg, GuardShare: DefaultGuardShare})
	up := NodeState{Exists: true, UID: "u", Ready: true}
	nodes := []string{"a", "b", "c"}
	for _, n := range nodes {
		l.ObserveNode(n, up)
	}
	rv := 0
	var lastPlugin, fenced time.Time
	// 100 ms steps; kubelets renew every 10 s and plugins every 5 s, each
	// node at its own phase. a's kubelet is away from 30 s on; a's plugin
	// skips its renewal due at 60 s and renews 6 s late; it stops at 90 s.
	for step := 1; step <= 1500 && fenced.IsZero(); step++ {
		clock.Step(100 * time.Millisecond)
		at := clock.Now().Sub(t0)
		for i, n := range nodes {
			rv++
			if (step+i*13)%100 == 0 && (n != "a" || at <= 30*time.Second) {
				l.Observe(KubeletLease, n, fmt.Sprint(rv), 40*time.Second)
			}
			if n == "a" && (step > 900 || step == 600 || step == 650) {
				continue // stopped; the renewals due at 60 and 65 s
			}
			if (step+i*7)%50 == 0 || (n == "a" && step == 660) {
				l.Observe(PluginLease, n, fmt.Sprint(rv), 20*time.Second)
				if n == "a" {
					lastPlugin = clock.Now()
				}
			}
		}
		if reason, stale := Stale(l.Decorate("a", up), clock.Now(), cfg); stale {
			if at <= 90*time.Second {
				t.Fatalf("a stale (%s) at %s, %s after its plugin's last renewal: its kubelet away, its plugin renewing (one renewal late)",
					reason, at, clock.Now().Sub(lastPlugin))
			}
			fenced = clock.Now()
		}
		for _, n := range nodes[1:] {
			if _, stale := Stale(l.Decorate(n, up), clock.Now(), cfg); stale {
				t.Fatalf("%s, renewing, stale at %s", n, at)
			}
		}
	}
	if got := fenced.Sub(lastPlugin); fenced.IsZero() || got != 20100*time.Millisecond {
		t.Fatalf("a fenced %s after its plugin's last renewal (zero: never); want at the first step past the threshold (20 s)", got)
	}
}
