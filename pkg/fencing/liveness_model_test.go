package fencing

import (
	"cmp"
	"context"
	"errors"
	"math/rand"
	"os"
	"strconv"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/srvlab/rds-csi/pkg/nodelease"
)

// modelScenario is one set-up the heartbeat model check runs.
type modelScenario struct {
	name string
	// threshold: --heartbeat-threshold.
	threshold time.Duration
	// fastPool: the kubelets' Leases state 10 s (a renewal every 2.5 s),
	// one of the five still 40 s; else every kubelet's states 40 s
	// (cadence) or nothing (renewals at random moments).
	fastPool bool
	// cadence: every Lease is renewed at its writer's own cadence (a
	// quarter of its duration, up to 4 % jitter, one renewal in ten late,
	// a failed one retried with backoff); else the kubelets renew at
	// random moments.
	cadence bool
	// plugin: the node plugins' Lease duration (0: no plugin Leases);
	// straggler: one node's plugin still states this one (0: none).
	plugin, straggler time.Duration
	// late: now and then a renewal is late by up to this long (0: most
	// of its writer's interval).
	late time.Duration
	// promptWatch: the controller's watch delivers every renewal within
	// a tick (else late, in bursts, reordered: which also makes every
	// heartbeat look silent now and then, a gap that holds every fence).
	promptWatch bool
	seeds       int64
}

// The heartbeat model check (issues 23 and 38). Kubelets and node plugins
// renew their Leases in the API (each renewal stamped with the moment it
// reached the API), each writer at its own cadence and phase, a failed
// renewal retried with backoff; the controller's watch delivers the
// renewals late, in bursts, reordered (or promptly), none while the API
// is down (then every read and every renewal fails); the controller's
// clock runs on, and it looks at every node's timing at least every
// 250 ms, as its node controller does at each node's threshold. Nodes die
// (both writers stop) and come back; a fenced node is tainted out of
// service until it is back. On nodes that run on, a kubelet restarts
// (stops renewing for a while, its plugin renewing) or a node plugin is
// away (a rollout, a crash: its kubelet renewing), never both at once (a
// node that stops both looks dead: docs/attachments.md). At random
// moments the fencer looks at every node: timed by the Liveness, a stale
// one is confirmed by a live read (which fails while the API is down, and
// then nothing is fenced).
//
// Invariants:
//   - a node is never fenced for a lost heartbeat while the API shows its
//     kubelet's or its plugin's Lease renewed within that Lease's
//     threshold (modelThreshold: the configured one, raised to two of the
//     writer's renewals);
//   - where the writers keep their cadence, a node that runs is never
//     fenced while one of its writers has not failed a renewal since its
//     last: each writer is allowed one fault at a time, a renewal late by
//     up to the scenario's lateness or an outage. (Two are too many: an
//     API outage of a few seconds, too short for the guard, that makes a
//     renewal already late fail, or one writer's renewal fail while the
//     other is away, leaves that node's Lease stale past its threshold in
//     the API itself.)
//
// The late renewal of TestLateRenewalFencesNobody (6 s late: 16 s after
// the last at 10 s) on plugins renewing every 5 s, watched promptly, is
// what the second invariant refuses of timing each Lease against its own
// cadence (the plugin's silence judged by two of its renewals, 10 s, the
// kubelet's by the threshold): a node whose kubelet is away was fenced
// 10.5 s after its plugin's last renewal (seed 11 of that scenario; unit
// test TestLatePluginRenewalDuringAKubeletRestartFencesNobody).
//
// Each scenario runs its seeds (8, or 16); RDS_CSI_HEARTBEAT_MODEL_SEEDS=N
// runs 1 to N instead (a failure names its scenario, seed and step).
func TestHeartbeatModel(t *testing.T) {
	for _, sc := range []modelScenario{
		{name: "kubelets renewing at random moments, threshold 20 s", threshold: 20 * time.Second, seeds: 8},
		{name: "fast pool, threshold 6 s", threshold: 6 * time.Second, fastPool: true, cadence: true, seeds: 8},
		{name: "fast pool, threshold 6 s, node plugins of 10 s", threshold: 6 * time.Second, fastPool: true, cadence: true, plugin: 10 * time.Second, seeds: 8},
		{name: "default kubelets, threshold 20 s, node plugins of 40 s", threshold: 20 * time.Second, cadence: true, plugin: 40 * time.Second, seeds: 8},
		{name: "default kubelets, threshold 20 s, node plugins of 20 s", threshold: 20 * time.Second, cadence: true, plugin: 20 * time.Second, seeds: 8},
		{name: "default kubelets, threshold 20 s, node plugins of 20 s, one of 40 s", threshold: 20 * time.Second, cadence: true, plugin: 20 * time.Second, straggler: 40 * time.Second, seeds: 8},
		{name: "default kubelets, threshold 20 s, node plugins of 10 s", threshold: 20 * time.Second, cadence: true, plugin: 10 * time.Second, seeds: 8},
		{name: "default kubelets, threshold 20 s, node plugins of 40 s, renewals up to 6 s late", threshold: 20 * time.Second, cadence: true, plugin: 40 * time.Second, late: 6 * time.Second, seeds: 8},
		{name: "default kubelets, threshold 20 s, node plugins of 20 s, renewals up to 6 s late", threshold: 20 * time.Second, cadence: true, plugin: 20 * time.Second, late: 6 * time.Second, seeds: 8},
		{name: "default kubelets, threshold 20 s, node plugins of 40 s, prompt watch", threshold: 20 * time.Second, cadence: true, plugin: 40 * time.Second, promptWatch: true, seeds: 8},
		{name: "default kubelets, threshold 20 s, node plugins of 20 s, prompt watch", threshold: 20 * time.Second, cadence: true, plugin: 20 * time.Second, promptWatch: true, seeds: 8},
		{name: "default kubelets, threshold 20 s, node plugins of 20 s, prompt watch, renewals up to 6 s late", threshold: 20 * time.Second, cadence: true, plugin: 20 * time.Second, late: 6 * time.Second, promptWatch: true, seeds: 16},
		{name: "fast pool, threshold 6 s, node plugins of 10 s, prompt watch", threshold: 6 * time.Second, fastPool: true, cadence: true, plugin: 10 * time.Second, promptWatch: true, seeds: 8},
	} {
		if n, err := strconv.ParseInt(os.Getenv("RDS_CSI_HEARTBEAT_MODEL_SEEDS"), 10, 64); err == nil && n > 0 {
			sc.seeds = n
		}
		t.Run(sc.name, func(t *testing.T) {
			fences := 0
			for seed := int64(1); seed <= sc.seeds; seed++ {
				fences += heartbeatModel(t, sc, seed)
			}
			if fences < 10 {
				t.Errorf("%d fences decided in all: the model does not exercise lost heartbeats", fences)
			}
		})
	}
}

// modelThreshold is the threshold of a Lease stating leaseFor (0: none),
// the kubelet's or the node plugin's, as docs/attachments.md states the
// rule: the configured one, never shorter than two of its writer's
// renewals.
func modelThreshold(configured, leaseFor time.Duration) time.Duration {
	if leaseFor == 0 {
		leaseFor = 40 * time.Second
	}
	return max(configured, leaseFor/2)
}

// heartbeatModel runs sc with seed and returns how many fences it
// decided.
func heartbeatModel(t *testing.T, sc modelScenario, seed int64) int {
	rng := rand.New(rand.NewSource(seed))
	clock := clocktesting.NewFakeClock(t0)
	nodes := []string{"n0", "n1", "n2", "n3", "n4"}
	plugins := sc.plugin > 0
	// leaseFor: each writer's Lease duration (0: none stated).
	leaseFor := map[Signal]map[string]time.Duration{KubeletLease: {}, PluginLease: {}}
	for _, n := range nodes {
		switch {
		case sc.fastPool:
			leaseFor[KubeletLease][n] = 10 * time.Second
		case sc.cadence:
			leaseFor[KubeletLease][n] = 40 * time.Second
		}
		leaseFor[PluginLease][n] = sc.plugin
	}
	if sc.fastPool {
		// A fast pool with one kubelet not yet reconfigured (more slow
		// ones would look suspect together and hold the guard).
		leaseFor[KubeletLease][nodes[rng.Intn(len(nodes))]] = 40 * time.Second
	}
	if sc.straggler > 0 {
		leaseFor[PluginLease][nodes[rng.Intn(len(nodes))]] = sc.straggler
	}
	own := func(sig Signal, n string) time.Duration {
		return modelThreshold(sc.threshold, leaseFor[sig][n])
	}
	cfg := Config{HeartbeatThreshold: sc.threshold}
	l := NewLiveness(LivenessConfig{Clock: clock, Policy: cfg, GuardShare: DefaultGuardShare})
	if plugins {
		l.pluginNamespace = pluginNamespace // as LivenessConfig.PluginLeaseNamespace sets it
	}
	var objs []runtime.Object
	for _, n := range nodes {
		objs = append(objs, node(n, true, t0))
	}
	client := fake.NewClientset(objs...)
	apiDown := false
	// The Leases live in a map of their own, each write given a
	// resourceVersion as the API server gives it (the fake clientset's
	// tracker keeps none, and rebuilds a REST mapper on every write).
	leaseStore := map[string]*coordinationv1.Lease{}
	rv := 0
	client.PrependReactor("*", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		switch a := a.(type) {
		case k8stesting.GetAction:
			if l, ok := leaseStore[a.GetNamespace()+"/"+a.GetName()]; ok {
				return true, l.DeepCopy(), nil
			}
			return true, nil, apierrors.NewNotFound(coordinationv1.Resource("leases"), a.GetName())
		case k8stesting.CreateAction:
			l := a.GetObject().(*coordinationv1.Lease).DeepCopy()
			rv++
			l.Namespace, l.ResourceVersion = a.GetNamespace(), strconv.Itoa(rv)
			leaseStore[a.GetNamespace()+"/"+l.Name] = l
			return true, l.DeepCopy(), nil
		case k8stesting.UpdateAction:
			l := a.GetObject().(*coordinationv1.Lease).DeepCopy()
			rv++
			l.Namespace, l.ResourceVersion = a.GetNamespace(), strconv.Itoa(rv)
			leaseStore[a.GetNamespace()+"/"+l.Name] = l
			return true, l.DeepCopy(), nil
		}
		return false, nil, nil
	})
	// The outage comes first.
	client.PrependReactor("*", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
		if apiDown {
			return true, nil, apierrors.NewServiceUnavailable("the API server is down")
		}
		return false, nil, nil
	})
	type event struct {
		sig      Signal
		node, rv string
		leaseFor time.Duration
	}
	var pending []event
	renewedAt := map[Signal]map[string]time.Time{KubeletLease: {}, PluginLease: {}}
	// renewLease writes node n's Lease of heartbeat sig; false: the API
	// is down, the renewal never reached it.
	renewLease := func(sig Signal, n string) bool {
		ctx := context.Background()
		leases, name := client.CoordinationV1().Leases(NodeLeaseNamespace), n
		if sig == PluginLease {
			leases, name = client.CoordinationV1().Leases(pluginNamespace), nodelease.Prefix+n
		}
		cur, err := leases.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}}
			if d := leaseFor[sig][n]; d > 0 {
				secs := int32(d / time.Second)
				lease.Spec.LeaseDurationSeconds = &secs
			}
			cur, err = leases.Create(ctx, lease, metav1.CreateOptions{})
		} else if err == nil {
			cur.Spec.HolderIdentity = &n
			cur.ResourceVersion = ""
			cur, err = leases.Update(ctx, cur, metav1.UpdateOptions{})
		}
		if err != nil {
			return false
		}
		renewedAt[sig][n] = clock.Now()
		pending = append(pending, event{sig, n, cur.ResourceVersion, leaseFor[sig][n]})
		return true
	}
	dead := map[string]bool{}
	// back: when a dead node last came back. It runs from its first
	// renewal after that: until then it looks as dead as it was.
	back := map[string]time.Time{}
	// tainted: fenced and tainted out of service, as the driver does
	// after a heartbeat fence: no longer counted by the guard.
	tainted := map[string]bool{}
	// restarting: a kubelet that does not renew on a node that runs on
	// (its plugin renews); away: a node plugin that does not (its
	// kubelet renews).
	restarting, away := map[string]bool{}, map[string]bool{}
	running := func(sig Signal, n string) bool {
		switch {
		case dead[n]:
			return false
		case sig == KubeletLease:
			return !restarting[n]
		default:
			return plugins && !away[n]
		}
	}
	// next: each writer's next renewal, at its own cadence.
	next := map[Signal]map[string]time.Time{KubeletLease: {}, PluginLease: {}}
	every := func(sig Signal, n string) time.Duration {
		d := leaseFor[sig][n]
		if d == 0 {
			d = 40 * time.Second
		}
		return d / 4
	}
	// retry: how long a writer waits after its failures in a row, as
	// the kubelet and pkg/nodelease back off: from 200 ms, doubled each
	// time, never longer than an interval. failed: the writer's current
	// renewal failed for an outage (the strong invariant below gives each
	// writer one fault at a time: a late renewal, or an outage).
	retry := map[Signal]map[string]time.Duration{KubeletLease: {}, PluginLease: {}}
	failed := map[Signal]map[string]bool{KubeletLease: {}, PluginLease: {}}
	attempt := func(sig Signal, n string) {
		e := every(sig, n)
		if !renewLease(sig, n) {
			retry[sig][n] = min(max(2*retry[sig][n], 200*time.Millisecond), e)
			next[sig][n] = clock.Now().Add(retry[sig][n])
			failed[sig][n] = true
			return
		}
		retry[sig][n], failed[sig][n] = 0, false
		next[sig][n] = clock.Now().Add(e + time.Duration(rng.Int63n(int64(e/25))))
		if lateBy := cmp.Or(sc.late, e*9/10); rng.Intn(10) == 0 {
			next[sig][n] = next[sig][n].Add(time.Duration(rng.Int63n(int64(lateBy))))
		}
	}
	// watch: the controller looks at every node's timing as its node
	// controller does at each node's threshold (pkg/informers
	// wakeAtThreshold): the guard is counted then. A tick of the model
	// is at most this long.
	const tick = 250 * time.Millisecond
	watch := func() {
		if sc.promptWatch && !apiDown {
			for _, ev := range pending {
				l.Observe(ev.sig, ev.node, ev.rv, ev.leaseFor)
			}
			pending = pending[:0]
		}
		for _, n := range nodes {
			l.Decorate(n, NodeState{Exists: true, UID: n, Ready: true})
		}
	}
	// advance runs the clock on by d, every writer renewing when due.
	advance := func(d time.Duration) {
		end := clock.Now().Add(d)
		for clock.Now().Before(end) {
			stop := clock.Now().Add(tick)
			if stop.After(end) {
				stop = end
			}
			for sc.cadence {
				var at time.Time
				var sig Signal
				var who string
				for _, s := range []Signal{KubeletLease, PluginLease} {
					for _, n := range nodes {
						if due := next[s][n]; running(s, n) && !due.After(stop) && (who == "" || due.Before(at)) {
							at, sig, who = due, s, n
						}
					}
				}
				if who == "" {
					break
				}
				if at.After(clock.Now()) {
					clock.SetTime(at)
				}
				attempt(sig, who)
			}
			clock.SetTime(stop)
			watch()
		}
	}
	for _, n := range nodes {
		l.ObserveNode(n, NodeState{Exists: true, UID: n, Ready: true})
		for _, sig := range []Signal{KubeletLease, PluginLease} {
			if running(sig, n) {
				renewLease(sig, n)
				// Each writer at its own phase.
				next[sig][n] = t0.Add(time.Duration(rng.Int63n(int64(every(sig, n)))))
			}
		}
	}
	l.client = client
	fences, checks := 0, 0
	for step := 0; step < 2500; step++ {
		switch r := rng.Intn(100); {
		case r < 30 || (r < 55 && sc.cadence):
			advance(time.Duration(rng.Intn(2000)) * time.Millisecond)
		case r < 55:
			n := nodes[rng.Intn(len(nodes))]
			if !dead[n] {
				renewLease(KubeletLease, n)
			}
		case r < 75 && !apiDown && len(pending) > 0:
			// Deliver a burst, maybe out of order; keep the rest late.
			k := 1 + rng.Intn(len(pending))
			rng.Shuffle(k, func(i, j int) { pending[i], pending[j] = pending[j], pending[i] })
			for _, ev := range pending[:k] {
				l.Observe(ev.sig, ev.node, ev.rv, ev.leaseFor)
			}
			pending = pending[k:]
		case r < 78:
			// Outages are rare and short or long.
			if apiDown == (rng.Intn(6) == 0) {
				continue
			}
			apiDown = !apiDown
			if !apiDown && rng.Intn(2) == 0 {
				// The watch reconnected after the outage.
				l.Restored()
			}
		case r < 80 && plugins && rng.Intn(2) == 0:
			// A kubelet restarts or a node plugin is away, or is back;
			// never both on one node.
			n := nodes[rng.Intn(len(nodes))]
			switch {
			case restarting[n]:
				restarting[n], next[KubeletLease][n] = false, clock.Now()
			case away[n]:
				away[n], next[PluginLease][n] = false, clock.Now()
			case rng.Intn(2) == 0:
				restarting[n] = true
			default:
				away[n] = true
			}
		case r < 80:
			// A node dies; a dead one comes back now and then.
			n := nodes[rng.Intn(len(nodes))]
			deadNow := 0
			for _, d := range dead {
				if d {
					deadNow++
				}
			}
			switch {
			case dead[n] && rng.Intn(8) == 0:
				dead[n], back[n] = false, clock.Now()
				if tainted[n] {
					// Back: the taint goes (the driver lifts it after
					// the recovery period; sooner here, so that the node
					// counts in the guard again).
					tainted[n] = false
					l.ObserveNode(n, NodeState{Exists: true, UID: n, Ready: true})
				}
				next[KubeletLease][n], next[PluginLease][n] = clock.Now(), clock.Now()
			case !dead[n] && deadNow < 2:
				// At most two of five: more hold the guard.
				dead[n] = true
			}
		default:
			// Every node the fencer would look at now.
			for _, n := range nodes {
				if tainted[n] {
					continue
				}
				if _, stale := Stale(l.Decorate(n, NodeState{Exists: true, UID: n, Ready: true}), clock.Now(), cfg); !stale {
					continue
				}
				checks++
				s, err := l.LiveNode(context.Background(), n)
				if err != nil {
					var status apierrors.APIStatus
					if !errors.As(err, &status) {
						t.Fatalf("seed %d step %d: %v", seed, step, err)
					}
					continue // unconfirmed: no fence
				}
				reason, stale := Stale(s, clock.Now(), cfg)
				if !stale {
					continue
				}
				fences++
				tainted[n] = true
				l.ObserveNode(n, NodeState{Exists: true, UID: n, Ready: true, OutOfService: true})
				ago := func(sig Signal) string {
					at, ok := renewedAt[sig][n]
					if !ok {
						return "never"
					}
					return clock.Now().Sub(at).String() + " ago (threshold " + own(sig, n).String() + ")"
				}
				for _, sig := range []Signal{KubeletLease, PluginLease} {
					at, ok := renewedAt[sig][n]
					if reason == FenceHeartbeatLost && ok && clock.Now().Sub(at) <= own(sig, n) {
						t.Fatalf("seed %d step %d: node %s fenced (%s) although the API shows its %s Lease renewed %s",
							seed, step, n, reason, sig, ago(sig))
					}
				}
				// It runs, with a writer renewing since it came back whose
				// renewal has not failed since its last (an outage that
				// makes one writer's renewal fail, too short for the guard
				// to see, is beyond one fault: see the test's comment).
				onSchedule := false
				for _, sig := range []Signal{KubeletLease, PluginLease} {
					onSchedule = onSchedule || (running(sig, n) && !failed[sig][n] && !renewedAt[sig][n].Before(back[n]) && !renewedAt[sig][n].IsZero())
				}
				if sc.cadence && onSchedule {
					t.Fatalf("seed %d step %d: node %s fenced (%s) while it runs (kubelet restarting %t, node plugin away %t); the API shows its kubelet's Lease renewed %s, its plugin's %s",
						seed, step, n, reason, restarting[n], away[n], ago(KubeletLease), ago(PluginLease))
				}
			}
		}
	}
	t.Logf("seed %d: %d fence decisions confirmed of %d candidates", seed, fences, checks)
	return fences
}
