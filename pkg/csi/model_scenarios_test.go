package csi

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/srvlab/rds-csi/pkg/informers"
)

// Scenarios of the publish model check (publish_model_test.go), scripted
// on its own harness: two replicas, watch streams delivered by hand, late
// RDS commands placed by hand, the model's checks on every answer. Each
// is a finding of the model check, as the smallest deterministic
// interleaving found, kept as a regression test once fixed. The open ones
// are in model_findings_test.go.

// scriptedModel is the model with nothing random: no late RDS commands,
// every stream of every replica delivered.
func scriptedModel(t *testing.T, fenced bool) *model {
	m := newModel(t, 1, fenced)
	m.lateOff = true
	return m
}

func (m *model) deliverAll() {
	m.collect()
	for _, r := range m.replicas {
		m.deliver(r, 1<<30)
	}
}

func (m *model) publishRequest(v *modelVolume, node string) *csi.ControllerPublishVolumeRequest {
	return &csi.ControllerPublishVolumeRequest{VolumeId: v.id, NodeId: m.nodeID(node), VolumeCapability: m.capability(v.multi)}
}

// ensureVA creates node's VolumeAttachment of v (not attached yet), as the
// attach/detach controller does before a publish.
func (m *model) ensureVA(v *modelVolume, node string) {
	if m.getVA(v, node) != nil {
		return
	}
	va := testVA(v.pvs[len(v.pvs)-1], node, publishNow)
	va.Name = m.vaName(v, node)
	va.Status.Attached = false
	m.newVAUID(va)
	if _, err := m.api.StorageV1().VolumeAttachments().Create(m.ctx, va, metav1.CreateOptions{}); err != nil {
		m.t.Fatal(err)
	}
}

// taintOutOfService taints node out of service, as nodeOp does.
func (m *model) taintOutOfService(node string) {
	n, err := m.api.CoreV1().Nodes().Get(m.ctx, node, metav1.GetOptions{})
	if err != nil {
		m.t.Fatal(err)
	}
	n.Spec.Taints = []corev1.Taint{{Key: informers.OutOfServiceTaint, Effect: corev1.TaintEffectNoExecute}}
	if _, err := m.api.CoreV1().Nodes().Update(m.ctx, n, metav1.UpdateOptions{}); err != nil {
		m.t.Fatal(err)
	}
	m.oos[node] = true
	m.voidHolds(node, m.uid[node])
}

// timeOutSwap makes the n-th SwapExport from now (1 = the next) answer
// a timeout; its command is lost (it never lands).
func (m *model) timeOutSwap(n int) {
	calls := 0
	m.rds.mu.Lock()
	defer m.rds.mu.Unlock()
	m.rds.delaySwap = func(s *lateSwap) (bool, bool) {
		calls++
		if calls != n {
			return false, false
		}
		s.lost = true
		return true, false
	}
}

func (m *model) dropLost() {
	m.rds.mu.Lock()
	defer m.rds.mu.Unlock()
	for _, s := range append([]*lateSwap(nil), m.rds.inFlight...) {
		m.rds.loseLocked(s)
	}
	m.rds.delaySwap = nil
}

// Found by the model check (finding 1, fixed in dd90a1e): a handle with
// two PersistentVolumes (a Retained volume's PV re-created). Commit wrote
// the claims as the index merged them over both PVs to each PV in turn,
// each patch conditional on that PV's resourceVersion. With a replica's
// view of the first PV current and of the second stale, the first patch
// succeeded with a claim only the stale second PV still showed, and only
// the second conflicted: a claim released by an answered unpublish was
// back, with its old nonce, on no VolumeAttachment; with storage fencing
// the export was opened to that retired attachment's host once the other
// holder left.
//
// Interleaving (raw-block RWX volume, so that a second node may join):
//  1. r0 publishes to n0 (claim n0:N0 on PV-a and PV-b, export open to N0).
//  2. n0's VolumeAttachment is deleted; r1 unpublishes n0: n0's claim is
//     released on PV-a, then on PV-b; the export is closed.
//  3. r0's PV stream delivers the first of those two writes only.
//  4. r0 publishes to n1: its index still shows n0:N0 (from PV-b) and sees
//     n1 joining a migration; the commit of PV-a (current) succeeds, that
//     of PV-b conflicts (ABORTED). PV-a must not carry n0:N0 again.
//  5. With the indexes caught up, n1 publishes and is unpublished: the
//     export must not be opened to N0.
func TestCommitDoesNotBringBackAReleasedClaim(t *testing.T) {
	m := scriptedModel(t, true)
	r0, r1 := m.replicas[0], m.replicas[1]
	v := m.vols[3] // raw-block ReadWriteMany
	if !v.multi {
		t.Fatal("want the multi-writer volume")
	}
	m.createPV(v) // a second PV of the handle
	m.deliverAll()

	// 1.
	m.publish(r0, v, "n0")
	n0Host := m.answeredCtx[m.vaName(v, "n0")][PublishContextHostNQN]
	if n0Host == "" {
		t.Fatal("the publish to n0 failed")
	}
	m.markAttached()
	m.deliverAll()

	// 2.
	m.unpublish(r1, v, "n0")
	if m.getVA(v, "n0") != nil {
		t.Fatal("the unpublish of n0 failed")
	}
	for _, pv := range v.pvs {
		if _, ok := claimsOf(t, m.api, pv)["n0"]; ok {
			t.Fatalf("n0's claim is still on %s after its unpublish", pv)
		}
	}
	m.collect()
	// 3.
	m.deliverStream(r0, "volumeattachments", 1<<30)
	m.deliverStream(r0, "nodes", 1<<30)
	m.deliverStream(r0, "persistentvolumes", 1)
	if _, stale := r0.index.Volume(v.id).Claims["n0"]; !stale {
		t.Fatal("scripting: r0's index should still show n0's claim from the second PV")
	}

	// 4.
	m.ensureVA(v, "n1")
	_, err := r0.cs.ControllerPublishVolume(m.ctx, m.publishRequest(v, "n1"))
	t.Logf("r0's publish to n1 with a stale view of one PV: %v", codeOf(err))
	var back []string
	for _, pv := range v.pvs {
		if c, ok := claimsOf(t, m.api, pv)["n0"]; ok {
			back = append(back, pv+" (nonce "+c.Nonce+")")
		}
	}
	if len(back) > 0 {
		t.Errorf("n0's claim, released by an answered unpublish, is back on %v with no VolumeAttachment of n0", back)
	}

	// 5.
	m.deliverAll()
	m.publish(r1, v, "n1")
	m.markAttached()
	m.deliverAll()
	m.unpublish(r1, v, "n1")
	m.deliverAll()
	if d, _ := m.rds.disk(v.id); d.Exported && d.AllowHost == n0Host {
		t.Errorf("the export is open to %s, the host of n0's attachment whose unpublish was answered in step 2", n0Host)
	}
	m.check()
}

// Found by the model check (finding 3, fixed in dd90a1e):
// ControllerUnpublish shuts the node's host out, releases its claim, then
// makes one more export change (retireExport). When that last change
// failed (an RDS timeout), the unpublish failed and the detach was
// retried with the claim already gone; a replica whose VolumeAttachment
// watch lagged then admitted another node of a single-node volume while
// the first node's detach had not completed. Since the fix that change is
// best effort after a release: the unpublish answers OK.
//
// Interleaving (ReadWriteOnce volume; r1's VolumeAttachment watch stalls
// throughout):
//  1. r0 publishes to n0, the attacher records it (attached).
//  2. n0's VolumeAttachment is deleted; r0's unpublish closes the export,
//     releases n0's claim, and its last export change times out.
//  3. r1 sees the PV (no claim) but none of n0's VolumeAttachment events,
//     and publishes to n1.
func TestUnpublishAfterItsReleaseIsDone(t *testing.T) {
	m := scriptedModel(t, true)
	r0, r1 := m.replicas[0], m.replicas[1]
	v := m.vols[0]
	deliverButVAs := func() {
		m.collect()
		m.deliver(r0, 1<<30)
		m.deliverStream(r1, "persistentvolumes", 1<<30)
		m.deliverStream(r1, "nodes", 1<<30)
	}
	// 1.
	m.publish(r0, v, "n0")
	m.markAttached()
	deliverButVAs()
	if !m.holdOf(v, "n0") {
		t.Fatal("scripting: the publish to n0 should succeed")
	}
	// 2.
	m.timeOutSwap(2)
	m.unpublish(r0, v, "n0")
	m.dropLost()
	if va := m.getVA(v, "n0"); va != nil {
		t.Fatalf("n0's unpublish failed after releasing its claim (its detach retried with the claim gone): %v", va.Status)
	}
	if d, _ := m.rds.disk(v.id); d.Exported {
		t.Fatalf("the export is open to %s after n0's unpublish", d.AllowHost)
	}
	deliverButVAs()
	// 3.
	m.publish(r1, v, "n1")
	m.check()
	if !m.holdOf(v, "n1") {
		t.Fatal("n1's publish after n0's detach should succeed")
	}
}

// Found by the model check (finding 5, fixed in dd90a1e): a publish that
// fenced a live migration's other holder did not drop that holder's
// connection when the export already allowed the requester: its claim
// went with the commit, and syncExport, finding the export open to the
// requester (the migration's target), changed nothing. The fenced source
// kept its connection, with no claim left for the fencer to cut.
//
// Interleaving (raw-block RWX volume):
//  1. r0 publishes to n2 (export open to H2), then to n0, the migration's
//     target (export moved to H0 without a drop: n2 stays connected).
//  2. n2 is tainted out of service; r0 (not the leader: its fencer does
//     not act) sees it, the leader does not yet.
//  3. r0 publishes to n0 again: the decision fences n2 (its claim goes
//     with the commit), and the connections must be dropped.
func TestCommitFenceDropsTheFencedHolder(t *testing.T) {
	m := scriptedModel(t, true)
	r0 := m.replicas[0]
	v := m.vols[3]
	m.leader = 1
	// 1.
	m.publish(r0, v, "n2")
	m.markAttached()
	m.deliverAll()
	m.publish(r0, v, "n0")
	m.markAttached()
	m.deliverAll()
	if !m.conns[v.id]["n2"] || !m.conns[v.id]["n0"] {
		t.Fatalf("scripting: both holders should be connected: %v", m.conns[v.id])
	}
	m.rds.mu.Lock()
	drops := m.rds.drops[v.id]
	m.rds.mu.Unlock()
	// 2.
	m.taintOutOfService("n2")
	m.collect()
	m.deliverStream(r0, "nodes", 1<<30)
	// 3.
	if _, err := r0.cs.ControllerPublishVolume(m.ctx, m.publishRequest(v, "n0")); err != nil {
		t.Fatalf("scripting: the repeated publish to n0 should fence n2 and succeed: %v", err)
	}
	if _, ok := m.liveClaims(v)["n2"]; ok {
		t.Fatal("scripting: n2's claim should be gone with the commit")
	}
	m.rds.mu.Lock()
	after := m.rds.drops[v.id]
	m.rds.mu.Unlock()
	if after == drops {
		t.Errorf("n2 was fenced by n0's publish (its claim released with the commit) and the export never dropped its connection: the fenced node keeps writing next to n0")
	}
	// The leader catches up: nothing is left for its fencer to cut.
	m.deliverAll()
	m.rds.mu.Lock()
	after = m.rds.drops[v.id]
	m.rds.mu.Unlock()
	if after == drops {
		t.Errorf("once every replica caught up, n2's connection has still not been dropped")
	}
	m.check()
}
