//go:build kubelet

package kubelet

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/srvlab/rds-csi/e2e/framework"
)

// The kustomize base (manifests/, as `kubectl apply -k` builds it) on real
// kubelets, with an overlay of what a site sets: the RDS in the ConfigMap,
// the SSH Secret (manifests/examples/ssh-secret.yaml's shape), the lab's
// loop connector on the DaemonSet, and the stand-in node sidecars' images.
// The node plugin registers and a pod's filesystem volume takes a pattern.
func TestKustomizeBaseOnRealKubelets(t *testing.T) {
	parallelLab(t, labShort)
	l := NewLab(t, LabOptions{NoInstall: true})
	e := l.Env
	dir := t.TempDir()
	kh := filepath.Join(dir, "known_hosts")
	if err := l.Sim.WriteKnownHosts(kh, framework.LabRDSAddress+":"+strconv.Itoa(l.Sim.Port)); err != nil {
		t.Fatal(err)
	}
	key, err := os.ReadFile(l.Sim.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "id_ed25519"), key, 0o600); err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(dir, filepath.Join(e.Root, "manifests"))
	if err != nil {
		t.Fatal(err)
	}
	driverRepo, driverTag := splitRef(l.DriverImage)
	kust := `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [` + rel + `]
secretGenerator:
  - name: rds-csi-ssh
    namespace: rds-csi
    options: {disableNameSuffixHash: true}
    files: [id_ed25519, known_hosts]
images:
  - name: ghcr.io/srvlab/rds-csi-driver
    newName: ` + driverRepo + `
    newTag: ` + driverTag + `
  - name: registry.k8s.io/sig-storage/csi-node-driver-registrar
    newName: ` + strings.Split(l.Tier.ImageRefs["lab-registrar"], ":")[0] + `
    newTag: lab
  - name: registry.k8s.io/sig-storage/livenessprobe
    newName: ` + strings.Split(l.Tier.ImageRefs["lab-livenessprobe"], ":")[0] + `
    newTag: lab
patches:
  - patch: |
      apiVersion: v1
      kind: ConfigMap
      metadata: {name: rds-csi-config, namespace: rds-csi}
      data:
        rds-address: "` + framework.LabRDSAddress + `"
        rds-port: "` + strconv.Itoa(l.Sim.Port) + `"
        rds-user: admin
        rds-name: ` + framework.RDSName + `
  - patch: |
      apiVersion: apps/v1
      kind: DaemonSet
      metadata: {name: rds-csi-node, namespace: rds-csi}
      spec:
        template:
          spec:
            containers:
              - name: rds-csi-plugin
                volumeMounts:
                  - {name: lab-loop-data, mountPath: ` + l.Sim.PoolDir + `}
            volumes:
              - name: lab-loop-data
                hostPath: {path: ` + l.Sim.PoolDir + `, type: Directory}
  - target: {kind: DaemonSet, name: rds-csi-node}
    patch: |
      - op: add
        path: /spec/template/spec/containers/0/args/-
        value: --node-connector=loop
      - op: add
        path: /spec/template/spec/containers/0/args/-
        value: --node-loop-data-dir=` + l.Sim.PoolDir + `
`
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kust), 0o644); err != nil {
		t.Fatal(err)
	}
	done := e.TL.Step("install the driver from the kustomize base with a site overlay")
	l.Apply(t, namespacesFirst(runRender(t, e.Root, "kustomize", dir)))
	done()
	l.WaitDriverReady(t)

	ns := framework.TestNamespace
	if _, err := e.Client.AppsV1().StatefulSets(ns).Create(e.Ctx, statefulSet(ns, "fs", "rds-nvme-ext4", fsWriter), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	l.WaitPodReady(t, ns, "fs-0", 5*time.Minute)
	waitLog(t, l, ns, "fs-0", "written")
	if out, err := l.Exec(ns, "fs-0", "sha256sum", "-c", "/data/pattern.sha256"); err != nil || !strings.Contains(out, "OK") {
		t.Errorf("the pattern does not check: %v\n%s", err, out)
	}
}
