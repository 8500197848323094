package informers

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/fencing"
)

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, time.Minute, true,
		func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// runSynced runs c until the test ends and waits until it has synced.
func runSynced(t *testing.T, c *Controller) context.Context {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	if !c.WaitForSync(ctx) {
		t.Fatal("never synced")
	}
	return ctx
}

// TestOrphanedClaimReported: a claim with no VolumeAttachment of its node
// (force-deleted) is reported once it has been so for the threshold, and
// counted; a VolumeAttachment of the node clears it. It is never released.
func TestOrphanedClaimReported(t *testing.T) {
	var gauge []int
	h := newHarnessWith(t, Config{Policy: fencing.DefaultConfig(), OrphanedClaimThreshold: 5 * time.Minute,
		OrphanedClaims: func(n int) { gauge = append(gauge, n) }})
	h.put(node("node-a", true, t0))
	h.put(pv("pv-1", "vol-1", corev1.ReadWriteOnce, `{"node-a":"2026-11-22T12:00:00Z"}`))
	if len(h.react.orphaned) != 0 {
		t.Fatalf("reported before the threshold: %v", h.react.orphaned)
	}
	h.clock.Step(5*time.Minute + 2*time.Millisecond)
	if k := h.next(h.c.reactions); k != (key{kindOrphan, "vol-1"}) {
		t.Fatalf("queued %v, want the orphan check", k)
	}
	if len(h.react.orphaned) != 1 || h.react.orphaned[0] != "vol-1/node-a" || gauge[len(gauge)-1] != 1 {
		t.Fatalf("orphans reported %v, gauge %v", h.react.orphaned, gauge)
	}
	// Not again on an unrelated change.
	h.put(pv("pv-1", "vol-1", corev1.ReadWriteOnce, `{"node-a":"2026-11-22T12:00:00Z"}`))
	if len(h.react.orphaned) != 1 {
		t.Fatalf("reported again: %v", h.react.orphaned)
	}
	if v := h.index.Volume("vol-1"); !v.HasClaim("node-a") {
		t.Fatal("the orphaned claim was dropped")
	}
	h.put(va("va-1", "pv-1", "node-a", true, t0))
	if gauge[len(gauge)-1] != 0 {
		t.Fatalf("gauge %v after a VolumeAttachment of node-a appeared", gauge)
	}
}

// blockingReactor hangs every fence call until its context ends, as an
// API call to an unresponsive server would.
type blockingReactor struct {
	mu        sync.Mutex
	calls     int
	deadlines int
}

func (r *blockingReactor) NodeStale(ctx context.Context, _ fencing.StaleHolder) error {
	r.mu.Lock()
	r.calls++
	if _, ok := ctx.Deadline(); ok {
		r.deadlines++
	}
	r.mu.Unlock()
	<-ctx.Done()
	return ctx.Err()
}

func (r *blockingReactor) MigrationTimedOut(context.Context, fencing.VolumeRef, fencing.Migration) error {
	return nil
}

func (r *blockingReactor) OrphanedClaim(context.Context, fencing.VolumeRef, string, time.Duration) error {
	return nil
}

func (r *blockingReactor) counts() (int, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls, r.deadlines
}

// TestHungFenceCallDoesNotFreezeTheIndex: a fence reaction whose API call
// hangs neither stops the index from following the API server, nor hangs
// for good: each call has a deadline and is retried.
func TestHungFenceCallDoesNotFreezeTheIndex(t *testing.T) {
	client := fake.NewClientset(pv("pv-1", "vol-1", corev1.ReadWriteOnce, `{"node-gone":"2026-11-22T12:00:00Z"}`))
	react := &blockingReactor{}
	index := NewAttachmentIndex()
	c, err := NewController(client, index, Config{DriverName: driver, Policy: fencing.DefaultConfig(), Reactor: react, ReactionTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := runSynced(t, c)
	c.RefenceStale()
	waitUntil(t, "the fence call to start", func() bool { n, _ := react.counts(); return n >= 1 })
	if _, err := client.CoreV1().PersistentVolumes().Create(ctx, pv("pv-2", "vol-2", corev1.ReadWriteOnce, ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the index to follow the API while a fence call hangs", func() bool { return index.Volume("vol-2") != nil })
	waitUntil(t, "the hung call to time out and be retried", func() bool { n, _ := react.counts(); return n >= 2 })
	if n, withDeadline := react.counts(); withDeadline != n {
		t.Fatalf("%d of %d fence calls had no deadline", n-withDeadline, n)
	}
}

// TestDisconnectedWatchFailsReadiness: readiness reports a watch that has
// been closed longer than the threshold, and recovers when the informer
// opens a new one.
func TestDisconnectedWatchFailsReadiness(t *testing.T) {
	client := fake.NewClientset()
	var mu sync.Mutex
	refuse := false
	var nodeWatches []*watch.RaceFreeFakeWatcher
	client.PrependWatchReactor("nodes", func(k8stesting.Action) (bool, watch.Interface, error) {
		mu.Lock()
		defer mu.Unlock()
		if refuse {
			return true, nil, errors.New("connection refused")
		}
		w := watch.NewRaceFreeFake()
		nodeWatches = append(nodeWatches, w)
		return true, w, nil
	})
	clk := clocktesting.NewFakeClock(t0)
	c, err := NewController(client, NewAttachmentIndex(), Config{DriverName: driver, Policy: fencing.DefaultConfig(), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	runSynced(t, c)
	if err := c.WatchesHealthy(30 * time.Second); err != nil {
		t.Fatalf("healthy watches reported: %v", err)
	}
	mu.Lock()
	refuse = true
	first := nodeWatches[0]
	mu.Unlock()
	first.Stop()
	waitUntil(t, "readiness to fail once the node watch is down past the threshold", func() bool {
		clk.Step(time.Second)
		err := c.WatchesHealthy(30 * time.Second)
		return err != nil
	})
	mu.Lock()
	refuse = false
	mu.Unlock()
	waitUntil(t, "readiness to recover when the watch reopens", func() bool { return c.WatchesHealthy(30*time.Second) == nil })
}

// TestRecreatedNodeTriggersFence: a Node that comes back under its name
// with another UID (its deletion missed by the watch) queues a fence
// reaction for the claims of the incarnation that is gone.
func TestRecreatedNodeTriggersFence(t *testing.T) {
	h := newHarness(t, fencing.DefaultConfig())
	first := node("node-a", true, t0)
	first.UID = "uid-1"
	h.put(first, pv("pv-1", "vol-1", corev1.ReadWriteOnce, `{"node-a":{"at":"2026-11-22T12:00:00Z","uid":"uid-1"}}`))
	if len(h.react.stale) != 0 {
		t.Fatalf("reacted to a healthy node: %+v", h.react.stale)
	}
	second := node("node-a", true, t0.Add(time.Hour))
	second.UID = "uid-2"
	h.put(second)
	if len(h.react.stale) != 1 || h.react.stale[0].Reason != fencing.FenceNodeRecreated || h.react.stale[0].Volumes[0].Handle != "vol-1" {
		t.Fatalf("reactions %+v, want one NodeRecreated for vol-1", h.react.stale)
	}
}

// TestTwoPVsOneHandleIndex: the index keeps a handle while any of its PVs
// or attachments remain, merges their claims, and lists every PV for the
// claims to be written to.
func TestTwoPVsOneHandleIndex(t *testing.T) {
	h := newHarness(t, fencing.DefaultConfig())
	h.put(pv("pv-old", "vol-1", corev1.ReadWriteOnce, `{"node-a":{"at":"2026-11-22T12:00:00Z","gen":1}}`))
	h.put(pv("pv-new", "vol-1", corev1.ReadWriteOnce, `{"node-b":{"at":"2026-11-22T12:30:00Z","gen":1}}`))
	v := h.index.Volume("vol-1")
	if len(v.PVs) != 2 || !v.HasClaim("node-a") || !v.HasClaim("node-b") {
		t.Fatalf("merged entry %+v", v)
	}
	h.remove(pv("pv-old", "vol-1", corev1.ReadWriteOnce, ""))
	v = h.index.Volume("vol-1")
	if v == nil || len(v.PVs) != 1 || v.PVs[0].Name != "pv-new" || v.PVName != "pv-new" || !v.HasClaim("node-b") {
		t.Fatalf("after deleting the old PV: %+v", v)
	}
}

// TestParseClaims: the one decoder of the annotation reads claim objects
// and the bare times of older drivers, and refuses anything else rather
// than read it as no claim.
func TestParseClaims(t *testing.T) {
	at := time.Date(2026, 11, 23, 8, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		raw  string
		want map[string]claims.Claim
		bad  bool
	}{
		{raw: ``, want: nil},
		{raw: `{"a":"2026-11-23T08:00:00Z"}`, want: map[string]claims.Claim{"a": {At: at}}},
		{raw: `{"a":{"at":"2026-11-23T08:00:00Z","uid":"u","cap":"block/MULTI_NODE_MULTI_WRITER","ro":true,"gen":3}}`,
			want: map[string]claims.Claim{"a": {At: at, NodeUID: "u", Capability: "block/MULTI_NODE_MULTI_WRITER", ReadOnly: true, Gen: 3}}},
		{raw: `{"a":{"uid":"u"}}`, bad: true},
		{raw: `{"a":42}`, bad: true},
		{raw: `{not json`, bad: true},
	} {
		got, err := claims.ParseClaims(tc.raw)
		if tc.bad {
			if err == nil {
				t.Errorf("claims.ParseClaims(%s) accepted: %+v", tc.raw, got)
			}
			continue
		}
		if err != nil || len(got) != len(tc.want) {
			t.Errorf("claims.ParseClaims(%s) = %+v, %v", tc.raw, got, err)
			continue
		}
		for n, c := range tc.want {
			if g := got[n]; !g.At.Equal(c.At) || g.NodeUID != c.NodeUID || g.Capability != c.Capability || g.ReadOnly != c.ReadOnly || g.Gen != c.Gen {
				t.Errorf("claims.ParseClaims(%s)[%s] = %+v, want %+v", tc.raw, n, g, c)
			}
		}
	}
}

// An overdue live migration is reported once per migration, whatever the
// number of PVs of its volume handle. A Retained volume's PV re-created
// under a new name gives the handle two PVs; the migration check runs per
// PV (RefenceStale queues one per PV of the handle) and remembers what it
// reported per PV (Controller.overdue), so the new leader reports the
// same migration of the same volume twice (two LiveMigrationTimedOut
// events, two counts of rds_csi_migrations_ended_total{reason="timed_out"}).
func TestOverdueMigrationReportedOncePerVolume(t *testing.T) {
	policy := fencing.DefaultConfig()
	policy.MigrationTimeout = 5 * time.Minute
	h := newLeaderHarness(t, Config{Policy: policy})
	now := h.clock.Now()
	h.put(node("node-a", true, t0), node("node-b", true, t0))
	block := corev1.PersistentVolumeBlock
	for _, name := range []string{"pv-1", "pv-1-recreated"} {
		p := unbound(pv(name, "vol-1", corev1.ReadWriteMany, ""))
		p.Spec.VolumeMode = &block
		h.put(p)
	}
	h.put(va("va-a", "pv-1", "node-a", true, now.Add(-time.Hour)), va("va-b", "pv-1", "node-b", true, now.Add(-time.Minute)))
	h.clock.Step(10 * time.Minute)
	h.c.Drain(t.Context())
	if n := h.reported(fencing.ReasonMigrationTimedOut); n != 0 {
		t.Fatalf("a follower reported %d overdue migrations", n)
	}
	h.leader.Store(true)
	h.c.RefenceStale()
	h.c.Drain(t.Context())
	if n := h.reported(fencing.ReasonMigrationTimedOut); n != 1 {
		t.Fatalf("the new leader reported the overdue migration of one volume %d times, want once", n)
	}
}

// --orphaned-claim-threshold=0 means orphaned claims are never reported
// (the flag's help: "0: never"). A new leader's RefenceStale queues the
// orphan check of every volume whatever the threshold, and the check
// (syncOrphans) has no guard of its own: with a zero threshold every
// claim the index shows without a VolumeAttachment is reported at once,
// on every takeover, including one whose VolumeAttachment the index has
// not seen yet.
func TestNoOrphanReportsWhenTheThresholdIsZero(t *testing.T) {
	h := newLeaderHarness(t, Config{Policy: fencing.DefaultConfig()}) // OrphanedClaimThreshold 0: never
	h.put(node("node-a", true, t0))
	h.put(unbound(pv("pv-1", "vol-1", corev1.ReadWriteOnce, `{"node-a":"2026-11-22T12:00:00Z"}`)))
	h.clock.Step(time.Hour)
	h.leader.Store(true)
	h.c.RefenceStale()
	h.c.Drain(t.Context())
	if n := h.reported(fencing.ReasonOrphanedClaim); n != 0 {
		t.Fatalf("with orphan reports off (threshold 0), the new leader reported %d orphaned claims", n)
	}
}
