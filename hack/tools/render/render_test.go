package render

import (
	"context"
	"encoding/base64"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint/support"
)

func root(t *testing.T) string {
	t.Helper()
	r, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func helmObjects(t *testing.T, o HelmOptions) map[string]Object {
	t.Helper()
	return objects(t)(Helm(filepath.Join(root(t), "charts", "rds-csi"), o))
}

func kustomizeObjects(t *testing.T, dir string) map[string]Object {
	t.Helper()
	return objects(t)(Kustomize(dir))
}

// objects returns a function that splits a render into objects, failing t
// on the render's error or a bad stream.
func objects(t *testing.T) func([]byte, error) map[string]Object {
	return func(out []byte, err error) map[string]Object {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		objs, err := Objects(out)
		if err != nil {
			t.Fatal(err)
		}
		return objs
	}
}

// overlay writes a kustomization in a temporary directory with the given
// body (paths in it relative to the repository root) and returns its dir.
func overlay(t *testing.T, body string) string {
	t.Helper()
	dir := t.TempDir()
	rel, err := filepath.Rel(dir, root(t)) // kustomize refuses absolute paths
	if err != nil {
		t.Fatal(err)
	}
	body = strings.ReplaceAll(body, "ROOT", rel)
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// The chart with no values renders the same objects as the kustomize tree
// an install uses (manifests/: base + storageclass), field for field.
func TestChartDefaultEqualsKustomize(t *testing.T) {
	h := helmObjects(t, HelmOptions{})
	k := kustomizeObjects(t, filepath.Join(root(t), "manifests"))
	if d := Diff("kustomize", k, "helm", h); d != "" {
		t.Errorf("the chart's default render differs from manifests/:\n%s", d)
	}
	if len(k) < 15 {
		t.Errorf("kustomize rendered only %d objects", len(k))
	}
	t.Logf("%d objects equal", len(k))
}

// What the chart's values switch on equals the kustomize pieces that do
// the same: storage fencing as the component overlays/storage-fencing, the
// snapshot class as manifests/snapshot, and a site's address and Secret
// as the example overlay does them.
func TestChartValuesEqualKustomizePieces(t *testing.T) {
	cases := []struct {
		name string
		set  []string
		kust string
	}{
		{
			name: "storage fencing",
			set:  []string{"storageFencing.enabled=true"},
			kust: "resources: [ROOT/manifests]\ncomponents: [ROOT/manifests/overlays/storage-fencing]\n",
		},
		{
			name: "snapshot class",
			set:  []string{"volumeSnapshotClass.create=true"},
			kust: "resources: [ROOT/manifests, ROOT/manifests/snapshot]\n",
		},
		{
			name: "image",
			set:  []string{"image.repository=registry.example.internal/rds-csi-driver", "image.tag=v9.9.9"},
			kust: `resources: [ROOT/manifests]
images:
  - name: ghcr.io/srvlab/rds-csi-driver
    newName: registry.example.internal/rds-csi-driver
    newTag: v9.9.9
`,
		},
		{
			name: "replicas",
			set:  []string{"controller.replicas=3"},
			kust: `resources: [ROOT/manifests]
replicas:
  - name: rds-csi-controller
    count: 3
`,
		},
		{
			name: "more RDS",
			set:  []string{"extraRDS[0].name=rack-b", "extraRDS[0].address=192.0.2.20", "extraRDS[0].nodes[0]=rack-b-*"},
			kust: `resources: [ROOT/manifests]
patches:
  - target: {kind: ConfigMap, name: rds-csi-config}
    patch: |-
      - op: replace
        path: /data/rds-config.yaml
        value: "rds:\n- address: 192.0.2.20\n  name: rack-b\n  nodes:\n  - rack-b-*\n"
`,
		},
		{
			name: "site address",
			set:  []string{"rds.address=192.0.2.10", "rds.port=2222", "nvme.address=198.51.100.7"},
			kust: `resources: [ROOT/manifests]
patches:
  - target: {kind: ConfigMap, name: rds-csi-config}
    patch: |-
      - {op: replace, path: /data/rds-address, value: 192.0.2.10}
      - {op: replace, path: /data/rds-port, value: "2222"}
      - {op: replace, path: /data/nvme-address, value: 198.51.100.7}
`,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := helmObjects(t, HelmOptions{Set: c.set})
			k := kustomizeObjects(t, overlay(t, "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"+c.kust))
			if d := Diff("kustomize", k, "helm", h); d != "" {
				t.Errorf("helm --set %v differs from its kustomize equivalent:\n%s", c.set, d)
			}
		})
	}
}

// path walks o along keys (map keys, or "[i]" list indexes written as ints).
func path(o interface{}, keys ...interface{}) interface{} {
	if obj, ok := o.(Object); ok {
		o = map[string]interface{}(obj)
	}
	for _, k := range keys {
		switch k := k.(type) {
		case string:
			m, _ := o.(map[string]interface{})
			o = m[k]
		case int:
			l, _ := o.([]interface{})
			if k >= len(l) {
				return nil
			}
			o = l[k]
		}
	}
	return o
}

// The values a user changes that have no one-line kustomize twin land
// where the pods and classes read them.
func TestChartValues(t *testing.T) {
	h := helmObjects(t, HelmOptions{
		ValueFiles: []string{writeFile(t, "values.yaml", `
controller:
  nodeSelector: {node-role.kubernetes.io/control-plane: ""}
node:
  nodeSelector: {storage.example/nvme: "yes"}
  tolerations: [{key: dedicated, operator: Equal, value: storage, effect: NoSchedule}]
  kubeletDir: /var/lib/k0s/kubelet
rds:
  sshSecret:
    name: site-ssh
    create: true
    privateKey: "-----BEGIN OPENSSH PRIVATE KEY-----\nKEY\n-----END OPENSSH PRIVATE KEY-----\n"
    knownHosts: "rds.example.invalid ssh-ed25519 AAAAHOST\n"
storageClasses:
  - name: rds-xfs
    parameters: {csi.storage.k8s.io/fstype: xfs}
    allowVolumeExpansion: false
    reclaimPolicy: Retain
`)},
	})
	dep := h["Deployment/rds-csi/rds-csi-controller"]
	if got := path(dep, "spec", "template", "spec", "nodeSelector", "node-role.kubernetes.io/control-plane"); got != "" {
		t.Errorf("controller nodeSelector: %v", path(dep, "spec", "template", "spec", "nodeSelector"))
	}
	if got := path(dep, "spec", "template", "spec", "volumes", 1, "secret", "secretName"); got != "site-ssh" {
		t.Errorf("controller mounts Secret %v, want site-ssh", got)
	}
	ds := h["DaemonSet/rds-csi/rds-csi-node"]
	if got, _ := path(ds, "spec", "template", "spec", "nodeSelector").(map[string]interface{}); got["storage.example/nvme"] != "yes" || got["kubernetes.io/os"] != "linux" {
		// Helm merges a map value into the default one (a key set to null
		// removes a default key); lists replace.
		t.Errorf("node nodeSelector: %v", got)
	}
	if got := path(ds, "spec", "template", "spec", "tolerations", 0, "key"); got != "dedicated" {
		t.Errorf("node tolerations: %v", path(ds, "spec", "template", "spec", "tolerations"))
	}
	if got := path(ds, "spec", "template", "spec", "containers", 1, "args", 1); got != "--kubelet-registration-path=/var/lib/k0s/kubelet/plugins/rds.csi.srvlab.io/csi.sock" {
		t.Errorf("registrar: %v", got)
	}
	sec := h["Secret/rds-csi/site-ssh"]
	if path(sec, "data", "id_ed25519") != base64.StdEncoding.EncodeToString([]byte("-----BEGIN OPENSSH PRIVATE KEY-----\nKEY\n-----END OPENSSH PRIVATE KEY-----\n")) ||
		path(sec, "data", "known_hosts") != base64.StdEncoding.EncodeToString([]byte("rds.example.invalid ssh-ed25519 AAAAHOST\n")) {
		t.Errorf("Secret site-ssh: %v", sec)
	}
	sc := h["StorageClass//rds-xfs"]
	if path(sc, "parameters", "csi.storage.k8s.io/fstype") != "xfs" || path(sc, "allowVolumeExpansion") != false || path(sc, "reclaimPolicy") != "Retain" {
		t.Errorf("StorageClass rds-xfs: %v", sc)
	}
	if _, ok := h["StorageClass//rds-nvme-ext4"]; ok {
		t.Error("storageClasses replaces the default list, but rds-nvme-ext4 is still there")
	}
}

// A Secret asked for without its key is refused with the value's name.
func TestChartSecretNeedsItsKeys(t *testing.T) {
	_, err := Helm(filepath.Join(root(t), "charts", "rds-csi"), HelmOptions{Set: []string{"rds.sshSecret.create=true", "rds.sshSecret.knownHosts=rds.example.invalid ssh-ed25519 AAAAHOST"}})
	if err == nil || !strings.Contains(err.Error(), "rds.sshSecret.privateKey is required") {
		t.Errorf("err = %v, want one naming rds.sshSecret.privateKey", err)
	}
}

func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// helm lint (strict: warnings fail) finds nothing to say about the chart
// beyond information (such as a missing icon).
func TestChartLints(t *testing.T) {
	l := action.NewLint()
	l.Strict = true
	l.KubeVersion, _ = chartutil.ParseKubeVersion(KubeVersion)
	res := l.Run([]string{filepath.Join(root(t), "charts", "rds-csi")}, map[string]interface{}{})
	for _, m := range res.Messages {
		if m.Severity > support.InfoSev {
			t.Errorf("helm lint: %v", m)
		} else {
			t.Logf("helm lint: %v", m)
		}
	}
	for _, err := range res.Errors {
		t.Errorf("helm lint: %v", err)
	}
}

// A misspelt or mistyped value fails the render with the value named,
// instead of being ignored (values.schema.json); so does a value the
// driver refuses at start (its pods would crashloop) or the API server
// refuses (the install would fail half-way), and a driver flag in
// extraArgs that the chart sets from a value (the driver refuses a flag
// given twice; storage fencing through extraArgs would lack the RBAC
// storageFencing.enabled grants) or that the driver does not have
// (_validate.tpl).
func TestChartRefusesBadValues(t *testing.T) {
	for _, c := range []struct {
		set  []string
		want string
	}{
		{[]string{"storageFencing.enable=true"}, "enable"},
		{[]string{"controller.replicas=two"}, "replicas"},
		{[]string{"rds.port=70000"}, "port"},
		{[]string{"image.pullPolicy=Always"}, "pullPolicy"},
		{[]string{"image.digest=latest"}, "digest"},
		{[]string{"node.extraArgs[0]=storage-fencing"}, "extraArgs"},
		// The chart would make the release's own namespace.
		{[]string{"namespace.name="}, "namespace.name is empty while namespace.create is true"},
		// Refused by the driver at start.
		{[]string{"rds.name=rds 1"}, "/rds/name"},
		{[]string{"rds.volumePath=/storage-pool"}, `rds.volumePath "/storage-pool" is the storage pool itself`},
		{[]string{"rds.volumePath=/"}, "/rds/volumePath"},
		{[]string{"rds.volumePath=/storage-pool/../etc"}, "/rds/volumePath"},
		{[]string{"rds.pool=my pool"}, "/rds/pool"},
		{[]string{"rds.address=192.0.2.10:22"}, `rds.address "192.0.2.10:22" has a port`},
		{[]string{"rds.address=[fd00::1]", "rds.name=rds-1"}, "without brackets"},
		{[]string{"rds.address=rds 1", "rds.name=rds-1"}, `rds.address "rds 1" is not a host name`},
		{[]string{"rds.address=fd00::1"}, "rds.name is required"},
		{[]string{"nvme.address=192.0.2.11:4420"}, `nvme.address "192.0.2.11:4420" has a port`},
		{[]string{"rds.sshSecret.create=true", "rds.sshSecret.privateKey=ssh-ed25519 AAAAC3Nza driver@site", "rds.sshSecret.knownHosts=rds ssh-ed25519 AAAA"}, "rds.sshSecret.privateKey is not a private key"},
		{[]string{"rds.sshSecret.create=true", "rds.sshSecret.privateKey=-----BEGIN OPENSSH PRIVATE KEY-----", "rds.sshSecret.knownHosts=ssh-ed25519 AAAAHOST"}, "rds.sshSecret.knownHosts is not a known_hosts file"},
		// Refused by the API server.
		{[]string{"storageClasses[0].name=Fast_NVMe"}, "/storageClasses/0/name"},
		{[]string{"volumeSnapshotClass.create=true", "volumeSnapshotClass.name=Snap Class"}, "/volumeSnapshotClass/name"},
		{[]string{"rds.sshSecret.name=RDS_SSH"}, "/rds/sshSecret/name"},
		{[]string{"controller.priorityClassName=High Priority"}, "/controller/priorityClassName"},
		{[]string{"node.nodeSelector.disk=fast nvme"}, "/node/nodeSelector/disk"},
		{[]string{"controller.tolerations[0].key=x", "controller.tolerations[0].efect=NoSchedule"}, "efect"},
		{[]string{"controller.resources.limit.memory=1Gi"}, "limit"},
		{[]string{"image.repository=ghcr.io/srvlab/rds-csi-driver:v1"}, "/image/repository"},
		{[]string{"image.tag=v 1"}, "/image/tag"},
		{[]string{"node.kubeletDir=/"}, "/node/kubeletDir"},
		{[]string{"node.labLoopDataDir=rds-pool"}, "/node/labLoopDataDir"},
		{[]string{"imagePullSecrets[0].name=Reg Cred"}, "/imagePullSecrets/0/name"},
		// Refused by the driver at CreateVolume.
		{[]string{"storageClasses[0].name=x", "storageClasses[0].parameters.fsType=ext4"}, "fsType"},
		{[]string{`storageClasses[0].name=x`, `storageClasses[0].parameters.csi\.storage\.k8s\.io/fstype=btrfs`}, "fstype"},
		{[]string{"storageClasses[0].name=x", "storageClasses[0].parameters.rds=rack-z", "extraRDS[0].name=rack-b", "extraRDS[0].address=192.0.2.20"}, `storageClasses[0].parameters.rds "rack-z" names no RDS of the chart`},
		{[]string{"storageClasses[0].name=x", "storageClasses[0].parameters.rdsName=rack-b"}, "rdsName"},
		{[]string{"extraRDS[0].name=rack-b", "extraRDS[0].address=192.0.2.20", "extraRDS[0].knownHosts=x"}, "knownHosts"},
		// extraArgs.
		{[]string{"controller.extraArgs[0]=--storage-fencing=allow-host"}, "--storage-fencing is set by the chart from storageFencing.enabled"},
		{[]string{"controller.extraArgs[0]=--out-of-service-taint"}, "storageFencing.outOfServiceTaint"},
		{[]string{"controller.extraArgs[0]=--rds-address=other"}, "--rds-address is set by the chart from rds.address"},
		{[]string{"controller.extraArgs[0]=--rds-config=/x.yaml"}, "--rds-config is set by the chart from extraRDS"},
		{[]string{"node.extraArgs[0]=--v=5"}, "node.logLevel"},
		{[]string{"node.extraArgs[0]=--node-id=n1"}, "--node-id is set by the chart"},
		{[]string{"node.extraArgs[0]=--node-connector=loop"}, "--node-connector is node.labLoopDataDir (labs only"},
		{[]string{"controller.extraArgs[0]=--driver-name=other.example"}, "--driver-name must stay rds.csi.srvlab.io"},
		{[]string{"controller.extraArgs[0]=--attachment-key-file=/k"}, "names a file the chart does not mount"},
		{[]string{"controller.extraArgs[0]=--not-ready-threshold=60s", "controller.extraArgs[1]=--not-ready-threshold=30s"}, "controller.extraArgs gives --not-ready-threshold twice"},
		{[]string{"controller.extraArgs[0]=--not-ready-treshold=60s"}, "the driver has no flag --not-ready-treshold"},
		{[]string{"controller.extraArgs[0]=--not-ready-threshold 60s"}, "/controller/extraArgs/0"},
	} {
		out, err := Helm(filepath.Join(root(t), "charts", "rds-csi"), HelmOptions{Set: c.set})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--set %q: err = %v (render of %d bytes), want a refusal saying %q", c.set, err, len(out), c.want)
		}
	}
}

// Two StorageClasses of one name (the API server would refuse the second
// half-way through the install) are refused with both indexes.
func TestChartRefusesDuplicateStorageClasses(t *testing.T) {
	_, err := Helm(filepath.Join(root(t), "charts", "rds-csi"), HelmOptions{ValueFiles: []string{writeFile(t, "values.yaml", `
storageClasses:
  - name: fast
  - name: slow
  - name: fast
`)}})
	if err == nil || !strings.Contains(err.Error(), `storageClasses[2].name "fast" is also storageClasses[0].name`) {
		t.Errorf("err = %v, want the duplicate StorageClass named", err)
	}
}

// What the checks must let through renders: an extra flag of the driver
// the chart does not set, an IPv6 RDS with its name, fencing through its
// value.
func TestChartAcceptsGoodValues(t *testing.T) {
	h := helmObjects(t, HelmOptions{Set: []string{"controller.extraArgs[0]=--not-ready-threshold=60s",
		"node.extraArgs[0]=--nvme-fast-io-fail-timeout=10s", "rds.address=fd00::1", "rds.name=rds-1",
		"storageFencing.enabled=true", "namespace.create=false", "namespace.name="}})
	args := path(h["Deployment/rds-csi/rds-csi-controller"], "spec", "template", "spec", "containers", 0, "args").([]interface{})
	if args[len(args)-1] != "--not-ready-threshold=60s" {
		t.Errorf("controller args end with %v, want the extra flag", args[len(args)-1])
	}
	if _, ok := h["ClusterRole//rds-csi-controller-fencing"]; !ok {
		t.Error("storageFencing.enabled rendered no fencing RBAC")
	}
	if _, ok := h["Namespace//rds-csi"]; ok {
		t.Error("namespace.create=false rendered a Namespace")
	}
}

// What the driver and the API server take renders: a known_hosts line for
// the RDS among others (by name, in a list of names, as [host]:port on
// another port, hashed, or a wildcard pattern the chart cannot match), and
// resource quantities in every form the API server takes.
func TestChartAcceptsWhatTheDriverTakes(t *testing.T) {
	for _, c := range []struct {
		address    string
		port       int
		knownHosts string
	}{
		{"192.0.2.10", 22, "# pinned\nrds-old ssh-ed25519 AAAAOLD\n192.0.2.10 ssh-ed25519 AAAAHOST\n"},
		{"rds.lan", 22, "rds,rds.lan,192.0.2.10 ssh-ed25519 AAAAHOST"},
		{"192.0.2.10", 2222, "[192.0.2.10]:2222 ssh-ed25519 AAAAHOST"},
		{"fd00::1", 22, "fd00::1 ssh-ed25519 AAAAHOST"},
		{"192.0.2.10", 22, "|1|c2FsdA==|aGFzaA== ssh-ed25519 AAAAHOST"},
		{"192.0.2.10", 22, "@cert-authority *.lan ssh-ed25519 AAAACA\n192.0.2.* ssh-ed25519 AAAAHOST"},
	} {
		values := fmt.Sprintf("rds:\n  address: %q\n  name: rds-1\n  port: %d\n  sshSecret:\n    create: true\n    privateKey: \"-----BEGIN OPENSSH PRIVATE KEY-----\"\n    knownHosts: %q\n",
			c.address, c.port, c.knownHosts)
		if _, err := Helm(filepath.Join(root(t), "charts", "rds-csi"), HelmOptions{ValueFiles: []string{writeFile(t, "values.yaml", values)}}); err != nil {
			t.Errorf("rds.address %s, rds.port %d, knownHosts %q: %v", c.address, c.port, c.knownHosts, err)
		}
	}
	set := []string{"controller.resources.limits.memory=1Gi", "controller.resources.requests.cpu=0.5", "node.resources.requests.cpu=100m",
		"node.resources.limits.memory=268435456", "node.resources.limits.cpu=2", "controller.resources.requests.memory=1e9"}
	if _, err := Helm(filepath.Join(root(t), "charts", "rds-csi"), HelmOptions{Set: set}); err != nil {
		t.Errorf("--set %q: %v", set, err)
	}
}

// driver-flags.txt, the flags the chart lets extraArgs give and the type of
// each one's value, is the driver's own list (its -h), so that a new flag
// of the driver is usable from the chart, a removed one is refused at
// render time, and each value is checked as the driver parses it.
func TestChartKnowsTheDriverFlags(t *testing.T) {
	help, _ := exec.Command(driverBinary(t), "-h").CombinedOutput() // the exit status of -h is the driver's business
	var driver []string
	for _, m := range regexp.MustCompile(`(?m)^  -(\S+)(?: (\S+))?`).FindAllStringSubmatch(string(help), -1) {
		typ := m[2]
		if typ == "" {
			typ = "bool" // the flag package prints no type for a bool
		}
		driver = append(driver, m[1]+" "+typ)
	}
	if len(driver) < 20 {
		t.Fatalf("found only %d flags in rds-csi-driver -h:\n%s", len(driver), help)
	}
	data, err := os.ReadFile(filepath.Join(root(t), "charts", "rds-csi", "driver-flags.txt"))
	if err != nil {
		t.Fatal(err)
	}
	var chart []string
	for _, l := range strings.Split(string(data), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			chart = append(chart, l)
		}
	}
	slices.Sort(driver)
	slices.Sort(chart)
	if !slices.Equal(driver, chart) {
		t.Errorf("charts/rds-csi/driver-flags.txt differs from rds-csi-driver -h: update it to\n%s", strings.Join(driver, "\n"))
	}
}

// driverBin is rds-csi-driver built once for the tests that run it.
var driverBin struct {
	once      sync.Once
	dir, path string
	err       error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if driverBin.dir != "" {
		os.RemoveAll(driverBin.dir)
	}
	os.Exit(code)
}

func driverBinary(t *testing.T) string {
	t.Helper()
	driverBin.once.Do(func() {
		r, err := RepoRoot()
		if err != nil {
			driverBin.err = err
			return
		}
		if driverBin.dir, driverBin.err = os.MkdirTemp("", "render-driver-"); driverBin.err != nil {
			return
		}
		driverBin.path = filepath.Join(driverBin.dir, "rds-csi-driver")
		build := exec.Command("go", "build", "-o", driverBin.path, "./cmd/rds-csi-driver")
		build.Dir = r
		if out, err := build.CombinedOutput(); err != nil {
			driverBin.err = fmt.Errorf("go build ./cmd/rds-csi-driver: %v\n%s", err, out)
		}
	})
	if driverBin.err != nil {
		t.Fatal(driverBin.err)
	}
	return driverBin.path
}

// The chart's checks of extraArgs values agree with the driver: for each
// input, the chart renders exactly when the driver, started with the
// controller args the chart renders, gets past its flag checks (it then
// stops at the next step, the Kubernetes API it finds no config for). The
// inputs sit on both sides of each range the chart copies from the driver,
// so a range changed in the driver fails here until the chart follows.
func TestChartFlagValuesAgreeWithTheDriver(t *testing.T) {
	bin := driverBinary(t)
	fencing := []string{"storageFencing.enabled=true"}
	for _, c := range []struct {
		args []string
		set  []string
	}{
		{[]string{"--not-ready-threshold=0"}, nil},
		{[]string{"--not-ready-threshold=1m30s"}, nil},
		{[]string{"--not-ready-threshold=-1s"}, nil},
		{[]string{"--not-ready-threshold=abc"}, nil},
		{[]string{"--not-ready-threshold"}, nil},
		{[]string{"--heartbeat-threshold=10s"}, nil},
		{[]string{"--heartbeat-threshold=0"}, nil},
		{[]string{"--heartbeat-threshold=5s"}, fencing},
		{[]string{"--heartbeat-threshold=4.5s"}, fencing},
		{[]string{"--not-ready-threshold=0", "--heartbeat-threshold=0"}, fencing},
		{[]string{"--not-ready-threshold=0", "--heartbeat-threshold=0"}, append([]string{"storageFencing.outOfServiceTaint=false"}, fencing...)},
		{[]string{"--not-ready-threshold=0"}, fencing},
		{[]string{"--rds-health-interval=0"}, nil},
		{[]string{"--rds-health-interval=5s"}, nil},
		{[]string{"--rds-health-interval=4999ms"}, nil},
		{[]string{"--rds-health-interval=1h"}, nil},
		{[]string{"--rds-health-interval=1h0m1s"}, nil},
		{[]string{"--rds-command-timeout=1s"}, nil},
		{[]string{"--rds-command-timeout=999ms"}, nil},
		{[]string{"--rds-command-timeout=10m"}, nil},
		{[]string{"--rds-command-timeout=10m1s"}, nil},
		{[]string{"--shutdown-grace=10m"}, nil},
		{[]string{"--shutdown-grace=0"}, nil},
		{[]string{"--shutdown-grace=-1s"}, nil},
		{[]string{"--shutdown-grace=601s"}, nil},
		{[]string{"--export-reconcile-period=1s"}, nil},
		{[]string{"--export-reconcile-period=1s"}, fencing},
		{[]string{"--export-reconcile-period=0.5s"}, fencing},
		{[]string{"--migration-timeout=0"}, nil},
		{[]string{"--migration-timeout=1ns"}, nil},
		{[]string{"--migration-timeout=9s"}, nil},
		{[]string{"--migration-timeout=10s"}, nil},
		{[]string{"--orphaned-claim-threshold=0"}, nil},
		{[]string{"--orphaned-claim-threshold=-1h"}, nil},
		{[]string{"--orphaned-claim-threshold=1ns"}, nil},
		{[]string{"--orphaned-claim-threshold=59s"}, nil},
		{[]string{"--orphaned-claim-threshold=1m"}, nil},
		{[]string{"--orphaned-claim-threshold=24h"}, nil},
		{[]string{"--orphaned-claim-threshold=24h0m1s"}, nil},
		{[]string{"--not-ready-threshold=1ns"}, nil},
		{[]string{"--not-ready-threshold=5s"}, nil},
		{[]string{"--not-ready-threshold=24h1s"}, nil},
		{[]string{"--watch-disconnect-threshold=0"}, nil},
		{[]string{"--watch-disconnect-threshold=4s"}, nil},
		{[]string{"--watch-disconnect-threshold=5s"}, nil},
		{[]string{"--fence-call-timeout=0s"}, nil},
		{[]string{"--fence-call-timeout=999ms"}, nil},
		{[]string{"--fence-call-timeout=1s"}, nil},
		{[]string{"--fence-call-timeout=10m"}, nil},
		{[]string{"--fence-call-timeout=10m1s"}, nil},
		{[]string{"--migration-timeout=24h"}, nil},
		{[]string{"--migration-timeout=24h0m1s"}, nil},
		{[]string{"--watch-disconnect-threshold=10m"}, nil},
		{[]string{"--watch-disconnect-threshold=601s"}, nil},
		{[]string{"--export-reconcile-period=1h"}, fencing},
		{[]string{"--export-reconcile-period=1h0m1s"}, fencing},
		{[]string{"--shutdown-grace=1ns"}, nil},
		{[]string{"--shutdown-grace=1s"}, nil},
		{[]string{"--fence-guard-share=NaN"}, nil},
		{[]string{"--fence-guard-share=Inf"}, nil},
		{[]string{"--nvme-ctrl-loss-timeout=30s"}, nil},
		{[]string{"--max-volumes-per-node=8"}, nil},
		{[]string{"--node-state-dir=/var/lib/rds-csi"}, nil},
		{[]string{"--attach-grace-period=-1s"}, nil},
		{[]string{"--fence-guard-share=1"}, nil},
		{[]string{"--fence-guard-share=0.3"}, fencing},
		{[]string{"--fence-guard-share=0.3", "--not-ready-threshold=0", "--heartbeat-threshold=0"}, append([]string{"storageFencing.outOfServiceTaint=false"}, fencing...)},
		{[]string{"--fence-guard-share=0.3", "--not-ready-threshold=0"}, fencing},
		{[]string{"--fence-guard-share=0.3", "--not-ready-threshold=30s"}, nil},
		{[]string{"--fence-guard-share=0"}, nil},
		{[]string{"--fence-guard-share=1.5"}, nil},
		{[]string{"--copy-from-data=unsupported"}, nil},
		{[]string{"--copy-from-data=no"}, nil},
		{[]string{"--rds-insecure-skip-host-key-check=yes"}, nil},
		{[]string{"--logtostderr=false"}, nil},
		{[]string{"--nqn-prefix=nqn.2000-02.com.example:rds-1:"}, nil},
		{[]string{"--nqn-prefix=iqn.2000-02.com.example:"}, nil},
		{[]string{"--nqn-prefix=nqn.2000-02.com.example:rds 1:"}, nil},
	} {
		set := slices.Clone(c.set)
		for i, a := range c.args {
			set = append(set, fmt.Sprintf("controller.extraArgs[%d]=%s", i, a))
		}
		out, renderErr := Helm(filepath.Join(root(t), "charts", "rds-csi"), HelmOptions{Set: set})
		var args []string
		if renderErr != nil {
			// What the chart would have rendered: its default args and these.
			var err error
			if out, err = Helm(filepath.Join(root(t), "charts", "rds-csi"), HelmOptions{Set: c.set}); err != nil {
				t.Fatalf("--set %q: %v", c.set, err)
			}
			args = append(controllerArgs(t, out), c.args...)
		} else {
			args = controllerArgs(t, out)
		}
		driverTook, stderr := driverTakesFlags(t, bin, args, rdsConfig(t, out), "the controller needs the Kubernetes API")
		if chartTook := renderErr == nil; chartTook != driverTook {
			t.Errorf("--set %q: chart renders %v (%v), driver takes the flags %v (%s)", set, chartTook, renderErr, driverTook, stderr)
		}
	}
}

// The chart's checks of extraRDS agree with the driver's of --rds-config:
// for each list, the chart renders exactly when the driver, started with
// the controller args and the list the chart renders, gets past its checks
// (a refused list is given to the driver as the chart would have rendered
// it).
func TestChartRDSListAgreesWithTheDriver(t *testing.T) {
	bin := driverBinary(t)
	type box map[string]string
	for _, c := range []struct {
		name  string
		boxes []box
		more  []string
	}{
		{"one more", []box{{"name": "rack-b", "address": "192.0.2.20"}}, nil},
		{"two more, own ports", []box{{"name": "rack-b", "address": "192.0.2.20", "port": "2222", "nvmePort": "4421"}, {"name": "rack-c", "address": "rds-c.example.net", "commandTimeout": "5s", "maxSessions": "2"}}, nil},
		{"a name twice", []box{{"name": "rack-b", "address": "192.0.2.20"}, {"name": "Rack-B", "address": "192.0.2.21"}}, nil},
		{"the default's name", []box{{"name": "rds-1", "address": "192.0.2.20"}}, nil},
		{"the default's address", []box{{"name": "rack-b", "address": "192.0.2.10"}}, nil},
		{"another port of the default's address", []box{{"name": "rack-b", "address": "192.0.2.10", "port": "2222", "nvmePort": "4421"}}, nil},
		{"the default's NVMe target", []box{{"name": "rack-b", "address": "192.0.2.20", "nvmeAddress": "192.0.2.10"}}, nil},
		{"not a label value", []box{{"name": "rack b", "address": "192.0.2.20"}}, nil},
		{"too long for the node label", []box{{"name": strings.Repeat("b", 60), "address": "192.0.2.20"}}, nil},
		{"59 characters", []box{{"name": strings.Repeat("b", 59), "address": "192.0.2.20"}}, nil},
		{"an address with a port", []box{{"name": "rack-b", "address": "192.0.2.20:22"}}, nil},
		{"no address", []box{{"name": "rack-b"}}, nil},
		{"the pool as volume path", []box{{"name": "rack-b", "address": "192.0.2.20", "pool": "p2", "volumePath": "/p2"}}, nil},
		{"a command timeout of an hour", []box{{"name": "rack-b", "address": "192.0.2.20", "commandTimeout": "1h"}}, nil},
		{"a command timeout of 10m", []box{{"name": "rack-b", "address": "192.0.2.20", "commandTimeout": "9m60s"}}, nil},
		{"a StorageClass pinning a box", []box{{"name": "rack-b", "address": "192.0.2.20"}}, []string{"storageClasses[0].name=b", "storageClasses[0].parameters.rds=rack-b"}},
	} {
		// The default box as driverTakesFlags starts the driver.
		def := []string{"rds.address=192.0.2.10", "rds.name=rds-1"}
		set := append(slices.Clone(def), c.more...)
		var list strings.Builder
		list.WriteString("rds:\n")
		for i, b := range c.boxes {
			for j, k := range slices.Sorted(maps.Keys(b)) {
				v := b[k]
				set = append(set, fmt.Sprintf("extraRDS[%d].%s=%s", i, k, v))
				lead := "  "
				if j == 0 {
					lead = "- "
				}
				if k == "port" || k == "nvmePort" || k == "maxSessions" {
					fmt.Fprintf(&list, "%s%s: %s\n", lead, k, v)
				} else {
					fmt.Fprintf(&list, "%s%s: %q\n", lead, k, v)
				}
			}
		}
		out, renderErr := Helm(filepath.Join(root(t), "charts", "rds-csi"), HelmOptions{Set: set})
		text := list.String()
		if renderErr == nil {
			text = rdsConfig(t, out)
		}
		base, err := Helm(filepath.Join(root(t), "charts", "rds-csi"), HelmOptions{Set: def})
		if err != nil {
			t.Fatal(err)
		}
		driverTook, stderr := driverTakesFlags(t, bin, controllerArgs(t, base), text, "the controller needs the Kubernetes API")
		if chartTook := renderErr == nil; chartTook != driverTook {
			t.Errorf("%s: chart renders %v (%v), driver takes the list %v (%s)", c.name, chartTook, renderErr, driverTook, stderr)
		}
	}
}

// controllerArgs are the controller container's args in a render.
func controllerArgs(t *testing.T, stream []byte) []string {
	return podArgs(t, stream, "Deployment/rds-csi/rds-csi-controller")
}

// podArgs are the args of the first container of a workload in a render.
func podArgs(t *testing.T, stream []byte, workload string) []string {
	t.Helper()
	objs, err := Objects(stream)
	if err != nil {
		t.Fatal(err)
	}
	var args []string
	for _, a := range path(objs[workload], "spec", "template", "spec", "containers", 0, "args").([]interface{}) {
		args = append(args, a.(string))
	}
	return args
}

// rdsConfig is the ConfigMap's rds-config.yaml in a render (the file the
// pods mount for --rds-config).
func rdsConfig(t *testing.T, stream []byte) string {
	t.Helper()
	objs, err := Objects(stream)
	if err != nil {
		t.Fatal(err)
	}
	text, ok := path(objs["ConfigMap/rds-csi/rds-csi-config"], "data", "rds-config.yaml").(string)
	if !ok {
		t.Fatal("the ConfigMap rds-csi-config has no rds-config.yaml")
	}
	return text
}

// The node plugin's extraArgs, likewise: the chart renders exactly when
// the node plugin, started with the args the chart renders, gets past its
// flag checks. With storage fencing the node plugin keeps a Lease, so it
// stops at the Kubernetes API it finds no config for, before it touches
// the host's /etc/nvme.
func TestChartNodeFlagValuesAgreeWithTheDriver(t *testing.T) {
	bin := driverBinary(t)
	fencing := []string{"storageFencing.enabled=true"}
	for _, args := range [][]string{
		{"--nvme-ctrl-loss-timeout=30s"},
		{"--nvme-ctrl-loss-timeout=29s"},
		{"--nvme-ctrl-loss-timeout=61m"},
		{"--nvme-fast-io-fail-timeout=0"},
		{"--nvme-fast-io-fail-timeout=500ms"},
		{"--nvme-fast-io-fail-timeout=5m"},
		{"--nvme-fast-io-fail-timeout=40s", "--nvme-ctrl-loss-timeout=40s"},
		{"--nvme-fast-io-fail-timeout=39s", "--nvme-ctrl-loss-timeout=40s"},
		{"--max-volumes-per-node=0"},
		{"--max-volumes-per-node=-5"},
		{"--max-volumes-per-node=many"},
		{"--shutdown-grace=1ns"},
		{"--shutdown-grace=30s"},
		{"--copy-from-data=unsupported"},
		{"--not-ready-threshold=1m"},
		{"--orphaned-claim-threshold=10m"},
		{"--fence-guard-share=0.5"},
		{"--rds-pool=other"},
		{"--node-lease-duration=10s"},
		{"--node-lease-duration=9s"},
		{"--node-lease-duration=12500ms"},
	} {
		set := slices.Clone(fencing)
		for i, a := range args {
			set = append(set, fmt.Sprintf("node.extraArgs[%d]=%s", i, a))
		}
		out, renderErr := Helm(filepath.Join(root(t), "charts", "rds-csi"), HelmOptions{Set: set})
		var pod []string
		if renderErr != nil {
			var err error
			if out, err = Helm(filepath.Join(root(t), "charts", "rds-csi"), HelmOptions{Set: fencing}); err != nil {
				t.Fatalf("--set %q: %v", fencing, err)
			}
			pod = append(podArgs(t, out, "DaemonSet/rds-csi/rds-csi-node"), args...)
		} else {
			pod = podArgs(t, out, "DaemonSet/rds-csi/rds-csi-node")
		}
		driverTook, stderr := driverTakesFlags(t, bin, pod, rdsConfig(t, out), "--node-lease needs the Kubernetes API")
		if chartTook := renderErr == nil; chartTook != driverTook {
			t.Errorf("--set %q: chart renders %v (%v), driver takes the flags %v (%s)", set, chartTook, renderErr, driverTook, stderr)
		}
	}
}

// driverTakesFlags runs the driver with a pod's args, made runnable here:
// the $(VAR)s get values, the CSI socket a temporary path, --rds-config
// the ConfigMap's list (rdsList) in a file, and no HTTP port is opened.
// It reports whether the driver got past its flag checks and its list's,
// to the Kubernetes API (which it cannot find outside a pod: it exits
// saying past, which the caller gives).
func driverTakesFlags(t *testing.T, bin string, podArgs []string, rdsList, past string) (bool, string) {
	t.Helper()
	vars := strings.NewReplacer("$(RDS_ADDRESS)", "192.0.2.10", "$(RDS_PORT)", "22", "$(RDS_USER)", "csi", "$(RDS_NAME)", "rds-1",
		"$(RDS_POOL)", "storage-pool", "$(RDS_VOLUME_PATH)", "/storage-pool/kubernetes-volumes", "$(NVME_ADDRESS)", "192.0.2.10",
		"$(NVME_PORT)", "4420", "$(NAMESPACE)", "rds-csi", "$(NODE_NAME)", "worker-1")
	var args []string
	for _, a := range podArgs {
		switch {
		case strings.HasPrefix(a, "--http-endpoint="):
		case strings.HasPrefix(a, "--endpoint="):
			args = append(args, "--endpoint=unix://"+filepath.Join(t.TempDir(), "csi.sock"))
		case strings.HasPrefix(a, "--rds-config="):
			args = append(args, "--rds-config="+writeFile(t, "rds-config.yaml", rdsList))
		default:
			args = append(args, vars.Replace(a))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "KUBERNETES_") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	out, err := cmd.CombinedOutput()
	if err == nil || ctx.Err() != nil {
		t.Fatalf("rds-csi-driver %q: %v, want it to stop at the Kubernetes API:\n%s", args, err, out)
	}
	return strings.Contains(string(out), past), strings.TrimSpace(string(out))
}

// Values the driver or the API server would refuse once installed fail the
// render, naming the value (review of issue 25, second pass: each rendered,
// and the install failed half-way or the controller crashlooped).
func TestChartRefusesWhatTheDriverOrAPIRefuses(t *testing.T) {
	for _, c := range []struct {
		hole string
		set  []string
		want string
	}{
		// (was: install fails half-way: the API server refuses the
		// Deployment, "quantities must match the regular expression"):
		// go run ./cmd/render helm -set controller.resources.limits.memory=abc
		// renders `memory: abc`; the schema checks the field names only.
		{"resource quantity", []string{"controller.resources.limits.memory=abc"}, "controller.resources.limits.memory"},
		{"resource quantity", []string{"node.resources.requests.cpu=lots"}, "node.resources.requests.cpu"},
		// (was: controller crashloop: the driver refuses at start
		// "--heartbeat-threshold needs --storage-fencing=allow-host"):
		// -set controller.extraArgs[0]=--heartbeat-threshold=10s with
		// storageFencing.enabled=false (the default) renders.
		{"flag needs fencing", []string{"controller.extraArgs[0]=--heartbeat-threshold=10s"}, "storageFencing.enabled"},
		// (was: every volume attaches without the driver's attachment index
		// or fencing: the chart's CSIDriver says attachRequired: true, and
		// the driver's own -h says --publish=false is "only for deployments
		// without attach (CSIDriver attachRequired: false)"):
		// -set controller.extraArgs[0]=--publish=false renders.
		{"publish off with attach", []string{"controller.extraArgs[0]=--publish=false"}, "--publish"},
		// (was: controller crashloop: the driver refuses at start
		// "--out-of-service-taint needs ... a positive --not-ready-threshold
		// or --heartbeat-threshold"): storageFencing.outOfServiceTaint is
		// true by default, and turning both thresholds off renders. Input:
		// -set storageFencing.enabled=true
		// -set controller.extraArgs[0]=--not-ready-threshold=0
		// -set controller.extraArgs[1]=--heartbeat-threshold=0
		{"taint without a threshold", []string{"storageFencing.enabled=true", "controller.extraArgs[0]=--not-ready-threshold=0",
			"controller.extraArgs[1]=--heartbeat-threshold=0"}, "storageFencing.outOfServiceTaint"},
		// (was: controller crashloop: the driver refuses the value at
		// start): extraArgs values are never checked, only flag names:
		// -set controller.extraArgs[0]=--rds-health-interval=1s (driver: 5s
		// to 1h), --not-ready-threshold=abc (not a duration),
		// --shutdown-grace=-1s, node.extraArgs[0]=--max-volumes-per-node=-5.
		{"flag value", []string{"controller.extraArgs[0]=--rds-health-interval=1s"}, "--rds-health-interval"},
		{"flag value", []string{"controller.extraArgs[0]=--not-ready-threshold=abc"}, "--not-ready-threshold"},
		{"flag value", []string{"controller.extraArgs[0]=--shutdown-grace=-1s"}, "--shutdown-grace"},
		{"flag value", []string{"node.extraArgs[0]=--max-volumes-per-node=-5"}, "--max-volumes-per-node"},
		// Found beside them: a prefix too long for any volume's NQN.
		{"flag value", []string{"controller.extraArgs[0]=--nqn-prefix=nqn.2000-02.com.example:" + strings.Repeat("a", 160)}, "--nqn-prefix"},
		// (was: controller crashloop: the driver refuses at start "known_hosts
		// has no entry for 192.0.2.10", or "for [192.0.2.10]:2222" on another
		// port): with rds.sshSecret.create the chart checks that knownHosts
		// looks like known_hosts lines, not that one names rds.address (in
		// [host]:port form when rds.port is not 22). Inputs:
		// -set rds.address=192.0.2.10,rds.sshSecret.create=true,
		//   rds.sshSecret.privateKey=<PEM>,rds.sshSecret.knownHosts="rds-old ssh-ed25519 AAAA"
		// and the same with knownHosts "192.0.2.10 ssh-ed25519 AAAA" and rds.port=2222.
		{"known_hosts without the RDS", []string{"rds.address=192.0.2.10", "rds.sshSecret.create=true",
			"rds.sshSecret.privateKey=-----BEGIN OPENSSH PRIVATE KEY-----", "rds.sshSecret.knownHosts=rds-old ssh-ed25519 AAAAHOST"}, "rds.sshSecret.knownHosts"},
		{"known_hosts without the RDS's port", []string{"rds.address=192.0.2.10", "rds.port=2222", "rds.sshSecret.create=true",
			"rds.sshSecret.privateKey=-----BEGIN OPENSSH PRIVATE KEY-----", "rds.sshSecret.knownHosts=192.0.2.10 ssh-ed25519 AAAAHOST"}, "rds.sshSecret.knownHosts"},
	} {
		out, err := Helm(filepath.Join(root(t), "charts", "rds-csi"), HelmOptions{Set: c.set})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: --set %q: err = %v (render of %d bytes), want a refusal naming %q", c.hole, c.set, err, len(out), c.want)
		}
	}
}
