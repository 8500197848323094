//go:build kubelet

// Package kubelet is the kubelet tier: the driver as users run it, on
// real kubelets (framework.RealNode: kubelet and containerd built from
// their Go modules, runc and the CNI plugins from Debian), installed from
// the chart's render with the images of `make image` and
// hack/build-kubelet-tier.sh, against the RDS simulator with the lab's
// loop-device connector (node.labLoopDataDir). Build tag kubelet; `make
// e2e-kubelet` runs it (root only).
package kubelet

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/srvlab/rds-csi/e2e/framework"
)

// Namespace is where the chart installs the driver (its default).
const Namespace = "rds-csi"

// Lab is a control plane with real nodes, the RDS simulator and the
// driver installed from the chart.
type Lab struct {
	*framework.KubeletCluster
	Sim     *framework.Sim
	Nodes   []*framework.RealNode
	Kubectl string
	// DriverImage is the reference `make image` tagged its archive with:
	// this checkout's version (hack/version.sh), which is the chart's
	// appVersion only at a release's commit.
	DriverImage string
}

// LabOptions configure NewLab.
type LabOptions struct {
	Nodes int // default 2
	// Values are the chart's values besides what the lab needs (--set
	// arguments, e.g. "storageFencing.enabled=true").
	Values []string
	// NodeOptions tune each node (Index is set by NewLab).
	NodeOptions framework.RealNodeOptions
	// NoInstall leaves the driver out (a test installs it its own way).
	NoInstall     bool
	ControlPlane  framework.ControlPlaneOptions
	ReadyTimeout  time.Duration
	ExpectNoReady bool
}

var (
	imageOnce sync.Once
	imageErr  error
)

// driverImage is `make image`'s archive, built once per test binary (the
// build finds its cache warm after the first time: ~25 s).
func driverImage(t *testing.T, root string) string {
	t.Helper()
	out := filepath.Join(root, "bin", "rds-csi-driver-image.tar")
	imageOnce.Do(func() {
		if os.Getenv("RDS_CSI_E2E_BUILD") == "0" {
			return
		}
		cmd := exec.Command("make", "--no-print-directory", "image")
		cmd.Dir = root
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			imageErr = fmt.Errorf("make image: %w", err)
		}
	})
	if imageErr != nil {
		t.Fatal(imageErr)
	}
	return out
}

// imageRef is the reference an OCI archive's index names its image by
// (io.containerd.image.name, what `ctr images import` tags it with).
func imageRef(t *testing.T, archive string) string {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			t.Fatalf("%s: no index.json", archive)
		}
		if err != nil {
			t.Fatalf("%s: %v", archive, err)
		}
		if strings.TrimPrefix(h.Name, "./") != "index.json" {
			continue
		}
		var index struct {
			Manifests []struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"manifests"`
		}
		if err := json.NewDecoder(tr).Decode(&index); err != nil {
			t.Fatalf("%s: index.json: %v", archive, err)
		}
		for _, m := range index.Manifests {
			if ref := m.Annotations["io.containerd.image.name"]; ref != "" {
				return ref
			}
		}
		t.Fatalf("%s: index.json names no image (io.containerd.image.name)", archive)
	}
}

// splitRef splits an image reference into repository and tag.
func splitRef(ref string) (repo, tag string) {
	i := strings.LastIndex(ref, ":")
	if i < 0 || strings.Contains(ref[i:], "/") {
		return ref, ""
	}
	return ref[:i], ref[i+1:]
}

// The tier's tests run side by side: each builds a Lab of its own and
// mostly waits (grace periods, silent Leases, pods starting), so running
// them one after the other left the machine idle. Labs share nothing but
// the kernel and what is built once per test binary (driverImage,
// framework.EnsureKubeletTier): each has its own control plane (ports
// from framework.FreePort), egress proxy socket (framework.SocketDir),
// node state directory and cgroup names (a random prefix), artifact
// directory, simulator (its own pool directory, so the loop devices a
// lab's nodes attach are over files of its own, the only ones
// detachLoops detaches), and nodes in network and mount namespaces of
// their own (so the same node names, addresses, ports 10250 and
// 10.0.0.1:443, /run, /var/lib/kubelet and /proc/sys binds in every lab).

// labTurn is how a test waits for its turn to build a Lab: at most
// labsAtOnce() tests of the tier run at once, the long ones first.
type labTurn int

const (
	labShort labTurn = iota // a few minutes at most
	// labLong is a test that alone runs several times longer than the
	// others (the storage suite): started first, it runs while the
	// others take their turns beside it, instead of after them.
	labLong
)

// labLine is the line of the tier's tests waiting for their turn.
type labLine struct {
	mu         sync.Mutex
	cond       *sync.Cond
	waiting    []*labTicket // in the order the tests registered
	registered int
	running    int
}

type labTicket struct {
	turn    labTurn
	arrived bool // past go test's own -parallel limit, waiting here
}

var labQueue labLine

// goTestParallel is go test's -parallel (default GOMAXPROCS).
func goTestParallel() int {
	if f := flag.Lookup("test.parallel"); f != nil {
		if n, err := strconv.Atoi(f.Value.String()); err == nil && n > 0 {
			return n
		}
	}
	return 1
}

// labsAtOnce is how many of the tier's tests run at once:
// $RDS_CSI_KUBELET_LABS (make e2e-kubelet sets it from
// E2E_KUBELET_PARALLEL), else go test's -parallel, which bounds it too.
func labsAtOnce() int {
	if n, err := strconv.Atoi(os.Getenv("RDS_CSI_KUBELET_LABS")); err == nil && n > 0 {
		return min(n, goTestParallel())
	}
	return goTestParallel()
}

// parallelLab is a tier test's first call: it puts the test in line, lets
// it run in parallel with the others (t.Parallel) and waits for its turn,
// which ends after the test's cleanups (the Lab's teardown included).
//
// The line is complete before any test waits in it: go test runs every
// top-level test up to its t.Parallel one after the other, and releases
// them together afterwards. Turns go to the long tests first, then in
// the order the tests registered, so a run is scheduled the same way
// every time. That holds when go test's -parallel is at least the number
// of tests (make e2e-kubelet passes a higher one): below it, go test
// itself admits the released tests in no set order and holds the rest,
// so turns go to those it admitted, long ones first.
func parallelLab(t *testing.T, turn labTurn) {
	t.Helper()
	q := &labQueue
	q.mu.Lock()
	if q.cond == nil {
		q.cond = sync.NewCond(&q.mu)
	}
	tk := &labTicket{turn: turn}
	q.waiting = append(q.waiting, tk)
	q.registered++
	q.mu.Unlock()

	t.Parallel()

	t0 := time.Now()
	q.mu.Lock()
	tk.arrived = true
	for q.running >= labsAtOnce() || q.next(goTestParallel() >= q.registered) != tk {
		q.cond.Wait()
	}
	q.running++
	for i, w := range q.waiting {
		if w == tk {
			q.waiting = append(q.waiting[:i], q.waiting[i+1:]...)
			break
		}
	}
	q.cond.Broadcast()
	q.mu.Unlock()
	if w := time.Since(t0); w > time.Second {
		t.Logf("waited %s for a turn (%d labs at once)", w.Round(time.Second), labsAtOnce())
	}
	t.Cleanup(func() {
		q.mu.Lock()
		q.running--
		q.cond.Broadcast()
		q.mu.Unlock()
	})
}

// next is the waiting test whose turn comes first (q.mu held): of all
// waiting when every registered test gets past go test's -parallel (all),
// else of those that got past it (a test go test holds cannot take a
// turn; waiting for it would wait for ever).
func (q *labLine) next(all bool) *labTicket {
	var best *labTicket
	for _, w := range q.waiting {
		if (all || w.arrived) && (best == nil || w.turn > best.turn) {
			best = w
		}
	}
	return best
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("the kubelet tier needs root (namespaces, cgroups, mounts, loop devices)")
		}
		t.Skip("the kubelet tier needs root (namespaces, cgroups, mounts, loop devices)")
	}
}

// NewLab starts the control plane, kube-scheduler, the simulator and the
// nodes, and installs the driver from the chart's render.
func NewLab(t *testing.T, opts LabOptions) *Lab {
	t.Helper()
	requireRoot(t)
	root := framework.EnsureBinaries(t)
	image := driverImage(t, root)
	tier := framework.EnsureKubeletTier(t, root, image)
	c := framework.NewKubeletEnv(t, tier, framework.EnvOptions{ControlPlane: opts.ControlPlane})
	l := &Lab{KubeletCluster: c, Kubectl: filepath.Join(framework.BinDir(root), "kubectl"), DriverImage: imageRef(t, image)}
	l.Sim = c.Env.StartSim(framework.SimOptions{})
	c.Sim = l.Sim
	c.AfterNodes(func() { detachLoops(t, l.Sim.PoolDir) })
	if opts.Nodes == 0 {
		opts.Nodes = 2
	}
	for i := 1; i <= opts.Nodes; i++ {
		no := opts.NodeOptions
		no.Index = i
		l.Nodes = append(l.Nodes, c.AddNode(t, fmt.Sprintf("node-%c", 'a'+i-1), no))
	}
	if !opts.NoInstall {
		l.InstallChart(t, opts.Values...)
		l.WaitDriverReady(t)
	}
	return l
}

// ChartValues writes the values the lab installs with into a values
// file: the simulator as the RDS (its address as the nodes reach it, its
// host key pinned, the driver's key in a Secret the chart makes), the loop
// connector over its files, the driver's image as `make image` tagged it
// (image.tag: the checkout's version, the chart's appVersion only at a
// release's commit) and the stand-in node sidecars' images
// (hack/build-kubelet-tier.sh).
func (l *Lab) ChartValues(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	kh := filepath.Join(dir, "known_hosts")
	if err := l.Sim.WriteKnownHosts(kh, framework.LabRDSAddress+":"+strconv.Itoa(l.Sim.Port)); err != nil {
		t.Fatal(err)
	}
	khText, err := os.ReadFile(kh)
	if err != nil {
		t.Fatal(err)
	}
	key, err := os.ReadFile(l.Sim.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	repo, tag := splitRef(l.DriverImage)
	values := map[string]any{
		"image": map[string]any{"repository": repo, "tag": tag},
		"rds": map[string]any{
			"address": framework.LabRDSAddress, "port": l.Sim.Port, "user": "admin", "name": framework.RDSName,
			"sshSecret": map[string]any{"create": true, "privateKey": string(key), "knownHosts": string(khText)},
		},
		"node": map[string]any{"labLoopDataDir": l.Sim.PoolDir},
		"sidecars": map[string]any{
			"nodeDriverRegistrar": map[string]any{"image": l.Tier.ImageRefs["lab-registrar"]},
			"livenessProbe":       map[string]any{"image": l.Tier.ImageRefs["lab-livenessprobe"]},
		},
	}
	b, err := yaml.Marshal(values)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(dir, "lab-values.yaml")
	if err := os.WriteFile(f, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// Render renders the chart with the lab's values and extra --set ones.
func (l *Lab) Render(t *testing.T, set ...string) []byte {
	t.Helper()
	args := []string{"helm", "-f", l.ChartValues(t)}
	for _, v := range set {
		args = append(args, "--set", v)
	}
	args = append(args, filepath.Join(l.Env.Root, "charts", "rds-csi"))
	return runRender(t, l.Env.Root, args...)
}

// InstallChart applies the chart's render in Helm's install order
// (namespaces first; the render lists objects by kind), as `helm install`
// creates them.
func (l *Lab) InstallChart(t *testing.T, extra ...string) {
	t.Helper()
	done := l.Env.TL.Step("install the driver from the chart's render")
	l.Apply(t, namespacesFirst(l.Render(t, extra...)))
	done()
}

// namespacesFirst reorders a YAML stream so that Namespaces come first.
func namespacesFirst(stream []byte) []byte {
	var docs []string
	var cur strings.Builder
	for _, line := range strings.Split(string(stream), "\n") {
		if strings.TrimSpace(line) == "---" {
			docs = append(docs, cur.String())
			cur.Reset()
			continue
		}
		cur.WriteString(line + "\n")
	}
	docs = append(docs, cur.String())
	var first, rest []string
	for _, d := range docs {
		if strings.Contains("\n"+d, "\nkind: Namespace\n") {
			first = append(first, d)
		} else if strings.TrimSpace(d) != "" {
			rest = append(rest, d)
		}
	}
	return []byte("---\n" + strings.Join(append(first, rest...), "---\n"))
}

// Apply runs kubectl apply --server-side on a YAML stream.
func (l *Lab) Apply(t *testing.T, yaml []byte) {
	t.Helper()
	out, err := l.KubectlIn(yaml, "apply", "--server-side", "--force-conflicts", "-f", "-")
	if err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
	l.Env.TL.Logf("kubectl apply:\n%s", strings.TrimSpace(string(out)))
}

// KubectlIn runs kubectl as the admin with stdin.
func (l *Lab) KubectlIn(stdin []byte, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(l.Env.Ctx, l.Kubectl, append([]string{"--kubeconfig", l.Env.CP.Kubeconfig}, args...)...)
	cmd.Stdin = bytes.NewReader(stdin)
	return cmd.CombinedOutput()
}

// Kubectl runs kubectl as the admin.
func (l *Lab) KubectlRun(args ...string) ([]byte, error) { return l.KubectlIn(nil, args...) }

// WaitDriverReady waits until the node plugin runs and is registered on
// every node and the controller's replicas are available.
func (l *Lab) WaitDriverReady(t *testing.T) {
	t.Helper()
	e := l.Env
	if _, err := framework.WaitFor(e.Ctx, e.TL, 5*time.Minute, "node plugin ready and registered on every node; controller available", func(ctx context.Context) (bool, string, error) {
		ds, err := e.Client.AppsV1().DaemonSets(Namespace).Get(ctx, "rds-csi-node", metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		if ds.Status.NumberReady != int32(len(l.Nodes)) {
			return false, fmt.Sprintf("DaemonSet %d/%d ready; %s", ds.Status.NumberReady, len(l.Nodes), l.podProblems(ctx)), nil
		}
		for _, n := range l.Nodes {
			cn, err := e.Client.StorageV1().CSINodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return false, "CSINode " + n.Name + ": " + err.Error(), nil
			}
			found := false
			for _, d := range cn.Spec.Drivers {
				found = found || d.Name == framework.DriverName
			}
			if !found {
				return false, "CSINode " + n.Name + " lists no " + framework.DriverName, nil
			}
		}
		d, err := e.Client.AppsV1().Deployments(Namespace).Get(ctx, "rds-csi-controller", metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		if d.Status.AvailableReplicas < 1 || d.Status.ReadyReplicas != *d.Spec.Replicas {
			return false, fmt.Sprintf("controller %d/%d ready; %s", d.Status.ReadyReplicas, *d.Spec.Replicas, l.podProblems(ctx)), nil
		}
		return true, "", nil
	}); err != nil {
		t.Fatal(err)
	}
}

// podProblems describes the driver's pods that are not ready, for wait
// messages: their phase, waiting reasons and last events.
func (l *Lab) podProblems(ctx context.Context) string {
	pods, err := l.Env.Client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, p := range pods.Items {
		var why []string
		for _, cs := range p.Status.ContainerStatuses {
			if cs.Ready {
				continue
			}
			switch {
			case cs.State.Waiting != nil:
				why = append(why, cs.Name+": "+cs.State.Waiting.Reason+" "+cs.State.Waiting.Message)
			case cs.State.Terminated != nil:
				why = append(why, cs.Name+": terminated "+cs.State.Terminated.Reason)
			default:
				why = append(why, cs.Name+": not ready")
			}
		}
		if len(why) > 0 || p.Status.Phase != corev1.PodRunning {
			out = append(out, fmt.Sprintf("%s on %s (%s): %s", p.Name, p.Spec.NodeName, p.Status.Phase, strings.Join(why, "; ")))
		}
	}
	return strings.Join(out, " | ")
}

// runRender runs hack/tools/cmd/render (the Helm SDK).
func runRender(t *testing.T, root string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("go", append([]string{"run", "./cmd/render"}, args...)...)
	cmd.Dir = filepath.Join(root, "hack", "tools")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("render %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return stdout.Bytes()
}

// detachLoops detaches the loop devices over files under dir that the
// nodes left (a node that lost power never unstages). They are matched by
// device and inode: losetup prints a backing file's path as the reader's
// mount namespace sees it, and the nodes attached them in theirs.
func detachLoops(t *testing.T, dir string) {
	files := map[string]bool{}
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if st, ok := statKey(p); ok {
			files[st] = true
		}
		return nil
	})
	out, err := exec.Command("losetup", "--list", "--json", "--output", "NAME,BACK-INO,BACK-MAJ:MIN").Output()
	if err != nil {
		return
	}
	var list struct {
		Devices []struct {
			Name   string `json:"name"`
			Ino    uint64 `json:"back-ino"`
			MajMin string `json:"back-maj:min"`
		} `json:"loopdevices"`
	}
	if err := json.Unmarshal(out, &list); err != nil {
		t.Logf("losetup --list: %v", err)
		return
	}
	// The kubelet holds each raw block volume's device with a loop device
	// of its own over the device node (its block-volume lock); a node that
	// lost power leaves those too. They go first.
	var pool []string
	for _, d := range list.Devices {
		if files[strings.TrimSpace(d.MajMin)+"/"+strconv.FormatUint(d.Ino, 10)] {
			pool = append(pool, d.Name)
		}
	}
	nodes := map[string]bool{}
	for _, name := range pool {
		if k, ok := statKey(name); ok {
			nodes[k] = true
		}
	}
	var locks []string
	for _, d := range list.Devices {
		if nodes[strings.TrimSpace(d.MajMin)+"/"+strconv.FormatUint(d.Ino, 10)] {
			locks = append(locks, d.Name)
		}
	}
	for _, name := range append(locks, pool...) {
		if out, err := exec.Command("losetup", "--detach", name).CombinedOutput(); err != nil {
			t.Logf("losetup --detach %s: %v %s", name, err, out)
		}
	}
}

// statKey is "major:minor/inode" of a file, as losetup prints its backing file.
func statKey(p string) (string, bool) {
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		return "", false
	}
	return fmt.Sprintf("%d:%d/%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino), true
}

// podRunning waits until a pod runs with every container ready; it yields
// the pod.
func (l *Lab) WaitPodReady(t *testing.T, ns, name string, timeout time.Duration) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	e := l.Env
	if _, err := framework.WaitFor(e.Ctx, e.TL, timeout, "pod "+ns+"/"+name+" ready", func(ctx context.Context) (bool, string, error) {
		p, err := e.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, "no pod", nil
		}
		if err != nil {
			return false, err.Error(), nil
		}
		pod = p
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return true, "", nil
			}
		}
		return false, fmt.Sprintf("%s on %q; events: %s", p.Status.Phase, p.Spec.NodeName, l.events(ctx, ns, name)), nil
	}); err != nil {
		t.Fatal(err)
	}
	return pod
}

// events are the last events of an object, for wait messages.
func (l *Lab) events(ctx context.Context, ns, name string) string {
	evs, err := l.Env.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		return err.Error()
	}
	var out []string
	for i := max(0, len(evs.Items)-3); i < len(evs.Items); i++ {
		ev := evs.Items[i]
		out = append(out, ev.Reason+": "+ev.Message)
	}
	return strings.Join(out, " / ")
}

// Exec runs a command in a pod's container through the API server and the
// kubelet (kubectl exec).
func (l *Lab) Exec(ns, pod string, cmd ...string) (string, error) {
	out, err := l.KubectlRun(append([]string{"exec", "-n", ns, pod, "--"}, cmd...)...)
	return string(out), err
}

// blockStatefulSet is a StatefulSet of busybox pods with a raw block claim
// of class at /dev/xvda that run script.
func blockStatefulSet(ns, name, class, script string) *appsv1.StatefulSet {
	s := statefulSet(ns, name, class, script)
	c := &s.Spec.Template.Spec.Containers[0]
	c.VolumeMounts = nil
	c.VolumeDevices = []corev1.VolumeDevice{{Name: "data", DevicePath: "/dev/xvda"}}
	s.Spec.VolumeClaimTemplates[0].Spec.VolumeMode = ptrTo(corev1.PersistentVolumeBlock)
	return s
}

// preferNode makes a StatefulSet's pods prefer node (they go elsewhere when
// it cannot take them).
func preferNode(s *appsv1.StatefulSet, node string) *appsv1.StatefulSet {
	s.Spec.Template.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{
			Weight: 100,
			Preference: corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{{
				Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}},
		}},
	}}
	return s
}

// statefulSet is a StatefulSet of busybox pods that mount a claim of class
// at /data and run script.
func statefulSet(ns, name, class, script string) *appsv1.StatefulSet {
	labels := map[string]string{"app": name}
	one := int32(1)
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.StatefulSetSpec{
			Replicas: &one,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptrTo(int64(5)),
					Containers: []corev1.Container{{
						Name: "app", Image: busybox, Command: []string{"sh", "-c", script},
						VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
					}},
				},
			},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{*framework.PVC("", "data", class, "64Mi", corev1.ReadWriteOnce, false)},
		},
	}
}

func ptrTo[T any](v T) *T { return &v }

// busybox is the suite's busybox image (Debian's busybox-static under
// registry.k8s.io/e2e-test-images/busybox's name; hack/build-kubelet-tier.sh).
const busybox = "registry.k8s.io/e2e-test-images/busybox:1.37.0-1"
