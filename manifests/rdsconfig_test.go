package manifests

import (
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/srvlab/rds-csi/pkg/backends"
	"github.com/srvlab/rds-csi/pkg/csi"
)

// The ConfigMap's rds-config.yaml (the RDS boxes beside the default) is
// a list the driver takes, empty as shipped, and both pods read it where
// their --rds-config points: the ConfigMap's key, mounted read-only.
func TestBothPodsReadTheShippedRDSList(t *testing.T) {
	s := load(t)
	cm := mustGet[*corev1.ConfigMap](t, s, "ConfigMap", namespace, configMapName)
	text, ok := cm.Data["rds-config.yaml"]
	if !ok {
		t.Fatal("the ConfigMap has no rds-config.yaml")
	}
	for _, spec := range []struct {
		mode string
		pod  *corev1.PodSpec
	}{
		{"controller", &mustGet[*appsv1.Deployment](t, s, "Deployment", namespace, "rds-csi-controller").Spec.Template.Spec},
		{"node", &mustGet[*appsv1.DaemonSet](t, s, "DaemonSet", namespace, "rds-csi-node").Spec.Template.Spec},
	} {
		plugin, opts := driverContainer(t, s, spec.pod, spec.mode)
		if opts.RDSConfigFile == "" {
			t.Errorf("%s: no --rds-config", spec.mode)
			continue
		}
		purpose := backends.ForController
		if spec.mode == "node" {
			purpose = backends.ForNode
		}
		boxes, err := backends.Parse(opts.RDSConfigFile, []byte(text), opts.DefaultBackend())
		if err != nil {
			t.Fatalf("%s: %v", spec.mode, err)
		}
		if err := backends.Validate(boxes, purpose); err != nil || len(boxes) != 1 {
			t.Errorf("%s: the shipped list gives %d boxes (%v), want the default alone", spec.mode, len(boxes), err)
		}
		dir, file := path.Split(opts.RDSConfigFile)
		mounted := false
		for _, m := range plugin.VolumeMounts {
			if path.Clean(m.MountPath) != path.Clean(dir) {
				continue
			}
			for _, v := range spec.pod.Volumes {
				if v.Name != m.Name || v.ConfigMap == nil || v.ConfigMap.Name != configMapName {
					continue
				}
				for _, it := range v.ConfigMap.Items {
					mounted = mounted || (it.Key == "rds-config.yaml" && it.Path == file && m.ReadOnly)
				}
			}
		}
		if !mounted {
			t.Errorf("%s: --rds-config=%s is not the ConfigMap's rds-config.yaml mounted read-only", spec.mode, opts.RDSConfigFile)
		}
	}
}

// The two-box overlay (docs/deploy.md, "Several RDS") builds, and the
// driver takes its list on the controller and on the nodes; its classes
// name boxes of that list, by parameter and by topology key.
func TestTheTwoRDSOverlayIsAListTheDriverTakes(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl is not installed; the file-level checks in this package still ran")
	}
	root := t.TempDir()
	if err := os.CopyFS(root, os.DirFS(".")); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"id_ed25519", "known_hosts"} {
		if err := os.WriteFile(filepath.Join(root, "overlays", "example", f), []byte("test "+f+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(root, "overlays", "two-rds")
	out, err := exec.Command(kubectl, "kustomize", dir).Output()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v", dir, err)
	}
	objs, err := decode("kubectl kustomize "+dir, out)
	if err != nil {
		t.Fatal(err)
	}
	var cm *corev1.ConfigMap
	var classes []*storagev1.StorageClass
	for _, o := range objs {
		switch v := o.obj.(type) {
		case *corev1.ConfigMap:
			cm = v
		case *storagev1.StorageClass:
			classes = append(classes, v)
		}
	}
	if cm == nil {
		t.Fatal("no ConfigMap")
	}
	opts := csi.Options{RDSAddress: cm.Data["rds-address"], RDSName: cm.Data["rds-name"], RDSPort: 22, RDSUser: cm.Data["rds-user"],
		RDSKeyFile: "/etc/rds-csi/ssh/id_ed25519", RDSKnownHostsFile: "/etc/rds-csi/ssh/known_hosts", RDSPool: cm.Data["rds-pool"],
		VolumePath: cm.Data["rds-volume-path"], NVMePort: 4420}
	boxes, err := backends.Parse("rds-config.yaml", []byte(cm.Data["rds-config.yaml"]), opts.DefaultBackend())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []backends.Purpose{backends.ForController, backends.ForNode} {
		if err := backends.Validate(boxes, p); err != nil {
			t.Fatal(err)
		}
	}
	if len(boxes) != 2 || boxes[0].Name != "rds-a" || boxes[1].Name != "rds-b" {
		t.Fatalf("boxes %+v, want rds-a (the default) and rds-b", boxes)
	}
	names := map[string]bool{"rds-a": true, "rds-b": true}
	pinned, byTopology := false, false
	for _, sc := range classes {
		if b, ok := sc.Parameters[csi.ParameterRDS]; ok {
			pinned = true
			if !names[b] {
				t.Errorf("StorageClass %s pins RDS %q, not in the list", sc.Name, b)
			}
		}
		for _, term := range sc.AllowedTopologies {
			for _, e := range term.MatchLabelExpressions {
				for _, v := range e.Values {
					named := backends.NamedIn(csi.DefaultDriverName, map[string]string{e.Key: v})
					if len(named) != 1 || !names[named[0]] {
						t.Errorf("StorageClass %s: allowedTopologies %s=%s names no RDS of the list", sc.Name, e.Key, v)
					}
					byTopology = true
				}
			}
		}
	}
	if !pinned || !byTopology {
		t.Errorf("the overlay's classes pin a box: %v, name boxes by topology: %v; want both", pinned, byTopology)
	}
}
