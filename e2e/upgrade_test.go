//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/srvlab/rds-csi/e2e/framework"
	"github.com/srvlab/rds-csi/pkg/exportauth"
	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// Upgrades and downgrades with live volumes (issue 37). The driver runs as
// a release deploys it, as processes: two controller replicas (driver,
// csi-provisioner, csi-attacher each) and a node plugin per node keeping
// its own Lease, with storage fencing, DH-HMAC-CHAP exports and
// unattended failover on. One build writes the records: volumes attached,
// a node fenced (cut off the RDS, its claim released, tainted out of
// service) and its volume moved, a raw-block live migration in flight.
// Then the controller Deployment is rolled to the other build as
// `helm upgrade` rolls it (maxSurge 0, maxUnavailable 1: a replica
// stopped, its successor started and ready, then the next), and the node
// DaemonSet node by node (the kubelet deregisters the plugin, the new one
// registers again). Through the roll nothing detaches, no export closes,
// moves or changes its password, and afterwards every claim is read as it
// was written: each holder's repeated publish gets the attachment it has
// (the same host NQN, a secret that opens to the same password), any
// other node is refused naming the holder. Then the new build publishes,
// unpublishes, ends the migration, fences a node and fails its volume
// over, and lifts the fence the old build set once that node is back.
//
// The records are the stored formats: the claims and retiring
// annotations on PVs, the export's allowed host and password on the RDS
// (derived from the claims), the publish_context in VolumeAttachments,
// the driver's taint on fenced nodes and the node plugins' Leases. The
// test reads them by their literal names, as the previous release wrote
// them, never through the current code's constants, so a build that
// renames or reshapes one fails here.

// upgradeRecords is what the roll must not change.
type upgradeRecords struct {
	disks  map[string]rdssim.DiskInfo                       // by volume handle
	logs   map[string]int                                   // export log length, by handle
	vas    map[string]map[string]storagev1.VolumeAttachment // by PV, by node
	claims map[string]map[string]map[string]any             // by PV, by node: the claim without its publish count
}

// releaseVolume is a claim of the scenario.
type releaseVolume struct {
	claim, pv, handle string
	block             bool
}

// releaseWorld is the deployment the roll works on.
type releaseWorld struct {
	e        *framework.Env
	sim      *framework.Sim
	dep      *framework.Deployment
	mon      *framework.AttachmentMonitor
	nodes    map[string]*framework.FakeKubelet
	keys     map[string]*exportauth.NodeKey
	ids      map[string]string // node IDs with keys, as the plugins register them
	plugins  map[string]*framework.NodePlugin
	replicas []*framework.Replica
	vols     map[string]*releaseVolume // by claim
	next     int                       // the next replica's number
}

var releaseNodes = []string{"node-a", "node-b", "node-c", "node-d"}

// releaseDriverArgs are the controller's flags in both builds: storage
// fencing with DH-HMAC-CHAP and unattended failover (the default 20 s
// thresholds), the node plugins' Leases read, a migration that outlasts
// the test.
var releaseDriverArgs = []string{"--storage-fencing=allow-host", "--export-auth=dhchap", "--out-of-service-taint",
	"--node-lease-namespace=" + framework.NodePluginNamespace, "--migration-timeout=30m"}

func startReleaseWorld(t *testing.T, e *framework.Env, bin, version string) *releaseWorld {
	t.Helper()
	ctx, c, tl := e.Ctx, e.Client, e.TL
	w := &releaseWorld{e: e, nodes: map[string]*framework.FakeKubelet{}, keys: map[string]*exportauth.NodeKey{},
		ids: map[string]string{}, plugins: map[string]*framework.NodePlugin{}, vols: map[string]*releaseVolume{}}
	w.sim = e.StartSim(framework.SimOptions{})
	var err error
	if w.mon, err = framework.WatchAttachments(ctx, c); err != nil {
		t.Fatal(err)
	}
	done := tl.Step("install " + version + ": RBAC, CSIDriver, storage fencing, node plugin identity")
	w.dep = framework.Deploy(ctx, t, tl, e.CP, e.Dir)
	framework.DeployFile(ctx, t, tl, e.CP, "manifests/overlays/storage-fencing/fencing-rbac.yaml")
	deployNodePluginIdentity(t, e)
	done()

	done = tl.Step("nodes, each with a node key (its plugin's, kept on the host across restarts) and a node plugin of " + version)
	for _, n := range releaseNodes {
		w.nodes[n] = e.NewNode(n)
		k, err := exportauth.NewNodeKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		w.keys[n], w.ids[n] = k, n+"/"+k.Public.String()
		if err := w.nodes[n].SetNodeID(ctx, w.ids[n]); err != nil {
			t.Fatal(err)
		}
		w.plugins[n] = framework.StartNodePlugin(t, tl, e.Dir, w.sim, framework.NodePluginOptions{
			Bin: bin, Node: n, Kubeconfig: framework.NodePluginKubeconfig(ctx, t, e.CP, e.Dir, n)})
		w.checkVersion(t, w.plugins[n].Endpoint, version)
	}
	done()

	done = tl.Step("two controller replicas of " + version)
	for range 2 {
		w.startReplica(t, bin, version)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "a leader holds the driver's, csi-provisioner's and csi-attacher's Leases",
		leasesHeldByOneOf(c, w.dep.Namespace, w.replicas)); err != nil {
		t.Fatal(err)
	}
	done()
	return w
}

// startReplica starts controller replica ctrl-N of bin and checks that it
// reports version.
func (w *releaseWorld) startReplica(t *testing.T, bin, version string) *framework.Replica {
	t.Helper()
	w.next++
	r := w.e.StartReplica(w.sim, w.dep, framework.ReplicaOptions{Name: fmt.Sprintf("ctrl-%d", w.next), DriverBin: bin,
		LeaderElection: framework.FastLeaderElection, DriverArgs: releaseDriverArgs})
	w.checkVersion(t, r.Driver.Endpoint, version)
	w.replicas = append(w.replicas, r)
	return r
}

// checkVersion: the CSI driver at endpoint says it is version.
func (w *releaseWorld) checkVersion(t *testing.T, endpoint, version string) {
	t.Helper()
	info, err := framework.GetPluginInfo(w.e.Ctx, endpoint)
	if err != nil {
		t.Fatal(err)
	}
	if info.GetVendorVersion() != version || info.GetName() != framework.DriverName {
		t.Fatalf("%s: GetPluginInfo %s %s; want %s %s", endpoint, info.GetName(), info.GetVendorVersion(), framework.DriverName, version)
	}
}

// leasesHeldByOneOf holds once the driver's and both sidecars' Leases are
// held, each by one of the replicas (the leader of each may differ).
func leasesHeldByOneOf(c kubernetes.Interface, ns string, rs []*framework.Replica) framework.Condition {
	return func(ctx context.Context) (bool, string, error) {
		var seen []string
		ok := true
		for _, name := range []string{framework.DriverLease, framework.ProvisionerLease, framework.AttacherLease} {
			h, err := framework.LeaseHolder(ctx, c, ns, name)
			if err != nil {
				return false, err.Error(), nil
			}
			seen = append(seen, name+"="+h)
			ok = ok && slices.ContainsFunc(rs, func(r *framework.Replica) bool { return framework.HolderIs(h, r.Name) })
		}
		return ok, strings.Join(seen, ", "), nil
	}
}

// provision creates a 1Gi claim of class and waits until it is bound.
func (w *releaseWorld) provision(t *testing.T, claim, class string, mode corev1.PersistentVolumeAccessMode, block bool) *releaseVolume {
	t.Helper()
	ctx, c, tl := w.e.Ctx, w.e.Client, w.e.TL
	if _, err := c.CoreV1().PersistentVolumeClaims(framework.TestNamespace).Create(ctx,
		framework.PVC(framework.TestNamespace, claim, class, "1Gi", mode, block), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	v := &releaseVolume{claim: claim, block: block}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "PVC "+claim+" bound", framework.PVCBound(c, framework.TestNamespace, claim, &v.pv)); err != nil {
		t.Fatal(err)
	}
	pv, err := c.CoreV1().PersistentVolumes().Get(ctx, v.pv, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v.handle = pv.Spec.CSI.VolumeHandle
	w.vols[claim] = v
	return v
}

// attach runs pod on node with v and waits until v is attached there.
func (w *releaseWorld) attach(t *testing.T, pod, node string, v *releaseVolume) {
	t.Helper()
	ctx, c, tl := w.e.Ctx, w.e.Client, w.e.TL
	p := framework.PodOnNode(framework.TestNamespace, pod, node, v.claim)
	if v.block {
		p = framework.BlockPodOnNode(framework.TestNamespace, pod, node, v.claim)
	}
	if _, err := c.CoreV1().Pods(framework.TestNamespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, v.claim+" attached to "+node, framework.VolumeAttached(c, v.pv, node, nil)); err != nil {
		t.Fatal(err)
	}
}

// exportOpensTo holds once v's export is open to node's attachment alone
// and its password is the one node's publish_context seals to node's key.
func (w *releaseWorld) exportOpensTo(v *releaseVolume, node string) framework.Condition {
	return func(ctx context.Context) (bool, string, error) {
		va, err := framework.AttachmentFor(ctx, w.e.Client, v.pv, node)
		if err != nil || va == nil || !va.Status.Attached {
			return false, fmt.Sprintf("%s not attached to %s yet (%v)", v.claim, node, err), nil
		}
		host := va.Status.AttachmentMetadata["hostNQN"]
		d, ok := w.sim.Disk(v.handle)
		if !ok {
			return false, "no disk " + v.handle, nil
		}
		if !d.NVMeTCPExport || host == "" || d.AllowHostName != host {
			return false, fmt.Sprintf("export=%t allow-host=%q, %s's attachment host %q", d.NVMeTCPExport, d.AllowHostName, node, host), nil
		}
		secret, err := w.keys[node].Open(va.Status.AttachmentMetadata["dhchapSecret"])
		if err != nil {
			return false, "", fmt.Errorf("%s's key does not open its publish_context's secret for %s: %w", node, v.claim, err)
		}
		if secret.Reveal() != d.Secret {
			return false, fmt.Sprintf("%s's secret is not the one the RDS prints for %s", node, v.handle), nil
		}
		return true, "", nil
	}
}

// records reads everything the roll must leave as it is.
func (w *releaseWorld) records(t *testing.T) upgradeRecords {
	t.Helper()
	ctx, c := w.e.Ctx, w.e.Client
	r := upgradeRecords{disks: map[string]rdssim.DiskInfo{}, logs: map[string]int{},
		vas: map[string]map[string]storagev1.VolumeAttachment{}, claims: map[string]map[string]map[string]any{}}
	for _, v := range w.vols {
		d, ok := w.sim.Disk(v.handle)
		if !ok {
			t.Fatalf("no disk %s", v.handle)
		}
		r.disks[v.handle], r.logs[v.handle] = d, len(w.sim.ExportChangesOf(v.handle))
		vas, err := framework.VolumeAttachmentsFor(ctx, c, v.pv)
		if err != nil {
			t.Fatal(err)
		}
		r.vas[v.pv] = map[string]storagev1.VolumeAttachment{}
		for _, va := range vas {
			r.vas[v.pv][va.Spec.NodeName] = va
		}
		pv, err := c.CoreV1().PersistentVolumes().Get(ctx, v.pv, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		r.claims[v.pv] = claimRecords(t, pv.Annotations[framework.ClaimsAnnotation])
	}
	return r
}

// claimRecords parses a claims annotation as the previous release wrote
// it (node -> claim object), each claim without its publish count "gen",
// which every publish success bumps.
func claimRecords(t *testing.T, raw string) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	if raw == "" {
		return out
	}
	if err := json.Unmarshal([]byte(raw), &out); err != nil {
		t.Fatalf("claims annotation %q: %v", raw, err)
	}
	for _, c := range out {
		delete(c, "gen")
	}
	return out
}

// unchanged compares the records now with before: the same disks, export
// logs, VolumeAttachments (the same objects, attached, the same
// publish_context) and claims.
func (w *releaseWorld) unchanged(t *testing.T, before upgradeRecords, what string) {
	t.Helper()
	now := w.records(t)
	for _, v := range w.vols {
		if before.disks[v.handle] != now.disks[v.handle] {
			t.Errorf("%s: %s's disk changed: %+v, was %+v", what, v.claim, now.disks[v.handle], before.disks[v.handle])
		}
		if n := now.logs[v.handle]; n != before.logs[v.handle] {
			t.Errorf("%s: %s's export changed %d times: %+v", what, v.claim, n-before.logs[v.handle], w.sim.ExportChangesOf(v.handle)[before.logs[v.handle]:])
		}
		for node, va := range before.vas[v.pv] {
			got, ok := now.vas[v.pv][node]
			switch {
			case !ok:
				t.Errorf("%s: %s's VolumeAttachment on %s is gone", what, v.claim, node)
			case got.UID != va.UID || got.Status.Attached != va.Status.Attached || !maps.Equal(got.Status.AttachmentMetadata, va.Status.AttachmentMetadata):
				t.Errorf("%s: %s's VolumeAttachment on %s changed: uid %s attached %t %v, was uid %s attached %t %v", what, v.claim, node,
					got.UID, got.Status.Attached, mapKeys(got.Status.AttachmentMetadata), va.UID, va.Status.Attached, mapKeys(va.Status.AttachmentMetadata))
			}
		}
		if len(now.vas[v.pv]) != len(before.vas[v.pv]) {
			t.Errorf("%s: %s has VolumeAttachments on %v, had %v", what, v.claim, slices.Sorted(maps.Keys(now.vas[v.pv])), slices.Sorted(maps.Keys(before.vas[v.pv])))
		}
		if !reflect.DeepEqual(now.claims[v.pv], before.claims[v.pv]) {
			t.Errorf("%s: %s's claims are %v, were %v", what, v.claim, now.claims[v.pv], before.claims[v.pv])
		}
	}
}

// holderPublishes asks r's driver for v's holder's publish again, as
// csi-attacher does after losing track of it: the answer must be the
// attachment the holder has (its host NQN, a secret that opens to the
// password the RDS has), and another node must be refused, naming the
// holder.
func (w *releaseWorld) holderPublishes(t *testing.T, r *framework.Replica, v *releaseVolume, holder, other string) {
	t.Helper()
	ctx, tl := w.e.Ctx, w.e.TL
	cc, conn, err := r.Driver.Controller()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	va, err := framework.AttachmentFor(ctx, w.e.Client, v.pv, holder)
	if err != nil || va == nil {
		t.Fatalf("%s on %s: %v", v.claim, holder, err)
	}
	// The capability the attacher published with, as the claim records it.
	pv, err := w.e.Client.CoreV1().PersistentVolumes().Get(ctx, v.pv, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	capability, _ := claimRecords(t, pv.Annotations[framework.ClaimsAnnotation])[holder]["cap"].(string)
	code, pc, msg := releasePublish(ctx, t, tl, cc, r.Name, v.pv, w.ids[holder], capability)
	if code != codes.OK {
		t.Errorf("%s: the holder %s's repeated publish of %s: %s %q", r.Name, holder, v.claim, code, msg)
	} else {
		if pc["hostNQN"] != va.Status.AttachmentMetadata["hostNQN"] || pc["nqn"] != va.Status.AttachmentMetadata["nqn"] {
			t.Errorf("%s: the holder %s's repeated publish of %s answers host %q nqn %q; its attachment has host %q nqn %q",
				r.Name, holder, v.claim, pc["hostNQN"], pc["nqn"], va.Status.AttachmentMetadata["hostNQN"], va.Status.AttachmentMetadata["nqn"])
		}
		secret, err := w.keys[holder].Open(pc["dhchapSecret"])
		d, _ := w.sim.Disk(v.handle)
		if err != nil || secret.Reveal() != d.Secret {
			t.Errorf("%s: the holder %s's repeated publish of %s gives a secret that is not the RDS's (%v)", r.Name, holder, v.claim, err)
		}
	}
	code, _, msg = releasePublish(ctx, t, tl, cc, r.Name, v.pv, w.ids[other], capability)
	if code != codes.FailedPrecondition || !strings.Contains(msg, holder) {
		t.Errorf("%s: %s publishing %s, held by %s: %s %q; want FAILED_PRECONDITION naming %s", r.Name, other, v.claim, holder, code, msg, holder)
	}
}

// releasePublish calls ControllerPublishVolume as csi-attacher would,
// with capability as a claim records it ("mount/SINGLE_NODE_MULTI_WRITER",
// "block/MULTI_NODE_MULTI_WRITER").
func releasePublish(ctx context.Context, t *testing.T, tl *framework.Timeline, cc csipb.ControllerClient, who, pv, nodeID, capability string) (codes.Code, map[string]string, string) {
	t.Helper()
	kind, mode, _ := strings.Cut(capability, "/")
	m, ok := csipb.VolumeCapability_AccessMode_Mode_value[mode]
	if !ok || (kind != "mount" && kind != "block") {
		t.Fatalf("capability %q: not as a claim records one", capability)
	}
	vc := &csipb.VolumeCapability{
		AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_Mode(m)},
	}
	if kind == "block" {
		vc.AccessType = &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}}
	}
	var resp *csipb.ControllerPublishVolumeResponse
	err := failoverRetryBusy(ctx, t, tl, fmt.Sprintf("%s: ControllerPublish %s to %s", who, pv, nodeID), func() error {
		var err error
		resp, err = cc.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: pv, NodeId: nodeID, VolumeCapability: vc})
		return err
	})
	st := status.Convert(err)
	tl.Logf("%s: ControllerPublish %s to %s: %s %q", who, pv, strings.SplitN(nodeID, "/", 2)[0], st.Code(), st.Message())
	if err != nil {
		return st.Code(), nil, st.Message()
	}
	return codes.OK, resp.GetPublishContext(), ""
}

// fenceNode stops node (its kubelet and its plugin: the machine is gone)
// and waits until the driver has cut it off v's export, tainted it out of
// service and v is attached to the node whose pod waits for it.
func (w *releaseWorld) fenceNode(t *testing.T, node string, v *releaseVolume, to string) {
	t.Helper()
	ctx, c, tl := w.e.Ctx, w.e.Client, w.e.TL
	if err := w.plugins[node].Stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	w.nodes[node].Fail()
	if _, err := framework.WaitFor(ctx, tl, fencedGrace+2*time.Minute, node+" tainted out of service by the driver",
		framework.NodeTaint(c, node, corev1.TaintNodeOutOfService, releaseFenceTaint, true)); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, v.claim+" attached to "+to, framework.VolumeAttached(c, v.pv, to, nil)); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 30*time.Second, v.claim+"'s export opens to "+to+" alone", w.exportOpensTo(v, to)); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, v.claim+"'s claims name "+to+" only", framework.ClaimsAre(c, v.pv, to)); err != nil {
		t.Fatal(err)
	}
}

// releaseFenceTaint is the value of the out-of-service taint the driver
// puts on a node it fenced: a stored record like the annotations, read by
// its literal value.
const releaseFenceTaint = "rds-csi-fenced"

// rollControllers replaces each replica by one of bin, one at a time, as
// the Deployment's rolling update does (maxSurge 0, maxUnavailable 1);
// with both builds running, both answer the holders' publishes alike.
func (w *releaseWorld) rollControllers(t *testing.T, bin, version string, probe func(r *framework.Replica)) {
	t.Helper()
	old := w.replicas
	w.replicas = nil
	for i, r := range old {
		done := w.e.TL.Step(fmt.Sprintf("controller rollout: %s stopped, its successor of %s started", r.Name, version))
		if err := r.Stop(); err != nil {
			t.Fatal(err)
		}
		n := w.startReplica(t, bin, version)
		rest := append(append([]*framework.Replica{}, w.replicas...), old[i+1:]...)
		if _, err := framework.WaitFor(w.e.Ctx, w.e.TL, time.Minute, "a running replica leads each Lease",
			leasesHeldByOneOf(w.e.Client, w.dep.Namespace, rest)); err != nil {
			t.Fatal(err)
		}
		if i == 0 && len(old) > 1 {
			// Mid-rollout, both builds serve: each reads the records alike.
			probe(n)
			probe(old[1])
		}
		done()
	}
}

// rollNodePlugins replaces each running node plugin by one of bin, node by
// node, as the DaemonSet's rolling update does: the kubelet deregisters
// the plugin, the new one starts and registers with the same node ID
// (its node key is the host's).
func (w *releaseWorld) rollNodePlugins(t *testing.T, bin, version string) {
	t.Helper()
	ctx, tl := w.e.Ctx, w.e.TL
	for _, n := range releaseNodes {
		p := w.plugins[n]
		if p.Exited() {
			continue // its node is down: the DaemonSet waits for it
		}
		done := tl.Step("node plugin rollout on " + n + ": " + version)
		if err := w.nodes[n].DeregisterPlugin(ctx); err != nil {
			t.Fatal(err)
		}
		w.plugins[n] = p.Replace(t, tl, w.e.Dir, w.sim, bin)
		w.checkVersion(t, w.plugins[n].Endpoint, version)
		if err := w.nodes[n].SetNodeID(ctx, w.ids[n]); err != nil {
			t.Fatal(err)
		}
		if _, err := framework.WaitFor(ctx, tl, 30*time.Second, n+"'s plugin Lease renewed by the new plugin", pluginLeaseRenewed(w.e.Client, n, 1)); err != nil {
			t.Fatal(err)
		}
		done()
	}
}

// releaseBuild gives a build of the driver and its version, within e's
// timeline.
type releaseBuild func(e *framework.Env) (bin, version string)

func previousRelease(e *framework.Env) (string, string) {
	return framework.BuildRelease(e.T, e.TL, e.Root, framework.PreviousRelease), framework.PreviousRelease.Version
}

func currentBuild(e *framework.Env) (string, string) {
	return framework.BuildCurrent(e.T, e.TL, e.Root)
}

// The upgrade from the previous release to this checkout.
func TestUpgradeWithLiveVolumes(t *testing.T) {
	t.Parallel()
	framework.RequireRelease(t, framework.PreviousRelease)
	rollThrough(t, previousRelease, currentBuild)
}

// A downgrade after the new build wrote its records (its claims, a fence,
// a migration): the previous release reads them and carries on, so a
// rollback (`helm rollback`) is safe. A future format change the previous
// release cannot read fails here: that release must then refuse to start
// on it with a message, or the format must stay readable; docs/release.md
// says which releases may be rolled back to.
func TestDowngradeAfterNewRecords(t *testing.T) {
	t.Parallel()
	framework.RequireRelease(t, framework.PreviousRelease)
	rollThrough(t, currentBuild, previousRelease)
}

// rollThrough: records written by from, the roll to to, the checks, and
// then to at work.
func rollThrough(t *testing.T, from, to releaseBuild) {
	e := framework.NewEnv(t, framework.EnvOptions{ControlPlane: framework.ControlPlaneOptions{NodeMonitorGracePeriod: fencedGrace}})
	fromBin, fromVersion := from(e)
	toBin, toVersion := to(e)
	if fromVersion == toVersion {
		t.Fatalf("both builds say %s: the roll would prove nothing", fromVersion)
	}
	w := startReleaseWorld(t, e, fromBin, fromVersion)
	ctx, c, tl := e.Ctx, e.Client, e.TL
	ns := framework.TestNamespace

	done := tl.Step(fromVersion + " writes the records: volumes attached, a node fenced and its volume moved, a migration in flight")
	for _, sc := range []string{"rds", "rds-block"} {
		if _, err := c.StorageV1().StorageClasses().Create(ctx, framework.StorageClass(sc, nil), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	dataA := w.provision(t, "data-a", "rds", corev1.ReadWriteOnce, false)
	dataC := w.provision(t, "data-c", "rds", corev1.ReadWriteOnce, false)
	vm := w.provision(t, "vm-disk", "rds-block", corev1.ReadWriteMany, true)
	w.attach(t, "pod-a", "node-a", dataA)
	w.attach(t, "pod-c", "node-c", dataC)
	w.attach(t, "vm-source", "node-a", vm)
	// The target joins in a later second than the source (the driver
	// tells them apart by their one-second timestamps).
	va, err := framework.AttachmentFor(ctx, c, vm.pv, "node-a")
	if err != nil || va == nil {
		t.Fatalf("vm-disk on node-a: %v", err)
	}
	if _, err := framework.WaitFor(ctx, tl, 10*time.Second, "the clock past the source's second", func(context.Context) (bool, string, error) {
		return time.Now().Truncate(time.Second).After(va.CreationTimestamp.Time), "", nil
	}); err != nil {
		t.Fatal(err)
	}
	w.attach(t, "vm-target", "node-b", vm)
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "vm-disk claimed by node-a and node-b", framework.ClaimsAre(c, vm.pv, "node-a", "node-b")); err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		v    *releaseVolume
		node string
	}{{dataA, "node-a"}, {dataC, "node-c"}} {
		if _, err := framework.WaitFor(ctx, tl, 30*time.Second, x.v.claim+"'s export opens to "+x.node+" alone", w.exportOpensTo(x.v, x.node)); err != nil {
			t.Fatal(err)
		}
	}
	// node-c dies with data-c; its replacement waits on node-d.
	if _, err := c.CoreV1().Pods(ns).Create(ctx, framework.PodOnNode(ns, "pod-c2", "node-d", "data-c"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "Multi-Attach error on pod-c2",
		framework.EventOn(c, ns, "Pod", "pod-c2", "FailedAttachVolume", nil, "Multi-Attach")); err != nil {
		t.Fatal(err)
	}
	w.fenceNode(t, "node-c", dataC, "node-d")
	done()

	before := w.records(t)
	rollStart := time.Now()
	probe := func(r *framework.Replica) {
		w.holderPublishes(t, r, dataA, "node-a", "node-b")
		w.holderPublishes(t, r, dataC, "node-d", "node-a")
		// The migration: a third node is refused, naming both holders.
		cc, conn, err := r.Driver.Controller()
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		code, _, msg := releasePublish(ctx, t, tl, cc, r.Name, vm.pv, w.ids["node-d"], "block/MULTI_NODE_MULTI_WRITER")
		if code != codes.FailedPrecondition || !strings.Contains(msg, "node-a") || !strings.Contains(msg, "node-b") {
			t.Errorf("%s: node-d publishing vm-disk during its migration: %s %q; want FAILED_PRECONDITION naming node-a and node-b", r.Name, code, msg)
		}
	}

	w.rollControllers(t, toBin, toVersion, probe)
	w.rollNodePlugins(t, toBin, toVersion)

	done = tl.Step("after the roll: nothing detached, no export changed, every claim as it was")
	w.unchanged(t, before, "after the roll")
	for _, v := range w.vols {
		for _, ch := range w.mon.History(v.pv) {
			if ch.At.After(rollStart) {
				t.Errorf("%s's attached nodes changed during the roll: %v at %s", v.claim, ch.Nodes, ch.At.Format(time.RFC3339Nano))
			}
		}
	}
	if _, err := framework.WaitFor(ctx, tl, 5*time.Second, "node-c still tainted out of service by the driver",
		framework.NodeTaint(c, "node-c", corev1.TaintNodeOutOfService, releaseFenceTaint, true)); err != nil {
		t.Error(err)
	}
	for _, r := range w.replicas {
		probe(r)
	}
	noAttachError(ctx, t, tl, c, w.vols)
	done()

	done = tl.Step(toVersion + " at work: unpublish, the migration's end, a publish, a fence and a failover, the old fence lifted")
	if err := framework.ForceDeletePod(ctx, c, ns, "pod-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "data-a detached from node-a", framework.NoVolumeAttachment(c, dataA.pv, "node-a")); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "data-a's export closed and its claim gone", framework.AnyOf(func(ctx context.Context) (bool, string, error) {
		d, _ := w.sim.Disk(dataA.handle)
		claims, err := framework.Claims(ctx, c, dataA.pv)
		return !d.NVMeTCPExport && err == nil && len(claims) == 0, fmt.Sprintf("export=%t claims=%v (%v)", d.NVMeTCPExport, claims, err), nil
	})); err != nil {
		t.Error(err)
	}
	if err := framework.ForceDeletePod(ctx, c, ns, "vm-source"); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "the migration ends: vm-disk on node-b alone", claimsMatchAttachments(c, map[string]string{vm.pv: "node-b"})); err != nil {
		t.Error(err)
	}
	dataB := w.provision(t, "data-b", "rds", corev1.ReadWriteOnce, false)
	w.attach(t, "pod-b", "node-b", dataB)
	if _, err := framework.WaitFor(ctx, tl, 30*time.Second, "data-b's export opens to node-b alone", w.exportOpensTo(dataB, "node-b")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Pods(ns).Create(ctx, framework.PodOnNode(ns, "pod-b2", "node-a", "data-b"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "Multi-Attach error on pod-b2",
		framework.EventOn(c, ns, "Pod", "pod-b2", "FailedAttachVolume", nil, "Multi-Attach")); err != nil {
		t.Fatal(err)
	}
	w.fenceNode(t, "node-b", dataB, "node-a")
	// node-c, fenced by the other build, comes back with a plugin of this
	// one: this build lifts that fence.
	if err := w.nodes["node-c"].Recover(ctx); err != nil {
		t.Fatal(err)
	}
	w.plugins["node-c"] = w.plugins["node-c"].Replace(t, tl, e.Dir, w.sim, toBin)
	if err := w.nodes["node-c"].SetNodeID(ctx, w.ids["node-c"]); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "node-c's out-of-service taint lifted", framework.NodeTaint(c, "node-c", corev1.TaintNodeOutOfService, "", false)); err != nil {
		t.Error(err)
	}
	for _, v := range []*releaseVolume{dataA, dataB, dataC} {
		if got := w.mon.MaxAttached(v.pv); got != 1 {
			t.Errorf("%s was attached to %d nodes at once; history %+v", v.claim, got, w.mon.History(v.pv))
		}
	}
	var logs []string
	for i := 1; i <= w.next; i++ {
		logs = append(logs, filepath.Join(e.Dir, fmt.Sprintf("rds-csi-driver-ctrl-%d.log", i)))
	}
	answers, err := framework.DriverAnswers(logs...)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []*releaseVolume{dataA, dataB, dataC} {
		if n, worst := framework.MaxHolders(answers, v.pv); n > 1 {
			t.Errorf("%s was held by %d nodes at once by what the replicas of both builds answered: %v", v.claim, n, worst)
		}
	}
	done()
}

// noAttachError: no VolumeAttachment of the scenario carries an attach
// error (a refusal of the new build to serve an old attachment).
func noAttachError(ctx context.Context, t *testing.T, tl *framework.Timeline, c kubernetes.Interface, vols map[string]*releaseVolume) {
	t.Helper()
	// An attach error the attacher retries away (a call ABORTED because
	// another one on the volume was in flight, as a replica's restart
	// makes two) clears with its next success; one that stays is a
	// failure, and so is a refusal at once.
	_, err := framework.WaitFor(ctx, tl, 2*time.Minute, "no VolumeAttachment with an attach error", func(ctx context.Context) (bool, string, error) {
		var left []string
		for _, v := range vols {
			vas, err := framework.VolumeAttachmentsFor(ctx, c, v.pv)
			if err != nil {
				return false, "", err
			}
			for _, va := range vas {
				e := va.Status.AttachError
				if e == nil {
					continue
				}
				msg := fmt.Sprintf("%s on %s: attach error %q", v.claim, va.Spec.NodeName, e.Message)
				if !strings.Contains(e.Message, "code = Aborted") && !strings.Contains(e.Message, "code = Unavailable") {
					return false, "", errors.New(msg)
				}
				left = append(left, msg)
			}
		}
		return len(left) == 0, strings.Join(left, "; "), nil
	})
	if err != nil {
		t.Error(err)
	}
}
