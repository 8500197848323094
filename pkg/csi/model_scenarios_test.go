package csi

import (
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// Scenarios of the publish model check (publish_model_test.go), scripted
// on its own harness: two replicas, watch streams delivered by hand, late
// RDS commands placed by hand, the model's checks on every answer. Each
// is a finding of the model check, as the smallest deterministic
// interleaving found, kept as a regression test once fixed.

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
	n.Spec.Taints = []corev1.Taint{{Key: fencing.OutOfServiceTaint, Effect: corev1.TaintEffectNoExecute}}
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
	m.rds.delaySwap = func(s *lateSwap) bool {
		calls++
		if calls != n {
			return false
		}
		s.lost = true
		return true
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
	if stale := r0.index.Volume(v.id).Claims.Has("n0"); !stale {
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

// Fixed after the model found them (findings 6, 7, 8; see the comment on
// each for the interleaving).

// Finding 6 (in the model check on dd90a1e:
// RDS_CSI_MODEL_SEED=1 RDS_CSI_MODEL_OPS=2186, step 2186): the fix of finding 1 is incomplete. Commit now
// writes each PV its own claims plus the change, but the change itself,
// the requester's claim, is taken from the index's merged view: a repeated
// publish of a node (decideAndCommit: claimed && same UID, "the same
// attachment") reuses a claim that only a stale PV still shows, after an
// answered unpublish released it. The first PV, current, is written that
// released claim with its old nonce before the stale one conflicts.
// The node's next attachment then gets the retired attachment's host NQN
// (the export is opened to it): "a host fenced once can never reconnect
// to a later export of the volume, not even when the volume comes back to
// the same node" does not hold.
//
// Interleaving (ReadWriteOnce volume with two PVs):
//  1. r0 publishes to n0 (claim n0:N0 on PV-a and PV-b, export open to H0).
//  2. n0's VolumeAttachment is deleted; r1 unpublishes n0: its claim is
//     released on PV-a, then on PV-b; the export is closed.
//  3. r0's PV stream delivers the first of those two writes only.
//  4. n0 attaches again (a new VolumeAttachment); r0 publishes to n0: its
//     index still shows n0:N0 (from PV-b), so the publish is a repeated
//     one of that attachment; PV-a (current) is written n0:N0, PV-b
//     conflicts: ABORTED, but n0:N0 is back on PV-a.
//  5. With the indexes caught up, n0's publish is retried: it reuses N0,
//     and the export is opened to H0, the first attachment's host.
func TestRepublishDoesNotBringBackItsReleasedClaim(t *testing.T) {
	m := scriptedModel(t, true)
	r0, r1 := m.replicas[0], m.replicas[1]
	v := m.vols[0]
	m.createPV(v)
	m.deliverAll()
	// 1.
	m.publish(r0, v, "n0")
	h0 := m.answeredCtx[m.vaName(v, "n0")][PublishContextHostNQN]
	if h0 == "" {
		t.Fatal("scripting: the publish to n0 should succeed")
	}
	m.markAttached()
	m.deliverAll()
	// 2.
	m.unpublish(r1, v, "n0")
	if m.getVA(v, "n0") != nil {
		t.Fatal("scripting: the unpublish of n0 should succeed")
	}
	m.collect()
	// 3.
	m.deliverStream(r0, "volumeattachments", 1<<30)
	m.deliverStream(r0, "nodes", 1<<30)
	m.deliverStream(r0, "persistentvolumes", 1)
	if stale := r0.index.Volume(v.id).Claims.Has("n0"); !stale {
		t.Fatal("scripting: r0's index should still show n0's claim from the second PV")
	}
	// 4.
	m.ensureVA(v, "n0")
	_, err := r0.cs.ControllerPublishVolume(m.ctx, m.publishRequest(v, "n0"))
	t.Logf("r0's publish to n0 with a stale view of one PV: %v", codeOf(err))
	for _, pv := range v.pvs {
		if c, ok := claimsOf(t, m.api, pv)["n0"]; ok && m.hostOf(v.id, "n0", c) == h0 {
			t.Errorf("n0's first attachment's claim, released by an answered unpublish, is back on %s (nonce %s)", pv, c.Nonce)
		}
	}
	// 5.
	m.deliverAll()
	resp, err := r1.cs.ControllerPublishVolume(m.ctx, m.publishRequest(v, "n0"))
	if err != nil {
		t.Logf("n0's publish once the indexes caught up: %v", err)
		return
	}
	if host := resp.GetPublishContext()[PublishContextHostNQN]; host == h0 {
		t.Errorf("n0's second attachment was given %s, the host NQN of its first, retired attachment (the export is open to it)", host)
	}
}

// Finding 7 (in the model check on dd90a1e:
// RDS_CSI_MODEL_SEED=48 RDS_CSI_MODEL_OPS=27281, step 27281; a variant of
// finding 5, whose fix drops connections when a publish fences another
// node's claim): a
// publish from a node that was deleted and re-created replaces its old
// incarnation's claim (another UID: a new attachment, a new host NQN)
// without dropping a connection, when the export is moved between the
// holders of a live migration. The old incarnation's attachment is
// retired (its claim is gone), but a kernel of it that still runs (the
// node was deleted, not shut down) keeps the connection it has and
// keeps writing next to the holders.
//
// Interleaving (raw-block RWX volume; the leader r1 does not see the
// node events, so its fencer does not act):
//  1. r0 publishes to n2 (export open to H2), then to n0, the migration's
//     target (export moved to H0 without a drop: n2 stays connected).
//  2. n2 is deleted and re-created (a new UID).
//  3. r0 publishes to n2 (its VolumeAttachment still stands): the claim of
//     n2's old incarnation is replaced by a new one (host H2'), and the
//     export is moved to H2', the newest claim, without a drop.
func TestRecreatedNodeLosesItsOldConnection(t *testing.T) {
	m := scriptedModel(t, true)
	r0, v := m.replicas[0], m.vols[3]
	// 1, 2.
	h2, drops := m.recreateMigrationSource(r0, v)
	// 3.
	resp, err := r0.cs.ControllerPublishVolume(m.ctx, m.publishRequest(v, "n2"))
	if err != nil {
		t.Fatalf("scripting: the publish of n2's new incarnation should succeed: %v", err)
	}
	if host := resp.GetPublishContext()[PublishContextHostNQN]; host == h2 {
		t.Fatal("scripting: n2's new incarnation should get a new attachment")
	}
	for _, c := range m.liveClaims(v) {
		if c.NodeUID != m.uid["n2"] && m.hostOf(v.id, "n2", c) == h2 {
			t.Fatal("scripting: the old incarnation's claim should be gone")
		}
	}
	m.rds.mu.Lock()
	after := m.rds.drops[v.id]
	m.rds.mu.Unlock()
	if after == drops {
		t.Errorf("n2's old incarnation's claim was replaced (its attachment %s retired) and the export never dropped a connection: a kernel of the deleted node that still runs keeps writing", h2)
	}
}

// Finding 8 (seen in the model check on dd90a1e, RDS_CSI_MODEL_SEED=47
// at step 53092, as one of the ways a state comes back for finding 4; no
// invariant of the model fails on it alone): the fence of a node on a handle with two PVs lets the node
// in again half-way. The fencer releases the claim PV by PV
// (ReleaseIfStale per PV): CutOff drops the fenced node's host, its claim
// goes from the first PV, and Settle then re-derives the export from the
// live claims of every PV of the handle, where the second PV still
// carries the fenced node's claim: the export is reopened to the fenced
// attachment, whose kernel (the node may still run) reconnects, until the
// second PV's fence cuts it again. Its writes land in the middle of its
// fence, and the state "open to the fenced host" comes back.
//
// Interleaving (ReadWriteOnce volume with two PVs; r0 leads):
//  1. r0 publishes to n0 (export open to H0).
//  2. n0 is tainted out of service; r0's fencer cuts it and releases its
//     claim on the first PV, Settles, then does the same for the second.
func TestFenceDoesNotReopenBetweenPVs(t *testing.T) {
	m := scriptedModel(t, true)
	r0 := m.replicas[0]
	v := m.vols[0]
	m.leader = 0
	m.createPV(v)
	m.deliverAll()
	// 1.
	m.publish(r0, v, "n0")
	h0 := m.answeredCtx[m.vaName(v, "n0")][PublishContextHostNQN]
	if h0 == "" {
		t.Fatal("scripting: the publish to n0 should succeed")
	}
	m.markAttached()
	m.deliverAll()
	// 2.
	var seq []string
	m.rds.mu.Lock()
	follow := m.rds.onChange
	m.rds.onChange = func(slot string, before, after rds.Disk) {
		follow(slot, before, after)
		if slot == v.id {
			seq = append(seq, stateLabel(rds.StateOf(&after)))
		}
	}
	m.rds.mu.Unlock()
	m.taintOutOfService("n0")
	m.deliverAll()
	if _, ok := m.liveClaims(v)["n0"]; ok {
		t.Fatal("scripting: the fence of n0 should be complete")
	}
	cut := false
	for _, s := range seq {
		if !strings.HasPrefix(s, "open") {
			cut = true
		} else if cut && s == stateLabel(rds.ExportState{Open: true, Host: h0}) {
			t.Errorf("the fence of n0 cut its host and then opened the export to it again before the fence completed: %v", seq)
			break
		}
	}
}

// Found by the model check (finding 4, fixed by parking): a swap that
// lands late after an attachment was retired let it in again, because the
// open state it was conditioned on came back (ABA): a fence's cut drops
// the export and reopens it to the remaining holder, the very state a
// migration's join move was conditioned on. Now no swap conditioned on an
// open state lets a host in (it parks the export at a fresh host first),
// and rds.Client no longer re-sends a swap whose outcome is unknown.
//
// Interleaving (raw-block RWX volume):
//  1. r0 publishes to n2 (export open to H2).
//  2. r0 publishes to n0, the migration's target: its first swap times
//     out and stays in flight; the publish fails. The retried publish
//     succeeds: export open to H0, n2 still connected.
//  3. n0 is tainted out of service; the leader fences it: the cut
//     closes the export (both connections dropped) and reopens it to H2,
//     n0's claim is released. The fence is complete.
//  4. The first swap of step 2 lands. Before the fix it was "open to H2
//     -> open to H0" and matched: n0, fenced, was let in again.
func TestLateJoinDoesNotLetARetiredHolderIn(t *testing.T) {
	m := scriptedModel(t, true)
	r0 := m.replicas[0]
	v := m.vols[3]
	m.leader = 0
	// 1.
	m.publish(r0, v, "n2")
	m.markAttached()
	m.deliverAll()
	// 2.
	var first *lateSwap
	m.rds.mu.Lock()
	m.rds.delaySwap = func(s *lateSwap) bool {
		if first != nil {
			return false
		}
		first = s
		s.due = 1 << 30 // in flight until landed by hand (step 4)
		return true
	}
	m.rds.mu.Unlock()
	m.publish(r0, v, "n0")
	m.rds.mu.Lock()
	m.rds.delaySwap = nil
	m.rds.mu.Unlock()
	if first == nil || !first.from.Open {
		t.Fatalf("scripting: n0's publish should have sent a swap from the open export (%+v)", first)
	}
	if _, ok := m.answeredCtx[m.vaName(v, "n0")]; ok {
		t.Fatal("scripting: n0's publish whose swap timed out should have failed")
	}
	m.deliverAll()
	m.publish(r0, v, "n0")
	h0 := m.answeredCtx[m.vaName(v, "n0")][PublishContextHostNQN]
	if h0 == "" {
		t.Fatal("scripting: n0's retried publish should succeed")
	}
	m.markAttached()
	m.deliverAll()
	// 3.
	m.taintOutOfService("n0")
	m.deliverAll()
	if _, ok := m.liveClaims(v)["n0"]; ok {
		t.Fatal("scripting: the fence of n0 should be complete (its claim released)")
	}
	if d, _ := m.rds.disk(v.id); !d.Exported || d.AllowHost == h0 {
		t.Fatalf("scripting: after the fence the export should allow n2 alone: %+v", d)
	}
	// 4.
	m.rds.mu.Lock()
	matched := m.rds.landLocked(first)
	m.rds.mu.Unlock()
	if d, _ := m.rds.disk(v.id); matched && d.Exported && d.AllowHost == h0 {
		t.Errorf("the first swap of n0's join (%s -> %s), sent before n0 was fenced, landed after the fence completed and opened the export to %s, the fenced attachment's host", stateLabel(first.from), stateLabel(first.to), h0)
	}
	// The reconcile undoes whatever the late swap left: the export allows
	// n2's attachment again.
	if _, err := r0.fence.Reconcile(m.ctx, nil); err != nil {
		t.Fatal(err)
	}
	h2 := m.answeredCtx[m.vaName(v, "n2")][PublishContextHostNQN]
	if d, _ := m.rds.disk(v.id); !d.Exported || d.AllowHost != h2 {
		t.Errorf("after the reconcile the export is %+v, want open to n2's %s", d, h2)
	}
}

// Found by the model check (finding 2, on dd90a1e: seed 1, step 1441):
// a live migration's source whose connection a fence dropped was told it
// may write while the export let in the target alone.
// decideAndCommit passes admitted=true to syncExport when the source's
// VolumeAttachment is attached with this attachment's host NQN (it was
// let in before, "and keeps the connection it has"), and syncExport then
// leaves an export that allows the other holder as it is. But a fence of
// the source cuts (drops every connection and reopens the export to the
// remaining holder) BEFORE it releases the source's claim; when the fence
// does not complete (its reopen times out, or the release fails; it is
// retried later), the claim and the attached VolumeAttachment remain, the
// connection does not. No second writer results: the source cannot
// connect. But the success answered is not backed by an export open to
// that attachment (issue 21's invariant), and a source that is back in
// service (untainted, or Ready again before the retried fence reads it)
// stays cut off while it is told it may write: the migration's source VM
// loses its disk. (The model found it with n0 still out of service.)
//
// Interleaving (raw-block RWX volume):
//  1. r0 publishes to n0 (export open to H0), the attacher records it.
//  2. r0 publishes to n1, the migration target (export moved to H1,
//     without a drop: n0 keeps its connection).
//  3. n0 is tainted out of service; the leader's fence of n0 cuts: the
//     export is closed (n0's and n1's connections dropped), and its
//     reopen to H1 times out: the fence fails, n0's claim stays.
//  4. The leader's reconcile reopens the export to H1 (n1 reconnects).
//  5. n0 is back in service (the taint removed; the retried fence keeps
//     its claim), and r1 publishes to n0 again (its VolumeAttachment is
//     attached as H0). It was answered OK with H0 (the publish trusted
//     the VolumeAttachment's status: "let in before, keeps its
//     connection") while the export allowed H1 alone and n0's kernel
//     could not reconnect. Now the older holder's repeated publish is
//     refused (ABORTED) while the export allows the newer one.
func TestCutSourceNotToldItMayWrite(t *testing.T) {
	m := scriptedModel(t, true)
	r0, r1 := m.replicas[0], m.replicas[1]
	v := m.vols[3]
	// 1, 2.
	m.publish(r0, v, "n0")
	m.markAttached()
	m.deliverAll()
	h0 := m.answeredCtx[m.vaName(v, "n0")][PublishContextHostNQN]
	m.publish(r0, v, "n1")
	m.markAttached()
	m.deliverAll()
	h1 := m.answeredCtx[m.vaName(v, "n1")][PublishContextHostNQN]
	if h0 == "" || h1 == "" {
		t.Fatal("scripting: the publishes to n0 and n1 should succeed")
	}
	if d, _ := m.rds.disk(v.id); !d.Exported || d.AllowHost != h1 || !m.conns[v.id]["n0"] {
		t.Fatalf("scripting: the export should allow the target with the source still connected: %+v, conns %v", d, m.conns[v.id])
	}
	// 3. (The cut's swaps: park, drop, reopen; the reopen times out.)
	m.leader = 0
	m.timeOutSwap(3)
	m.taintOutOfService("n0")
	m.deliverAll()
	m.dropLost()
	if _, ok := m.liveClaims(v)["n0"]; !ok {
		t.Fatal("scripting: the fence of n0 should have failed with its claim kept")
	}
	if m.conns[v.id]["n0"] {
		t.Fatal("scripting: the fence's cut should have dropped n0's connection")
	}
	// 4.
	if _, err := r0.fence.Reconcile(m.ctx, nil); err != nil {
		t.Fatal(err)
	}
	if d, _ := m.rds.disk(v.id); !d.Exported || d.AllowHost != h1 {
		t.Fatalf("scripting: the reconcile should reopen the export to the target: %+v", d)
	}
	// 5. n0 is back in service (the taint removed): the retried fence
	// keeps its claim.
	n, err := m.api.CoreV1().Nodes().Get(m.ctx, "n0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.Taints = nil
	if _, err := m.api.CoreV1().Nodes().Update(m.ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	m.oos["n0"] = false
	m.deliverAll()
	resp, err := r1.cs.ControllerPublishVolume(m.ctx, m.publishRequest(v, "n0"))
	if err == nil {
		d, _ := m.rds.disk(v.id)
		if host := resp.GetPublishContext()[PublishContextHostNQN]; !d.Exported || d.AllowHost != host {
			t.Fatalf("n0 (the migration source, its connection dropped by the fence's cut in step 3) was told it may write as %s, while the export allows only %s (the target): it cannot connect", host, d.AllowHost)
		}
		return
	}
	if status.Code(err) != codes.Aborted {
		t.Errorf("the repeated publish of the cut source: %v, want ABORTED (retried once the migration settled)", err)
	}
	if d, _ := m.rds.disk(v.id); !d.Exported || d.AllowHost != h1 {
		t.Errorf("the refused publish changed the export: %+v, want it open to the target's %s", d, h1)
	}
}

// Found by the publish model check after the review fixes (seed 2, step
// 199577 at 300 000 operations): a publish that replaces its node's own
// earlier attachment (here: the node deleted and re-created while its old
// attachment, a live migration's source, stays connected) released the
// old claim with its commit and cut it off only after; when that cut was
// lost (an RDS timeout), the old claim was gone and its connection was
// never dropped. Now the old attachment is cut off before the commit, as
// fenced nodes are: a lost cut fails the publish with the old claim kept.
func TestReplacedOwnAttachmentCutBeforeItsClaimGoes(t *testing.T) {
	m := scriptedModel(t, true)
	r0, v := m.replicas[0], m.vols[3]
	h2, drops := m.recreateMigrationSource(r0, v)
	// The drop of the cut (after its park) times out and never lands.
	m.timeOutSwap(2)
	_, err := r0.cs.ControllerPublishVolume(m.ctx, m.publishRequest(v, "n2"))
	m.dropLost()
	m.rds.mu.Lock()
	dropped := m.rds.drops[v.id] != drops
	m.rds.mu.Unlock()
	oldKept := false
	for n, c := range m.liveClaims(v) {
		if n == "n2" && m.hostOf(v.id, "n2", c) == h2 {
			oldKept = true
		}
	}
	if !dropped && !oldKept {
		t.Errorf("n2's old attachment %s lost its claim (publish: %v) and its connection was never dropped: nothing is left to cut it", h2, err)
	}
}

// recreateMigrationSource publishes v to n2, then to n0 (a migration,
// both connected), then deletes and re-creates n2's Node (r0 sees the new
// incarnation). It returns n2's old attachment host and the drops so far.
func (m *model) recreateMigrationSource(r0 *modelReplica, v *modelVolume) (string, int) {
	t := m.t
	t.Helper()
	m.leader = 1
	m.publish(r0, v, "n2")
	m.markAttached()
	m.deliverAll()
	h2 := m.answeredCtx[m.vaName(v, "n2")][PublishContextHostNQN]
	m.publish(r0, v, "n0")
	m.markAttached()
	m.deliverAll()
	if !m.conns[v.id]["n2"] || !m.conns[v.id]["n0"] || h2 == "" {
		t.Fatalf("scripting: both holders should be connected: %v", m.conns[v.id])
	}
	m.rds.mu.Lock()
	drops := m.rds.drops[v.id]
	m.rds.mu.Unlock()
	if err := m.api.CoreV1().Nodes().Delete(m.ctx, "n2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	m.voidHolds("n2", m.uid["n2"])
	m.uid["n2"] = ""
	if _, err := m.api.CoreV1().Nodes().Create(m.ctx, m.newNode("n2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	m.collect()
	m.deliverStream(r0, "nodes", 1<<30)
	return h2, drops
}
