//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	"github.com/srvlab/rds-csi/e2e/framework"
	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/diagnose"
)

// kubectlRDS runs the plugin binary as an operator bound only to the roles
// of manifests/kubectl-rds, and keeps every run's output in the artifact
// directory (kubectl-rds.txt, the source of docs/kubectl-rds.md).
type kubectlRDS struct {
	t            *testing.T
	tl           *framework.Timeline
	bin          string
	kubeconfig   string
	inventoryURL string
	transcript   *os.File
}

func (k *kubectlRDS) run(stdin string, args ...string) (int, string) {
	k.t.Helper()
	// Subcommand first, as kubectl passes it.
	full := append([]string{args[0]}, append([]string{"--kubeconfig", k.kubeconfig, "--inventory-url", k.inventoryURL}, args[1:]...)...)
	cmd := exec.Command(k.bin, full...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		k.t.Fatalf("kubectl-rds %v: %v", args, err)
	}
	fmt.Fprintf(k.transcript, "$ kubectl rds %s\n%s%s(exit status %d)\n\n", strings.Join(args, " "), out.String(), errOut.String(), code)
	k.tl.Logf("kubectl rds %s: exit %d", strings.Join(args, " "), code)
	return code, out.String() + errOut.String()
}

// why runs `why` in JSON and returns the first volume's verdict; the
// text form is run too, for the transcript.
func (k *kubectlRDS) why(kind, name string) diagnose.Verdict {
	k.t.Helper()
	if code, out := k.run("", "why", kind, name); code != 0 {
		k.t.Fatalf("why %s %s: exit %d\n%s", kind, name, code, out)
	}
	code, out := k.run("", "why", kind, name, "-o", "json")
	var ex diagnose.Explanation
	if err := json.Unmarshal([]byte(out), &ex); err != nil || code != 0 || len(ex.Stories) == 0 {
		k.t.Fatalf("why %s %s -o json: exit %d, %v\n%s", kind, name, code, err, out)
	}
	return ex.Stories[0].Verdict
}

func (k *kubectlRDS) check() (int, diagnose.Report) {
	k.t.Helper()
	k.run("", "check")
	code, out := k.run("", "check", "-o", "json")
	var r diagnose.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		k.t.Fatalf("check -o json: exit %d, %v\n%s", code, err, out)
	}
	return code, r
}

// plugin is cmd/kubectl-rds, built once for the tests that run it side
// by side.
var plugin = framework.GoBuild{Name: "kubectl-rds", Pkg: "./cmd/kubectl-rds"}

// operatorKubeconfig creates a ServiceAccount bound to the ClusterRoles of
// manifests/kubectl-rds (reader and release) and returns a kubeconfig with
// its token: the plugin then runs with exactly the documented permissions.
func operatorKubeconfig(t *testing.T, e *framework.Env) string {
	ctx, c := e.Ctx, e.Client
	data, err := os.ReadFile(filepath.Join(e.Root, "manifests", "kubectl-rds", "rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatal(err)
		}
		if meta.Kind != "ClusterRole" {
			continue // the port-forward Role: the test reaches the driver directly
		}
		var cr rbacv1.ClusterRole
		if err := yaml.UnmarshalStrict([]byte(doc), &cr); err != nil {
			t.Fatal(err)
		}
		if _, err := c.RbacV1().ClusterRoles().Create(ctx, &cr, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: cr.Name},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: framework.TestNamespace, Name: "operator"}},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: cr.Name},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.CoreV1().ServiceAccounts(framework.TestNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "operator"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tok, err := c.CoreV1().ServiceAccounts(framework.TestNamespace).CreateToken(ctx, "operator", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile(e.CP.Env["KUBE_CA_FILE"])
	if err != nil {
		t.Fatal(err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = &clientcmdapi.Cluster{Server: e.CP.Env["KUBE_APISERVER_URL"], CertificateAuthorityData: ca}
	cfg.AuthInfos["operator"] = &clientcmdapi.AuthInfo{Token: tok.Status.Token}
	cfg.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: "operator", Namespace: framework.TestNamespace}
	cfg.CurrentContext = "e2e"
	path := filepath.Join(e.Dir, "operator.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(path) }) // a bearer token
	return path
}

// stripFinalizers is what an operator does to a VolumeAttachment stuck
// Terminating: it lets the object go without ControllerUnpublish.
func stripFinalizers(ctx context.Context, c kubernetes.Interface, va string) error {
	_, err := c.StorageV1().VolumeAttachments().Patch(ctx, va, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	return err
}

// TestKubectlRDS produces each verdict of kubectl rds from a real
// scenario on the real control plane: a Multi-Attach refusal, a dead node,
// a stale claim (and its release), an orphan disk.
func TestKubectlRDS(t *testing.T) {
	t.Parallel()
	e := framework.NewEnv(t, framework.EnvOptions{ControlPlane: framework.ControlPlaneOptions{NodeMonitorGracePeriod: nodeMonitorGrace}})
	ctx, c, tl, ns := e.Ctx, e.Client, e.TL, framework.TestNamespace
	sim := e.StartSim(framework.SimOptions{})
	nodes := map[string]*framework.FakeKubelet{"node-a": e.NewNode("node-a"), "node-b": e.NewNode("node-b")}
	port, err := framework.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	ctrl := e.StartController(sim, framework.ControllerOptions{DriverArgs: []string{"--http-endpoint=127.0.0.1:" + strconv.Itoa(port)}})
	// The snapshot CRDs come with the optional snapshotter build; without
	// them check says the snapshot files were not checked.
	snapshotAPI := false
	if _, err := os.Stat(framework.SnapshotCRDDir(e.Root)); err == nil {
		framework.InstallSnapshotCRDs(ctx, t, tl, e.CP)
		snapshotAPI = true
	}

	transcript, err := os.Create(filepath.Join(e.Dir, "kubectl-rds.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer transcript.Close()
	k := &kubectlRDS{t: t, tl: tl, bin: plugin.Path(t, tl, e.Root), kubeconfig: operatorKubeconfig(t, e),
		inventoryURL: fmt.Sprintf("http://127.0.0.1:%d/inventory", port), transcript: transcript}
	t.Logf("transcript: %s", transcript.Name())

	done := tl.Step("claims: data (RWO, Delete) and kept (RWO, Retain); pod-a on node-a")
	retain := framework.StorageClass("rds-retain", nil)
	retain.ReclaimPolicy = ptrTo(corev1.PersistentVolumeReclaimRetain)
	for _, sc := range []*storagev1.StorageClass{framework.StorageClass("rds", nil), retain} {
		if _, err := c.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for name, sc := range map[string]string{"data": "rds", "kept": "rds-retain"} {
		if _, err := c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, framework.PVC(ns, name, sc, "1Gi", corev1.ReadWriteOnce, false), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var pv, keptPV string
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "PVC data bound", framework.PVCBound(c, ns, "data", &pv)); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "PVC kept bound", framework.PVCBound(c, ns, "kept", &keptPV)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Pods(ns).Create(ctx, framework.PodOnNode(ns, "pod-a", "node-a", "data"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var vaA storagev1.VolumeAttachment
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "data attached to node-a", framework.VolumeAttached(c, pv, "node-a", &vaA)); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "claims name node-a", claimsAre(c, pv, "node-a")); err != nil {
		t.Fatal(err)
	}
	done()
	if code, r := k.check(); code != 0 || !r.OK || len(r.Skipped) != map[bool]int{true: 0, false: 1}[snapshotAPI] || r.Checked.PVs != 2 || r.Checked.Disks != 2 {
		t.Errorf("check on a healthy cluster: exit %d, %+v", code, r)
	}

	done = tl.Step("scenario 1: Multi-Attach refusal")
	if _, err := c.CoreV1().Pods(ns).Create(ctx, framework.PodOnNode(ns, "pod-b", "node-b", "data"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "Multi-Attach error on pod-b",
		framework.EventOn(c, ns, "Pod", "pod-b", "FailedAttachVolume", nil, "Multi-Attach")); err != nil {
		t.Fatal(err)
	}
	v := k.why("pod", "pod-b")
	if v.Code != diagnose.VerdictHeldByHealthyNode || !strings.Contains(v.Summary, "node-a holds PV "+pv) ||
		!strings.Contains(v.Summary, "used by pod e2e/pod-a") || !strings.Contains(v.Next, "kubectl delete pod -n e2e pod-a") {
		t.Errorf("Multi-Attach: verdict %+v", v)
	}
	if v := k.why("pod", "pod-a"); v.Code != diagnose.VerdictAttached {
		t.Errorf("pod-a: verdict %+v, want %s", v, diagnose.VerdictAttached)
	}
	done()

	done = tl.Step("scenario 2: node-a dies")
	nodes["node-a"].Fail()
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "node-a NotReady", framework.NodeReady(c, "node-a", corev1.ConditionUnknown)); err != nil {
		t.Fatal(err)
	}
	v = k.why("pvc", "data")
	if v.Code != diagnose.VerdictHolderNotReady || !strings.Contains(v.Summary, "node-a holds PV "+pv+" and has been NotReady for") ||
		v.Next != "if node-a is really down: kubectl taint node node-a node.kubernetes.io/out-of-service=nodeshutdown:NoExecute" {
		t.Errorf("dead node: verdict %+v", v)
	}
	if code, out := k.run("", "release", pv, "--node", "node-a", "--yes"); code == 0 || !strings.Contains(out, "VolumeAttachment "+vaA.Name) {
		t.Errorf("release while node-a's VolumeAttachment exists: exit %d\n%s", code, out)
	}
	done()

	done = tl.Step("scenario 3: a stale claim: csi-attacher down, node-a's VolumeAttachment stripped of its finalizer")
	if err := ctrl.Attacher.Stop(10 * time.Second); err != nil {
		t.Logf("csi-attacher stop: %v", err)
	}
	if err := framework.ForceDeletePod(ctx, c, ns, "pod-a"); err != nil {
		t.Fatal(err)
	}
	// node-a's status without volumesInUse lets the attach/detach
	// controller detach now rather than after 6 minutes.
	if err := framework.ReportNodeStatus(ctx, c, "node-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "node-a's VolumeAttachment deleting (held by csi-attacher's finalizer)",
		func(ctx context.Context) (bool, string, error) {
			va, err := c.StorageV1().VolumeAttachments().Get(ctx, vaA.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error(), nil
			}
			return va.DeletionTimestamp != nil, fmt.Sprintf("finalizers %v", va.Finalizers), nil
		}); err != nil {
		t.Fatal(err)
	}
	if err := stripFinalizers(ctx, c, vaA.Name); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "node-a's VolumeAttachment gone", framework.NoVolumeAttachment(c, pv, "node-a")); err != nil {
		t.Fatal(err)
	}
	ctrl.Attacher = framework.StartAttacher(t, tl, e.Root, e.Dir, ctrl.Driver, ctrl.Deployment, framework.SidecarOptions{Name: "csi-attacher-2"})
	var vaB storagev1.VolumeAttachment
	if _, err := framework.WaitFor(ctx, tl, 3*time.Minute, "node-b's VolumeAttachment refused: node-a's claim stands",
		framework.AttachRefused(c, pv, "node-b", &vaB, "FailedPrecondition", "node-a")); err != nil {
		t.Fatal(err)
	}
	v = k.why("pod", "pod-b")
	if v.Code != diagnose.VerdictStaleClaim || v.Next != "kubectl rds release "+pv+" --node node-a" {
		t.Errorf("stale claim: verdict %+v", v)
	}
	code, r := k.check()
	if code != 1 || r.Counts[diagnose.FindingClaimWithoutVA] != 1 || len(r.Findings) != 1 || r.Findings[0].Object != "pv/"+pv {
		t.Errorf("check with a stale claim: exit %d, %+v", code, r)
	}
	if code, out := k.run("", "release", pv, "--node", "node-b", "--yes"); code == 0 || !strings.Contains(out, "has no claim") {
		t.Errorf("release of node-b, which has no claim: exit %d\n%s", code, out)
	}
	if code, out := k.run("n\n", "release", pv, "--node", "node-a"); code == 0 || !strings.Contains(out, "Nothing changed") {
		t.Errorf("release answered no: exit %d\n%s", code, out)
	}
	if _, err := framework.WaitFor(ctx, tl, 5*time.Second, "claims still name node-a", claimsAre(c, pv, "node-a")); err != nil {
		t.Error(err)
	}
	if code, out := k.run("y\n", "release", pv, "--node", "node-a"); code != 0 || !strings.Contains(out, "Released") {
		t.Fatalf("release: exit %d\n%s", code, out)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "ClaimReleased event on the PV",
		framework.EventOn(c, metav1.NamespaceDefault, "PersistentVolume", pv, "ClaimReleased", nil, "node-a", "system:serviceaccount:e2e:operator")); err != nil {
		t.Error(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "data attached to node-b", framework.VolumeAttached(c, pv, "node-b", nil)); err != nil {
		t.Fatal(err)
	}
	if v := k.why("pod", "pod-b"); v.Code != diagnose.VerdictAttached {
		t.Errorf("after the release: verdict %+v, want %s", v, diagnose.VerdictAttached)
	}
	done()

	done = tl.Step("scenario 4: an orphan disk: a Retain PV deleted")
	kept, err := c.CoreV1().PersistentVolumes().Get(ctx, keptPV, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	keptHandle := kept.Spec.CSI.VolumeHandle
	if err := c.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, "kept", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "PVC kept gone", framework.PVCGone(c, ns, "kept")); err != nil {
		t.Fatal(err)
	}
	if err := c.CoreV1().PersistentVolumes().Delete(ctx, keptPV, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "PV "+keptPV+" gone", framework.PVGone(c, keptPV)); err != nil {
		t.Fatal(err)
	}
	if _, ok := sim.Disk(keptHandle); !ok {
		t.Fatalf("disk %s is gone from the simulator; a Retain PV's disk must stay", keptHandle)
	}
	code, r = k.check()
	if code != 1 || r.Counts[diagnose.FindingOrphanDisk] != 1 || len(r.Findings) != 1 || r.Findings[0].Object != "disk/"+keptHandle {
		t.Errorf("check with an orphan disk: exit %d, %+v", code, r)
	}
	done()

	// The verdict says so when the RDS side is unreachable, and does not fail.
	k.inventoryURL = "http://127.0.0.1:1/inventory"
	if v := k.why("pod", "pod-b"); v.Code != diagnose.VerdictAttached || !strings.Contains(v.Summary, "disk on the RDS not checked") {
		t.Errorf("without the inventory: verdict %+v", v)
	}
}

func ptrTo[T any](v T) *T { return &v }

// claimsAre holds when the PV's claims name exactly nodes, read as kubectl
// rds reads them (a time or an object per node).
func claimsAre(c kubernetes.Interface, pvName string, nodes ...string) framework.Condition {
	return func(ctx context.Context) (bool, string, error) {
		pv, err := c.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		claims, err := diagnose.ParseClaims(pv.Annotations[claims.ClaimsAnnotation])
		if err != nil {
			return false, "", err
		}
		var got []string
		for n := range claims {
			got = append(got, n)
		}
		sort.Strings(got)
		return strings.Join(got, ",") == strings.Join(nodes, ","), fmt.Sprintf("claims of %v", got), nil
	}
}
