package framework

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
)

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// SnapshotCRDDir is where hack/build-controlplane.sh put the VolumeSnapshot
// CRDs of the external-snapshotter it built.
func SnapshotCRDDir(root string) string {
	return filepath.Join(filepath.Dir(BinDir(root)), "crds", "external-snapshotter")
}

// InstallSnapshotCRDs creates the snapshot.storage.k8s.io CRDs (not the
// group-snapshot ones: the driver has no group snapshots) and waits until
// they are Established.
func InstallSnapshotCRDs(ctx context.Context, tb testing.TB, tl *Timeline, cp *ControlPlane) {
	tb.Helper()
	dir := SnapshotCRDDir(cp.Root)
	files, err := filepath.Glob(filepath.Join(dir, "snapshot.storage.k8s.io_*.yaml"))
	if err != nil || len(files) == 0 {
		tb.Fatalf("no snapshot CRDs in %s (%v): hack/build-controlplane.sh did not build the snapshotter", dir, err)
	}
	InstallCRDs(ctx, tb, tl, cp, "the VolumeSnapshot CRDs", files...)
}

// InstallCRDs creates the CRD in each file (one a file) and waits until
// they are Established.
func InstallCRDs(ctx context.Context, tb testing.TB, tl *Timeline, cp *ControlPlane, what string, files ...string) {
	tb.Helper()
	done := tl.Step("install " + what)
	dyn, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		tb.Fatal(err)
	}
	var names []string
	for _, f := range files {
		crd, err := readUnstructured(f)
		if err != nil {
			tb.Fatal(err)
		}
		if _, err := dyn.Resource(crdResource).Create(ctx, crd, metav1.CreateOptions{}); err != nil {
			tb.Fatalf("create CRD %s: %v", crd.GetName(), err)
		}
		names = append(names, crd.GetName())
	}
	for _, name := range names {
		_, err := WaitFor(ctx, tl, time.Minute, "CRD "+name+" established", func(ctx context.Context) (bool, string, error) {
			u, err := dyn.Resource(crdResource).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error(), nil
			}
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, c := range conds {
				m, _ := c.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return true, "", nil
				}
			}
			return false, fmt.Sprintf("conditions %v", conds), nil
		})
		if err != nil {
			tb.Fatal(err)
		}
	}
	done()
}

func readUnstructured(path string) (*unstructured.Unstructured, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := utilyaml.NewYAMLReader(bufio.NewReader(f))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s: no object", path)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		u := &unstructured.Unstructured{}
		if err := utilyaml.Unmarshal(doc, &u.Object); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if u.GetKind() != "" {
			return u, nil
		}
	}
}

// StartSnapshotController runs the common snapshot-controller, a cluster
// add-on rather than part of the driver, with the admin kubeconfig and
// leader election in kube-system.
func StartSnapshotController(tb testing.TB, tl *Timeline, cp *ControlPlane, dir string) *Process {
	tb.Helper()
	if !HaveBinary(cp.Root, "snapshot-controller") {
		tb.Fatalf("snapshot-controller is not in %s", BinDir(cp.Root))
	}
	return StartProcess(tb, tl, "snapshot-controller", filepath.Join(dir, "snapshot-controller.log"),
		filepath.Join(BinDir(cp.Root), "snapshot-controller"),
		"--kubeconfig="+cp.Kubeconfig, "--leader-election", "--leader-election-namespace=kube-system",
		"--feature-gates=CSIVolumeGroupSnapshot=false", "--v=4")
}
