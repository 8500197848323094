package render

import (
	"encoding/base64"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

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
		{[]string{"imagePullSecrets[0].name=Reg Cred"}, "/imagePullSecrets/0/name"},
		// Refused by the driver at CreateVolume.
		{[]string{"storageClasses[0].name=x", "storageClasses[0].parameters.fsType=ext4"}, "fsType"},
		{[]string{`storageClasses[0].name=x`, `storageClasses[0].parameters.csi\.storage\.k8s\.io/fstype=btrfs`}, "fstype"},
		// extraArgs.
		{[]string{"controller.extraArgs[0]=--storage-fencing=allow-host"}, "--storage-fencing is set by the chart from storageFencing.enabled"},
		{[]string{"controller.extraArgs[0]=--out-of-service-taint"}, "storageFencing.outOfServiceTaint"},
		{[]string{"controller.extraArgs[0]=--rds-address=other"}, "--rds-address is set by the chart from rds.address"},
		{[]string{"node.extraArgs[0]=--v=5"}, "node.logLevel"},
		{[]string{"node.extraArgs[0]=--node-id=n1"}, "--node-id is set by the chart"},
		{[]string{"node.extraArgs[0]=--node-connector=loop"}, "--node-connector is for labs without a cluster"},
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

// driver-flags.txt, the flags the chart lets extraArgs give, is the
// driver's own list (its -h), so that a new flag of the driver is usable
// from the chart and a removed one is refused at render time.
func TestChartKnowsTheDriverFlags(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "rds-csi-driver")
	build := exec.Command("go", "build", "-o", bin, "./cmd/rds-csi-driver")
	build.Dir = root(t)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/rds-csi-driver: %v\n%s", err, out)
	}
	help, _ := exec.Command(bin, "-h").CombinedOutput() // the exit status of -h is the driver's business
	var driver []string
	for _, m := range regexp.MustCompile(`(?m)^  -(\S+)`).FindAllStringSubmatch(string(help), -1) {
		driver = append(driver, m[1])
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
