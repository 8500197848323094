package nodelease

import (
	"context"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
)

var t0 = time.Date(2026, 11, 26, 7, 0, 0, 0, time.UTC)

func TestName(t *testing.T) {
	for _, tc := range []struct {
		node, want string
		ok         bool
	}{
		{"worker-1", "rds-csi-node-worker-1", true},
		{"node.example.com", "rds-csi-node-node.example.com", true},
		{strings.Repeat("a", 253-len(Prefix)), Prefix + strings.Repeat("a", 253-len(Prefix)), true},
		{strings.Repeat("a", 254-len(Prefix)), "", false}, // 254 characters: too long for a name
	} {
		got, err := Name(tc.node)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("Name(%q) = %q, %v; want %q, ok %t", tc.node, got, err, tc.want, tc.ok)
		}
		if tc.ok {
			if node, ok := NodeOf(got); !ok || node != tc.node {
				t.Errorf("NodeOf(%q) = %q, %t; want %q", got, node, ok, tc.node)
			}
		}
	}
	for _, name := range []string{"rds-csi-controller", Prefix, "kube-node-lease"} {
		if node, ok := NodeOf(name); ok {
			t.Errorf("NodeOf(%q) = %q: not a node plugin's Lease", name, node)
		}
	}
}

// The Lease is created on the first renewal and renewed in place after,
// stating the node as holder, the duration and the label the controller
// selects; a Lease deleted or written by someone else meanwhile costs one
// failed renewal, and the next one writes it again.
func TestRenew(t *testing.T) {
	ctx := context.Background()
	clock := clocktesting.NewFakeClock(t0)
	client := fake.NewClientset()
	r, err := NewRenewer(client, "rds-csi", "node-a", 40*time.Second, clock)
	if err != nil {
		t.Fatal(err)
	}
	if r.Interval() != 10*time.Second {
		t.Fatalf("interval %s; want a quarter of 40s", r.Interval())
	}
	leases := client.CoordinationV1().Leases("rds-csi")
	check := func(what string, at time.Time) string {
		t.Helper()
		l, err := leases.Get(ctx, "rds-csi-node-node-a", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if l.Labels[Label] != LabelValue || *l.Spec.HolderIdentity != "node-a" || *l.Spec.LeaseDurationSeconds != 40 || !l.Spec.RenewTime.Time.Equal(at) {
			t.Fatalf("%s: labels %v holder %s duration %d renewed %s; want %s=%s, node-a, 40, %s", what, l.Labels, *l.Spec.HolderIdentity, *l.Spec.LeaseDurationSeconds, l.Spec.RenewTime, Label, LabelValue, at)
		}
		return l.ResourceVersion
	}
	if err := r.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	check("created", t0)
	clock.Step(10 * time.Second)
	if err := r.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	check("renewed", t0.Add(10*time.Second))

	// Deleted (by an operator, a namespace cleanup): one failure, then
	// created again.
	if err := leases.Delete(ctx, "rds-csi-node-node-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	clock.Step(10 * time.Second)
	if err := r.Renew(ctx); !apierrors.IsNotFound(err) {
		t.Fatalf("renewing a deleted Lease: %v; want NotFound", err)
	}
	if err := r.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	check("created again", t0.Add(20*time.Second))

	// Written by someone else: the stored copy is old.
	l, err := leases.Get(ctx, "rds-csi-node-node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l.ResourceVersion = "999"
	l.Annotations = map[string]string{"x": "y"}
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	client.PrependReactor("update", "leases", conflictOnce())
	clock.Step(10 * time.Second)
	if err := r.Renew(ctx); !apierrors.IsConflict(err) {
		t.Fatalf("renewing over another write: %v; want Conflict", err)
	}
	if err := r.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	check("renewed after a conflict", t0.Add(30*time.Second))
}

func TestNewRenewerRefuses(t *testing.T) {
	if _, err := NewRenewer(fake.NewClientset(), "rds-csi", "node-a", 9*time.Second, nil); err == nil {
		t.Error("a 9s Lease accepted; the shortest is 10s")
	}
	if _, err := NewRenewer(fake.NewClientset(), "rds-csi", strings.Repeat("a", 250), DefaultDuration, nil); err == nil {
		t.Error("a node whose Lease name would be 263 characters accepted")
	}
}

// After failures in a row the next try comes sooner than a renewal:
// 200 ms, doubled each time, never later than the renew interval.
func TestRetryAfter(t *testing.T) {
	r, err := NewRenewer(fake.NewClientset(), "ns", "n", 10*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, 1600 * time.Millisecond, 2500 * time.Millisecond, 2500 * time.Millisecond}
	for i, w := range want {
		if got := r.retryAfter(i + 1); got != w {
			t.Errorf("after %d failures: retry in %s; want %s", i+1, got, w)
		}
	}
}

// conflictOnce answers the next update with a Conflict, as the API server
// does when the resourceVersion written is not the stored one.
func conflictOnce() func(action k8stesting.Action) (bool, runtime.Object, error) {
	done := false
	return func(action k8stesting.Action) (bool, runtime.Object, error) {
		if done {
			return false, nil, nil
		}
		done = true
		return true, nil, apierrors.NewConflict(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, "rds-csi-node-node-a", nil)
	}
}

// Run keeps renewing through failures: an API that refuses the first three
// reads costs retries after 200, 400 and 800 ms (each logged, at most one
// line a minute after the first), never the loop; the Lease is created at
// the fourth try, and renewed an interval later.
func TestRunRetriesFailures(t *testing.T) {
	clock := clocktesting.NewFakeClock(t0)
	client := fake.NewClientset()
	failures := 3
	client.PrependReactor("get", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if failures > 0 {
			failures--
			return true, nil, apierrors.NewServiceUnavailable("the API server is down")
		}
		return false, nil, nil
	})
	r, err := NewRenewer(client, "rds-csi", "node-a", 10*time.Second, clock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	// step: once Run has written and set its timer (the fake clock's
	// waiter); then the clock is stepped to it. The minute is only a
	// safety net for a Run that stopped: a starved -race run can take
	// seconds to get there.
	step := func(d time.Duration) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); !clock.HasWaiters(); {
			if time.Now().After(deadline) {
				t.Fatal("Run set no timer: it stopped")
			}
			goruntime.Gosched()
		}
		clock.Step(d)
	}
	for _, d := range []time.Duration{200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, 2500 * time.Millisecond} {
		step(d)
	}
	// The fourth try created the Lease (at t0+1.4s), the fifth renewed it
	// an interval later; wait for Run's next timer, set after it.
	step(0)
	l, err := client.CoordinationV1().Leases("rds-csi").Get(context.Background(), "rds-csi-node-node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("no Lease after three failed tries and two more: %v", err)
	}
	if want := t0.Add(1400*time.Millisecond + 2500*time.Millisecond); !l.Spec.RenewTime.Time.Equal(want) || !l.Spec.AcquireTime.Time.Equal(t0.Add(1400*time.Millisecond)) {
		t.Errorf("acquired %s, renewed %s; want %s and %s", l.Spec.AcquireTime, l.Spec.RenewTime, t0.Add(1400*time.Millisecond), want)
	}
	if r.failures != 0 {
		t.Errorf("%d failures counted after renewals worked again", r.failures)
	}
}

// One renewal that hangs until its timeout, retried after the first
// backoff, still lands well within two intervals of the renewal before
// (the controller's floor for a node plugin's Lease): a quarter of an
// interval is left for the retry's own read and write, at every duration
// a Lease may state. With the timeout a whole interval, as before, the
// retry came two intervals and 200 ms after the last renewal: one hung
// request made a node whose kubelet was away look dead.
func TestOneHungRenewalIsRetriedWithinTwoIntervals(t *testing.T) {
	for d := MinDuration; d <= MaxDuration; d += time.Second {
		r, err := NewRenewer(fake.NewClientset(), "ns", "n", d, nil)
		if err != nil {
			t.Fatal(err)
		}
		retried := r.Interval() + r.attemptTimeout() + r.retryAfter(1)
		if room := 2*r.Interval() - retried; room < r.Interval()/4 {
			t.Fatalf("Lease of %s: a hung renewal is retried %s after the last one, %s before two intervals (%s); want at least a quarter interval (%s) for the retry",
				d, retried, room, 2*r.Interval(), r.Interval()/4)
		}
	}
}

// deadlineLeases records the deadline of the context of each Lease read
// and how long it had left when the read came, and fails the read.
type deadlineLeases struct {
	coordinationv1client.LeaseInterface
	left chan<- leaseDeadline
}

// leaseDeadline: whether a read's context had a deadline, and how long was
// left of it when the read came (less than Run gave it by however long
// the machine took to get there; below zero on a starved one).
type leaseDeadline struct {
	set  bool
	left time.Duration
}

func (d deadlineLeases) Get(ctx context.Context, name string, _ metav1.GetOptions) (*coordinationv1.Lease, error) {
	var got leaseDeadline
	if dl, ok := ctx.Deadline(); ok {
		got = leaseDeadline{set: true, left: time.Until(dl)}
	}
	d.left <- got
	return nil, apierrors.NewServiceUnavailable("hung until its timeout")
}

type deadlineCoordination struct {
	coordinationv1client.CoordinationV1Interface
	left chan<- leaseDeadline
}

func (d deadlineCoordination) Leases(ns string) coordinationv1client.LeaseInterface {
	return deadlineLeases{d.CoordinationV1Interface.Leases(ns), d.left}
}

type deadlineClient struct {
	*fake.Clientset
	left chan<- leaseDeadline
}

func (d deadlineClient) CoordinationV1() coordinationv1client.CoordinationV1Interface {
	return deadlineCoordination{d.Clientset.CoordinationV1(), d.left}
}

// Run gives each renewal the half interval that
// TestOneHungRenewalIsRetriedWithinTwoIntervals counts on, not a whole
// interval: what a renewal that hangs costs is what its context allows.
func TestRunBoundsEachRenewalByHalfAnInterval(t *testing.T) {
	left := make(chan leaseDeadline, 1)
	r, err := NewRenewer(deadlineClient{fake.NewClientset(), left}, "ns", "n", MinDuration, clocktesting.NewFakeClock(t0))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Run(ctx)
	}()
	got := <-left
	cancel()
	<-done
	// What was left when the read came is at most what Run gave: the
	// bound holds however slow the machine. (Whether what Run gives is
	// positive is attemptTimeout's, checked here too: a deadline already
	// passed on arrival says nothing on a loaded machine.)
	if !got.set || got.left > r.Interval()/2 || r.attemptTimeout() <= 0 {
		t.Errorf("a renewal of a Lease of %s is given %+v (attempt timeout %s); want a deadline of at most half an interval (%s)", MinDuration, got, r.attemptTimeout(), r.Interval()/2)
	}
}
