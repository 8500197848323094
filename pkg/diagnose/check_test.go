package diagnose

import (
	"strings"

	"testing"
	"time"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/inventory"
)

func TestCheck(t *testing.T) {
	tests := []struct {
		name    string
		world   *world
		want    map[string]int // finding kind -> count; every other kind must be 0
		skipped []string
		message string
		next    string // a substring of the first finding's next step
	}{
		{name: "a healthy cluster", world: held("True", time.Hour).snapshots()},
		{
			name:  "a single-node volume attached to two Ready nodes",
			world: held("True", time.Hour).va("pv-1", "node-b", true, "").snapshots(),
			want:  map[string]int{FindingMultiHeld: 1}, message: "held by 2 nodes: node-a, node-b",
		},
		{
			name: "a fenced holder's VolumeAttachment does not count, its claim is gone",
			world: newWorld().node("node-a", "Unknown", time.Hour, OutOfServiceTaint).node("node-b", "True", time.Hour).
				volume("data", "pv-1", `{"node-b":"2026-11-23T08:00:00Z"}`).va("pv-1", "node-a", true, "").va("pv-1", "node-b", true, "").disks("pv-1").snapshots(),
		},
		{
			name: "a claim without a VolumeAttachment",
			world: newWorld().node("node-a", "Unknown", time.Hour).volume("data", "pv-1", `{"node-a":"2026-11-23T08:00:00Z"}`).
				disks("pv-1").snapshots(),
			want: map[string]int{FindingClaimWithoutVA: 1}, message: "node-a claims PV pv-1",
		},
		{
			name:  "a VolumeAttachment to a node that no longer exists",
			world: newWorld().volume("data", "pv-1", "").va("pv-1", "node-gone", false, "").disks("pv-1").snapshots(),
			want:  map[string]int{FindingVAToMissingNode: 1}, message: "names node node-gone, which does not exist",
		},
		{
			name:  "a disk without a PV, a PV without a disk, a snapshot without a content",
			world: held("True", time.Hour).volume("other", "pv-2", "").disks("pv-1", "pvc-orphan", "snap-1", "snap-2").snapshots("snap-1"),
			want:  map[string]int{FindingOrphanDisk: 1, FindingMissingDisk: 1, FindingOrphanSnapshot: 1},
		},
		{
			name: "without the inventory and the snapshot API, the RDS side is skipped, not failed",
			world: func() *world {
				w := held("True", time.Hour)
				w.c.Inventory, w.c.InventoryNote = nil, "no --inventory-url"
				w.c.SnapshotsNote = "the VolumeSnapshotContent API is not installed"
				return w
			}(),
			skipped: []string{"disks on the RDS: no --inventory-url", "snapshot files: the VolumeSnapshotContent API is not installed"},
		},
		{
			name:  "storage fencing: the export allows the holder's attachment",
			world: fencedWorld(true, hostA1, hostA1),
		},
		{
			name:  "storage fencing: the export allows another host than the holder's attachment",
			world: fencedWorld(true, hostA1, hostOther),
			want:  map[string]int{FindingExportMismatch: 1}, message: "allows " + inventory.HostFingerprint(hostOther),
		},
		{
			name:  "storage fencing: a claimed volume whose export is closed",
			world: fencedWorld(false, hostA1, "nqn.2014-08.org.nvmexpress:uuid:00000000-dead-4000-8000-000000000000"),
			want:  map[string]int{FindingExportMismatch: 1}, message: "export on the RDS is closed",
		},
		{
			name: "storage fencing: an unclaimed volume whose export is open",
			world: func() *world {
				w := newWorld().node("node-a", "True", time.Hour).volume("data", "pv-1", "").disks("pv-1").snapshots()
				w.c.Inventory.Disks[0].AllowHost = inventory.HostFingerprint(hostOther)
				return w
			}(),
			want: map[string]int{FindingExportMismatch: 1}, message: "no node claims it",
		},
		{
			name:  "an unreadable claims annotation",
			world: held("True", time.Hour).volume("other", "pv-2", `not json`).va("pv-2", "node-a", true, "").disks("pv-1", "pv-2").snapshots(),
			want:  map[string]int{FindingClaimsUnreadable: 1},
			message: "rds.csi.srvlab.io/claims: invalid character 'o' in literal null (expecting 'u'): the driver cannot tell which nodes hold volume pv-2, " +
				"skips the PV and refuses every publish and unpublish of it until the annotation is fixed; VolumeAttachments name node-a (attached)",
			next: "kubectl annotate pv pv-2 rds.csi.srvlab.io/claims-",
		},
		{
			// Its claims cannot be read, so check cannot say it is
			// unclaimed: "no node claims it" would have the operator
			// close the export under a live holder.
			name: "an unreadable claims annotation, its export open to a host",
			world: func() *world {
				w := held("True", time.Hour).snapshots()
				w.c.PVs[0].Annotations[claims.ClaimsAnnotation] = "not json"
				w.c.Inventory.Disks[0].AllowHost = inventory.HostFingerprint(hostA1)
				return w
			}(),
			want: map[string]int{FindingClaimsUnreadable: 1},
		},
		{
			name: "claims naming no time",
			world: held("True", time.Hour).volume("other", "pv-2", `{"node-a": "yesterday", "": "2024-01-01T00:00:00Z"}`).
				disks("pv-1", "pv-2").snapshots(),
			want: map[string]int{FindingClaimsUnreadable: 1}, message: "no VolumeAttachment names it",
		},
		{
			name: "an unreadable record of released attachments",
			world: func() *world {
				w := held("True", time.Hour).snapshots()
				w.c.PVs[0].Annotations[claims.RetiringAnnotation] = "[{"
				return w
			}(),
			want: map[string]int{FindingRetiringUnreadable: 1}, message: "PV pv-1: unreadable annotation rds.csi.srvlab.io/retiring",
			next: "kubectl annotate pv pv-1 rds.csi.srvlab.io/retiring-",
		},
		{
			name: "another driver's objects are not ours to judge",
			world: func() *world {
				w := held("True", time.Hour).snapshots()
				w.c.PVs[0].Spec.CSI.Driver = "other.csi"
				w.c.Attachments[0].Spec.Attacher = "other.csi"
				w.c.Inventory.Disks = nil
				return w
			}(),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Check(&tt.world.c)
			for kind, n := range r.Counts {
				if n != tt.want[kind] {
					t.Errorf("%s: %d, want %d; findings: %+v", kind, n, tt.want[kind], r.Findings)
				}
			}
			if r.OK != (len(tt.want) == 0) {
				t.Errorf("OK = %v with findings %+v", r.OK, r.Findings)
			}
			if strings.Join(r.Skipped, "|") != strings.Join(tt.skipped, "|") {
				t.Errorf("skipped = %q, want %q", r.Skipped, tt.skipped)
			}
			if tt.message != "" && (len(r.Findings) == 0 || !strings.Contains(r.Findings[0].Message, tt.message)) {
				t.Errorf("findings %+v do not say %q", r.Findings, tt.message)
			}
			if tt.next != "" && (len(r.Findings) == 0 || !strings.Contains(r.Findings[0].Next, tt.next)) {
				t.Errorf("findings %+v do not say next %q", r.Findings, tt.next)
			}
			for _, f := range r.Findings {
				if f.Next == "" || f.Object == "" {
					t.Errorf("finding without object or next step: %+v", f)
				}
			}
		})
	}
}

func TestPlanRelease(t *testing.T) {
	stale := func(nodeAReady string) *world {
		return newWorld().node("node-a", nodeAReady, 10*time.Minute).node("node-b", "True", time.Hour).
			volume("data", "pv-1", `{"node-a":"2026-11-23T08:00:00Z","node-c":{"at":"2026-11-23T08:00:01Z","uid":"u"}}`).disks("pv-1")
	}
	tests := []struct {
		name    string
		world   *world
		node    string
		refused string // substring of the error; empty: allowed
	}{
		{name: "NotReady node without a VolumeAttachment", world: stale("Unknown"), node: "node-a"},
		{name: "deleted node", world: stale("True"), node: "node-c"},
		{name: "Ready node", world: stale("True"), node: "node-a", refused: "node node-a is Ready"},
		{name: "a VolumeAttachment to the node exists", world: stale("Unknown").va("pv-1", "node-a", false, ""), node: "node-a", refused: "VolumeAttachment csi-pv-1-node-a"},
		{name: "a node without a claim", world: stale("Unknown"), node: "node-b", refused: "node node-b has no claim on PV pv-1 (claimed by node-a, node-c)"},
		{name: "a PV nobody claims", world: newWorld().volume("data", "pv-1", ""), node: "node-a", refused: "node node-a has no claim on PV pv-1 (no node claims it)"},
		{name: "an unknown PV", world: newWorld(), node: "node-a", refused: "not found"},
		{
			name: "a Ready node re-created since the claim",
			world: newWorld().node("node-a", "True", time.Minute).
				volume("data", "pv-1", `{"node-a":{"at":"2026-11-23T08:00:00Z","uid":"uid-before"}}`),
			node: "node-a",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pvName := "pv-1"
			plan, err := PlanRelease(&tt.world.c, pvName, tt.node)
			if tt.refused != "" {
				if err == nil || !strings.Contains(err.Error(), tt.refused) {
					t.Fatalf("err = %v, want a refusal saying %q", err, tt.refused)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if plan.ResourceVersion != "42" || !strings.Contains(string(plan.Patch), `"resourceVersion":"42"`) {
				t.Errorf("patch %s is not conditioned on resourceVersion 42", plan.Patch)
			}
			if plan.NodeState == "" {
				t.Error("the plan does not say why the node cannot be using the volume")
			}
			if strings.Contains(string(plan.Patch), `\"`+tt.node+`\"`) {
				t.Errorf("patch %s still names %s", plan.Patch, tt.node)
			}
		})
	}
	// The other claims keep their exact encoding (an object with a UID stays one).
	w := stale("Unknown")
	plan, err := PlanRelease(&w.c, "pv-1", "node-a")
	if err != nil {
		t.Fatal(err)
	}
	want := `{"metadata":{"annotations":{"rds.csi.srvlab.io/claims":"{\"node-c\":{\"at\":\"2026-11-23T08:00:01Z\",\"uid\":\"u\"}}"},"resourceVersion":"42"}}`
	if string(plan.Patch) != want {
		t.Errorf("patch\n %s\nwant\n %s", plan.Patch, want)
	}
	// The last claim removes the annotation.
	w = newWorld().volume("data", "pv-1", `{"node-a":"2026-11-23T08:00:00Z"}`)
	if plan, err = PlanRelease(&w.c, "pv-1", "node-a"); err != nil || !strings.Contains(string(plan.Patch), `"rds.csi.srvlab.io/claims":null`) {
		t.Errorf("last claim: patch %s, err %v", plan.Patch, err)
	}
}

const (
	hostA1    = "nqn.2014-08.org.nvmexpress:uuid:a1a1a1a1-0000-4000-8000-000000000001"
	hostOther = "nqn.2014-08.org.nvmexpress:uuid:0707a707-0000-4000-8000-000000000002"
)

// fencedWorld: pv-1 claimed by node-a, whose attachment's host NQN the
// attacher recorded as recorded; the disk is open (or closed) to allow.
func fencedWorld(open bool, recorded, allow string) *world {
	w := held("True", time.Hour).snapshots()
	w.c.Attachments[0].Status.AttachmentMetadata = map[string]string{"hostNQN": recorded}
	w.c.Inventory.Disks[0].Exported, w.c.Inventory.Disks[0].AllowHost = open, inventory.HostFingerprint(allow)
	return w
}
