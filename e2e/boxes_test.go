//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/srvlab/rds-csi/e2e/framework"
	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// Several RDS boxes under one driver (issue 36). The default box is the
// in-process simulator (framework.RDSName); the others are rds-sim
// processes listed in --rds-config, so that a test can freeze or kill one.

// The node labels a box is reached by, as the docs write them.
const (
	defaultBoxKey = framework.TopologyKey                        // =<default box's name>
	boxKeyPrefix  = "topology." + framework.DriverName + "/rds." // <name>=true
)

// boxesWorld is a driver serving the default box and more.
type boxesWorld struct {
	e     *framework.Env
	sim   *framework.Sim
	boxes map[string]*framework.SimProcess
	list  string // --rds-config
	nodes map[string]*framework.FakeKubelet
	ctrl  *framework.Controller
	down  map[string]bool // boxes frozen or killed: not asked
}

// startBoxesWorld starts the default simulator and one rds-sim process per
// extra box (pool sizes by name, 0: 100 GiB), writes the list (reach: a
// box's node patterns), registers each node with the topology its own
// node plugin reports (NodeGetInfo, as the kubelet registers it), and
// starts the controller with the list.
func startBoxesWorld(t *testing.T, e *framework.Env, pools map[string]int64, reach map[string][]string, nodes []string, driverArgs ...string) *boxesWorld {
	t.Helper()
	ctx, tl := e.Ctx, e.TL
	w := &boxesWorld{e: e, sim: e.StartSim(framework.SimOptions{}), boxes: map[string]*framework.SimProcess{}, nodes: map[string]*framework.FakeKubelet{}, down: map[string]bool{}}
	done := tl.Step("RDS boxes: the default in process, the others rds-sim processes")
	var list []framework.BoxConfig
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range pools {
			if !yield(n) {
				return
			}
		}
	})
	for i, name := range names {
		b := framework.StartSimProcess(t, tl, e.Root, e.Dir, name, pools[name])
		w.boxes[name] = b
		cfg := b.Box(4421 + i) // one address: a target port each
		cfg.Nodes = reach[name]
		cfg.CommandTimeout = "5s"
		list = append(list, cfg)
	}
	w.list = framework.WriteRDSConfig(t, e.Dir, list...)
	done()

	done = tl.Step("nodes, registered with the topology their node plugin reports")
	bin := framework.BuildDriver(t, tl, e.Root)
	for _, n := range nodes {
		w.nodes[n] = e.NewNode(n)
		p := framework.StartNodePlugin(t, tl, e.Dir, w.sim, framework.NodePluginOptions{Bin: bin, Node: n, ExtraArgs: []string{"--rds-config=" + w.list}})
		_, node, conn, err := p.Clients()
		if err != nil {
			t.Fatal(err)
		}
		info, err := node.NodeGetInfo(ctx, &csipb.NodeGetInfoRequest{})
		conn.Close()
		if err != nil {
			t.Fatal(err)
		}
		if err := w.nodes[n].RegisterTopology(ctx, info); err != nil {
			t.Fatal(err)
		}
	}
	done()
	w.ctrl = e.StartController(w.sim, framework.ControllerOptions{
		DriverArgs:      append([]string{"--rds-config=" + w.list, "--rds-command-timeout=5s"}, driverArgs...),
		ProvisionerArgs: []string{"--capacity-poll-interval=5s"},
	})
	return w
}

// class is a StorageClass pinned to a box (pin) and/or limited to the
// boxes of allowed, with a binding mode.
func class(name, pin string, wffc bool, allowed ...string) *storagev1.StorageClass {
	sc := framework.StorageClass(name, nil)
	if pin != "" {
		sc.Parameters = map[string]string{"rds": pin}
	}
	if wffc {
		mode := storagev1.VolumeBindingWaitForFirstConsumer
		sc.VolumeBindingMode = &mode
	}
	for _, b := range allowed {
		key, value := boxKeyPrefix+b, "true"
		if b == framework.RDSName {
			key, value = defaultBoxKey, b // the default box by its own key
		}
		sc.AllowedTopologies = append(sc.AllowedTopologies, corev1.TopologySelectorTerm{
			MatchLabelExpressions: []corev1.TopologySelectorLabelRequirement{{Key: key, Values: []string{value}}}})
	}
	return sc
}

// claim creates a claim of class and, with bound, waits until it is bound
// and returns its PV.
func (w *boxesWorld) claim(t *testing.T, name, class, size string, bound bool) *corev1.PersistentVolume {
	t.Helper()
	ctx, c, tl := w.e.Ctx, w.e.Client, w.e.TL
	if _, err := c.CoreV1().PersistentVolumeClaims(framework.TestNamespace).Create(ctx,
		framework.PVC(framework.TestNamespace, name, class, size, corev1.ReadWriteOnce, false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if !bound {
		return nil
	}
	var pvName string
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "PVC "+name+" bound", framework.PVCBound(c, framework.TestNamespace, name, &pvName)); err != nil {
		t.Fatal(err)
	}
	pv, err := c.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pv
}

// onBox checks that pv is a volume of box: its ID names it (the default
// box's none), its disk is there and on no other box, and its node
// affinity requires the box's label.
func (w *boxesWorld) onBox(t *testing.T, pv *corev1.PersistentVolume, box string) {
	t.Helper()
	handle := pv.Spec.CSI.VolumeHandle
	slot, wantKey, wantValue := handle, defaultBoxKey, box
	if box != framework.RDSName {
		var ok bool
		if slot, ok = strings.CutPrefix(handle, box+"/"); !ok {
			t.Fatalf("PV %s: volume handle %q does not name RDS %s", pv.Name, handle, box)
		}
		wantKey, wantValue = boxKeyPrefix+box, "true"
	} else if strings.Contains(handle, "/") {
		t.Fatalf("PV %s: the default box's volume handle %q names a box", pv.Name, handle)
	}
	has := map[string]bool{}
	if _, ok := w.sim.Disk(slot); ok {
		has[framework.RDSName] = true
	}
	for name, b := range w.boxes {
		if w.down[name] {
			continue
		}
		if _, err := b.Client(t).GetDisk(w.e.Ctx, slot); err == nil {
			has[name] = true
		}
	}
	if len(has) != 1 || !has[box] {
		t.Errorf("PV %s (%s): disk %s found on %v, want on %s alone", pv.Name, handle, slot, has, box)
	}
	terms := pv.Spec.NodeAffinity.Required.NodeSelectorTerms
	if len(terms) != 1 || len(terms[0].MatchExpressions) != 1 || terms[0].MatchExpressions[0].Key != wantKey ||
		!slices.Equal(terms[0].MatchExpressions[0].Values, []string{wantValue}) {
		t.Errorf("PV %s: node affinity %+v, want %s in [%s]", pv.Name, terms, wantKey, wantValue)
	}
	w.e.TL.Logf("PV %s: volume %s on RDS %s, node affinity %s=%s", pv.Name, handle, box, wantKey, wantValue)
}

// A StorageClass pins a box, or its topology picks one: volumes go where
// the class and the nodes allow, a full box is passed over, every PV
// requires its box's label, the capacity per segment is published for the
// scheduler, and a claim that waits for its pod goes to a box its node
// reaches.
func TestVolumesGoToTheBoxesTheirClassAndTopologyAllow(t *testing.T) {
	t.Parallel()
	e := framework.NewEnv(t, framework.EnvOptions{})
	ctx, c, tl := e.Ctx, e.Client, e.TL
	// rds-c is nearly full: 1 GiB of pool; node-b reaches only the default
	// box and rds-b.
	w := startBoxesWorld(t, e, map[string]int64{"rds-b": 0, "rds-c": 1 << 30}, map[string][]string{"rds-c": {"node-a"}}, []string{"node-a", "node-b"})

	done := tl.Step("the nodes report the boxes they reach")
	for node, want := range map[string][]string{"node-a": {framework.RDSName, "rds-b", "rds-c"}, "node-b": {framework.RDSName, "rds-b"}} {
		n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for k, v := range n.Labels {
			if b, ok := strings.CutPrefix(k, boxKeyPrefix); ok && v == "true" {
				got = append(got, b)
			}
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) || n.Labels[defaultBoxKey] != framework.RDSName {
			t.Errorf("node %s: reaches %v (default key %q), want %v", node, got, n.Labels[defaultBoxKey], want)
		}
	}
	done()

	for _, sc := range []*storagev1.StorageClass{
		class("pin-b", "rds-b", false),
		class("topo-c", "", false, "rds-c"),
		class("topo-c-or-default", "", false, "rds-c", framework.RDSName),
		class("wffc", "", true),
	} {
		if _, err := c.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	done = tl.Step("a class pinned to rds-b")
	w.onBox(t, w.claim(t, "pinned", "pin-b", "1Gi", true), "rds-b")
	done()
	done = tl.Step("a class whose topology allows rds-c alone")
	w.onBox(t, w.claim(t, "on-c", "topo-c", "512Mi", true), "rds-c")
	done()
	done = tl.Step("rds-c is full: a claim that rds-c or the default box may take goes to the default box")
	w.onBox(t, w.claim(t, "passed-over", "topo-c-or-default", "2Gi", true), framework.RDSName)
	done()

	done = tl.Step("csi-provisioner publishes each segment's capacity")
	caps := func(ctx context.Context) (bool, string, error) {
		list, err := c.StorageV1().CSIStorageCapacities(w.ctrl.Deployment.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, "", err
		}
		var seen []string
		withC, withoutC := 0, 0
		for _, cap := range list.Items {
			if cap.StorageClassName != "wffc" || cap.NodeTopology == nil || cap.MaximumVolumeSize == nil {
				continue
			}
			labels := cap.NodeTopology.MatchLabels
			seen = append(seen, fmt.Sprintf("%v: %s (largest %s)", labels, cap.Capacity, cap.MaximumVolumeSize))
			// Each segment reaches a box of 100 GiB: its largest volume
			// is about that; node-a's reaches rds-c too, node-b's not.
			if cap.MaximumVolumeSize.Cmp(resource.MustParse("90Gi")) < 0 || labels[boxKeyPrefix+"rds-b"] != "true" {
				continue
			}
			if labels[boxKeyPrefix+"rds-c"] == "true" {
				withC++
			} else {
				withoutC++
			}
		}
		return withC == 1 && withoutC == 1 && len(seen) == 2, strings.Join(seen, "; "), nil
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "CSIStorageCapacity of class wffc for node-a's and node-b's segments", caps); err != nil {
		t.Error(err)
	}
	done()

	done = tl.Step("a claim that waits for its pod, scheduled to node-b: on a box node-b reaches")
	w.claim(t, "waits", "wffc", "1Gi", false)
	// The scheduler's part: the node it picked for the pod.
	pvc, err := c.CoreV1().PersistentVolumeClaims(framework.TestNamespace).Get(ctx, "waits", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pvc.Annotations = map[string]string{"volume.kubernetes.io/selected-node": "node-b"}
	if _, err := c.CoreV1().PersistentVolumeClaims(framework.TestNamespace).Update(ctx, pvc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pvName string
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "PVC waits bound", framework.PVCBound(c, framework.TestNamespace, "waits", &pvName)); err != nil {
		t.Fatal(err)
	}
	pv, err := c.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(pv.Spec.CSI.VolumeHandle, "rds-c/") {
		t.Errorf("a claim scheduled to node-b went to rds-c, which node-b does not reach")
	}
	tl.Logf("the claim for node-b: %s", pv.Spec.CSI.VolumeHandle)
	done()

	done = tl.Step("every claim deleted: every box's disks go")
	for _, n := range []string{"pinned", "on-c", "passed-over", "waits"} {
		if err := c.CoreV1().PersistentVolumeClaims(framework.TestNamespace).Delete(ctx, n, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "no PV left", noPVs(c)); err != nil {
		t.Error(err)
	}
	for name, b := range w.boxes {
		if disks, err := b.Client(t).ListDisks(ctx); err != nil || len(volumeDisks(disks)) != 0 {
			t.Errorf("%s still has volume disks %v (%v)", name, volumeDisks(disks), err)
		}
	}
	done()
}

// noPVs holds once no PersistentVolume is left.
func noPVs(c kubernetes.Interface) framework.Condition {
	return func(ctx context.Context) (bool, string, error) {
		pvs, err := c.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		return len(pvs.Items) == 0, fmt.Sprintf("%d PVs", len(pvs.Items)), nil
	}
}

// volumeDisks are the disks of a listing that are volumes (pvc-...).
func volumeDisks(disks []rds.Disk) []string {
	var out []string
	for _, d := range disks {
		if strings.HasPrefix(d.Slot, "pvc-") {
			out = append(out, d.Slot)
		}
	}
	return out
}

// One box frozen (SIGSTOP: every command hangs, its connections stay
// open), then killed: on the other boxes claims are provisioned, volumes
// attached, a failed node fenced and its volume failed over as usual;
// the frozen box's own volumes' calls fail naming it, and it works again
// once back.
func TestAStoppedBoxTakesNothingElseDown(t *testing.T) {
	t.Parallel()
	e := framework.NewEnv(t, framework.EnvOptions{ControlPlane: framework.ControlPlaneOptions{NodeMonitorGracePeriod: fencedGrace}})
	ctx, c, tl := e.Ctx, e.Client, e.TL
	framework.DeployFile(ctx, t, tl, e.CP, "manifests/overlays/storage-fencing/fencing-rbac.yaml")
	w := startBoxesWorld(t, e, map[string]int64{"rds-b": 0}, nil, []string{"node-a", "node-b", "node-c"},
		"--storage-fencing=allow-host", "--out-of-service-taint")
	mon, err := framework.WatchAttachments(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	for _, sc := range []*storagev1.StorageClass{class("on-default", framework.RDSName, false), class("on-b", "rds-b", false)} {
		if _, err := c.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	attach := func(pod, node, claim, pv string) {
		t.Helper()
		if _, err := c.CoreV1().Pods(framework.TestNamespace).Create(ctx, framework.PodOnNode(framework.TestNamespace, pod, node, claim), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, claim+" attached to "+node, framework.VolumeAttached(c, pv, node, nil)); err != nil {
			t.Fatal(err)
		}
	}
	done := tl.Step("a volume on the default box on node-a, one on rds-b on node-c")
	onA := w.claim(t, "on-a", "on-default", "1Gi", true)
	onB := w.claim(t, "on-b", "on-b", "1Gi", true)
	w.onBox(t, onA, framework.RDSName)
	w.onBox(t, onB, "rds-b")
	attach("pod-a", "node-a", "on-a", onA.Name)
	attach("pod-c", "node-c", "on-b", onB.Name)
	va, err := framework.AttachmentFor(ctx, c, onB.Name, "node-c")
	if err != nil {
		t.Fatal(err)
	}
	if md := va.Status.AttachmentMetadata; md["nvmeAddress"] != w.boxes["rds-b"].Host || md["nvmePort"] != "4421" {
		t.Errorf("rds-b's volume's publish_context %v: want rds-b's target %s:4421", md, w.boxes["rds-b"].Host)
	}
	bHost := va.Status.AttachmentMetadata["hostNQN"]
	done()

	done = tl.Step("rds-b frozen (SIGSTOP)")
	if err := w.boxes["rds-b"].Pause(); err != nil {
		t.Fatal(err)
	}
	w.down["rds-b"] = true
	done()
	others := func(what string, i int) {
		done := tl.Step(fmt.Sprintf("with rds-b %s: provision a volume on the default box and attach it to node-b", what))
		claim := fmt.Sprintf("new-%d", i)
		pv := w.claim(t, claim, "on-default", "1Gi", true)
		w.onBox(t, pv, framework.RDSName)
		attach("pod-new-"+claim, "node-b", claim, pv.Name)
		done()
	}
	others("frozen", 0)

	done = tl.Step("node-a stops while rds-b is frozen: its volume (default box) is fenced and moves to node-b")
	if _, err := c.CoreV1().Pods(framework.TestNamespace).Create(ctx, framework.PodOnNode(framework.TestNamespace, "pod-a2", "node-b", "on-a"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	w.nodes["node-a"].Fail()
	if _, err := framework.WaitFor(ctx, tl, fencedGrace+2*time.Minute, "node-a tainted out of service by the driver",
		framework.NodeTaint(c, "node-a", corev1.TaintNodeOutOfService, fencing.DriverOutOfServiceValue, true)); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "on-a attached to node-b", framework.VolumeAttached(c, onA.Name, "node-b", nil)); err != nil {
		t.Fatal(err)
	}
	tl.Logf("FAILOVER WITH A FROZEN BOX: node-a stop -> on-a attached on node-b in %s", time.Since(t0).Round(time.Millisecond))
	if got := mon.MaxAttached(onA.Name); got != 1 {
		t.Errorf("on-a was attached to %d nodes at once", got)
	}
	done()

	done = tl.Step("rds-b killed")
	w.boxes["rds-b"].Kill()
	done()
	others("killed", 1)

	done = tl.Step("rds-b's volume published again to its holder: refused naming rds-b (no answer without its export)")
	if err := framework.RepublishAttachment(ctx, c, va.Name); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "the publish of on-b to node-c refused naming rds-b",
		framework.AttachRefused(c, onB.Name, "node-c", nil, "rds-b")); err != nil {
		t.Error(err)
	}
	done()

	done = tl.Step("rds-b back: the holder's publish goes through with its attachment, the export open to it alone, and rds-b takes new volumes")
	w.boxes["rds-b"].Restart(t, tl)
	delete(w.down, "rds-b")
	var again storagev1.VolumeAttachment
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "on-b attached to node-c again", framework.VolumeAttached(c, onB.Name, "node-c", &again)); err != nil {
		t.Fatal(err)
	}
	if got := again.Status.AttachmentMetadata["hostNQN"]; got != bHost {
		t.Errorf("node-c's attachment came back as %q, want its own %q", got, bHost)
	}
	d, err := w.boxes["rds-b"].Client(t).GetDisk(ctx, strings.TrimPrefix(onB.Spec.CSI.VolumeHandle, "rds-b/"))
	if err != nil {
		t.Fatal(err)
	}
	if !d.Exported || d.AllowHost != bHost {
		t.Errorf("rds-b's volume: export=%t allow-host %q, want open to node-c's attachment %q", d.Exported, d.AllowHost, bHost)
	}
	w.onBox(t, w.claim(t, "after", "on-b", "1Gi", true), "rds-b")
	done()
}
