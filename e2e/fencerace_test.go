//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/srvlab/rds-csi/e2e/framework"
	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// Issue 21 on the real control plane: storage fencing under a paused
// replica and a stalled RDS command. Two controller replicas (driver,
// csi-provisioner, csi-attacher each, 4s/3s/1s leases) with
// --storage-fencing=allow-host; nodes node-2 and node-3 register host
// NQNs; one RWO filesystem claim "data". Every scenario ends with: never
// two holders by what the replicas answered, the PV's claims naming
// exactly the node whose live VolumeAttachment is attached, and the
// volume's export open to that attachment's own host NQN alone (closed
// once nothing holds it), without an export change since it was opened
// to it (a late step that undid it and was repaired would show).

const publishMethod = "/csi.v1.Controller/ControllerPublishVolume"

// fenceRaceWorld is the two replicas, the simulator and the claim.
type fenceRaceWorld struct {
	e      *framework.Env
	sim    *framework.Sim
	dep    *framework.Deployment
	a, b   *framework.Replica
	mon    *framework.AttachmentMonitor
	pv     string
	handle string
	// openFromClosed is the text of an RDS command that opens the
	// volume's export from the state it was provisioned in (closed, with
	// its first tombstone host): SwapExport's compare-and-swap, which
	// matches nothing once any export change happened since.
	openFromClosed string
}

// startFenceRace starts ctrl-a alone (so it leads the driver and both
// sidecars), then ctrl-b, and provisions the claim through ctrl-a.
func startFenceRace(t *testing.T, driverArgs ...string) *fenceRaceWorld {
	t.Helper()
	e := framework.NewEnv(t, framework.EnvOptions{})
	ctx, c, tl := e.Ctx, e.Client, e.TL
	w := &fenceRaceWorld{e: e}
	w.sim = e.StartSim(framework.SimOptions{})
	for _, n := range []string{"node-2", "node-3"} {
		e.NewNode(n)
	}
	w.dep = framework.Deploy(ctx, t, tl, e.CP, e.Dir)
	framework.DeployFile(ctx, t, tl, e.CP, "manifests/overlays/storage-fencing/fencing-rbac.yaml")
	var err error
	if w.mon, err = framework.WatchAttachments(ctx, c); err != nil {
		t.Fatal(err)
	}
	opts := func(name string) framework.ReplicaOptions {
		return framework.ReplicaOptions{Name: name, LeaderElection: framework.FastLeaderElection,
			DriverArgs: append([]string{"--storage-fencing=allow-host"}, driverArgs...)}
	}
	w.a = e.StartReplica(w.sim, w.dep, opts("ctrl-a"))
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "ctrl-a holds the driver's, csi-provisioner's and csi-attacher's Leases",
		framework.LeasesHeldBy(c, w.dep.Namespace, "ctrl-a", 3)); err != nil {
		t.Fatal(err)
	}
	w.b = e.StartReplica(w.sim, w.dep, opts("ctrl-b"))
	if _, err := framework.WaitFor(ctx, tl, 30*time.Second, "ctrl-b reports rds_csi_leader 0", w.b.MetricEquals("rds_csi_leader", 0)); err != nil {
		t.Fatal(err)
	}

	done := tl.Step("StorageClass + 1Gi RWO PVC e2e/data")
	w.pv, w.handle = provisionData(t, e, w.sim)
	d, _ := w.sim.Disk(w.handle)
	if d.NVMeTCPExport {
		t.Fatalf("disk %s is exported before any publish (allow-host %q)", w.handle, d.AllowHostName)
	}
	w.openFromClosed = fmt.Sprintf(`nvme-tcp-server-allow-host-name=%q and nvme-tcp-export=no] nvme-tcp-export=yes`, d.AllowHostName)
	tl.Logf("disk %s provisioned closed (allowed host %q)", w.handle, d.AllowHostName)
	done()
	return w
}

func (w *fenceRaceWorld) createPod(t *testing.T, name, node string) {
	t.Helper()
	if _, err := w.e.Client.CoreV1().Pods(framework.TestNamespace).Create(w.e.Ctx,
		framework.PodOnNode(framework.TestNamespace, name, node, "data"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// exportOnlyTo holds once the volume's export is open to node's
// attachment host NQN (its VolumeAttachment's attachmentMetadata) and so
// to no one else; it yields that host.
func (w *fenceRaceWorld) exportOnlyTo(node string, host *string) framework.Condition {
	return func(ctx context.Context) (bool, string, error) {
		h, err := framework.AttachmentHost(ctx, w.e.Client, w.pv, node)
		if err != nil || h == "" {
			return false, fmt.Sprintf("no attachment host NQN for %s yet (%v)", node, err), nil
		}
		d, ok := w.sim.Disk(w.handle)
		if !ok {
			return false, "no disk", nil
		}
		if host != nil {
			*host = h
		}
		state := fmt.Sprintf("nvme-tcp-export=%t allow-host=%q, %s's attachment is %q", d.NVMeTCPExport, d.AllowHostName, node, h)
		return d.NVMeTCPExport && d.AllowHostName == h, state, nil
	}
}

// exportClosed holds once the volume's export is closed.
func (w *fenceRaceWorld) exportClosed(ctx context.Context) (bool, string, error) {
	d, ok := w.sim.Disk(w.handle)
	if !ok {
		return false, "no disk", nil
	}
	return !d.NVMeTCPExport, fmt.Sprintf("nvme-tcp-export=%t allow-host=%q", d.NVMeTCPExport, d.AllowHostName), nil
}

// detaching holds once node's VolumeAttachment of the volume is being
// deleted (or gone). Like a kubelet whose pod went, the test posts node's
// status (no volumes in use) every few seconds until then: without it the
// attach/detach controller waits 6 minutes before it detaches.
func (w *fenceRaceWorld) detaching(node string) framework.Condition {
	var reported time.Time
	return func(ctx context.Context) (bool, string, error) {
		vas, err := framework.VolumeAttachmentsFor(ctx, w.e.Client, w.pv)
		if err != nil {
			return false, err.Error(), nil
		}
		state := "no VolumeAttachment for " + node
		for _, va := range vas {
			if va.Spec.NodeName == node {
				if va.DeletionTimestamp != nil {
					return true, "", nil
				}
				state = fmt.Sprintf("VolumeAttachment %s attached=%t", va.Name, va.Status.Attached)
			}
		}
		if state == "no VolumeAttachment for "+node {
			return true, state, nil
		}
		if time.Since(reported) >= 2*time.Second {
			reported = time.Now()
			if err := framework.ReportNodeStatus(ctx, w.e.Client, node); err != nil {
				return false, err.Error(), nil
			}
			state += "; " + node + " status posted"
		}
		return false, state, nil
	}
}

// publishInFlight holds once (want) or while not (!want) the replica's
// driver has a ControllerPublishVolume call that has not ended.
func publishInFlight(r *framework.Replica, want bool) framework.Condition {
	return func(context.Context) (bool, string, error) {
		ids, err := framework.CallsInFlight(r.Driver.LogPath, publishMethod)
		if err != nil {
			return false, err.Error(), nil
		}
		return (len(ids) > 0) == want, fmt.Sprintf("%s: publishes in flight %v", r.Name, ids), nil
	}
}

func exited(p *framework.Process) framework.Condition {
	return func(context.Context) (bool, string, error) {
		return p.Exited(), fmt.Sprintf("%s (pid %d) exited=%t", p.Name, p.Pid(), p.Exited()), nil
	}
}

// exportUnchangedSince checks the simulator's export log of the volume:
// its last change is the first one that opened it to host, so nothing has
// touched it since (no late step undid it, not even for a moment).
func (w *fenceRaceWorld) exportUnchangedSince(t *testing.T, host string) {
	t.Helper()
	changes := w.sim.ExportChangesOf(w.handle)
	first := -1
	for i, c := range changes {
		if c.Export && c.AllowHost == host {
			first = i
			break
		}
	}
	if first < 0 || first != len(changes)-1 {
		t.Errorf("the export of %s changed after it was opened to %s (or never was): %s", w.handle, host, formatExportChanges(changes))
		return
	}
	w.e.TL.Logf("export of %s: %s", w.handle, formatExportChanges(changes))
}

func formatExportChanges(changes []rdssim.ExportChange) string {
	var b strings.Builder
	for i, c := range changes {
		if i > 0 {
			b.WriteString("; ")
		}
		switch {
		case c.Removed:
			fmt.Fprintf(&b, "#%d removed", c.Seq)
		case c.Export:
			fmt.Fprintf(&b, "#%d open to %s", c.Seq, c.AllowHost)
		default:
			fmt.Fprintf(&b, "#%d closed (%s)", c.Seq, c.AllowHost)
		}
	}
	return b.String()
}

// checkHolders: by what both replicas answered, never two nodes held the
// volume; and by the API, it was never attached to two nodes.
func (w *fenceRaceWorld) checkHolders(t *testing.T) {
	t.Helper()
	answers, err := framework.DriverAnswers(w.a.Driver.LogPath, w.b.Driver.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	var mine []string
	for _, an := range answers {
		if an.Volume == w.handle {
			mine = append(mine, an.String())
		}
	}
	w.e.TL.Logf("answers for %s: %s", w.handle, strings.Join(mine, "; "))
	if n, why := framework.MaxHolders(answers, w.handle); n > 1 {
		t.Errorf("RWO volume %s was published to %d nodes without an unpublish between: %v", w.handle, n, why)
	}
	if got := w.mon.MaxAttached(w.pv); got > 1 {
		t.Errorf("PV %s was attached to %d nodes at once: %+v", w.pv, got, w.mon.History(w.pv))
	}
}

// finish checks the end state with node holding the volume, then deletes
// its pod: the export closes and no claim is left.
func (w *fenceRaceWorld) finish(t *testing.T, node, pod string) {
	t.Helper()
	ctx, c, tl := w.e.Ctx, w.e.Client, w.e.TL
	done := tl.Step("check: claims match the attachments, the export allows " + node + "'s attachment alone, one holder")
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "the claims name exactly "+node+", the node its live VolumeAttachment is attached to",
		claimsMatchAttachments(c, map[string]string{w.pv: node})); err != nil {
		t.Error(err)
	}
	var host string
	if _, err := framework.WaitFor(ctx, tl, 30*time.Second, "export open to "+node+"'s attachment alone", w.exportOnlyTo(node, &host)); err != nil {
		t.Error(err)
	} else {
		w.exportUnchangedSince(t, host)
	}
	w.checkHolders(t)
	done()

	done = tl.Step(pod + " deleted: nothing holds the volume, the export closes")
	if err := framework.ForceDeletePod(ctx, c, framework.TestNamespace, pod); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, node+"'s VolumeAttachment being deleted", w.detaching(node)); err != nil {
		t.Error(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "no VolumeAttachment left, no claim", claimsMatchAttachments(c, map[string]string{w.pv: ""})); err != nil {
		t.Error(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 30*time.Second, "export closed", w.exportClosed); err != nil {
		t.Error(err)
	}
	w.checkHolders(t)
	done()
}

// The whole leading replica freezes mid-publish (SIGSTOP of its driver,
// csi-provisioner and csi-attacher, as a frozen pod): ctrl-a's publish of
// the volume to node-2 is pinned inside the driver by holding its export
// change on the RDS, then ctrl-a stops and the held change lands (it is
// still node-2's: its claim and VolumeAttachment are live). Its leases
// expire; ctrl-b takes every one over and completes node-2's attach.
// Meanwhile the pod moves: node-2's pod is deleted and a pod on node-3
// created, so ctrl-b unpublishes node-2 and publishes node-3. Then ctrl-a
// continues with a publish answered long ago by the RDS and an attacher
// that does not know yet it lost its lease. Nothing it does may answer
// node-2 as a holder, leave its claim behind or move the export.
func TestPausedReplicaMidPublish(t *testing.T) {
	t.Parallel()
	w := startFenceRace(t)
	e := w.e
	ctx, c, tl := e.Ctx, e.Client, e.TL
	ns := w.dep.Namespace

	done := tl.Step("pod-2 on node-2: ctrl-a publishes; its export change is held on the RDS")
	if err := w.sim.ArmFault(ctx, tl, framework.LateFault(w.openFromClosed, 0, 1)); err != nil {
		t.Fatal(err)
	}
	w.createPod(t, "pod-2", "node-2")
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "ctrl-a's export change for node-2 held by the simulator", w.sim.HeldAtLeast(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 10*time.Second, "ctrl-a's driver has the publish in flight", publishInFlight(w.a, true)); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 10*time.Second, "the claims name node-2 (ctrl-a committed before the export change)", framework.ClaimsAre(c, w.pv, "node-2")); err != nil {
		t.Fatal(err)
	}
	done()

	done = tl.Step("SIGSTOP ctrl-a (driver, csi-provisioner, csi-attacher); the held export change lands")
	pausedAt := time.Now()
	if err := w.a.Pause(); err != nil {
		t.Fatal(err)
	}
	tl.Logf("paused ctrl-a: %s pid %d, %s pid %d, %s pid %d", w.a.Driver.Name, w.a.Driver.Pid(), w.a.Provisioner.Name, w.a.Provisioner.Pid(), w.a.Attacher.Name, w.a.Attacher.Pid())
	if n, err := w.sim.ReleaseLate(ctx, tl); err != nil || n != 1 {
		t.Fatalf("release: %d commands, %v; want 1", n, err)
	}
	if err := w.sim.ClearFaults(ctx); err != nil {
		t.Fatal(err)
	}
	tl.Logf("export of %s after the landing: %s", w.handle, formatExportChanges(w.sim.ExportChangesOf(w.handle)))
	done()

	done = tl.Step("ctrl-b takes over every Lease and completes (or refuses) node-2's attach")
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "every Lease held by ctrl-b", framework.LeasesHeldBy(c, ns, "ctrl-b", 3)); err != nil {
		t.Fatal(err)
	}
	tl.Logf("ctrl-b holds every Lease %s after the pause", time.Since(pausedAt).Round(time.Millisecond))
	if _, err := framework.WaitFor(ctx, tl, 30*time.Second, "ctrl-b reports rds_csi_leader 1", w.b.MetricEquals("rds_csi_leader", 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "node-2's VolumeAttachment answered by ctrl-b (attached or refused)",
		framework.AnyOf(framework.VolumeAttached(c, w.pv, "node-2", nil), framework.AttachRefused(c, w.pv, "node-2", nil))); err != nil {
		t.Fatal(err)
	}
	done()

	done = tl.Step("meanwhile the pod moves: pod-2 force-deleted, pod-3 on node-3, through ctrl-b")
	if err := framework.ForceDeletePod(ctx, c, framework.TestNamespace, "pod-2"); err != nil {
		t.Fatal(err)
	}
	w.createPod(t, "pod-3", "node-3")
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "node-2's VolumeAttachment being deleted", w.detaching("node-2")); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 3*time.Minute, "volume attached to node-3", framework.VolumeAttached(c, w.pv, "node-3", nil)); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "node-2's VolumeAttachment gone", framework.NoVolumeAttachment(c, w.pv, "node-2")); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 30*time.Second, "export open to node-3's attachment alone", w.exportOnlyTo("node-3", nil)); err != nil {
		t.Fatal(err)
	}
	done()

	done = tl.Step("SIGCONT ctrl-a")
	if err := w.a.Resume(); err != nil {
		t.Fatal(err)
	}
	tl.Logf("ctrl-a resumed after %s paused", time.Since(pausedAt).Round(time.Millisecond))
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "ctrl-a's csi-attacher exits (it lost its Lease)", exited(w.a.Attacher)); err != nil {
		t.Error(err)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "ctrl-a's driver answered its publish", publishInFlight(w.a, false)); err != nil {
		t.Error(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 30*time.Second, "ctrl-a reports rds_csi_leader 0", w.a.MetricEquals("rds_csi_leader", 0)); err != nil {
		t.Error(err)
	}
	tl.Logf("ctrl-a's csi-provisioner: exited=%t (%v)", w.a.Provisioner.Exited(), w.a.Provisioner.ExitErr())
	done()

	w.finish(t, "node-3", "pod-3")
}

// An RDS command stalls past the driver's command timeout while the
// other replica moves the volume on (--rds-command-timeout=3s): every
// attempt of ctrl-a's export change for its publish to node-2 is held
// unanswered on the simulator. pod-2 is deleted and ctrl-a's csi-attacher
// paused (SIGSTOP), so ctrl-b's attacher takes over: it unpublishes
// node-2 and publishes node-3 through ctrl-b's driver, while ctrl-a's
// driver, still running (and still the driver's leader), times out each
// attempt and gives up. Only then do the held commands land, every one of
// them more than twice the timeout late: each must match nothing
// (compare-and-swap on the export state), leaving the export open to
// node-3's attachment alone.
func TestStalledExportCommandLandsLate(t *testing.T) {
	t.Parallel()
	const timeout = 3 * time.Second
	w := startFenceRace(t, "--rds-command-timeout="+timeout.String())
	e := w.e
	ctx, c, tl := e.Ctx, e.Client, e.TL

	done := tl.Step("pod-2 on node-2: ctrl-a publishes; every attempt of its export change is held on the RDS")
	if err := w.sim.ArmFault(ctx, tl, framework.LateFault(w.openFromClosed, 0, -1)); err != nil {
		t.Fatal(err)
	}
	w.createPod(t, "pod-2", "node-2")
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "ctrl-a's export change for node-2 held by the simulator", w.sim.HeldAtLeast(1)); err != nil {
		t.Fatal(err)
	}
	heldAt := time.Now()
	if _, err := framework.WaitFor(ctx, tl, 10*time.Second, "ctrl-a's driver has the publish in flight", publishInFlight(w.a, true)); err != nil {
		t.Fatal(err)
	}
	done()

	done = tl.Step("pod-2 deleted, ctrl-a's csi-attacher paused: ctrl-b's attacher takes over")
	if err := framework.ForceDeletePod(ctx, c, framework.TestNamespace, "pod-2"); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "node-2's VolumeAttachment being deleted", w.detaching("node-2")); err != nil {
		t.Fatal(err)
	}
	if err := w.a.Attacher.Pause(); err != nil {
		t.Fatal(err)
	}
	tl.Logf("paused %s (pid %d); ctrl-a's driver runs on", w.a.Attacher.Name, w.a.Attacher.Pid())
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "csi-attacher's Lease held by ctrl-b",
		framework.LeaseHeldBy(c, w.dep.Namespace, "ctrl-b", framework.AttacherLease)); err != nil {
		t.Fatal(err)
	}
	done()

	done = tl.Step("ctrl-b moves the volume on: node-2 unpublished, pod-3 on node-3 published")
	w.createPod(t, "pod-3", "node-3")
	if _, err := framework.WaitFor(ctx, tl, 3*time.Minute, "volume attached to node-3", framework.VolumeAttached(c, w.pv, "node-3", nil)); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "node-2's VolumeAttachment gone", framework.NoVolumeAttachment(c, w.pv, "node-2")); err != nil {
		t.Fatal(err)
	}
	var host3 string
	if _, err := framework.WaitFor(ctx, tl, 30*time.Second, "export open to node-3's attachment alone", w.exportOnlyTo("node-3", &host3)); err != nil {
		t.Fatal(err)
	}
	done()

	done = tl.Step("ctrl-a's driver gives up its publish (each attempt timed out); then the held commands land")
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "ctrl-a's driver answered its publish", publishInFlight(w.a, false)); err != nil {
		t.Fatal(err)
	}
	n, err := w.sim.ReleaseLate(ctx, tl)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.sim.ClearFaults(ctx); err != nil {
		t.Fatal(err)
	}
	late := w.sim.LateCommands()
	tl.Logf("%d held commands landed %s after the first was held (command timeout %s): %d in the log", n, time.Since(heldAt).Round(time.Millisecond), timeout, len(late))
	if n < 1 || len(late) < n {
		t.Fatalf("released %d held commands, the log has %d", n, len(late))
	}
	changedBy := map[int]bool{}
	for _, ch := range w.sim.ExportLog() {
		changedBy[ch.Seq] = true
	}
	for _, cmd := range late {
		switch {
		case !cmd.Executed:
			t.Errorf("held command #%d never landed: %s", cmd.Seq, cmd.Text)
		case changedBy[cmd.Seq]:
			t.Errorf("held command #%d changed an export when it landed late: %s", cmd.Seq, cmd.Text)
		}
	}
	if _, err := framework.WaitFor(ctx, tl, 10*time.Second, "export still open to node-3's attachment alone", w.exportOnlyTo("node-3", nil)); err != nil {
		t.Error(err)
	}
	w.exportUnchangedSince(t, host3)
	done()

	done = tl.Step("SIGCONT ctrl-a's csi-attacher")
	if err := w.a.Attacher.Resume(); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "ctrl-a's csi-attacher exits (it lost its Lease)", exited(w.a.Attacher)); err != nil {
		t.Error(err)
	}
	done()

	w.finish(t, "node-3", "pod-3")
}
