package storagefence

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/srvlab/rds-csi/pkg/fencing"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
)

// The node fencer releases a claim only when a live read of the node, made after
// the PV was read, shows the claimed incarnation stale. A node that
// recovered (taint removed) keeps its claim; an earlier incarnation's claim
// of a re-created node is released.
func TestNodeFencerConfirmsWithALiveRead(t *testing.T) {
	tainted := func(n *corev1.Node) *corev1.Node {
		n.Spec.Taints = []corev1.Taint{{Key: fencing.OutOfServiceTaint, Effect: corev1.TaintEffectNoExecute}}
		return n
	}
	withUID := func(n *corev1.Node, uid string) *corev1.Node { n.UID = types.UID(uid); return n }
	for _, tc := range []struct {
		name     string
		node     runtime.Object // the node as the API server has it; nil: deleted
		claim    string
		released bool
		reason   fencing.FenceReason
	}{
		{"node healthy again", withUID(node("node-a", true, t0), "uid-1"), `{"node-a":{"at":"2026-11-22T12:00:00Z","uid":"uid-1"}}`, false, ""},
		{"node still out of service", tainted(withUID(node("node-a", false, t0), "uid-1")), `{"node-a":{"at":"2026-11-22T12:00:00Z","uid":"uid-1"}}`, true, fencing.FenceOutOfService},
		{"node deleted", nil, `{"node-a":{"at":"2026-11-22T12:00:00Z","uid":"uid-1"}}`, true, fencing.FenceNodeDeleted},
		{"node re-created", withUID(node("node-a", true, t0), "uid-2"), `{"node-a":{"at":"2026-11-22T12:00:00Z","uid":"uid-1"}}`, true, fencing.FenceNodeRecreated},
		{"claim without UID on a live node", withUID(node("node-a", true, t0), "uid-2"), `{"node-a":"2026-11-22T12:00:00Z"}`, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := []runtime.Object{pv("pv-1", "vol-1", corev1.ReadWriteOnce, tc.claim)}
			if tc.node != nil {
				objs = append(objs, tc.node)
			}
			client := fake.NewClientset(objs...)
			fenced := &fenceCounts{}
			// The index said stale (out of service); the API server decides.
			nf := newClaimsOnlyFencer(t, client, fencing.NewReporter(nil, fenced))
			vol := fencing.VolumeRef{PV: "pv-1", Handle: "vol-1"}
			if err := nf.NodeStale(context.Background(), fencing.StaleHolder{Node: "node-a", Reason: fencing.FenceOutOfService, Volumes: []fencing.VolumeRef{vol}}); err != nil {
				t.Fatal(err)
			}
			if _, kept := apiClaims(t, client, "pv-1")["node-a"]; kept == tc.released {
				t.Fatalf("claim kept %t, want released %t", kept, tc.released)
			}
			// The reason reported is the live one, not the index's.
			var want []fencing.FenceReason
			if tc.released {
				want = []fencing.FenceReason{tc.reason}
			}
			if !slices.Equal(fenced.reasons, want) {
				t.Fatalf("fences reported %v; want %v", fenced.reasons, want)
			}
		})
	}
}

// A follower reports no orphaned claim or overdue migration: it answers
// fencing.ErrNotLeader, so the index keeps them for the next leader.
func TestNodeFencerReportsOnlyAsLeader(t *testing.T) {
	leader := false
	nf := newClaimsOnlyFencer(t, fake.NewClientset(), nil)
	nf.isLeader = func() bool { return leader }
	v := fencing.VolumeRef{PV: "pv-1", Handle: "vol-1"}
	if err := nf.OrphanedClaim(context.Background(), v, "node-a", time.Hour); !errors.Is(err, fencing.ErrNotLeader) {
		t.Fatalf("a follower's OrphanedClaim = %v; want ErrNotLeader", err)
	}
	if err := nf.MigrationTimedOut(context.Background(), v, fencing.Migration{Source: "node-a", Target: "node-b"}); !errors.Is(err, fencing.ErrNotLeader) {
		t.Fatalf("a follower's MigrationTimedOut = %v; want ErrNotLeader", err)
	}
	leader = true
	if err := nf.OrphanedClaim(context.Background(), v, "node-a", time.Hour); err != nil {
		t.Fatalf("the leader's OrphanedClaim = %v", err)
	}
}
