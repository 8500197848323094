package fencing

import (
	"context"
	"errors"
	"math/rand"
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

// The heartbeat model check (issue 23). Kubelets renew their Leases in
// the API (each renewal stamped with the moment it reached the API);
// the controller's watch delivers them late, in bursts, reordered, or
// not at all while the API is down (then every read fails); the
// controller's clock runs on. At random moments a fence of a random node
// is decided the way the fencer decides one: the node as the Liveness
// times it, confirmed by a live read (which fails while the API is down,
// and then nothing is fenced). Invariant: no node is fenced for a lost
// heartbeat whose Lease the API shows renewed within the threshold. Seeds
// 9 to 16 run the opt-in fast threshold (6 s) over kubelets at their own
// cadence, four with Leases of 10 s (fast) and one of 40 s (the default):
// there a node's threshold is its own, never below two of its renewals
// (20 s for 40). Seeds 17 to 24 add the node plugins' Leases (pkg/
// nodelease), each at its node's kubelet's cadence, and kubelets that
// restart (stop renewing for a while) on nodes that run on, their plugins
// renewing: the invariant then holds for either Lease, a node is never
// fenced for a lost heartbeat while the API shows its kubelet's or its
// plugin's Lease renewed within that Lease's threshold.
func TestHeartbeatModel(t *testing.T) {
	total := 0
	for seed := int64(1); seed <= 24; seed++ {
		rng := rand.New(rand.NewSource(seed))
		clock := clocktesting.NewFakeClock(t0)
		threshold := 20 * time.Second
		leaseFor := map[string]time.Duration{} // 0: none stated
		plugins := seed > 16
		if seed > 8 {
			threshold = 6 * time.Second
			// A fast pool with one kubelet not yet reconfigured (more
			// slow ones would look suspect together and hold the guard).
			for _, n := range []string{"n0", "n1", "n2", "n3", "n4"} {
				leaseFor[n] = 10 * time.Second
			}
			leaseFor["n"+strconv.Itoa(rng.Intn(5))] = 40 * time.Second
		}
		// Each node's own threshold, as the kubelet's cadence bounds it.
		own := func(n string) time.Duration {
			d := leaseFor[n]
			if d == 0 {
				d = 40 * time.Second
			}
			return max(threshold, d/2)
		}
		cfg := Config{HeartbeatThreshold: threshold}
		l := NewLiveness(LivenessConfig{Clock: clock, Policy: cfg, GuardShare: DefaultGuardShare})
		if plugins {
			l.pluginNamespace = pluginNamespace // as LivenessConfig.PluginLeaseNamespace sets it
		}
		nodes := []string{"n0", "n1", "n2", "n3", "n4"}
		var objs []runtime.Object
		renewedAt := map[Signal]map[string]time.Time{KubeletLease: {}, PluginLease: {}}
		for _, n := range nodes {
			objs = append(objs, node(n, true, t0))
		}
		client := fake.NewClientset(objs...)
		apiDown := false
		client.PrependReactor("*", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
			if apiDown {
				return true, nil, apierrors.NewServiceUnavailable("the API server is down")
			}
			return false, nil, nil
		})
		// The fake API keeps no resourceVersions: give every Lease
		// write one, as the API server does.
		rv := 0
		stamp := func(a k8stesting.Action) (bool, runtime.Object, error) {
			if o, ok := a.(interface{ GetObject() runtime.Object }); ok {
				if lease, ok := o.GetObject().(*coordinationv1.Lease); ok {
					rv++
					lease.ResourceVersion = strconv.Itoa(rv)
				}
			}
			return false, nil, nil
		}
		client.PrependReactor("create", "leases", stamp)
		client.PrependReactor("update", "leases", stamp)
		type event struct {
			sig      Signal
			node, rv string
			leaseFor time.Duration
		}
		var pending []event
		renewLease := func(sig Signal, n string) {
			ctx := context.Background()
			leases, name := client.CoordinationV1().Leases(NodeLeaseNamespace), n
			if sig == PluginLease {
				leases, name = client.CoordinationV1().Leases(pluginNamespace), nodelease.Prefix+n
			}
			cur, err := leases.Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}}
				if d := leaseFor[n]; d > 0 {
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
				return // the API is down: the renewal never reached it
			}
			renewedAt[sig][n] = clock.Now()
			pending = append(pending, event{sig, n, cur.ResourceVersion, leaseFor[n]})
		}
		// restarting: a kubelet that does not renew on a node that runs on
		// (its plugin renews).
		restarting := map[string]bool{}
		renew := func(n string) {
			if !restarting[n] {
				renewLease(KubeletLease, n)
			}
			if plugins {
				renewLease(PluginLease, n)
			}
		}
		for _, n := range nodes {
			l.ObserveNode(n, NodeState{Exists: true, UID: n, Ready: true})
			renew(n)
		}
		l.client = client
		dead := map[string]bool{}
		next := map[string]time.Time{} // a kubelet's next renewal, at its cadence
		fences, checks := 0, 0
		for step := 0; step < 2500; step++ {
			switch r := rng.Intn(100); {
			case r < 30:
				clock.Step(time.Duration(rng.Intn(3000)) * time.Millisecond)
			case r < 55 && len(leaseFor) > 0:
				// Kubelets at their own cadence: a quarter of the Lease,
				// up to 4 % jitter, now and then a renewal late by up to
				// most of an interval.
				for _, n := range nodes {
					if dead[n] || clock.Now().Before(next[n]) {
						continue
					}
					renew(n)
					every := leaseFor[n] / 4
					next[n] = clock.Now().Add(every + time.Duration(rng.Int63n(int64(every/25))))
					if rng.Intn(10) == 0 {
						next[n] = next[n].Add(time.Duration(rng.Int63n(int64(every * 9 / 10))))
					}
				}
			case r < 55:
				n := nodes[rng.Intn(len(nodes))]
				if !dead[n] {
					renew(n)
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
				// A kubelet restarts, or is back from one.
				n := nodes[rng.Intn(len(nodes))]
				restarting[n] = !restarting[n]
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
					dead[n] = false
				case !dead[n] && deadNow < 2:
					// At most two of five: more hold the guard.
					dead[n] = true
				}
			default:
				n := nodes[rng.Intn(len(nodes))]
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
				for _, sig := range []Signal{KubeletLease, PluginLease} {
					at, ok := renewedAt[sig][n]
					if reason == FenceHeartbeatLost && ok && clock.Now().Sub(at) <= own(n) {
						t.Fatalf("seed %d step %d: node %s fenced (%s) although the API shows its %s Lease renewed %s ago (its threshold %s, Lease %s)",
							seed, step, n, reason, sig, clock.Now().Sub(at), own(n), leaseFor[n])
					}
				}
			}
		}
		t.Logf("seed %d: %d fence decisions confirmed of %d candidates", seed, fences, checks)
		total += fences
	}
	if total < 10 {
		t.Errorf("%d fences decided in all: the model does not exercise lost heartbeats", total)
	}
}
