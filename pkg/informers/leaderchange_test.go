package informers

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/srvlab/rds-csi/pkg/fencing"
)

// leaderHarness is a harness whose Reactor reports (an event each) only
// while leader is set and answers fencing.ErrNotLeader otherwise, as the
// driver's node fencer does (pkg/storagefence).
type leaderHarness struct {
	*harness
	leader atomic.Bool
	events *record.FakeRecorder
}

// leaderReactor is the Reactor contract of a replica that reports only
// while it leads.
type leaderReactor struct {
	leader   *atomic.Bool
	reporter *fencing.Reporter
}

func (r leaderReactor) NodeStale(context.Context, fencing.StaleHolder) error { return nil }

func (r leaderReactor) MigrationTimedOut(_ context.Context, v fencing.VolumeRef, m fencing.Migration) error {
	if !r.leader.Load() {
		return fencing.ErrNotLeader
	}
	r.reporter.MigrationTimedOut(v, m)
	return nil
}

func (r leaderReactor) OrphanedClaim(_ context.Context, v fencing.VolumeRef, node string, age time.Duration) error {
	if !r.leader.Load() {
		return fencing.ErrNotLeader
	}
	r.reporter.OrphanedClaim(v, node, age)
	return nil
}

func newLeaderHarness(t *testing.T, cfg Config) *leaderHarness {
	h := &leaderHarness{events: record.NewFakeRecorder(100)}
	h.harness = &harness{t: t, index: NewAttachmentIndex(), react: &recorder{}}
	h.harness.clock = clocktesting.NewFakeClock(t0.Add(time.Hour))
	cfg.DriverName, cfg.Clock = driver, h.harness.clock
	cfg.Reactor = leaderReactor{leader: &h.leader, reporter: fencing.NewReporter(h.events, nil)}
	h.c, h.feed = NewFedController(h.index, cfg)
	return h
}

// unbound is p without its claim: its events go to the PV alone, one per
// report.
func unbound(p *corev1.PersistentVolume) *corev1.PersistentVolume {
	p.Spec.ClaimRef = nil
	return p
}

// reported counts the events of reason recorded so far.
func (h *leaderHarness) reported(reason string) int {
	n := 0
	for {
		select {
		case e := <-h.events.Events:
			if strings.Contains(e, " "+reason+" ") {
				n++
			}
		default:
			return n
		}
	}
}

// An orphaned claim found while this replica followed is reported once it
// leads: the follower's Reactor reported nothing, so nothing was reported.
func TestOrphanedClaimReportedByTheNextLeader(t *testing.T) {
	h := newLeaderHarness(t, Config{Policy: fencing.DefaultConfig(), OrphanedClaimThreshold: 5 * time.Minute})
	h.put(node("node-a", true, t0))
	h.put(unbound(pv("pv-1", "vol-1", corev1.ReadWriteOnce, `{"node-a":"2026-11-22T12:00:00Z"}`)))
	h.clock.Step(5*time.Minute + 2*time.Millisecond)
	if k := h.next(h.c.reactions); k != (key{kindOrphan, "vol-1"}) {
		t.Fatalf("queued %v, want the orphan check", k)
	}
	if n := h.reported(fencing.ReasonOrphanedClaim); n != 0 {
		t.Fatalf("a follower reported %d orphaned claims", n)
	}
	h.leader.Store(true)
	h.c.RefenceStale()
	h.c.Drain(t.Context())
	if n := h.reported(fencing.ReasonOrphanedClaim); n != 1 {
		t.Fatalf("the new leader reported %d orphaned claims, want 1", n)
	}
	// Once reported, not again on the next takeover's pass.
	h.c.RefenceStale()
	h.c.Drain(t.Context())
	if n := h.reported(fencing.ReasonOrphanedClaim); n != 0 {
		t.Fatalf("reported %d more times after it was reported", n)
	}
}

// A migration that passed its timeout while this replica followed is
// reported once it leads.
func TestOverdueMigrationReportedByTheNextLeader(t *testing.T) {
	policy := fencing.DefaultConfig()
	policy.MigrationTimeout = 5 * time.Minute
	h := newLeaderHarness(t, Config{Policy: policy})
	now := h.clock.Now()
	h.put(node("node-a", true, t0), node("node-b", true, t0))
	rwx := unbound(pv("pv-1", "vol-1", corev1.ReadWriteMany, ""))
	block := corev1.PersistentVolumeBlock
	rwx.Spec.VolumeMode = &block
	h.put(rwx, va("va-a", "pv-1", "node-a", true, now.Add(-time.Hour)), va("va-b", "pv-1", "node-b", true, now.Add(-time.Minute)))
	h.clock.Step(4*time.Minute + 2*time.Millisecond)
	if k := h.next(h.c.reactions); k != (key{kindMigration, "pv-1"}) {
		t.Fatalf("queued %v, want the migration check", k)
	}
	if n := h.reported(fencing.ReasonMigrationTimedOut); n != 0 {
		t.Fatalf("a follower reported %d overdue migrations", n)
	}
	h.leader.Store(true)
	h.c.RefenceStale()
	h.c.Drain(t.Context())
	if n := h.reported(fencing.ReasonMigrationTimedOut); n != 1 {
		t.Fatalf("the new leader reported %d overdue migrations, want 1", n)
	}
}
