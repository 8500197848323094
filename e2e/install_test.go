//go:build e2e

package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/srvlab/rds-csi/e2e/framework"
)

// The installs a user runs are accepted by a real kube-apiserver, object
// for object (server-side dry-run, strict field validation): the kustomize
// tree as `kubectl apply -k` builds it, alone and with the snapshot class
// and the storage-fencing component, and the Helm chart as `helm install`
// renders it, with its defaults, with every switch on, and into an
// existing namespace. The renders come from hack/tools (the Helm SDK and
// kustomize's krusty, a module of their own).
func TestInstallsServerSideDryRun(t *testing.T) {
	t.Parallel()
	e := framework.NewEnv(t, framework.EnvOptions{})
	framework.InstallSnapshotCRDs(e.Ctx, t, e.TL, e.CP)
	render := buildRender(t, e.Root)
	chart := filepath.Join(e.Root, "charts", "rds-csi")
	overlay := kustomization(t, e.Root, "resources: [ROOT/manifests, ROOT/manifests/snapshot]\ncomponents: [ROOT/manifests/overlays/storage-fencing]\n")
	driver := []string{"Namespace", "CSIDriver", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
		"ConfigMap", "Deployment", "PodDisruptionBudget", "Service", "DaemonSet", "StorageClass"}
	cases := []struct {
		name string
		args []string
		want []string // kinds that must be accepted
	}{
		{"kustomize manifests", []string{"kustomize", filepath.Join(e.Root, "manifests")}, driver},
		{"kustomize with snapshot class and storage fencing", []string{"kustomize", overlay}, append(driver, "VolumeSnapshotClass")},
		{"helm defaults", []string{"helm", chart}, driver},
		{"helm every switch", []string{"helm",
			"--set", "storageFencing.enabled=true", "--set", "volumeSnapshotClass.create=true",
			"--set", "rds.sshSecret.create=true", "--set", "rds.sshSecret.privateKey=-----BEGIN OPENSSH PRIVATE KEY-----key-----END OPENSSH PRIVATE KEY-----",
			"--set", "rds.sshSecret.knownHosts=rds.example.invalid ssh-ed25519 AAAAkey",
			"--set", "namespace.name=storage", "--set", "controller.replicas=3", "--set", "image.digest=sha256:" + strings.Repeat("ab", 32),
			"--set", "controller.nodeSelector.node-role\\.kubernetes\\.io/control-plane=",
			chart}, append(driver, "VolumeSnapshotClass", "Secret")},
		{"helm into an existing namespace", []string{"helm", "--namespace", "rds-csi", "--set", "namespace.create=false", chart},
			driver[1:]},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			objs := decodeStream(t, c.name, runRender(t, render, c.args...))
			accepted, skipped := dryRunCreate(t, e, objs)
			e.TL.Logf("%s: accepted %v", c.name, accepted)
			if len(skipped) > 0 {
				t.Errorf("kinds the API server does not serve: %v", skipped)
			}
			for _, k := range c.want {
				if accepted[k] == 0 {
					t.Errorf("no %s accepted (accepted %v)", k, accepted)
				}
			}
		})
	}
}

// The scheduled-snapshot example of docs/volumes-and-snapshots.md, as
// written there, is accepted by a real kube-apiserver with the
// VolumeSnapshot CRDs and SnapScheduler's CRD, and fits this driver: its
// schedule selects the example's claim and names this driver's
// VolumeSnapshotClass, and the claim names one of its StorageClasses.
// SnapScheduler's CRD is not in the repository (AGPL-3.0) and its module is
// not on the module proxy: RDS_CSI_SNAPSCHEDULER_CRD names the file
// (config/crd/bases/snapscheduler.backube_snapshotschedules.yaml of a
// release); without it the SnapshotSchedule is left out, and logged.
func TestSnapshotScheduleExampleServerSideDryRun(t *testing.T) {
	t.Parallel()
	e := framework.NewEnv(t, framework.EnvOptions{})
	framework.InstallSnapshotCRDs(e.Ctx, t, e.TL, e.CP)
	crd := os.Getenv("RDS_CSI_SNAPSCHEDULER_CRD")
	if crd != "" {
		framework.InstallCRDs(e.Ctx, t, e.TL, e.CP, "SnapScheduler's CRD", crd)
	}
	doc := filepath.Join(e.Root, "docs", "volumes-and-snapshots.md")
	objs := decodeStream(t, "docs/volumes-and-snapshots.md", docYAML(t, doc, "## Scheduled snapshots"))

	byKind := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		byKind[o.GetKind()] = o
	}
	schedule, pvc := byKind["SnapshotSchedule"], byKind["PersistentVolumeClaim"]
	if schedule == nil || pvc == nil {
		t.Fatalf("the example has no SnapshotSchedule or no PersistentVolumeClaim (kinds %v)", keys(byKind))
	}
	sel, _, _ := unstructured.NestedStringMap(schedule.Object, "spec", "claimSelector", "matchLabels")
	for k, v := range sel {
		if pvc.GetLabels()[k] != v {
			t.Errorf("the schedule selects %s=%s, the claim's labels are %v: it would snapshot nothing", k, v, pvc.GetLabels())
		}
	}
	class, _, _ := unstructured.NestedString(schedule.Object, "spec", "snapshotTemplate", "snapshotClassName")
	if want := objectNames(t, filepath.Join(e.Root, "manifests", "snapshot"), "VolumeSnapshotClass"); !strings.Contains(want, "|"+class+"|") {
		t.Errorf("the schedule's snapshotClassName %q is not this driver's VolumeSnapshotClass (%s)", class, want)
	}
	sc, _, _ := unstructured.NestedString(pvc.Object, "spec", "storageClassName")
	if want := objectNames(t, filepath.Join(e.Root, "manifests", "storageclass"), "StorageClass"); !strings.Contains(want, "|"+sc+"|") {
		t.Errorf("the claim's storageClassName %q is not one of this driver's StorageClasses (%s)", sc, want)
	}

	accepted, skipped := dryRunCreate(t, e, objs)
	e.TL.Logf("accepted %v; skipped %v", accepted, skipped)
	for _, k := range []string{"Namespace", "PersistentVolumeClaim", "ResourceQuota"} {
		if accepted[k] == 0 {
			t.Errorf("no %s accepted (accepted %v)", k, accepted)
		}
	}
	switch {
	case crd != "" && accepted["SnapshotSchedule"] != 1:
		t.Errorf("with SnapScheduler's CRD installed the SnapshotSchedule was not accepted (skipped %v)", skipped)
	case crd == "" && (len(skipped) != 1 || skipped["SnapshotSchedule"] != 1):
		t.Errorf("skipped %v, want only the SnapshotSchedule (no CRD given)", skipped)
	case crd == "":
		t.Log("SnapshotSchedule not checked: set RDS_CSI_SNAPSCHEDULER_CRD to SnapScheduler's CRD file (docs/volumes-and-snapshots.md)")
	}
}

// buildRender builds hack/tools/cmd/render once for the test.
func buildRender(t *testing.T, root string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "render")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/render")
	cmd.Dir = filepath.Join(root, "hack", "tools")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building hack/tools/cmd/render: %v\n%s", err, out)
	}
	return bin
}

func runRender(t *testing.T, bin string, args ...string) []byte {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("render %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return stdout.Bytes()
}

// kustomization writes a kustomization (ROOT in body: the repository root,
// as a relative path, since kustomize refuses absolute ones) into a
// temporary directory and returns the directory.
func kustomization(t *testing.T, root, body string) string {
	t.Helper()
	dir := t.TempDir()
	rel, err := filepath.Rel(dir, root)
	if err != nil {
		t.Fatal(err)
	}
	body = "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n" + strings.ReplaceAll(body, "ROOT", rel)
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// decodeStream decodes a YAML stream of at least one object, annotating
// each with source.
func decodeStream(t *testing.T, source string, stream []byte) []*unstructured.Unstructured {
	t.Helper()
	objs, err := decodeDocs(source, stream)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) == 0 {
		t.Fatalf("%s: no objects", source)
	}
	return objs
}

// docYAML returns the ```yaml blocks of the section of a Markdown file
// that starts at heading, joined as one stream.
func docYAML(t *testing.T, file, heading string) []byte {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	in, inBlock := false, false
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case line == heading:
			in = true
		case in && !inBlock && strings.HasPrefix(line, "## "):
			in = false
		case in && !inBlock && strings.TrimSpace(line) == "```yaml":
			inBlock = true
			out.WriteString("---\n")
		case inBlock && strings.TrimSpace(line) == "```":
			inBlock = false
		case inBlock:
			out.WriteString(line + "\n")
		}
	}
	if out.Len() == 0 {
		t.Fatalf("%s: no yaml block under %q", file, heading)
	}
	return out.Bytes()
}

// objectNames returns "|name1|name2|" of the objects of kind in dir.
func objectNames(t *testing.T, dir, kind string) string {
	t.Helper()
	names := "|"
	for _, o := range readManifests(t, dir) {
		if o.GetKind() == kind {
			names += o.GetName() + "|"
		}
	}
	return names
}

func keys(m map[string]*unstructured.Unstructured) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
