package manifests

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/srvlab/rds-csi/pkg/csi"
	"github.com/srvlab/rds-csi/pkg/informers"
	"github.com/srvlab/rds-csi/pkg/metrics"
)

const (
	namespace      = "rds-csi"
	controllerName = "rds-csi-controller"
	nodeName       = "rds-csi-node"
	pluginName     = "rds-csi-plugin"
	configMapName  = "rds-csi-config"
	sshSecretName  = "rds-csi-ssh"
)

// leaderElectingSidecars must each run with leader election: with two
// replicas, two active provisioners would both create volumes.
var leaderElectingSidecars = []string{"csi-provisioner", "csi-attacher", "csi-resizer", "csi-snapshotter"}

func TestEveryManifestParses(t *testing.T) {
	s := load(t)
	kinds := map[string]int{}
	for _, o := range s.objects {
		kinds[o.gvk.Kind]++
	}
	// What an install consists of; a missing kind means a file was dropped.
	for _, k := range []string{"Namespace", "CSIDriver", "ConfigMap", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
		"Role", "RoleBinding", "Deployment", "PodDisruptionBudget", "Service", "DaemonSet", "StorageClass",
		"VolumeSnapshotClass", "PrometheusRule", "ServiceMonitor", "Secret"} {
		if kinds[k] == 0 {
			t.Errorf("no %s in the manifests", k)
		}
	}
	t.Logf("%d objects: %v", len(s.objects), kinds)
}

func TestNamespacesAndLabels(t *testing.T) {
	s := load(t)
	clusterScoped := map[string]bool{"Namespace": true, "CSIDriver": true, "ClusterRole": true, "ClusterRoleBinding": true,
		"StorageClass": true, "VolumeSnapshotClass": true}
	for _, o := range s.objects {
		switch {
		case clusterScoped[o.gvk.Kind] && o.ns != "":
			t.Errorf("%s (%s): cluster-scoped, but has namespace %q", o.key(), o.file, o.ns)
		case (o.gvk.Kind == "Role" || o.gvk.Kind == "RoleBinding") && o.ns == "kube-node-lease" && strings.HasSuffix(o.name, "-heartbeats"):
			// Read-only access to the kubelets' Leases (heartbeat
			// detection), granted where they are and nowhere else.
		case !clusterScoped[o.gvk.Kind] && o.ns != namespace:
			t.Errorf("%s (%s): namespace %q, want %q (the base uses no namespace transformer)", o.key(), o.file, o.ns, namespace)
		}
		if acc, ok := o.obj.(interface{ GetLabels() map[string]string }); ok && acc.GetLabels()["app.kubernetes.io/name"] != "rds-csi" {
			t.Errorf("%s (%s): lacks label app.kubernetes.io/name=rds-csi", o.key(), o.file)
		}
	}
}

func TestCSIDriver(t *testing.T) {
	s := load(t)
	o, ok := s.get("CSIDriver", "", csi.DefaultDriverName)
	if !ok {
		t.Fatalf("no CSIDriver named %s (the driver's default --driver-name)", csi.DefaultDriverName)
	}
	d := o.obj.(*storagev1.CSIDriver)
	if d.Spec.AttachRequired == nil || !*d.Spec.AttachRequired {
		t.Error("attachRequired must be true: fencing happens in ControllerPublishVolume, which only runs for attachments")
	}
	if d.Spec.PodInfoOnMount == nil || !*d.Spec.PodInfoOnMount {
		t.Error("podInfoOnMount must be true")
	}
	if d.Spec.FSGroupPolicy == nil || *d.Spec.FSGroupPolicy != storagev1.FileFSGroupPolicy {
		t.Errorf("fsGroupPolicy = %v, want File", d.Spec.FSGroupPolicy)
	}
	if !slices.Equal(d.Spec.VolumeLifecycleModes, []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent}) {
		t.Errorf("volumeLifecycleModes = %v, want [Persistent]", d.Spec.VolumeLifecycleModes)
	}
}

// imageRef is a reference with a registry path and an explicit tag or digest.
var imageRef = regexp.MustCompile(`^[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)+(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?$`)

func podSpecs(s *set) map[string]*corev1.PodSpec {
	out := map[string]*corev1.PodSpec{}
	for _, o := range s.kind("Deployment") {
		out[o.key()] = &o.obj.(*appsv1.Deployment).Spec.Template.Spec
	}
	for _, o := range s.kind("DaemonSet") {
		out[o.key()] = &o.obj.(*appsv1.DaemonSet).Spec.Template.Spec
	}
	return out
}

func TestEveryImageIsPinned(t *testing.T) {
	s := load(t)
	for key, spec := range podSpecs(s) {
		for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
			img := c.Image
			last := img[strings.LastIndex(img, "/")+1:]
			switch {
			case !imageRef.MatchString(img):
				t.Errorf("%s container %s: image %q is not registry/path:tag", key, c.Name, img)
			case !strings.Contains(last, ":") && !strings.Contains(img, "@"):
				t.Errorf("%s container %s: image %q has no tag", key, c.Name, img)
			case strings.HasSuffix(last, ":latest"):
				t.Errorf("%s container %s: image %q uses latest", key, c.Name, img)
			}
			if c.ImagePullPolicy == corev1.PullAlways {
				t.Errorf("%s container %s: imagePullPolicy Always makes a registry outage a storage outage", key, c.Name)
			}
		}
	}
}

// TestSidecarVersionsMatchE2E keeps the deployed sidecars the ones the e2e
// suite builds and runs (hack/build-controlplane.sh), when that script is
// there.
func TestSidecarVersionsMatchE2E(t *testing.T) {
	script, err := os.ReadFile(filepath.Join("..", "hack", "build-controlplane.sh"))
	if err != nil {
		t.Skipf("no e2e build script to compare with: %v", err)
	}
	s := load(t)
	spec := &mustGet[*appsv1.Deployment](t, s, "Deployment", namespace, controllerName).Spec.Template.Spec
	for name, variable := range map[string]string{"csi-provisioner": "PROVISIONER_VERSIONS", "csi-attacher": "ATTACHER_VERSIONS",
		"csi-resizer": "RESIZER_VERSIONS", "csi-snapshotter": "SNAPSHOTTER_VERSIONS"} {
		m := regexp.MustCompile(variable + `:-([^}]*)\}`).FindSubmatch(script)
		if m == nil {
			t.Logf("%s not found in hack/build-controlplane.sh; not compared", variable)
			continue
		}
		img := container(t, spec, name).Image
		tag := img[strings.LastIndex(img, ":")+1:]
		if !slices.Contains(strings.Fields(string(m[1])), tag) {
			t.Errorf("%s runs %s, but the e2e suite builds %s=%q", name, tag, variable, m[1])
		}
	}
}

// env is the value a container's $(VAR) expands to, for flag checks: the
// ConfigMap's values and plausible downward-API values.
func env(t *testing.T, s *set, c *corev1.Container) map[string]string {
	t.Helper()
	data := mustGet[*corev1.ConfigMap](t, s, "ConfigMap", namespace, configMapName).Data
	out := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			out[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil:
			switch e.ValueFrom.FieldRef.FieldPath {
			case "metadata.namespace":
				out[e.Name] = namespace
			case "spec.nodeName":
				out[e.Name] = "worker-1"
			case "metadata.name":
				out[e.Name] = "rds-csi-controller-5d8f9c7b6-x2x4q"
			default:
				t.Errorf("container %s env %s: unexpected fieldRef %s", c.Name, e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
		case e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			v, ok := data[ref.Key]
			if ref.Name != configMapName || !ok {
				t.Errorf("container %s env %s: ConfigMap %s key %s does not exist", c.Name, e.Name, ref.Name, ref.Key)
			}
			out[e.Name] = v
		case e.ValueFrom.ResourceFieldRef != nil:
			out[e.Name] = resourceFieldValue(t, c, e.ValueFrom.ResourceFieldRef)
		default:
			t.Errorf("container %s env %s: unexpected source", c.Name, e.Name)
		}
	}
	return out
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// expand does the kubelet's $(VAR) expansion; an undefined variable stays
// as written in the pod, which is always a bug here.
func expand(t *testing.T, c *corev1.Container, vars map[string]string) []string {
	t.Helper()
	var out []string
	for _, a := range c.Args {
		out = append(out, varRef.ReplaceAllStringFunc(a, func(m string) string {
			name := varRef.FindStringSubmatch(m)[1]
			v, ok := vars[name]
			if !ok {
				t.Errorf("container %s: argument %q uses $(%s), which its env does not define", c.Name, a, name)
			}
			return v
		}))
	}
	return out
}

func hasArg(c *corev1.Container, arg string) bool { return slices.Contains(c.Args, arg) }

// argValue is the value of --name=value in c's args.
func argValue(c *corev1.Container, name string) (string, bool) {
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// driverFlags checks args against the driver itself: the built binary
// parses them all (--version, given first, makes it exit right after
// parsing), so every flag exists and has a value of its type. The
// csi.Options among them are then parsed and validated by the driver's own
// code.
func driverFlags(t *testing.T, args []string) csi.Options {
	t.Helper()
	for _, a := range args {
		if !strings.HasPrefix(a, "--") || !strings.Contains(a, "=") {
			t.Errorf("argument %q: write flags as --name=value", a)
		}
	}
	if out, err := exec.Command(driverBinary(t), append([]string{"--version"}, args...)...).CombinedOutput(); err != nil {
		msg, _, _ := strings.Cut(string(out), "\n") // the rest is the usage
		t.Fatalf("the driver would not start: %v: %s (args %q)", err, msg, args)
	}
	fs := flag.NewFlagSet("rds-csi-driver", flag.ContinueOnError)
	var opts csi.Options
	opts.AddFlags(fs)
	var own []string
	for _, a := range args {
		if name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "="); fs.Lookup(name) != nil {
			own = append(own, a)
		}
	}
	if err := fs.Parse(own); err != nil {
		t.Fatalf("parsing the driver's options %q: %v", own, err)
	}
	if err := opts.Validate(); err != nil {
		t.Errorf("the driver's validation fails with the shipped ConfigMap: %v", err)
	}
	return opts
}

// driverContainer is the pod's driver container and its options; the
// pod's ServiceAccount must exist and the driver run in mode.
func driverContainer(t *testing.T, s *set, spec *corev1.PodSpec, mode string) (*corev1.Container, csi.Options) {
	t.Helper()
	if _, ok := s.get("ServiceAccount", namespace, spec.ServiceAccountName); !ok {
		t.Errorf("serviceAccountName %q does not exist", spec.ServiceAccountName)
	}
	plugin := container(t, spec, pluginName)
	opts := driverFlags(t, expand(t, plugin, env(t, s, plugin)))
	if opts.Mode != mode {
		t.Errorf("--mode = %s, want %s", opts.Mode, mode)
	}
	return plugin, opts
}

// TestMain removes the driver binary that driverBinary built.
func TestMain(m *testing.M) {
	code := m.Run()
	if driverBinaryPath != "" {
		os.RemoveAll(filepath.Dir(driverBinaryPath))
	}
	os.Exit(code)
}

var (
	driverBinaryOnce sync.Once
	driverBinaryPath string
	driverBinaryErr  error
)

// driverBinary builds cmd/rds-csi-driver once per test binary.
func driverBinary(t *testing.T) string {
	t.Helper()
	driverBinaryOnce.Do(func() {
		goTool, err := exec.LookPath("go")
		if err != nil {
			goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		dir, err := os.MkdirTemp("", "rds-csi-manifests-")
		if err != nil {
			driverBinaryErr = err
			return
		}
		driverBinaryPath = filepath.Join(dir, "rds-csi-driver")
		if out, err := exec.Command(goTool, "build", "-o", driverBinaryPath, "../cmd/rds-csi-driver").CombinedOutput(); err != nil {
			driverBinaryErr = fmt.Errorf("building cmd/rds-csi-driver: %v\n%s", err, out)
		}
	})
	if driverBinaryErr != nil {
		t.Fatal(driverBinaryErr)
	}
	return driverBinaryPath
}

func TestControllerDeployment(t *testing.T) {
	s := load(t)
	d := mustGet[*appsv1.Deployment](t, s, "Deployment", namespace, controllerName)
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		got := "unset"
		if d.Spec.Replicas != nil {
			got = fmt.Sprint(*d.Spec.Replicas)
		}
		t.Errorf("replicas = %s, want 2 (one leader, one warm standby)", got)
	}
	spec := &d.Spec.Template.Spec
	if spec.Affinity == nil || spec.Affinity.PodAntiAffinity == nil {
		t.Error("no pod anti-affinity: both replicas may land on the node that fails")
	}

	plugin, opts := driverContainer(t, s, spec, csi.ModeController)
	if opts.RDSInsecureSkipHostKeyCheck {
		t.Error("the shipped controller skips the RDS host key check")
	}
	if !hasArg(plugin, "--leader-election=true") {
		t.Error("the driver runs without --leader-election=true")
	}
	if ns, _ := argValue(plugin, "leader-election-namespace"); ns != "$(NAMESPACE)" {
		t.Errorf("driver --leader-election-namespace = %q, want $(NAMESPACE)", ns)
	}
	var timings []time.Duration
	for _, name := range []string{"leader-election-lease-duration", "leader-election-renew-deadline", "leader-election-retry-period"} {
		v, err := time.ParseDuration(mustArg(t, plugin, name))
		if err != nil {
			t.Errorf("--%s: %v", name, err)
		}
		timings = append(timings, v)
	}
	if lease, renew, retry := timings[0], timings[1], timings[2]; !(lease > renew && renew > retry && retry > 0) {
		t.Errorf("leader election timings lease %v > renew %v > retry %v > 0 do not hold (client-go refuses them)", lease, renew, retry)
	}

	// The HTTP endpoint serves the probes.
	endpoint, _ := argValue(plugin, "http-endpoint")
	port := containerPort(t, plugin, endpoint)
	probe := func(p *corev1.Probe, path string) {
		t.Helper()
		if p == nil || p.HTTPGet == nil {
			t.Errorf("driver has no HTTP probe for %s", path)
			return
		}
		if p.HTTPGet.Path != path || !portMatches(plugin, p.HTTPGet.Port, port) {
			t.Errorf("driver probe %s:%s, want %s on the --http-endpoint port %d", p.HTTPGet.Port.String(), p.HTTPGet.Path, path, port)
		}
	}
	probe(plugin.LivenessProbe, "/healthz")
	probe(plugin.ReadinessProbe, "/readyz")

	// The SSH Secret is mounted where the key flags point, with the keys
	// the example Secret documents.
	checkSSHMount(t, s, spec, plugin, opts)

	// Sidecars: leader election on, same socket as the driver.
	socketDir := mountFor(t, plugin, strings.TrimPrefix(opts.Endpoint, "unix://"))
	for _, name := range leaderElectingSidecars {
		c := container(t, spec, name)
		vars := env(t, s, c)
		expand(t, c, vars)
		if !hasArg(c, "--leader-election=true") && !hasArg(c, "--leader-election") {
			t.Errorf("%s runs without --leader-election", name)
		}
		if ns, _ := argValue(c, "leader-election-namespace"); ns != "$(NAMESPACE)" || vars["NAMESPACE"] != namespace {
			t.Errorf("%s: --leader-election-namespace=%q with NAMESPACE=%q, want the pod's namespace", name, ns, vars["NAMESPACE"])
		}
		checkSocket(t, c, socketDir)
		if ep, ok := argValue(c, "http-endpoint"); ok {
			p := containerPort(t, c, ep)
			if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/healthz/leader-election" || !portMatches(c, c.LivenessProbe.HTTPGet.Port, p) {
				t.Errorf("%s: its liveness probe is not /healthz/leader-election on port %d", name, p)
			}
		}
	}
	lp := container(t, spec, "liveness-probe")
	checkSocket(t, lp, socketDir)
	containerPort(t, lp, mustArg(t, lp, "http-endpoint"))

	// Every container port is unique within the pod.
	ports := map[int32]string{}
	for _, c := range spec.Containers {
		for _, p := range c.Ports {
			if other, dup := ports[p.ContainerPort]; dup {
				t.Errorf("port %d used by %s and %s", p.ContainerPort, other, c.Name)
			}
			ports[p.ContainerPort] = c.Name
		}
	}

	// The PodDisruptionBudget and the metrics Service select these pods.
	pdb := mustGet[*policyv1.PodDisruptionBudget](t, s, "PodDisruptionBudget", namespace, controllerName)
	if !selects(pdb.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
		t.Error("the PodDisruptionBudget selects no controller pod")
	}
	svcs := s.kind("Service")
	if len(svcs) == 0 {
		t.Fatal("no metrics Service")
	}
	for _, o := range svcs {
		svc := o.obj.(*corev1.Service)
		if !selects(svc.Spec.Selector, d.Spec.Template.Labels) {
			t.Errorf("Service %s selects no controller pod", svc.Name)
		}
		for _, p := range svc.Spec.Ports {
			if !portMatches(plugin, p.TargetPort, port) {
				t.Errorf("Service %s port %s targets %s, not the driver's --http-endpoint", svc.Name, p.Name, p.TargetPort.String())
			}
		}
	}
}

func mustArg(t *testing.T, c *corev1.Container, name string) string {
	t.Helper()
	v, ok := argValue(c, name)
	if !ok {
		t.Errorf("%s has no --%s", c.Name, name)
	}
	return v
}

// containerPort checks that endpoint (":8080") is a declared port of c.
func containerPort(t *testing.T, c *corev1.Container, endpoint string) int32 {
	t.Helper()
	_, portStr, ok := strings.Cut(endpoint, ":")
	var port int32
	if _, err := fmt.Sscanf(portStr, "%d", &port); !ok || err != nil {
		t.Errorf("%s: endpoint %q is not [host]:port", c.Name, endpoint)
		return 0
	}
	for _, p := range c.Ports {
		if p.ContainerPort == port {
			return port
		}
	}
	t.Errorf("%s listens on %d but does not declare it in ports", c.Name, port)
	return port
}

func portMatches(c *corev1.Container, p intstr.IntOrString, port int32) bool {
	if p.Type == intstr.Int {
		return p.IntVal == port
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort == port
		}
	}
	return false
}

func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// mountFor is the volume mounted at the directory of path in c.
func mountFor(t *testing.T, c *corev1.Container, path string) string {
	t.Helper()
	dir := filepath.Dir(path)
	for _, m := range c.VolumeMounts {
		if m.MountPath == dir {
			return m.Name
		}
	}
	t.Errorf("%s: nothing is mounted at %s (for %s)", c.Name, dir, path)
	return ""
}

func checkSocket(t *testing.T, c *corev1.Container, socketVolume string) {
	t.Helper()
	addr := mustArg(t, c, "csi-address")
	if got := mountFor(t, c, addr); got != socketVolume {
		t.Errorf("%s: --csi-address=%s is on volume %q, the driver's socket on %q", c.Name, addr, got, socketVolume)
	}
}

func checkSSHMount(t *testing.T, s *set, spec *corev1.PodSpec, plugin *corev1.Container, opts csi.Options) {
	t.Helper()
	example, ok := s.get("Secret", namespace, sshSecretName)
	if !ok {
		t.Fatalf("examples/ has no Secret %s documenting the key layout", sshSecretName)
	}
	keys := example.obj.(*corev1.Secret).StringData
	for _, file := range []string{opts.RDSKeyFile, opts.RDSKnownHostsFile} {
		vol := volume(spec, mountFor(t, plugin, file))
		if vol == nil || vol.Secret == nil || vol.Secret.SecretName != sshSecretName {
			t.Errorf("%s is not on the Secret %s", file, sshSecretName)
			continue
		}
		if _, ok := keys[filepath.Base(file)]; !ok {
			t.Errorf("the example Secret has no key %s for %s", filepath.Base(file), file)
		}
		if vol.Secret.DefaultMode == nil || *vol.Secret.DefaultMode&0o007 != 0 {
			t.Errorf("the SSH Secret volume is readable by others (defaultMode %v)", vol.Secret.DefaultMode)
		}
	}
}

func TestNodeDaemonSet(t *testing.T) {
	s := load(t)
	ds := mustGet[*appsv1.DaemonSet](t, s, "DaemonSet", namespace, nodeName)
	spec := &ds.Spec.Template.Spec
	if !spec.HostNetwork {
		t.Error("the node plugin is not in the host network: its NVMe/TCP connections would die with the pod")
	}
	if !slices.ContainsFunc(spec.Tolerations, func(tl corev1.Toleration) bool { return tl.Operator == corev1.TolerationOpExists && tl.Key == "" }) {
		t.Error("the node plugin does not tolerate every taint: volumes on tainted nodes could not be unmounted")
	}

	plugin, opts := driverContainer(t, s, spec, csi.ModeNode)
	if v, _ := argValue(plugin, "node-id"); v != "$(NODE_NAME)" || !slices.ContainsFunc(plugin.Env, func(e corev1.EnvVar) bool {
		return e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
	}) {
		t.Errorf("--node-id=%q is not the node's name from spec.nodeName", v)
	}
	if plugin.SecurityContext == nil || plugin.SecurityContext.Privileged == nil || !*plugin.SecurityContext.Privileged {
		t.Error("the node plugin is not privileged (NVMe/TCP connect, mount)")
	}

	hostPaths := map[string]string{} // volume -> host path
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	mounted := map[string]corev1.VolumeMount{} // host path -> mount in the plugin
	for _, m := range plugin.VolumeMounts {
		if hp, ok := hostPaths[m.Name]; ok {
			mounted[hp] = m
		}
	}
	kubelet, ok := mounted["/var/lib/kubelet"]
	switch {
	case !ok:
		t.Error("the kubelet directory is not mounted in the plugin")
	case kubelet.MountPath != "/var/lib/kubelet":
		t.Errorf("the kubelet directory is mounted at %s; staging and target paths are host paths, so it must be at /var/lib/kubelet", kubelet.MountPath)
	case kubelet.MountPropagation == nil || *kubelet.MountPropagation != corev1.MountPropagationBidirectional:
		t.Error("the kubelet directory is not mounted with Bidirectional propagation: mounts would not reach the host")
	}
	for _, hp := range []string{"/dev", "/sys", "/etc/nvme"} {
		if m, ok := mounted[hp]; !ok || m.MountPath != hp {
			t.Errorf("host %s is not mounted at %s in the plugin", hp, hp)
		}
	}
	// The host NQN in /etc/nvme is the node's identity on the RDS (its
	// CSI node ID carries it): the plugin creates it on the host when
	// missing, so it outlives the pod.
	if m := mounted["/etc/nvme"]; m.ReadOnly {
		t.Error("the host's /etc/nvme is mounted read-only: the plugin cannot create the host NQN there")
	}
	for _, v := range spec.Volumes {
		if v.HostPath != nil && v.HostPath.Path == "/etc/nvme" && (v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathDirectoryOrCreate) {
			t.Errorf("the host's /etc/nvme is a hostPath of type %v, want DirectoryOrCreate (a host without nvme-cli has none)", v.HostPath.Type)
		}
	}

	// Registration: the registrar tells the kubelet the socket's host path.
	socketVolume := mountFor(t, plugin, strings.TrimPrefix(opts.Endpoint, "unix://"))
	wantDir := "/var/lib/kubelet/plugins/" + csi.DefaultDriverName
	if hostPaths[socketVolume] != wantDir {
		t.Errorf("the plugin socket is in host %q, want %s", hostPaths[socketVolume], wantDir)
	}
	reg := container(t, spec, "node-driver-registrar")
	checkSocket(t, reg, socketVolume)
	if got, want := mustArg(t, reg, "kubelet-registration-path"), wantDir+"/"+filepath.Base(strings.TrimPrefix(opts.Endpoint, "unix://")); got != want {
		t.Errorf("--kubelet-registration-path=%s, want %s", got, want)
	}
	if hostPaths[mountFor(t, reg, "/registration/x")] != "/var/lib/kubelet/plugins_registry" {
		t.Error("the registrar's /registration is not the kubelet's plugins_registry")
	}

	// The plugin's liveness probe is the liveness-probe sidecar's port.
	lp := container(t, spec, "liveness-probe")
	checkSocket(t, lp, socketVolume)
	ep := mustArg(t, lp, "http-endpoint")
	port := containerPort(t, plugin, ep) // the sidecar shares the host network; the plugin declares the port
	if plugin.LivenessProbe == nil || plugin.LivenessProbe.HTTPGet == nil || !portMatches(plugin, plugin.LivenessProbe.HTTPGet.Port, port) {
		t.Errorf("the plugin's liveness probe is not the liveness-probe sidecar's %s", ep)
	}

	// The driver serves its node metrics (issue 14), and in the host
	// network nothing of this pod listens beyond the node's loopback:
	// every HTTP endpoint binds 127.0.0.1 and every probe goes there.
	if ep, ok := argValue(plugin, "http-endpoint"); !ok {
		t.Error("the node plugin has no --http-endpoint: its metrics are not served")
	} else {
		containerPort(t, plugin, ep)
	}
	for _, c := range spec.Containers {
		if ep, ok := argValue(&c, "http-endpoint"); ok && !strings.HasPrefix(ep, "127.0.0.1:") {
			t.Errorf("%s: --http-endpoint=%s listens on every address of the node (hostNetwork); bind 127.0.0.1", c.Name, ep)
		}
		for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
			if p != nil && p.HTTPGet != nil && p.HTTPGet.Host != "127.0.0.1" {
				t.Errorf("%s: an HTTP probe goes to host %q; its endpoint listens on 127.0.0.1 only", c.Name, p.HTTPGet.Host)
			}
		}
	}
}

func TestStorageAndSnapshotClasses(t *testing.T) {
	s := load(t)
	classes := s.kind("StorageClass")
	var fs, virt bool
	for _, o := range classes {
		sc := o.obj.(*storagev1.StorageClass)
		if sc.Provisioner != csi.DefaultDriverName {
			t.Errorf("StorageClass %s: provisioner %s, want %s", sc.Name, sc.Provisioner, csi.DefaultDriverName)
		}
		for k := range sc.Parameters {
			// The driver refuses every parameter of its own (none are
			// defined); only the sidecars' keys are allowed.
			if !strings.HasPrefix(k, "csi.storage.k8s.io/") {
				t.Errorf("StorageClass %s: parameter %s would make CreateVolume fail", sc.Name, k)
			}
		}
		if sc.AllowVolumeExpansion == nil || !*sc.AllowVolumeExpansion {
			t.Errorf("StorageClass %s does not allow expansion, which the driver supports", sc.Name)
		}
		if sc.VolumeBindingMode == nil || *sc.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer {
			t.Errorf("StorageClass %s: binding mode is not WaitForFirstConsumer (topology)", sc.Name)
		}
		fs = fs || sc.Parameters["csi.storage.k8s.io/fstype"] == "ext4"
		virt = virt || sc.Annotations["storageclass.kubevirt.io/is-default-virt-class"] == "true"
	}
	if !fs {
		t.Error("no ext4 filesystem StorageClass")
	}
	if !virt {
		t.Error("no StorageClass for KubeVirt VM disks")
	}
	snaps := s.kind("VolumeSnapshotClass")
	if len(snaps) == 0 {
		t.Fatal("no VolumeSnapshotClass")
	}
	for _, o := range snaps {
		u := o.obj.(*unstructured.Unstructured)
		if d, _, _ := unstructured.NestedString(u.Object, "driver"); d != csi.DefaultDriverName {
			t.Errorf("VolumeSnapshotClass %s: driver %q", o.name, d)
		}
		if p, _, _ := unstructured.NestedString(u.Object, "deletionPolicy"); p != "Delete" && p != "Retain" {
			t.Errorf("VolumeSnapshotClass %s: deletionPolicy %q", o.name, p)
		}
	}
}

// allows reports whether rules grant verb on group/resource.
func allows(rules []rbacv1.PolicyRule, group, resource, verb string) bool {
	for _, r := range rules {
		if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) {
			return true
		}
	}
	return false
}

func TestRBACIsSplitAndSufficient(t *testing.T) {
	s := load(t)
	roles := map[string][]rbacv1.PolicyRule{} // "ClusterRole/name" or "Role/ns/name"
	for _, o := range s.kind("ClusterRole") {
		cr := o.obj.(*rbacv1.ClusterRole)
		roles["ClusterRole/"+cr.Name] = cr.Rules
	}
	for _, o := range s.kind("Role") {
		r := o.obj.(*rbacv1.Role)
		roles["Role/"+r.Namespace+"/"+r.Name] = r.Rules
	}
	for key, rules := range roles {
		for _, r := range rules {
			for _, list := range [][]string{r.APIGroups, r.Resources, r.Verbs} {
				if slices.Contains(list, "*") {
					t.Errorf("%s uses a wildcard: %+v", key, r)
				}
			}
			if strings.HasPrefix(key, "ClusterRole/") && (slices.Contains(r.Resources, "secrets") || slices.Contains(r.Resources, "leases")) {
				t.Errorf("%s grants %v cluster-wide; Secrets and Leases belong in the controller's namespaced Role", key, r.Resources)
			}
		}
	}

	// What each ServiceAccount is granted, through which binding.
	granted := map[string][]rbacv1.PolicyRule{} // SA "ns/name" -> cluster-wide rules
	grantedNS := map[string][]rbacv1.PolicyRule{}
	subjects := func(kind, name string, subs []rbacv1.Subject, ref rbacv1.RoleRef, ns string) {
		key := ref.Kind + "/" + ref.Name
		if ref.Kind == "Role" {
			key = "Role/" + ns + "/" + ref.Name
		}
		rules, ok := roles[key]
		if !ok {
			t.Errorf("%s %s refers to %s, which does not exist", kind, name, key)
		}
		for _, sub := range subs {
			if _, ok := s.get("ServiceAccount", sub.Namespace, sub.Name); sub.Kind != "ServiceAccount" || !ok {
				t.Errorf("%s %s binds %s %s/%s, which the manifests do not create", kind, name, sub.Kind, sub.Namespace, sub.Name)
			}
			sa := sub.Namespace + "/" + sub.Name
			if kind == "ClusterRoleBinding" {
				granted[sa] = append(granted[sa], rules...)
			} else {
				grantedNS[sa] = append(grantedNS[sa], rules...)
			}
		}
	}
	for _, o := range s.kind("ClusterRoleBinding") {
		b := o.obj.(*rbacv1.ClusterRoleBinding)
		subjects("ClusterRoleBinding", b.Name, b.Subjects, b.RoleRef, "")
	}
	for _, o := range s.kind("RoleBinding") {
		b := o.obj.(*rbacv1.RoleBinding)
		if b.RoleRef.Kind != "Role" {
			t.Errorf("RoleBinding %s binds a %s; bind namespaced Roles only", b.Name, b.RoleRef.Kind)
		}
		subjects("RoleBinding", b.Name, b.Subjects, b.RoleRef, b.Namespace)
	}

	controller := namespace + "/" + controllerName
	// What the driver's informers and attachment claims, the sidecars
	// (from their upstream RBAC, minus features turned off by flags) and
	// events need cluster-wide.
	clusterNeeds := []struct {
		group, resource string
		verbs           []string
	}{
		{"", "persistentvolumes", []string{"get", "list", "watch", "create", "delete", "patch"}},
		{"", "persistentvolumeclaims", []string{"get", "list", "watch", "update"}},
		{"", "persistentvolumeclaims/status", []string{"patch"}},
		{"storage.k8s.io", "volumeattachments", []string{"get", "list", "watch", "patch"}},
		{"storage.k8s.io", "volumeattachments/status", []string{"patch"}},
		{"", "nodes", []string{"get", "list", "watch"}},
		{"storage.k8s.io", "csinodes", []string{"get", "list", "watch"}},
		{"storage.k8s.io", "storageclasses", []string{"get", "list", "watch"}},
		{"storage.k8s.io", "volumeattributesclasses", []string{"get", "list", "watch"}},
		{"", "events", []string{"create", "patch"}},
		{"snapshot.storage.k8s.io", "volumesnapshotclasses", []string{"get", "list", "watch"}},
		{"snapshot.storage.k8s.io", "volumesnapshots", []string{"get", "list", "watch", "update"}},
		{"snapshot.storage.k8s.io", "volumesnapshotcontents", []string{"get", "list", "watch", "update", "patch"}},
		{"snapshot.storage.k8s.io", "volumesnapshotcontents/status", []string{"update", "patch"}},
	}
	for _, n := range clusterNeeds {
		for _, v := range n.verbs {
			if !allows(granted[controller], n.group, n.resource, v) {
				t.Errorf("the controller may not %s %s.%s cluster-wide", v, n.resource, n.group)
			}
		}
	}
	for _, v := range []string{"get", "list", "watch", "create", "update"} {
		if !allows(grantedNS[controller], "coordination.k8s.io", "leases", v) {
			t.Errorf("the controller may not %s leases in %s (leader election)", v, namespace)
		}
	}
	// csi-provisioner's capacity tracking: its objects, and the walk up
	// to the Deployment that owns them.
	for _, n := range []struct{ group, resource, verb string }{
		{"storage.k8s.io", "csistoragecapacities", "create"}, {"storage.k8s.io", "csistoragecapacities", "update"},
		{"storage.k8s.io", "csistoragecapacities", "delete"}, {"storage.k8s.io", "csistoragecapacities", "watch"},
		{"", "pods", "get"}, {"apps", "replicasets", "get"},
	} {
		if !allows(grantedNS[controller], n.group, n.resource, n.verb) {
			t.Errorf("the controller may not %s %s.%s in %s (csi-provisioner --enable-capacity)", n.verb, n.resource, n.group, namespace)
		}
	}
	// No Secrets for anyone: the SSH key reaches the driver as a mounted
	// file, and every container of the controller pod carries its token.
	for key, rules := range roles {
		for _, r := range rules {
			if slices.Contains(r.Resources, "secrets") {
				t.Errorf("%s grants %v on Secrets %v; nothing reads a Secret through the API", key, r.Verbs, r.ResourceNames)
			}
		}
	}
	// VolumeSnapshots: exactly what csi-provisioner uses (restore, and its
	// source-protection finalizer with the sweep that clears it); the
	// snapshotter needs none.
	for _, r := range granted[controller] {
		if slices.Contains(r.APIGroups, "snapshot.storage.k8s.io") && slices.Contains(r.Resources, "volumesnapshots") {
			if got := slices.Sorted(slices.Values(r.Verbs)); !slices.Equal(got, []string{"get", "list", "update", "watch"}) {
				t.Errorf("the controller may %v volumesnapshots, want get, list, watch, update (csi-provisioner)", r.Verbs)
			}
		}
	}
	if allows(granted[controller], "", "pods", "list") {
		t.Error("the controller may list pods cluster-wide; nothing it runs needs that (the resizer runs with --handle-volume-inuse-error=false)")
	}

	// The node plugin talks to no API server.
	node := namespace + "/" + nodeName
	if len(granted[node])+len(grantedNS[node]) > 0 {
		t.Errorf("the node ServiceAccount is granted %v %v; the node plugin needs no API access", granted[node], grantedNS[node])
	}
	ds := mustGet[*appsv1.DaemonSet](t, s, "DaemonSet", namespace, nodeName)
	if tok := ds.Spec.Template.Spec.AutomountServiceAccountToken; tok == nil || *tok {
		t.Error("the node pods mount a ServiceAccount token they do not need")
	}
}

// metricName matches a driver metric in an expression.
var metricName = regexp.MustCompile(`\brds_csi_[a-z0-9_]+`)

func TestPrometheusRules(t *testing.T) {
	s := load(t)
	// Every family pkg/metrics exports; the command histogram has no series
	// (and so is not gathered) until a command is observed.
	m := metrics.New()
	m.ObserveRDSCommand("rds-a", "disk print", time.Millisecond, nil)
	m.AddRDS("rds-a")
	m.ReportMalformed(informers.NewMalformedSet(nil).Counts) // registered by the controller process
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, f := range families {
		known[f.GetName()] = true
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			known[f.GetName()+suffix] = true
		}
	}
	for name := range rdsHealthFamilies(t) { // reported by the polling leader only
		known[name] = true
	}

	rules := s.kind("PrometheusRule")
	if len(rules) == 0 {
		t.Fatal("no PrometheusRule")
	}
	alerts := map[string]map[string]any{}
	for _, o := range rules {
		groups, _, _ := unstructured.NestedSlice(o.obj.(*unstructured.Unstructured).Object, "spec", "groups")
		for _, g := range groups {
			rs, _ := g.(map[string]any)["rules"].([]any)
			for _, r := range rs {
				rule := r.(map[string]any)
				name, _ := rule["alert"].(string)
				if name == "" {
					t.Errorf("a rule in %s is not an alert: %v", o.file, rule["record"])
					continue
				}
				alerts[name] = rule
			}
		}
	}
	for _, want := range []string{"RDSCSIVolumeMultiAttach", "RDSCSIAttachmentStuck"} {
		if _, ok := alerts[want]; !ok {
			t.Errorf("alert %s missing", want)
		}
	}
	names := make([]string, 0, len(alerts))
	for n := range alerts {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		rule := alerts[name]
		expr, _ := rule["expr"].(string)
		if strings.TrimSpace(expr) == "" {
			t.Errorf("%s: no expr", name)
		}
		if strings.Count(expr, "(") != strings.Count(expr, ")") || strings.Count(expr, "{") != strings.Count(expr, "}") {
			t.Errorf("%s: unbalanced brackets in %q", name, expr)
		}
		if _, err := time.ParseDuration(fmt.Sprint(rule["for"])); err != nil {
			t.Errorf("%s: for %v: %v", name, rule["for"], err)
		}
		labels, _ := rule["labels"].(map[string]any)
		if sev := labels["severity"]; sev != "critical" && sev != "warning" {
			t.Errorf("%s: severity %v", name, sev)
		}
		ann, _ := rule["annotations"].(map[string]any)
		if ann["summary"] == nil || ann["description"] == nil {
			t.Errorf("%s: needs a summary and a description", name)
		}
		if strings.Contains(expr, "kube_volumeattachment") && !strings.Contains(expr, `attacher="`+csi.DefaultDriverName+`"`) {
			t.Errorf("%s: counts other drivers' VolumeAttachments (no attacher=%q)", name, csi.DefaultDriverName)
		}
		for _, m := range metricName.FindAllString(expr, -1) {
			if !known[m] {
				t.Errorf("%s: uses %s, which pkg/metrics does not export", name, m)
			}
		}
	}

	// The ServiceMonitor scrapes the Service's port.
	for _, o := range s.kind("ServiceMonitor") {
		eps, _, _ := unstructured.NestedSlice(o.obj.(*unstructured.Unstructured).Object, "spec", "endpoints")
		for _, ep := range eps {
			port, _ := ep.(map[string]any)["port"].(string)
			found := false
			for _, so := range s.kind("Service") {
				for _, p := range so.obj.(*corev1.Service).Spec.Ports {
					found = found || p.Name == port
				}
			}
			if !found {
				t.Errorf("ServiceMonitor %s scrapes port %q, which no Service has", o.name, port)
			}
		}
	}
}

// TestKustomizeBuild runs `kubectl kustomize` on every directory and
// checks it yields exactly the objects the files hold (no transformer
// changes them), and that the example overlay generates the Secret and
// patches the ConfigMap.
func TestKustomizeBuild(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl is not installed; the file-level checks in this package still ran")
	}
	kustomize := func(t *testing.T, dir string) []object {
		t.Helper()
		out, err := exec.Command(kubectl, "kustomize", dir).Output()
		if err != nil {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, stderr)
		}
		objs, err := decode("kubectl kustomize "+dir, out)
		if err != nil {
			t.Fatal(err)
		}
		return objs
	}
	keys := func(objs []object) []string {
		var out []string
		for _, o := range objs {
			out = append(out, o.key())
		}
		sort.Strings(out)
		return out
	}
	for _, dir := range kustomizeDirs {
		t.Run(dir, func(t *testing.T) {
			want, err := build(dir, map[string]bool{})
			if err != nil {
				t.Fatal(err)
			}
			got := kustomize(t, dir)
			if !slices.Equal(keys(got), keys(want)) {
				t.Errorf("kubectl kustomize %s gives\n%v\nthe files hold\n%v", dir, keys(got), keys(want))
			}
		})
	}

	t.Run("overlays/storage-fencing", func(t *testing.T) {
		// The components on top of the base, as a site overlay uses them
		// (export-auth needs storage-fencing).
		root := t.TempDir()
		if err := os.CopyFS(root, os.DirFS(".")); err != nil {
			t.Fatal(err)
		}
		site := filepath.Join(root, "overlays", "site")
		if err := os.MkdirAll(site, 0o755); err != nil {
			t.Fatal(err)
		}
		k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../../base\ncomponents:\n  - ../storage-fencing\n  - ../export-auth\n"
		if err := os.WriteFile(filepath.Join(site, "kustomization.yaml"), []byte(k), 0o644); err != nil {
			t.Fatal(err)
		}
		byKey := map[string]object{}
		for _, o := range kustomize(t, site) {
			byKey[o.key()] = o
		}
		dep, ok := byKey["Deployment/"+namespace+"/"+controllerName]
		if !ok {
			t.Fatal("no controller Deployment")
		}
		args := dep.obj.(*appsv1.Deployment).Spec.Template.Spec.Containers[0].Args
		for _, want := range []string{"--storage-fencing=allow-host", "--out-of-service-taint=true", "--export-auth=dhchap"} {
			if !slices.Contains(args, want) {
				t.Errorf("the driver's args %v lack %s", args, want)
			}
		}
		role, ok := byKey["ClusterRole//rds-csi-controller-fencing"]
		if !ok {
			t.Fatalf("no ClusterRole rds-csi-controller-fencing; got %v", keys(kustomize(t, site)))
		}
		rules := role.obj.(*rbacv1.ClusterRole).Rules
		if len(rules) != 1 || !slices.Equal(rules[0].Resources, []string{"nodes"}) || !slices.Equal(rules[0].Verbs, []string{"update"}) {
			t.Errorf("the fencing ClusterRole grants %+v; want update on nodes only", rules)
		}
		nodeHeartbeat(t, byKey)
	})

	t.Run("overlays/example", func(t *testing.T) {
		// A copy of the tree with the two files an operator adds.
		root := t.TempDir()
		if err := os.CopyFS(root, os.DirFS(".")); err != nil {
			t.Fatal(err)
		}
		overlay := filepath.Join(root, "overlays", "example")
		for _, f := range []string{"id_ed25519", "known_hosts"} {
			if err := os.WriteFile(filepath.Join(overlay, f), []byte("test "+f+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		objs := kustomize(t, overlay)
		byKey := map[string]object{}
		for _, o := range objs {
			byKey[o.key()] = o
		}
		sec, ok := byKey["Secret/"+namespace+"/"+sshSecretName]
		if !ok {
			t.Fatalf("the overlay generates no Secret %s/%s; got %v", namespace, sshSecretName, keys(objs))
		}
		data := sec.obj.(*corev1.Secret).Data
		if string(data["id_ed25519"]) != "test id_ed25519\n" || string(data["known_hosts"]) != "test known_hosts\n" {
			t.Errorf("the generated Secret holds %v", data)
		}
		cm := byKey["ConfigMap/"+namespace+"/"+configMapName].obj.(*corev1.ConfigMap)
		if cm.Data["rds-address"] == "rds.example.invalid" || cm.Data["rds-volume-path"] == "" {
			t.Errorf("the overlay's ConfigMap patch did not apply (or dropped keys): %v", cm.Data)
		}
		if _, ok := byKey["Deployment/"+namespace+"/"+controllerName]; !ok {
			t.Error("the overlay lacks the controller")
		}
	})
}
