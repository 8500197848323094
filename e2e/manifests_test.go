//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/srvlab/rds-csi/e2e/framework"
)

// Every object of manifests/ is accepted by a real kube-apiserver: a
// server-side dry-run create with strict field validation (unknown or
// duplicate fields fail), after the namespaces were created for real.
// Kinds whose API the cluster does not serve (the Prometheus Operator's)
// are logged and skipped; the VolumeSnapshot CRDs are installed first.
func TestManifestsServerSideDryRun(t *testing.T) {
	t.Parallel()
	e := framework.NewEnv(t, framework.EnvOptions{})
	ctx, tl := e.Ctx, e.TL
	if framework.HaveBinary(e.Root, "csi-snapshotter") {
		framework.InstallSnapshotCRDs(ctx, t, tl, e.CP)
	}
	objs := readManifests(t, filepath.Join(e.Root, "manifests"))
	if len(objs) == 0 {
		t.Fatal("no objects under manifests/")
	}
	accepted, skipped := dryRunCreate(t, e, objs)
	tl.Logf("accepted %v; skipped (API not served) %v", accepted, skipped)
	for _, k := range []string{"Namespace", "CSIDriver", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
		"ConfigMap", "Deployment", "DaemonSet", "StorageClass"} {
		if accepted[k] == 0 {
			t.Errorf("no %s accepted by the API server (accepted %v)", k, accepted)
		}
	}
}

// dryRunCreate offers every object to the API server as a server-side
// dry-run create with strict field validation (unknown or duplicate fields
// fail), after creating the Namespaces among them for real (a dry-run
// object cannot live in a namespace that was only dry-run created; one
// that exists already is fine). Kinds the cluster does not serve are
// counted in skipped and logged. A rejected object is a test error naming
// its source (annotation e2e/file).
func dryRunCreate(t *testing.T, e *framework.Env, objs []*unstructured.Unstructured) (accepted, skipped map[string]int) {
	t.Helper()
	ctx, tl := e.Ctx, e.TL
	objs = slices.Clone(objs)
	sort.SliceStable(objs, func(i, j int) bool {
		return objs[i].GetKind() == "Namespace" && objs[j].GetKind() != "Namespace"
	})
	dyn, err := dynamic.NewForConfig(e.CP.Config)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(e.Client.Discovery()))
	accepted, skipped = map[string]int{}, map[string]int{}
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if meta.IsNoMatchError(err) {
			tl.Logf("skip %s %s: the cluster does not serve %s", gvk.Kind, o.GetName(), gvk.GroupVersion())
			skipped[gvk.Kind]++
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		opts := metav1.CreateOptions{FieldValidation: "Strict"}
		if gvk.Kind != "Namespace" {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		ri := dyn.Resource(m.Resource)
		var res dynamic.ResourceInterface = ri
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ns := o.GetNamespace()
			if ns == "" {
				ns = "default"
			}
			res = ri.Namespace(ns)
		}
		_, err = res.Create(ctx, o, opts)
		if gvk.Kind == "Namespace" && apierrors.IsAlreadyExists(err) {
			err = nil
		}
		if err != nil {
			t.Errorf("%s %s/%s (%s): %v", gvk.Kind, o.GetNamespace(), o.GetName(), o.GetAnnotations()["e2e/file"], err)
			continue
		}
		accepted[gvk.Kind]++
	}
	return accepted, skipped
}

// readManifests decodes every document of every YAML file under dir except
// kustomization.yaml, annotating each object with its file for messages.
func readManifests(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(path) != ".yaml" || d.Name() == "kustomization.yaml" {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		more, err := decodeDocs(rel, data)
		objs = append(objs, more...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// decodeDocs decodes the objects of a YAML stream (documents of only
// comments are passed over), annotating each with source (e2e/file).
func decodeDocs(source string, stream []byte) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(stream)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", source, err)
		}
		u := &unstructured.Unstructured{}
		if err := utilyaml.Unmarshal(doc, &u.Object); err != nil {
			return nil, fmt.Errorf("%s: %w", source, err)
		}
		if u.Object == nil || u.GetKind() == "" {
			continue
		}
		ann := u.GetAnnotations()
		if ann == nil {
			ann = map[string]string{}
		}
		ann["e2e/file"] = source
		u.SetAnnotations(ann)
		objs = append(objs, u)
	}
}
