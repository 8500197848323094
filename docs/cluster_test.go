//go:build e2e

package docs

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/srvlab/rds-csi/e2e/framework"
)

// The names the docs use, as annotation and event reason, written out here
// rather than imported so that this test reads them as a user does.
const (
	claimsAnnotation = "rds.csi.srvlab.io/claims"
	malformedReason  = "MalformedAnnotation"
)

// expectation is what a cluster or install block must print, found by a
// command it runs: the exit status alone would pass a command that did
// nothing.
type expectation struct {
	doc, command string
	want         []string
}

// expectations of the blocks; every one must match a block (a renamed
// command fails the test rather than dropping the check).
var expectations = []expectation{
	{"README.md", "helm install rds-csi charts/rds-csi", []string{"STATUS: deployed", "secret/rds-csi-ssh created"}},
	{"docs/deploy.md", "kubectl apply -k manifests/overlays/example", []string{
		"namespace/rds-csi created", "csidriver.storage.k8s.io/rds.csi.srvlab.io created",
		"deployment.apps/rds-csi-controller created", "daemonset.apps/rds-csi-node created", "secret/rds-csi-ssh created"}},
	{"docs/deploy.md", "helm install rds-csi charts/rds-csi", []string{"STATUS: deployed", "secret/rds-csi-ssh created"}},
	{"docs/deploy.md", "kubectl apply -k manifests/overlays/two-rds", []string{"configmap/rds-csi-config created",
		"storageclass.storage.k8s.io/rds-b-nvme-ext4 created", "storageclass.storage.k8s.io/rds-a-or-b-nvme-ext4 created", "rds-a-or-b-nvme-ext4"}},
	{"docs/attachments.md", "kubectl get pv", []string{`"worker-1"`}},
	{"docs/attachments.md", "kubectl get csinode worker-1", []string{"worker-1"}},
	{"docs/kubectl-rds.md", "install -D bin/kubectl-rds", []string{"kubectl rds why"}},
	{"docs/kubectl-rds.md", "kubectl rds why pod web-0", []string{"Verdict (Attached)", "web-0"}},
	{"docs/operations.md", "kubectl rds why pv", []string{"not json", "Verdict (ClaimsUnreadable)"}},
	{"docs/operations.md", "kubectl annotate pv", []string{"annotated"}},
}

// TestDocumentedClusterCommands runs every shell block marked install,
// each against a new control plane of its own, and every block marked
// cluster against one control plane holding what they name: the driver
// and the RDS simulator, nodes worker-1 and worker-2, pod web-0 in
// namespace shop with its volume attached to worker-1, and a volume whose
// claims annotation someone mangled, detached from worker-2 but refused
// (operations.md's procedure). Commands run as written, in a copy of the
// checkout, with kubectl (the control plane's own build) and helm (the
// Helm SDK's command, hack/tools) on PATH and KUBECONFIG the admin's.
func TestDocumentedClusterCommands(t *testing.T) {
	root := repoRoot(t)
	blocks := allBlocks(t, root)
	var installs, clusters []docBlock
	for _, b := range blocks {
		switch k, _ := b.kind(); k {
		case markInstall:
			installs = append(installs, b)
		case markCluster:
			clusters = append(clusters, b)
		}
	}
	if len(installs) == 0 || len(clusters) == 0 {
		t.Fatalf("no block marked install (%d) or cluster (%d)", len(installs), len(clusters))
	}
	framework.EnsureBinaries(t)
	if !framework.HaveBinary(root, "kubectl") {
		t.Fatalf("no kubectl in %s: run hack/build-controlplane.sh (it builds kubectl unless BUILD_KUBECTL=0)", framework.BinDir(root))
	}
	bin := buildBinaries(t, root)
	tools := toolsDir(t, root, bin)
	work := checkoutCopy(t, root, bin)

	outputs := &blockOutputs{out: map[string]string{}}
	// After both groups, which run side by side.
	t.Cleanup(func() {
		checkExpectations(t, append(installs, clusters...), outputs)
		t.Logf("%d blocks run here: %d installs, each on a new control plane, and %d on the control plane holding the driver; %s",
			len(installs)+len(clusters), len(installs), len(clusters), census(blocks))
	})
	t.Run("install", func(t *testing.T) {
		t.Parallel()
		for _, b := range installs {
			t.Run(b.String(), func(t *testing.T) {
				t.Parallel()
				e := framework.NewEnv(t, framework.EnvOptions{QuietObjects: true})
				outputs.set(b, runClusterBlock(t, work, tools, e.CP.Kubeconfig, b, nil))
			})
		}
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		for _, b := range clusters {
			ok := t.Run(b.String(), func(t *testing.T) {
				outputs.set(b, runClusterBlock(t, work, tools, w.env.CP.Kubeconfig, b, w.placeholders[b.doc]))
			})
			if !ok {
				return // the later blocks stand on what this one did
			}
		}
		w.checkAfter(t)
	})
}

// checkExpectations checks that each expectation matches a block and that
// the blocks that ran printed what it wants.
func checkExpectations(t *testing.T, blocks []docBlock, outputs *blockOutputs) {
	t.Helper()
	for _, x := range expectations {
		found := false
		for _, b := range blocks {
			if b.doc != x.doc || !strings.Contains(b.text, x.command) {
				continue
			}
			found = true
			out, ran := outputs.get(b)
			if !ran {
				continue // it failed, and said so
			}
			for _, w := range x.want {
				if !strings.Contains(out, w) {
					t.Errorf("%s (%s): the output does not say %q:\n%s", b, x.command, w, out)
				}
			}
		}
		if !found {
			t.Errorf("no install or cluster block of %s runs %q: update the expectations with the docs", x.doc, x.command)
		}
	}
}

type blockOutputs struct {
	mu  sync.Mutex
	out map[string]string
}

func (o *blockOutputs) set(b docBlock, out string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.out[b.String()] = out
}

func (o *blockOutputs) get(b docBlock) (string, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	out, ok := o.out[b.String()]
	return out, ok
}

// runClusterBlock runs one block with bash -euo pipefail in work, against
// the API server of kubeconfig, after replacing each placeholder, and
// returns its output; a failure fails t.
func runClusterBlock(t *testing.T, work, tools, kubeconfig string, b docBlock, placeholders map[*regexp.Regexp]string) string {
	t.Helper()
	text := b.text
	for p, v := range placeholders {
		if !p.MatchString(text) {
			continue
		}
		text = p.ReplaceAllLiteralString(text, v)
	}
	if strings.Contains(text, "<") && regexp.MustCompile(`<[a-z-]+>`).MatchString(text) {
		t.Fatalf("%s: a placeholder the test does not fill in:\n%s", b, text)
	}
	script := fmt.Sprintf("# %s\n%s", b, text)
	home := filepath.Join(work, "home")
	env := []string{
		"HOME=" + home,
		// ~/.local/bin as a login shell's profile puts it there: where
		// kubectl-rds.md installs the plugin.
		"PATH=" + strings.Join([]string{filepath.Join(home, ".local", "bin"), tools, os.Getenv("PATH")}, string(os.PathListSeparator)),
		"KUBECONFIG=" + kubeconfig,
	}
	// Go's caches stay the user's: a HOME of its own would otherwise
	// move them there, empty, and make build would start cold.
	env = append(env, goCaches(t)...)
	out, err, hung := runScriptEnv(t, work, script, 5*time.Minute, env)
	switch {
	case hung:
		t.Fatalf("%s hung (killed after 5 minutes):\n%s\noutput:\n%s", b, script, out)
	case err != nil:
		t.Fatalf("%s failed: %v\nscript:\n%s\noutput:\n%s", b, err, script, out)
	}
	t.Logf("%s\noutput:\n%s", script, out)
	return out
}

var goEnv struct {
	once sync.Once
	vars []string
	err  error
}

// goCaches returns GOCACHE, GOMODCACHE and GOPATH as go env gives them to
// the test.
func goCaches(t *testing.T) []string {
	t.Helper()
	goEnv.once.Do(func() {
		names := []string{"GOCACHE", "GOMODCACHE", "GOPATH"}
		out, err := exec.Command("go", append([]string{"env"}, names...)...).Output()
		if err != nil {
			goEnv.err = fmt.Errorf("go env: %w", err)
			return
		}
		values := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(values) != len(names) {
			goEnv.err = fmt.Errorf("go env %v printed %q", names, out)
			return
		}
		for i, n := range names {
			goEnv.vars = append(goEnv.vars, n+"="+values[i])
		}
	})
	if goEnv.err != nil {
		t.Fatal(goEnv.err)
	}
	return goEnv.vars
}

// toolsDir is a directory for PATH with kubectl (the control plane's),
// helm (built from hack/tools at the Helm SDK's pinned version) and
// kubectl-rds (this checkout's, as kubectl-rds.md installs it).
func toolsDir(t *testing.T, root, bin string) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "helm"), "helm.sh/helm/v3/cmd/helm")
	cmd.Dir = filepath.Join(root, "hack", "tools")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building helm (hack/tools): %v\n%s", err, out)
	}
	for name, target := range map[string]string{
		"kubectl":     filepath.Join(framework.BinDir(root), "kubectl"),
		"kubectl-rds": filepath.Join(bin, "kubectl-rds"),
	} {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// checkoutCopy copies the checkout's files (tracked, and new ones git
// does not ignore) into a scratch directory, with bin/ the binaries built
// from it, a HOME of its own (home/), and the files docs/deploy.md has a
// user put next to the example overlay (the driver's key pair, the RDS's
// pinned host key), made as it says.
func checkoutCopy(t *testing.T, root, bin string) string {
	t.Helper()
	work := t.TempDir()
	out, err := exec.Command("git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	for _, rel := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		src := filepath.Join(root, rel)
		st, err := os.Lstat(src)
		if os.IsNotExist(err) {
			continue // deleted in the working tree
		}
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(work, rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if st.Mode()&os.ModeSymlink != 0 {
			target, err := os.Readlink(src)
			if err == nil {
				err = os.Symlink(target, dst)
			}
			if err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := copyFile(src, dst, st.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(bin, filepath.Join(work, "bin")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(work, "home"), 0o700); err != nil {
		t.Fatal(err)
	}
	overlay := filepath.Join(work, "manifests", "overlays", "example")
	hostKey := filepath.Join(t.TempDir(), "rds_host_key")
	for _, key := range []string{filepath.Join(overlay, "id_ed25519"), hostKey} {
		if out, err := exec.Command(filepath.Join(bin, "rdsctl"), "gen-key", key).CombinedOutput(); err != nil {
			t.Fatalf("rdsctl gen-key %s: %v\n%s", key, err, out)
		}
	}
	pub, err := os.ReadFile(hostKey + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(pub))
	if len(fields) < 2 {
		t.Fatalf("rdsctl gen-key wrote a public key without a type and a key: %q", pub)
	}
	// What ssh-keyscan prints for the documented rds-address.
	line := "192.0.2.10 " + fields[0] + " " + fields[1] + "\n"
	if err := os.WriteFile(filepath.Join(overlay, "known_hosts"), []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	return work
}

func copyFile(src, dst string, perm os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// world is the control plane the cluster blocks run against.
type world struct {
	env          *framework.Env
	dataPV       string // shop/data, attached to worker-1 for pod web-0
	logsPV       string // shop/logs, its claims annotation mangled, its detach from worker-2 refused
	placeholders map[string]map[*regexp.Regexp]string
}

// newWorld starts the driver (with its inventory on a free port) against
// the simulator on a new control plane and makes what the cluster blocks
// name.
func newWorld(t *testing.T) *world {
	t.Helper()
	e := framework.NewEnv(t, framework.EnvOptions{})
	ctx, c, tl := e.Ctx, e.Client, e.TL
	sim := e.StartSim(framework.SimOptions{})
	e.NewNode("worker-1")
	e.NewNode("worker-2")
	port, err := framework.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	e.StartController(sim, framework.ControllerOptions{DriverArgs: []string{"--http-endpoint=127.0.0.1:" + strconv.Itoa(port)}})

	done := tl.Step("namespace shop: claims data (pod web-0 on worker-1) and logs (pod logger-0 on worker-2)")
	const ns = "shop"
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.StorageV1().StorageClasses().Create(ctx, framework.StorageClass("rds", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w := &world{env: e}
	for _, v := range []struct {
		claim, pod, node string
		pv               *string
	}{{"data", "web-0", "worker-1", &w.dataPV}, {"logs", "logger-0", "worker-2", &w.logsPV}} {
		if _, err := c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, framework.PVC(ns, v.claim, "rds", "1Gi", corev1.ReadWriteOnce, false), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "PVC "+v.claim+" bound", framework.PVCBound(c, ns, v.claim, v.pv)); err != nil {
			t.Fatal(err)
		}
		if _, err := c.CoreV1().Pods(ns).Create(ctx, framework.PodOnNode(ns, v.pod, v.node, v.claim), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, v.claim+" attached to "+v.node, framework.VolumeAttached(c, *v.pv, v.node, nil)); err != nil {
			t.Fatal(err)
		}
		if _, err := framework.WaitFor(ctx, tl, time.Minute, v.claim+"'s claims name "+v.node, framework.ClaimsAre(c, *v.pv, v.node)); err != nil {
			t.Fatal(err)
		}
	}
	done()

	// operations.md, "Malformed objects": someone mangled the annotation;
	// the workload was stopped, its pod is gone from the node, and the
	// detach is refused while the annotation cannot be read.
	done = tl.Step("logs: claims annotation mangled, logger-0 gone, the detach from worker-2 refused")
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{claimsAnnotation: `{"worker-2": not json`}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().PersistentVolumes().Patch(ctx, w.logsPV, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "MalformedAnnotation event on logs' PV",
		framework.EventOn(c, metav1.NamespaceDefault, "PersistentVolume", w.logsPV, malformedReason, nil, claimsAnnotation)); err != nil {
		t.Fatal(err)
	}
	if err := framework.ForceDeletePod(ctx, c, ns, "logger-0"); err != nil {
		t.Fatal(err)
	}
	if err := framework.ReportNodeStatus(ctx, c, "worker-2"); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "logs' detach from worker-2 refused, naming the annotation",
		func(ctx context.Context) (bool, string, error) {
			va, err := framework.AttachmentFor(ctx, c, w.logsPV, "worker-2")
			if err != nil || va == nil {
				return false, fmt.Sprintf("no VolumeAttachment (%v)", err), nil
			}
			if va.DeletionTimestamp == nil || va.Status.DetachError == nil {
				return false, fmt.Sprintf("deleting %v, detach error %v", va.DeletionTimestamp != nil, va.Status.DetachError), nil
			}
			return strings.Contains(va.Status.DetachError.Message, claimsAnnotation), va.Status.DetachError.Message, nil
		}); err != nil {
		t.Fatal(err)
	}
	done()

	w.placeholders = map[string]map[*regexp.Regexp]string{
		"docs/attachments.md": {regexp.MustCompile(`<pv>`): w.dataPV},
		"docs/operations.md":  {regexp.MustCompile(`\bPV\b`): w.logsPV},
		// The documented port-forward's local port: the driver's
		// inventory, which the test reaches directly.
		"docs/kubectl-rds.md": {regexp.MustCompile(`localhost:8080\b`): "localhost:" + strconv.Itoa(port)},
	}
	return w
}

// checkAfter checks what operations.md says follows its commands: with the
// annotation removed, the refused detach goes through.
func (w *world) checkAfter(t *testing.T) {
	t.Helper()
	ctx, c, tl := w.env.Ctx, w.env.Client, w.env.TL
	pv, err := c.CoreV1().PersistentVolumes().Get(ctx, w.logsPV, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := pv.Annotations[claimsAnnotation]; ok {
		t.Errorf("after operations.md's kubectl annotate, logs' PV still has %s=%q", claimsAnnotation, v)
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "logs detached from worker-2 (operations.md: the detach then goes through)",
		framework.NoVolumeAttachment(c, w.logsPV, "worker-2")); err != nil {
		t.Error(err)
	}
}
