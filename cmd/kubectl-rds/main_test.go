package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/diagnose"
	"github.com/srvlab/rds-csi/pkg/inventory"
	"github.com/srvlab/rds-csi/pkg/rds"
)

const driver = "rds.csi.srvlab.io"

// staleWorld: node-a (NotReady for 10 minutes) claims pv-1 without a
// VolumeAttachment; pod-b on node-b waits, its VolumeAttachment refused.
func staleWorld() []runtime.Object {
	since := metav1.NewTime(time.Now().Add(-10 * time.Minute))
	node := func(name string, ready corev1.ConditionStatus) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready, LastTransitionTime: since}}}}
	}
	pvName := "pv-1"
	return []runtime.Object{
		node("node-a", corev1.ConditionUnknown), node("node-b", corev1.ConditionTrue),
		&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: pvName, ResourceVersion: "7",
			Annotations: map[string]string{claims.ClaimsAnnotation: `{"node-a":"2026-11-23T08:00:00Z"}`}},
			Spec: corev1.PersistentVolumeSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: pvName}},
				ClaimRef:               &corev1.ObjectReference{Namespace: "shop", Name: "data"}}},
		&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "data"},
			Spec: corev1.PersistentVolumeClaimSpec{VolumeName: pvName}, Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "pod-b"}, Spec: corev1.PodSpec{NodeName: "node-b",
			Volumes: []corev1.Volume{{Name: "d", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}}}}},
		&storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "csi-b"},
			Spec:   storagev1.VolumeAttachmentSpec{Attacher: driver, NodeName: "node-b", Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName}},
			Status: storagev1.VolumeAttachmentStatus{AttachError: &storagev1.VolumeError{Message: "already held by node-a"}}},
	}
}

func fakeClients(objs ...runtime.Object) (*clients, *fake.Clientset) {
	kube := fake.NewClientset(objs...)
	dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{snapshotContents: "VolumeSnapshotContentList"})
	return &clients{kube: kube, dynamic: dyn}, kube
}

type listerFunc func(context.Context) ([]rds.Disk, error)

func (f listerFunc) ListDisks(ctx context.Context) ([]rds.Disk, error) { return f(ctx) }

// inventoryServer serves an inventory holding the given volume slots.
func inventoryServer(t *testing.T, slots ...string) string {
	var disks []rds.Disk
	for _, s := range slots {
		disks = append(disks, rds.Disk{Slot: s, FilePath: "/v/" + s + ".img", Size: 1 << 30, Exported: true, Port: 4420, NQN: "nqn.x:" + s})
	}
	srv := httptest.NewServer(inventory.NewHandler(listerFunc(func(context.Context) ([]rds.Disk, error) { return disks, nil }), "/v"))
	t.Cleanup(srv.Close)
	return srv.URL + inventory.Path
}

func runCmd(t *testing.T, cl *clients, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, strings.NewReader(stdin), &out, &errOut, cl)
	return code, out.String(), errOut.String()
}

func TestWhyStaleClaim(t *testing.T) {
	cl, _ := fakeClients(staleWorld()...)
	url := inventoryServer(t, "pv-1")
	for _, args := range [][]string{
		{"why", "pod", "pod-b", "-n", "shop", "--inventory-url", url},
		{"why", "-n", "shop", "pvc", "data", "--inventory-url=" + url},
		{"why", "pv", "pv-1", "--inventory-url", url},
		{"why", "pod", "shop/pod-b", "--inventory-url", url},
	} {
		code, out, errOut := runCmd(t, cl, "", args...)
		if code != exitOK {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
		for _, want := range []string{"Verdict (StaleClaim): node-a claims PV pv-1 without a VolumeAttachment", "Next: kubectl rds release pv-1 --node node-a",
			"claim", "NotReady (Unknown)", "1073741824 bytes", "allowed host any", "csi-b", "already held by node-a"} {
			if !strings.Contains(out, want) {
				t.Errorf("%v: output does not say %q:\n%s", args, want, out)
			}
		}
	}
	// JSON, and without the inventory the verdict says the disk was not checked.
	code, out, _ := runCmd(t, cl, "", "why", "pod", "pod-b", "-n", "shop", "-o", "json")
	var ex diagnose.Explanation
	if err := json.Unmarshal([]byte(out), &ex); err != nil || code != exitOK {
		t.Fatalf("exit %d, %v: %s", code, err, out)
	}
	if v := ex.Stories[0].Verdict; v.Code != diagnose.VerdictStaleClaim || !strings.Contains(v.Summary, "disk on the RDS not checked: no --inventory-url") {
		t.Errorf("verdict = %+v", v)
	}
}

func TestCheckExitStatus(t *testing.T) {
	cl, _ := fakeClients(staleWorld()...)
	code, out, errOut := runCmd(t, cl, "", "check", "-o", "json", "--inventory-url", inventoryServer(t, "pv-1", "pvc-orphan"))
	if code != exitFindings {
		t.Fatalf("exit %d, want %d: %s %s", code, exitFindings, out, errOut)
	}
	var r diagnose.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if r.Counts[diagnose.FindingClaimWithoutVA] != 1 || r.Counts[diagnose.FindingOrphanDisk] != 1 || r.Counts[diagnose.FindingMultiHeld] != 0 {
		t.Errorf("counts = %v", r.Counts)
	}
	// Healthy (the driver installed, no volume yet): exit 0; the missing
	// snapshot API is reported as not checked.
	cl, _ = fakeClients(append(staleWorld()[:2], &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: driver}})...)
	code, out, _ = runCmd(t, cl, "", "check")
	if code != exitOK || !strings.Contains(out, "OK: nothing wrong") {
		t.Errorf("exit %d:\n%s", code, out)
	}
}

func claimsOf(t *testing.T, kube *fake.Clientset) string {
	pv, err := kube.CoreV1().PersistentVolumes().Get(context.Background(), "pv-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pv.Annotations[claims.ClaimsAnnotation]
}

func TestRelease(t *testing.T) {
	t.Run("refused while a VolumeAttachment to the node exists", func(t *testing.T) {
		cl, kube := fakeClients(staleWorld()...)
		code, _, errOut := runCmd(t, cl, "y\n", "release", "pv-1", "--node", "node-b")
		if code != exitError || !strings.Contains(errOut, "has no claim") {
			t.Errorf("exit %d: %s", code, errOut)
		}
		pvName := "pv-1"
		_, _ = kube.StorageV1().VolumeAttachments().Create(context.Background(), &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "csi-a"},
			Spec: storagev1.VolumeAttachmentSpec{Attacher: driver, NodeName: "node-a", Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName}}}, metav1.CreateOptions{})
		code, _, errOut = runCmd(t, cl, "y\n", "release", "pv-1", "--node", "node-a")
		if code != exitError || !strings.Contains(errOut, "VolumeAttachment csi-a") {
			t.Errorf("exit %d: %s", code, errOut)
		}
		if claimsOf(t, kube) == "" {
			t.Error("a refused release changed the claims")
		}
	})
	t.Run("not confirmed: nothing changes", func(t *testing.T) {
		cl, kube := fakeClients(staleWorld()...)
		code, out, _ := runCmd(t, cl, "n\n", "release", "pv-1", "--node", "node-a")
		if code != exitError || !strings.Contains(out, "[y/N]") || !strings.Contains(out, "Nothing changed") || claimsOf(t, kube) == "" {
			t.Errorf("exit %d, claims %q:\n%s", code, claimsOf(t, kube), out)
		}
	})
	t.Run("confirmed: a conditional patch and a Warning event", func(t *testing.T) {
		cl, kube := fakeClients(staleWorld()...)
		var patch []byte
		kube.PrependReactor("patch", "persistentvolumes", func(a k8stesting.Action) (bool, runtime.Object, error) {
			patch = a.(k8stesting.PatchAction).GetPatch()
			return false, nil, nil
		})
		code, out, errOut := runCmd(t, cl, "", "release", "pv-1", "--node", "node-a", "--yes")
		if code != exitOK {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		if !strings.Contains(string(patch), `"resourceVersion":"7"`) || claimsOf(t, kube) != "" || !strings.Contains(out, "Released") {
			t.Errorf("patch %s, claims %q, output %s", patch, claimsOf(t, kube), out)
		}
		evs, _ := kube.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{})
		if len(evs.Items) != 1 || evs.Items[0].Reason != "ClaimReleased" || evs.Items[0].InvolvedObject.Name != "pv-1" ||
			evs.Items[0].Type != corev1.EventTypeWarning || !strings.Contains(evs.Items[0].Message, "node-a") {
			t.Errorf("events = %+v", evs.Items)
		}
	})
	t.Run("the PV changed since the check: nothing released", func(t *testing.T) {
		cl, kube := fakeClients(staleWorld()...)
		kube.PrependReactor("patch", "persistentvolumes", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "persistentvolumes"}, "pv-1", errors.New("modified"))
		})
		code, _, errOut := runCmd(t, cl, "", "release", "pv-1", "--node", "node-a", "--yes")
		if code != exitError || !strings.Contains(errOut, "changed since it was checked") {
			t.Errorf("exit %d: %s", code, errOut)
		}
		evs, _ := kube.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{})
		if len(evs.Items) != 0 {
			t.Errorf("an event for a release that did not happen: %+v", evs.Items)
		}
	})
}

func TestUsage(t *testing.T) {
	cl, _ := fakeClients()
	for _, args := range [][]string{{"why", "pod"}, {"why", "deployment", "x"}, {"release", "pv-1"}, {"bogus"}, {"check", "-o", "yaml"}} {
		if code, _, _ := runCmd(t, cl, "", args...); code != exitError {
			t.Errorf("%v: exit %d, want %d", args, code, exitError)
		}
	}
	if code, out, _ := runCmd(t, cl, ""); code != exitOK || !strings.Contains(out, "kubectl rds why") {
		t.Errorf("no arguments: exit %d, %s", code, out)
	}
}

// A command line that lacks something says what and how to find it,
// before (and whatever) the kubeconfig: release without --node names
// the flag and the command that lists the claiming nodes; an empty name
// is refused.
func TestUsageErrorsSayWhatIsMissing(t *testing.T) {
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "absent"))
	cl, _ := fakeClients(staleWorld()...)
	tests := []struct {
		args []string
		says []string
	}{
		{[]string{"release", "pv-1"}, []string{"--node is required", "kubectl rds why pv pv-1", "release pv-1 --node NODE"}},
		{[]string{"release", "pv-1", "--yes"}, []string{"--node is required"}},
		{[]string{"why", "pod", "shop/"}, []string{"the name is empty"}},
		{[]string{"why", "pvc", ""}, []string{"the name is empty"}},
		{[]string{"check", "--timeout=0"}, []string{"--timeout must be at least 1s"}},
		{[]string{"check", "--timeout=-1s"}, []string{"--timeout must be at least 1s"}},
		{[]string{"check", "--timeout=1ns"}, []string{"--timeout must be at least 1s", "not 1ns"}},
	}
	for _, tc := range tests {
		for _, fake := range []*clients{cl, nil} { // nil: the kubeconfig, absent here
			var out, errOut bytes.Buffer
			code := run(context.Background(), tc.args, strings.NewReader(""), &out, &errOut, fake)
			if code != exitError {
				t.Errorf("%q (fake clients %v): exit %d, want %d", tc.args, fake != nil, code, exitError)
			}
			for _, s := range tc.says {
				if !strings.Contains(errOut.String(), s) || strings.Contains(errOut.String(), "kubeconfig") {
					t.Errorf("%q (fake clients %v): %q does not say %q (or blames the kubeconfig)", tc.args, fake != nil, errOut.String(), s)
				}
			}
		}
	}
}

// KUBECONFIG naming a file that does not exist (or none set and no
// ~/.kube/config) is said with the files looked for, not as client-go's
// "try setting KUBERNETES_MASTER".
func TestMissingKubeconfigNamed(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "") // not in a pod: no in-cluster fallback
	dir := t.TempDir()
	missing := filepath.Join(dir, "absent")
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		env  string
		says []string
	}{
		{missing, []string{`$KUBECONFIG is "` + missing + `"`, missing + " does not exist"}},
		{missing + string(filepath.ListSeparator) + empty, []string{missing + " does not exist", empty + " names no cluster"}},
	}
	// ~/.kube/config as client-go found it at start (its HOME then).
	if _, err := os.Stat(clientcmd.RecommendedHomeFile); err != nil {
		cases = append(cases, struct {
			env  string
			says []string
		}{"", []string{clientcmd.RecommendedHomeFile + " does not exist", "$KUBECONFIG is not set"}})
	}
	for _, tc := range cases {
		t.Setenv("KUBECONFIG", tc.env)
		var out, errOut bytes.Buffer
		code := run(context.Background(), []string{"check"}, strings.NewReader(""), &out, &errOut, nil)
		for _, s := range tc.says {
			if code != exitError || !strings.Contains(errOut.String(), s) || strings.Contains(errOut.String(), "KUBERNETES_MASTER") {
				t.Errorf("KUBECONFIG=%q: exit %d, stderr %q; want exit %d saying %q", tc.env, code, errOut.String(), exitError, s)
			}
		}
	}
}

// why refuses a kind it does not follow before the kubeconfig is read:
// without a cluster at hand the user hears about the kind, not the
// kubeconfig.
func TestWhyKindCheckedBeforeKubeconfig(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "nope")
	code, stdout, stderr := runCmd(t, nil, "", "why", "deployment", "web", "--kubeconfig", kc)
	if code != exitError || !strings.Contains(stderr, `"deployment" is not pod, pvc or pv`) || strings.Contains(stderr, "kubeconfig") || stdout != "" {
		t.Errorf("why deployment: exit %d, stdout %q, stderr %q: want the kind refused before the kubeconfig", code, stdout, stderr)
	}
}

// -h after a command prints the usage on stdout with exit 0, as `kubectl
// rds -h` does (`kubectl rds why -h | less`); a mistake prints it on
// stderr with exit 2.
func TestSubcommandHelpOnStdout(t *testing.T) {
	for _, args := range [][]string{{"why", "-h"}, {"check", "--help"}, {"release", "pv-1", "-h"}} {
		code, stdout, stderr := runCmd(t, nil, "", args...)
		if code != exitOK || !strings.Contains(stdout, "usage:") || stderr != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q: want the usage on stdout", args, code, stdout, stderr)
		}
	}
	code, stdout, stderr := runCmd(t, nil, "", "why", "--bogus")
	if code != exitError || stdout != "" || !strings.Contains(stderr, "-bogus") || !strings.Contains(stderr, "usage:") {
		t.Errorf("why --bogus: exit %d, stdout %q, stderr %q: want the mistake and the usage on stderr", code, stdout, stderr)
	}
}

// Every flag value and name on the command line that no cluster could
// accept is a usage error naming it, before the kubeconfig is read: an
// --inventory-url without its scheme (it would parse as scheme
// "localhost"), a namespace, pod, PV or node name the API server would
// refuse (which would otherwise read as "not found"), a driver name no
// CSIDriver can have, a flag a command does not use (it would be
// ignored), a flag given twice (the last would silently win).
func TestBadFlagValuesRefusedBeforeKubeconfig(t *testing.T) {
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "absent"))
	tests := []struct {
		args []string
		says string
	}{
		{[]string{"check", "--inventory-url", "localhost:8080/inventory"}, "--inventory-url"},
		{[]string{"check", "--inventory-url", "ftp://localhost/inventory"}, "--inventory-url"},
		{[]string{"check", "--inventory-url", "http://"}, "--inventory-url"},
		{[]string{"check", "--inventory-url", "http://localhost:8080"}, "http://localhost:8080/inventory"},
		{[]string{"check", "--inventory-url="}, "--inventory-url"},
		{[]string{"why", "pod", "web-0", "-n", "Bad_NS"}, "Bad_NS"},
		{[]string{"why", "pod", "web-0", "--namespace="}, "namespace is empty"},
		{[]string{"why", "pod", "Bad_NS/web-0"}, "Bad_NS"},
		{[]string{"why", "pod", "shop/web-0", "-n", "other"}, "two namespaces"},
		{[]string{"why", "pvc", "Data Volume"}, `"Data Volume" cannot be the name of a pvc`},
		{[]string{"why", "pv", "pv-1", "-n", "shop"}, "-n/--namespace does not apply to why pv"},
		{[]string{"release", "pv 1", "--node", "node-a"}, `"pv 1" cannot be the name of a PV`},
		{[]string{"release", "pv-1", "--node", "Node_A"}, "--node"},
		{[]string{"check", "--driver", ""}, "--driver"},
		{[]string{"check", "--driver", "rds csi"}, "--driver"},
		{[]string{"check", "-n", "shop"}, "-n/--namespace does not apply to check"},
		{[]string{"check", "--node", "node-a"}, "--node does not apply to check"},
		{[]string{"why", "pv", "pv-1", "--yes"}, "--yes does not apply to why"},
		{[]string{"release", "pv-1", "--node", "node-a", "-o", "json"}, "-o does not apply to release"},
		{[]string{"check", "--driver", "a.example", "--driver", "b.example"}, `--driver is given 2 times ("a.example", "b.example")`},
		{[]string{"why", "pod", "web-0", "-n", "a", "--namespace", "a"}, "-n/--namespace is given 2 times"},
	}
	for _, tc := range tests {
		code, stdout, stderr := runCmd(t, nil, "", tc.args...)
		if code != exitError || !strings.Contains(stderr, tc.says) || strings.Contains(stderr, "kubeconfig") || stdout != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q: want a usage error saying %q before the kubeconfig", tc.args, code, stdout, stderr, tc.says)
		}
	}
}

// The forms kubectl users type are taken: kinds in kubectl's spellings, a
// namespace as NAMESPACE/NAME or -n (the same one twice), flags that say
// where to look given to every command alike (a script passes
// --inventory-url to release too).
func TestGoodCommandLinesAccepted(t *testing.T) {
	cl, _ := fakeClients(staleWorld()...)
	for _, args := range [][]string{
		{"why", "PersistentVolumeClaim", "shop/data", "-n", "shop"},
		{"why", "po", "pod-b", "--namespace=shop"},
		{"why", "pvs", "pv-1", "--inventory-url", "https://inventory.example:8443/inventory", "--timeout", "1m"},
	} {
		if code, out, errOut := runCmd(t, cl, "", args...); code != exitOK {
			t.Errorf("%q: exit %d: %s%s", args, code, out, errOut)
		}
	}
	code, _, errOut := runCmd(t, cl, "", "release", "pv-1", "--node", "node-a", "--inventory-url", "http://localhost:8080/inventory", "--yes")
	if code != exitOK {
		t.Errorf("release with --inventory-url: exit %d: %s", code, errOut)
	}
}

// check of a driver the cluster does not know (--driver misspelt) is not
// "OK: nothing wrong" about no PV: it is an error naming the drivers the
// cluster's volumes are of. Measured with the stale-claim world, where
// plain check finds the stale claim.
func TestCheckOfAnUnknownDriverIsNotOK(t *testing.T) {
	cl, _ := fakeClients(staleWorld()...)
	if code, _, _ := runCmd(t, cl, "", "check"); code != exitFindings {
		t.Fatalf("plain check: exit %d, want %d (the world has a stale claim)", code, exitFindings)
	}
	code, stdout, stderr := runCmd(t, cl, "", "check", "--driver", "rds.csi.srvlab.com")
	if code != exitError || !strings.Contains(stderr, "no CSIDriver rds.csi.srvlab.com") || !strings.Contains(stderr, "volumes of "+driver+" only") || strings.Contains(stdout, "OK") {
		t.Errorf("check --driver rds.csi.srvlab.com: exit %d, stdout %q, stderr %q: want an error naming the cluster's driver", code, stdout, stderr)
	}
	// No volume and no CSIDriver: the driver is not installed.
	cl, _ = fakeClients(staleWorld()[:2]...)
	if code, stdout, stderr := runCmd(t, cl, "", "check"); code != exitError || !strings.Contains(stderr, "no CSI volumes at all") {
		t.Errorf("check without the driver installed: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// Flags may come before the command as after it (`kubectl rds --context
// prod check`), not taken for an unknown command "--context"; flags with
// no command are a usage error that says so.
func TestFlagsBeforeTheCommand(t *testing.T) {
	cl, _ := fakeClients(staleWorld()...)
	if code, out, errOut := runCmd(t, cl, "", "-n", "shop", "why", "pod", "pod-b"); code != exitOK || !strings.Contains(out, "Verdict (StaleClaim)") {
		t.Errorf("-n shop why pod pod-b: exit %d: %s%s", code, out, errOut)
	}
	if code, _, _ := runCmd(t, cl, "", "--timeout", "1m", "check"); code != exitFindings {
		t.Errorf("--timeout 1m check: exit %d, want %d", code, exitFindings)
	}
	if code, stdout, stderr := runCmd(t, cl, "", "--timeout", "1m"); code != exitError || stdout != "" || !strings.Contains(stderr, "no command") {
		t.Errorf("flags alone: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}
