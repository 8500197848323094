package informers

import (
	"fmt"
	"testing"
	"time"

	"github.com/srvlab/rds-csi/pkg/fencing"
	clocktesting "k8s.io/utils/clock/testing"
)

// A --heartbeat-threshold long enough to mean "practically never"
// (500000h parses; so does anything up to 2562047h) must not overflow the
// guard's arithmetic. Before, suspectShare tenths of it overflowed to a
// negative age, every node with a Lease counted as suspect, the guard held
// for good, and a node NotReady past --not-ready-threshold was never
// fenced: a dead node's volume never moved.
func TestHugeHeartbeatThresholdDoesNotHoldTheGuard(t *testing.T) {
	clock := clocktesting.NewFakeClock(t0)
	cfg := fencing.Config{HeartbeatThreshold: 500000 * time.Hour, NotReadyThreshold: 20 * time.Second}
	l := NewLiveness(clock, cfg, DefaultGuardShare)
	up := NodeState{Exists: true, UID: "u", Ready: true}
	rv := 0
	renew := func(nodes ...string) {
		for _, n := range nodes {
			rv++
			l.observeLease(n, fmt.Sprint(rv), 40*time.Second)
		}
	}
	for _, n := range []string{"a", "b", "c"} {
		l.observeNode(n, up)
	}
	renew("a", "b", "c")
	down := NodeState{Exists: true, UID: "u"}
	l.observeNode("a", down)
	for i := 0; i < 3; i++ {
		clock.Step(7 * time.Second)
		renew("b", "c")
	}
	if l.Holding() {
		t.Fatal("guard holding with one node of three NotReady and every heartbeat fresh")
	}
	if reason, stale := fencing.Stale(l.Decorate("a", down), clock.Now(), cfg); !stale || reason != fencing.FenceNotReady {
		t.Fatalf("node a NotReady for 21 s (threshold 20 s): Stale %q %t; want NotReady", reason, stale)
	}
}
