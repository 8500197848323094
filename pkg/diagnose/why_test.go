package diagnose

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

func TestWhy(t *testing.T) {
	tests := []struct {
		name      string
		world     *world
		kind      string
		target    string // namespace/name, or a PV name
		code      string
		summary   []string
		next      string
		noNeedles []string
	}{
		{
			name:  "Multi-Attach: a Ready node holds it",
			world: held("True", time.Hour).pod("pod-b", "node-b", "data"),
			kind:  KindPod, target: "e2e/pod-b",
			code:    VerdictHeldByHealthyNode,
			summary: []string{"node-a holds PV pv-1", "Ready", "used by pod e2e/pod-a", "node-b waits for it"},
			next:    "kubectl delete pod -n e2e pod-a",
		},
		{
			name:  "the holder has been NotReady for 7 minutes",
			world: held("Unknown", 7*time.Minute).pod("pod-b", "node-b", "data"),
			kind:  KindPod, target: "e2e/pod-b",
			code:    VerdictHolderNotReady,
			summary: []string{"node-a holds PV pv-1 and has been NotReady for 7m"},
			next:    "if node-a is really down: kubectl taint node node-a node.kubernetes.io/out-of-service=nodeshutdown:NoExecute",
		},
		{
			name:  "a PVC whose holder died while another pod waits: the verdict is about the waiting node",
			world: held("Unknown", 7*time.Minute).pod("pod-b", "node-b", "data"),
			kind:  KindPVC, target: "e2e/data",
			code:    VerdictHolderNotReady,
			summary: []string{"node-a holds PV pv-1 and has been NotReady for 7m", "node-b waits for it"},
		},
		{
			name:  "a PVC attached where its only pod runs",
			world: held("True", time.Hour),
			kind:  KindPVC, target: "e2e/data",
			code: VerdictAttached,
		},
		{
			name:  "the holder is out of service: Kubernetes is detaching",
			world: held("Unknown", 7*time.Minute, OutOfServiceTaint).pod("pod-b", "node-b", "data"),
			kind:  KindPod, target: "e2e/pod-b",
			code: VerdictFencing,
			next: "kubectl get volumeattachment csi-pv-1-node-a -w",
		},
		{
			name: "a stale claim of a NotReady node blocks node-b's refused attachment",
			world: newWorld().node("node-a", "Unknown", 3*time.Minute).node("node-b", "True", time.Hour).
				volume("data", "pv-1", `{"node-a":"2026-11-23T08:00:00Z"}`).pod("pod-b", "node-b", "data").
				va("pv-1", "node-b", false, "rpc error: code = FailedPrecondition desc = already held by node-a").disks("pv-1"),
			kind: KindPod, target: "e2e/pod-b",
			code:    VerdictStaleClaim,
			summary: []string{"node-a claims PV pv-1 without a VolumeAttachment", "NotReady for 3m"},
			next:    "kubectl rds release pv-1 --node node-a",
		},
		{
			name: "a stale claim of a deleted node",
			world: newWorld().node("node-b", "True", time.Hour).
				volume("data", "pv-1", `{"node-a":"2026-11-23T08:00:00Z"}`).pod("pod-b", "node-b", "data").disks("pv-1"),
			kind: KindPVC, target: "e2e/data",
			code:    VerdictStaleClaim,
			summary: []string{"no longer exists"},
			next:    "kubectl rds release pv-1 --node node-a",
		},
		{
			name: "a claim of a node re-created since (another UID) is stale although the node is Ready",
			world: newWorld().node("node-a", "True", time.Minute).node("node-b", "True", time.Hour).
				volume("data", "pv-1", `{"node-a":{"at":"2026-11-23T08:00:00Z","uid":"uid-old"}}`).pod("pod-b", "node-b", "data").disks("pv-1"),
			kind: KindPod, target: "e2e/pod-b",
			code:    VerdictStaleClaim,
			summary: []string{"re-created"},
			next:    "kubectl rds release pv-1 --node node-a",
		},
		{
			name: "a stale claim of a Ready node is not released from here",
			world: newWorld().node("node-a", "True", time.Hour).node("node-b", "True", time.Hour).
				volume("data", "pv-1", `{"node-a":{"at":"2026-11-23T08:00:00Z","uid":"uid-node-a"}}`).pod("pod-b", "node-b", "data").disks("pv-1"),
			kind: KindPod, target: "e2e/pod-b",
			code:      VerdictStaleClaimReady,
			summary:   []string{"node-a is Ready"},
			next:      "nvme list-subsys",
			noNeedles: []string{"kubectl rds release"},
		},
		{
			name: "the holder's Node is deleted, its VolumeAttachment stays",
			world: newWorld().node("node-b", "True", time.Hour).volume("data", "pv-1", "").
				va("pv-1", "node-a", true, "").pod("pod-b", "node-b", "data").disks("pv-1"),
			kind: KindPod, target: "e2e/pod-b",
			code: VerdictHolderDeleted,
			next: "kubectl get volumeattachment csi-pv-1-node-a -w",
		},
		{
			name:  "attached where the pod runs: the volume is not the problem",
			world: held("True", time.Hour),
			kind:  KindPod, target: "e2e/pod-a",
			code: VerdictAttached,
			next: "kubectl describe pod -n e2e pod-a   #", // a command that runs as written
		},
		{
			name: "the wanted node's attachment fails",
			world: newWorld().node("node-b", "True", time.Hour).volume("data", "pv-1", "").pod("pod-b", "node-b", "data").
				va("pv-1", "node-b", false, "rpc error: code = Unavailable desc = RDS unreachable").disks("pv-1"),
			kind: KindPod, target: "e2e/pod-b",
			code:    VerdictAttachFailing,
			summary: []string{"RDS unreachable"},
		},
		{
			name:  "no attachment asked for yet",
			world: newWorld().node("node-b", "True", time.Hour).volume("data", "pv-1", "").pod("pod-b", "node-b", "data").disks("pv-1"),
			kind:  KindPod, target: "e2e/pod-b",
			code: VerdictNoAttachment,
		},
		{
			name: "the claim is not bound",
			world: func() *world {
				w := newWorld().volume("data", "pv-1", "").pod("pod-b", "node-b", "data")
				w.c.PVCs[0].Spec.VolumeName, w.c.PVCs[0].Status.Phase = "", corev1.ClaimPending
				return w
			}(),
			kind: KindPod, target: "e2e/pod-b",
			code: VerdictNotBound,
			next: "kubectl describe pvc -n e2e data",
		},
		{
			name:  "the disk is gone from the RDS",
			world: held("True", time.Hour).disks("pv-other"),
			kind:  KindPV, target: "pv-1",
			code:    VerdictDiskMissing,
			summary: []string{"disk pv-1 of PV pv-1 is not on the RDS"},
		},
		{
			name: "without the inventory the verdict says the disk was not checked",
			world: func() *world {
				w := held("True", time.Hour).pod("pod-b", "node-b", "data")
				w.c.Inventory, w.c.InventoryNote = nil, "no --inventory-url"
				return w
			}(),
			kind: KindPod, target: "e2e/pod-b",
			code:    VerdictHeldByHealthyNode,
			summary: []string{"disk on the RDS not checked: no --inventory-url"},
		},
		{
			name:  "an unreadable claims annotation",
			world: newWorld().node("node-a", "True", time.Hour).volume("data", "pv-1", `{"node-a":42}`).pod("pod-a", "node-a", "data").disks("pv-1"),
			kind:  KindPod, target: "e2e/pod-a",
			code: VerdictClaimsUnreadable,
		},
		{
			name:  "a PV used by nobody",
			world: newWorld().volume("data", "pv-1", "").disks("pv-1"),
			kind:  KindPV, target: "pv-1",
			code: VerdictIdle,
		},
		{
			name: "raw block RWX: a third node is blocked by two healthy holders",
			world: newWorld().node("node-a", "True", time.Hour).node("node-b", "True", time.Hour).node("node-c", "True", time.Hour).
				volume("vm", "pv-1", `{"node-a":"2026-11-23T08:00:00Z","node-b":"2026-11-23T08:01:00Z"}`, corev1.ReadWriteMany).
				va("pv-1", "node-a", true, "").va("pv-1", "node-b", true, "").pod("virt-c", "node-c", "vm").disks("pv-1"),
			kind: KindPod, target: "e2e/virt-c",
			code: VerdictHeldByHealthyNode,
		},
		{
			name: "raw block RWX: the second node of a migration is not blocked",
			world: newWorld().node("node-a", "True", time.Hour).node("node-b", "True", time.Hour).
				volume("vm", "pv-1", `{"node-a":"2026-11-23T08:00:00Z"}`, corev1.ReadWriteMany).
				va("pv-1", "node-a", true, "").pod("virt-b", "node-b", "vm").disks("pv-1"),
			kind: KindPod, target: "e2e/virt-b",
			code: VerdictNoAttachment,
		},
		{
			name:  "a pod that does not exist",
			world: newWorld(),
			kind:  KindPod, target: "e2e/nope",
			code: VerdictMissing,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns, name, ok := strings.Cut(tt.target, "/")
			if !ok {
				ns, name = "", tt.target
			}
			ex := Why(&tt.world.c, tt.kind, ns, name)
			if len(ex.Stories) != 1 {
				t.Fatalf("stories = %+v, want 1", ex.Stories)
			}
			v := ex.Stories[0].Verdict
			if v.Code != tt.code {
				t.Fatalf("verdict = %+v, want code %s", v, tt.code)
			}
			for _, s := range tt.summary {
				if !strings.Contains(v.Summary, s) {
					t.Errorf("summary %q does not say %q", v.Summary, s)
				}
			}
			if !strings.Contains(v.Next, tt.next) || v.Next == "" {
				t.Errorf("next %q does not say %q", v.Next, tt.next)
			}
			for _, s := range tt.noNeedles {
				if strings.Contains(v.Summary+v.Next, s) {
					t.Errorf("verdict %+v must not say %q", v, s)
				}
			}
		})
	}
}

func TestWhyChain(t *testing.T) {
	w := held("Unknown", 7*time.Minute).pod("pod-b", "node-b", "data")
	s := Why(&w.c, KindPod, ns, "pod-b").Stories[0]
	if s.PVC != "e2e/data" || s.PV != "pv-1" || s.Handle != "pv-1" || s.WantNode != "node-b" || s.AccessModes != "ReadWriteOnce" {
		t.Errorf("chain = %+v", s)
	}
	if len(s.Attachments) != 1 || s.Attachments[0].Node != "node-a" || !s.Attachments[0].Attached {
		t.Errorf("attachments = %+v", s.Attachments)
	}
	if len(s.Claims) != 1 || s.Claims[0].Node != "node-a" || s.Claims[0].Attachment != "csi-pv-1-node-a" {
		t.Errorf("claims = %+v", s.Claims)
	}
	if len(s.Nodes) != 2 || s.Nodes[0].Ready != "Unknown" || !s.Nodes[0].ReadySince.Equal(w.c.Now.Add(-7*time.Minute)) || s.Nodes[1].Ready != "True" {
		t.Errorf("nodes = %+v", s.Nodes)
	}
	if s.Disk == nil || s.Disk.SizeBytes != 1<<30 {
		t.Errorf("disk = %+v", s.Disk)
	}
}

func TestParseClaims(t *testing.T) {
	got, err := ParseClaims(`{"a":"2026-11-23T08:00:00Z","b":{"at":"2026-11-23T09:00:00Z","uid":"u-b"}}`)
	if err != nil {
		t.Fatal(err)
	}
	if !got["a"].At.Equal(t0) || got["a"].UID != "" || !got["b"].At.Equal(t0.Add(time.Hour)) || got["b"].UID != "u-b" {
		t.Errorf("claims = %+v", got)
	}
	for _, bad := range []string{`[]`, `{"a":42}`, `{"a":{"uid":"u"}}`, `{"a":"yesterday"}`} {
		if _, err := ParseClaims(bad); err == nil {
			t.Errorf("ParseClaims(%s) accepted", bad)
		}
	}
	if m, err := ParseClaims(""); err != nil || len(m) != 0 {
		t.Errorf("empty: %v, %v", m, err)
	}
}

func TestAgo(t *testing.T) {
	for d, want := range map[time.Duration]string{40 * time.Second: "40s", 7*time.Minute + 10*time.Second: "7m", 125 * time.Minute: "2h5m"} {
		if got := Ago(d); got != want {
			t.Errorf("Ago(%s) = %s, want %s", d, got, want)
		}
	}
}
