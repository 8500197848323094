//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/srvlab/rds-csi/e2e/framework"
)

// failoverClaimsAnnotation is the driver's record of its publish decisions on a PV
// (docs/attachments.md).
const failoverClaimsAnnotation = "rds.csi.srvlab.io/claims"

// Two controller replicas, each a driver with its own csi-provisioner and
// csi-attacher in its own UTS namespace, elect leaders with 4s/3s/1s
// leases. While RWO volumes move between nodes (pods created and
// force-deleted, so the attach/detach controller attaches and detaches
// them through csi-attacher and our ControllerPublish/Unpublish), the
// leading driver is SIGKILLed (no Lease release; its sidecars exit on the
// lost connection). The other replica takes over every Lease and the
// churn completes through it; no RWO volume is ever attached to two nodes
// according to the API, and every PV's claims annotation ends up naming
// exactly the node its VolumeAttachment is attached to. Then a replica is
// restarted gracefully and answers the same publishes exactly as before.
func TestControllerFailover(t *testing.T) {
	t.Parallel()
	const (
		volumes = 4
		moves   = 6 // attachments per volume, each on another node
	)
	e := framework.NewEnv(t, framework.EnvOptions{})
	ctx, c, tl := e.Ctx, e.Client, e.TL
	sim := e.StartSim(framework.SimOptions{})
	nodes := []string{"node-1", "node-2", "node-3"}
	for _, n := range nodes {
		e.NewNode(n)
	}
	dep := framework.Deploy(ctx, t, tl, e.CP, e.Dir)
	ns := dep.Namespace
	opts := func(name string) framework.ReplicaOptions {
		return framework.ReplicaOptions{Name: name, LeaderElection: framework.FastLeaderElection}
	}

	// ctrl-a starts alone, so it leads the driver and both sidecars: the
	// kill below takes every leader at once, the hardest case.
	a := e.StartReplica(sim, dep, opts("ctrl-a"))
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "ctrl-a holds the driver's, csi-provisioner's and csi-attacher's Leases",
		framework.LeasesHeldBy(c, ns, "ctrl-a", 3)); err != nil {
		t.Fatal(err)
	}
	b := e.StartReplica(sim, dep, opts("ctrl-b"))
	if _, err := framework.WaitFor(ctx, tl, 30*time.Second, "ctrl-a reports rds_csi_leader 1", a.MetricEquals("rds_csi_leader", 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 30*time.Second, "ctrl-b reports rds_csi_leader 0", b.MetricEquals("rds_csi_leader", 0)); err != nil {
		t.Fatal(err)
	}

	mon, err := framework.WatchAttachments(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	done := tl.Step(fmt.Sprintf("provision %d RWO volumes and a spare", volumes))
	if _, err := c.StorageV1().StorageClasses().Create(ctx, framework.StorageClass("rds", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	claims := []string{"spare"}
	for i := range volumes {
		claims = append(claims, fmt.Sprintf("rwo-%d", i))
	}
	for _, name := range claims {
		if _, err := c.CoreV1().PersistentVolumeClaims(framework.TestNamespace).Create(ctx,
			framework.PVC(framework.TestNamespace, name, "rds", "1Gi", corev1.ReadWriteOnce, false), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pvOf := map[string]string{}
	for _, name := range claims {
		var pv string
		if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "PVC "+name+" bound", framework.PVCBound(c, framework.TestNamespace, name, &pv)); err != nil {
			t.Fatal(err)
		}
		pvOf[name] = pv
	}
	done()

	// Churn: each volume moves node-(i+k)%3 -> node-(i+k+1)%3: the next
	// pod is created before the previous one is force-deleted, so the
	// attach/detach controller sees both and must detach first.
	done = tl.Step(fmt.Sprintf("churn: %d volumes x %d moves; SIGKILL the leader mid-churn", volumes, moves))
	var (
		progress atomic.Int32
		wg       sync.WaitGroup
		mu       sync.Mutex
		errs     []error
		lastNode = map[string]string{} // pv -> node of its last pod
		spans    []failoverMoveSpan
	)
	for i := range volumes {
		claim := fmt.Sprintf("rwo-%d", i)
		pv := pvOf[claim]
		wg.Add(1)
		go func() {
			defer wg.Done()
			prev := ""
			for k := range moves {
				node := nodes[(i+k)%len(nodes)]
				pod := fmt.Sprintf("%s-%d", claim, k)
				start := time.Now()
				err := func() error {
					if _, err := c.CoreV1().Pods(framework.TestNamespace).Create(ctx, framework.PodOnNode(framework.TestNamespace, pod, node, claim), metav1.CreateOptions{}); err != nil {
						return err
					}
					if prev != "" {
						if err := framework.ForceDeletePod(ctx, c, framework.TestNamespace, prev); err != nil {
							return err
						}
					}
					_, err := framework.WaitFor(ctx, tl, 3*time.Minute, fmt.Sprintf("%s (%s) attached to %s, move %d", claim, pv, node, k),
						framework.VolumeAttached(c, pv, node, nil))
					return err
				}()
				if err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("%s move %d to %s: %w", claim, k, node, err))
					mu.Unlock()
					return
				}
				progress.Add(1)
				prev = pod
				mu.Lock()
				lastNode[pv] = node
				spans = append(spans, failoverMoveSpan{start, time.Now()})
				mu.Unlock()
			}
		}()
	}
	churnDone := make(chan struct{})
	go func() { wg.Wait(); close(churnDone) }()

	// Kill once a third of the moves are done: the others are in flight.
	if _, err := framework.WaitFor(ctx, tl, 3*time.Minute, "a third of the moves done", func(context.Context) (bool, string, error) {
		select {
		case <-churnDone:
			return false, "", fmt.Errorf("churn ended before the kill")
		default:
		}
		n := progress.Load()
		return int(n) >= volumes*moves/3, fmt.Sprintf("%d moves done", n), nil
	}); err != nil {
		t.Fatal(err)
	}
	holder, err := framework.LeaseHolder(ctx, c, ns, framework.DriverLease)
	if err != nil {
		t.Fatal(err)
	}
	if !framework.HolderIs(holder, "ctrl-a") {
		t.Fatalf("driver Lease held by %q before the kill, want ctrl-a", holder)
	}
	killedAt := time.Now()
	a.Driver.Kill()
	tl.Logf("SIGKILL %s (pid %d) after %d moves; it held Lease %s/%s as %s", a.Driver.Name, a.Driver.Pid(), progress.Load(), ns, framework.DriverLease, holder)

	observed, err := framework.WaitFor(ctx, tl, 2*time.Minute, "driver Lease taken over by ctrl-b", framework.LeaseHeldBy(c, ns, "ctrl-b", framework.DriverLease))
	if err != nil {
		t.Fatal(err)
	}
	lease, err := framework.GetLease(ctx, c, ns, framework.DriverLease)
	if err != nil {
		t.Fatal(err)
	}
	byAcquireTime := time.Duration(-1)
	if at := lease.Spec.AcquireTime; at != nil {
		byAcquireTime = at.Sub(killedAt)
	}
	if _, err := framework.WaitFor(ctx, tl, 30*time.Second, "ctrl-b reports rds_csi_leader 1", b.MetricEquals("rds_csi_leader", 1)); err != nil {
		t.Fatal(err)
	}
	// csi-attacher exits when it loses its driver; csi-provisioner does
	// not (it keeps its Lease and would reconnect to the restarted driver
	// container), so only the attacher's Lease must move.
	attacherTakeover, err := framework.WaitFor(ctx, tl, 2*time.Minute, "the driver's and csi-attacher's Leases held by ctrl-b",
		framework.LeaseHeldBy(c, ns, "ctrl-b", framework.DriverLease, framework.AttacherLease))
	if err != nil {
		t.Fatal(err)
	}
	attacherTakeover += observed
	tl.Logf("leader failover: kill -> driver Lease held by ctrl-b observed after %s (Lease acquireTime - kill = %s, lease %s); kill -> csi-attacher's Lease on ctrl-b %s",
		observed.Round(time.Millisecond), byAcquireTime.Round(time.Millisecond), framework.FastLeaderElection.LeaseDuration, attacherTakeover.Round(time.Millisecond))

	select {
	case <-churnDone:
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	if len(errs) > 0 {
		t.Fatalf("churn: %v", errs)
	}
	done()
	var across, other []time.Duration
	for _, s := range spans {
		if s.start.Before(killedAt) && s.end.After(killedAt) {
			across = append(across, s.end.Sub(s.start))
		} else {
			other = append(other, s.end.Sub(s.start))
		}
	}
	tl.Logf("moves in flight at the kill: %d, longest %s; the %d other moves: median %s",
		len(across), failoverMaxDuration(across).Round(time.Millisecond), len(other), failoverMedianDuration(other).Round(time.Millisecond))

	done = tl.Step("check: never two nodes at once; claims match the attachments")
	// The monitor's informer may be a little behind the polls above.
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "the attachment monitor has seen every volume's last attach", func(context.Context) (bool, string, error) {
		for pv, node := range lastNode {
			h := mon.History(pv)
			if len(h) == 0 || !slices.Equal(h[len(h)-1].Nodes, []string{node}) {
				return false, fmt.Sprintf("PV %s: history %+v, want it to end on [%s]", pv, h, node), nil
			}
		}
		return true, "", nil
	}); err != nil {
		t.Fatal(err)
	}
	for i := range volumes {
		pv := pvOf[fmt.Sprintf("rwo-%d", i)]
		if got := mon.MaxAttached(pv); got > 1 {
			t.Errorf("RWO PV %s was attached to %d nodes at once: %+v", pv, got, mon.History(pv))
		}
		if n := len(mon.History(pv)); n < 2*moves-1 {
			t.Errorf("PV %s: %d changes of its attached nodes seen, want at least %d (an attach and a detach per move)", pv, n, 2*moves-1)
		}
	}
	// What the replicas answered: a node holds a volume from a publish
	// success until an unpublish success, whichever replica answered.
	answers, err := framework.DriverAnswers(a.Driver.LogPath, b.Driver.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	published := 0
	for _, an := range answers {
		if an.Publish {
			published++
		}
	}
	if published < volumes*moves {
		t.Errorf("the driver logs show %d publish successes, want at least %d (one per move)", published, volumes*moves)
	}
	for i := range volumes {
		pv := pvOf[fmt.Sprintf("rwo-%d", i)]
		if n, why := framework.MaxHolders(answers, pv); n > 1 {
			t.Errorf("RWO volume %s was published to %d nodes without an unpublish between: %v", pv, n, why)
		}
	}
	tl.Logf("answers checked: %d publish and %d unpublish successes across both replicas, never two holders of an RWO volume", published, len(answers)-published)
	want := map[string]string{pvOf["spare"]: ""}
	for pv, n := range lastNode {
		want[pv] = n
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "every PV's claims name exactly its attached node", claimsMatchAttachments(c, want)); err != nil {
		t.Fatal(err)
	}
	done()

	// A plain restart: the crashed replica comes back, then the leader is
	// restarted gracefully. Both must answer the same publishes as the
	// leader did before its restart.
	done = tl.Step("restart ctrl-a (crashed), then ctrl-b (graceful); publishes answered as before")
	a = a.Restart(e, sim, dep)
	pv0 := pvOf["rwo-0"]
	probe := publishProbe{
		pv: pv0, holder: want[pv0], other: failoverOtherNode(nodes, want[pv0]),
		spare: pvOf["spare"], spareNode: nodes[0],
	}
	before := probe.ask(ctx, t, tl, b)
	stoppedAt := time.Now()
	if err := b.Stop(); err != nil {
		t.Fatal(err)
	}
	stopTook := time.Since(stoppedAt)
	handoff, err := framework.WaitFor(ctx, tl, 2*time.Minute, "driver Lease held by ctrl-a after ctrl-b's graceful stop", framework.LeaseHeldBy(c, ns, "ctrl-a", framework.DriverLease))
	if err != nil {
		t.Fatal(err)
	}
	handoff += stopTook
	tl.Logf("graceful handoff: SIGTERM to ctrl-b -> driver Lease held by ctrl-a after %s", handoff.Round(time.Millisecond))
	if _, err := framework.WaitFor(ctx, tl, 30*time.Second, "ctrl-a reports rds_csi_leader 1", a.MetricEquals("rds_csi_leader", 1)); err != nil {
		t.Fatal(err)
	}
	b = e.StartReplica(sim, dep, opts("ctrl-b"))
	if _, err := framework.WaitFor(ctx, tl, 30*time.Second, "restarted ctrl-b reports rds_csi_leader 0", b.MetricEquals("rds_csi_leader", 0)); err != nil {
		t.Fatal(err)
	}
	afterB := probe.ask(ctx, t, tl, b)
	afterA := probe.ask(ctx, t, tl, a)
	for _, got := range []struct {
		who string
		d   publishAnswers
	}{{"ctrl-b after its restart", afterB}, {"ctrl-a after its restart", afterA}} {
		if !reflect.DeepEqual(got.d, before) {
			t.Errorf("%s answers\n%+v\nwant (ctrl-b before its restart)\n%+v", got.who, got.d, before)
		}
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "claims unchanged by the probes", claimsMatchAttachments(c, want)); err != nil {
		t.Fatal(err)
	}
	for pv := range lastNode {
		if got := mon.MaxAttached(pv); got > 1 {
			t.Errorf("RWO PV %s was attached to %d nodes at once during the restarts: %+v", pv, got, mon.History(pv))
		}
	}
	done()

	t.Logf("leader failover (SIGKILL of the leader, lease %s): new holder observed after %s, by its acquireTime %s; csi-attacher's Lease moved after %s; graceful handoff %s",
		framework.FastLeaderElection.LeaseDuration, observed.Round(time.Millisecond), byAcquireTime.Round(time.Millisecond), attacherTakeover.Round(time.Millisecond), handoff.Round(time.Millisecond))
}

type failoverMoveSpan struct{ start, end time.Time }

func failoverMaxDuration(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return slices.Max(d)
}

func failoverMedianDuration(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	d = slices.Clone(d)
	slices.Sort(d)
	return d[len(d)/2]
}

// publishAnswers are the outcomes of publishProbe's three publishes.
type publishAnswers struct {
	HolderCode    codes.Code        // the holder publishing again
	HolderContext map[string]string // its publish_context
	OtherCode     codes.Code        // another node, refused
	OtherNames    bool              // the refusal names the holder
	SpareCode     codes.Code        // a free volume without a VolumeAttachment: ABORTED, nothing recorded
	SpareContext  map[string]string
}

// publishProbe asks a replica's driver directly over CSI: the volume's
// holder publishing again, another node publishing it, and a publish of a
// free volume (unpublished again, so the probe changes nothing).
type publishProbe struct {
	pv, holder, other string
	spare, spareNode  string
}

func (p publishProbe) ask(ctx context.Context, t *testing.T, tl *framework.Timeline, r *framework.Replica) publishAnswers {
	t.Helper()
	cc, conn, err := r.Driver.Controller()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var out publishAnswers
	var msg string
	out.HolderCode, out.HolderContext, _ = failoverPublish(ctx, t, tl, cc, r.Name, p.pv, p.holder)
	out.OtherCode, _, msg = failoverPublish(ctx, t, tl, cc, r.Name, p.pv, p.other)
	out.OtherNames = strings.Contains(msg, p.holder)
	out.SpareCode, out.SpareContext, _ = failoverPublish(ctx, t, tl, cc, r.Name, p.spare, p.spareNode)
	if out.SpareCode == codes.OK {
		failoverRetryBusy(ctx, t, tl, fmt.Sprintf("%s: ControllerUnpublish %s from %s", r.Name, p.spare, p.spareNode), func() error {
			_, err := cc.ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: p.spare, NodeId: p.spareNode})
			return err
		})
	}
	return out
}

// failoverPublish calls ControllerPublishVolume for a filesystem RWO volume as
// csi-attacher would, retrying while the answer is "busy, retry"
// (ABORTED, UNAVAILABLE).
func failoverPublish(ctx context.Context, t *testing.T, tl *framework.Timeline, cc csipb.ControllerClient, who, pv, node string) (codes.Code, map[string]string, string) {
	t.Helper()
	var resp *csipb.ControllerPublishVolumeResponse
	err := failoverRetryBusy(ctx, t, tl, fmt.Sprintf("%s: ControllerPublish %s to %s", who, pv, node), func() error {
		var err error
		resp, err = cc.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{
			VolumeId: pv, NodeId: node,
			VolumeCapability: &csipb.VolumeCapability{
				AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: "ext4"}},
				AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
			},
		})
		return err
	})
	st := status.Convert(err)
	tl.Logf("%s: ControllerPublish %s to %s: %s %q", who, pv, node, st.Code(), st.Message())
	if err != nil {
		return st.Code(), nil, st.Message()
	}
	return codes.OK, resp.GetPublishContext(), ""
}

// failoverRetryBusy runs call until it returns something other than ABORTED or
// UNAVAILABLE, and returns that.
func failoverRetryBusy(ctx context.Context, t *testing.T, tl *framework.Timeline, what string, call func() error) error {
	t.Helper()
	var last error
	if _, err := framework.WaitFor(ctx, tl, time.Minute, what+": a final answer", func(ctx context.Context) (bool, string, error) {
		last = call()
		switch {
		case status.Code(last) == codes.Aborted && strings.Contains(status.Convert(last).Message(), "no live VolumeAttachment"):
			// Final: a publish without a VolumeAttachment records nothing
			// (the probe's publish of a free volume has none).
			return true, "", nil
		case status.Code(last) == codes.Aborted, status.Code(last) == codes.Unavailable:
			return false, last.Error(), nil
		}
		return true, "", nil
	}); err != nil {
		t.Fatal(err)
	}
	return last
}

// claimsMatchAttachments holds once, for every PV in want, its only
// VolumeAttachment is attached to want[pv] and its claims annotation names
// exactly that node (want[pv] == "": no VolumeAttachment, no claim).
func claimsMatchAttachments(c kubernetes.Interface, want map[string]string) framework.Condition {
	return func(ctx context.Context) (bool, string, error) {
		for _, pv := range slices.Sorted(maps.Keys(want)) {
			node := want[pv]
			vas, err := framework.VolumeAttachmentsFor(ctx, c, pv)
			if err != nil {
				return false, err.Error(), nil
			}
			var attached []string
			for _, va := range vas {
				s := va.Spec.NodeName
				if !va.Status.Attached || va.DeletionTimestamp != nil {
					s += fmt.Sprintf("(attached=%t,deleting=%t)", va.Status.Attached, va.DeletionTimestamp != nil)
				}
				attached = append(attached, s)
			}
			obj, err := c.CoreV1().PersistentVolumes().Get(ctx, pv, metav1.GetOptions{})
			if err != nil {
				return false, err.Error(), nil
			}
			claimed, err := failoverClaimNodes(obj.Annotations[failoverClaimsAnnotation])
			if err != nil {
				return false, "", fmt.Errorf("PV %s: %w", pv, err)
			}
			wantNodes := []string{}
			if node != "" {
				wantNodes = []string{node}
			}
			if !slices.Equal(attached, wantNodes) || !slices.Equal(claimed, wantNodes) {
				return false, fmt.Sprintf("PV %s: VolumeAttachments %v, claims %v, want %v", pv, attached, claimed, wantNodes), nil
			}
		}
		return true, "", nil
	}
}

// failoverClaimNodes are the nodes of a claims annotation, sorted.
func failoverClaimNodes(raw string) ([]string, error) {
	if raw == "" {
		return []string{}, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		return nil, fmt.Errorf("claims annotation %q: %w", raw, err)
	}
	return slices.Sorted(maps.Keys(m)), nil
}

func failoverOtherNode(nodes []string, not string) string {
	for _, n := range nodes {
		if n != not {
			return n
		}
	}
	return ""
}
