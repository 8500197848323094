package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
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

	"github.com/srvlab/rds-csi/pkg/diagnose"
	"github.com/srvlab/rds-csi/pkg/informers"
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
			Annotations: map[string]string{informers.ClaimsAnnotation: `{"node-a":"2026-11-23T08:00:00Z"}`}},
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
	// Healthy: exit 0; the missing snapshot API is reported as not checked.
	cl, _ = fakeClients(staleWorld()[:2]...)
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
	return pv.Annotations[informers.ClaimsAnnotation]
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
		{[]string{"check", "--timeout=0"}, []string{"--timeout must be positive"}},
		{[]string{"check", "--timeout=-1s"}, []string{"--timeout must be positive"}},
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
