package manifests

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

// object is one manifest document, decoded.
type object struct {
	file string // relative to manifests/
	gvk  schema.GroupVersionKind
	obj  runtime.Object // typed for built-in kinds, *unstructured.Unstructured for CRDs
	name string
	ns   string
}

func (o object) key() string { return o.gvk.Kind + "/" + o.ns + "/" + o.name }

// crdKinds are the kinds not in client-go's scheme that the manifests may
// use; they are decoded as unstructured and checked by hand.
var crdKinds = map[schema.GroupVersionKind]bool{
	{Group: "snapshot.storage.k8s.io", Version: "v1", Kind: "VolumeSnapshotClass"}: true,
	{Group: "monitoring.coreos.com", Version: "v1", Kind: "PrometheusRule"}:        true,
	{Group: "monitoring.coreos.com", Version: "v1", Kind: "ServiceMonitor"}:        true,
}

// strict rejects unknown and duplicate fields, so a misspelt or misplaced
// field fails here instead of being dropped silently by the API server.
var strict = serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()

// splitDocuments returns the non-empty YAML documents of data.
func splitDocuments(data []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(stripComments(doc))) > 0 {
			docs = append(docs, doc)
		}
	}
}

func stripComments(doc []byte) []byte {
	var out [][]byte
	for _, l := range bytes.Split(doc, []byte("\n")) {
		if t := bytes.TrimSpace(l); len(t) > 0 && t[0] != '#' {
			out = append(out, l)
		}
	}
	return bytes.Join(out, []byte("\n"))
}

// decode turns the documents of data (from file) into objects.
func decode(file string, data []byte) ([]object, error) {
	docs, err := splitDocuments(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	var out []object
	for i, doc := range docs {
		obj, gvk, err := strict.Decode(doc, nil, nil)
		if err != nil && !runtime.IsNotRegisteredError(err) {
			return nil, fmt.Errorf("%s: document %d: %w", file, i+1, err)
		}
		if err != nil {
			u := &unstructured.Unstructured{}
			if err := yaml.UnmarshalStrict(doc, &u.Object); err != nil {
				return nil, fmt.Errorf("%s: document %d: %w", file, i+1, err)
			}
			g := u.GroupVersionKind()
			if !crdKinds[g] {
				return nil, fmt.Errorf("%s: document %d: kind %s is neither a built-in kind nor one of the CRD kinds this test knows", file, i+1, g)
			}
			obj, gvk = u, &g
		}
		acc, err := meta.Accessor(obj)
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", file, i+1, err)
		}
		out = append(out, object{file: file, gvk: *gvk, obj: obj, name: acc.GetName(), ns: acc.GetNamespace()})
	}
	return out, nil
}

// kustomization is the part of kustomization.yaml this test reads.
type kustomization struct {
	Resources       []string         `json:"resources"`
	Patches         []map[string]any `json:"patches"`
	SecretGenerator []map[string]any `json:"secretGenerator"`
	Images          []map[string]any `json:"images"`
}

func readKustomization(dir string) (kustomization, error) {
	var k kustomization
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return k, err
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		return k, fmt.Errorf("%s: %w", filepath.Join(dir, "kustomization.yaml"), err)
	}
	return k, nil
}

// build resolves a kustomization without transformers the way kustomize
// does: its resources, files or directories, in order. It refuses
// kustomizations with patches or generators (those are built by kubectl
// in TestKustomizeBuild).
func build(dir string, seen map[string]bool) ([]object, error) {
	k, err := readKustomization(dir)
	if err != nil {
		return nil, err
	}
	if len(k.Patches) > 0 || len(k.SecretGenerator) > 0 || len(k.Images) > 0 {
		return nil, fmt.Errorf("%s: has transformers; build it with kubectl", dir)
	}
	var out []object
	for _, r := range k.Resources {
		p := filepath.Join(dir, r)
		fi, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("%s: resource %s: %w", dir, r, err)
		}
		if fi.IsDir() {
			objs, err := build(p, seen)
			if err != nil {
				return nil, err
			}
			out = append(out, objs...)
			continue
		}
		seen[filepath.Clean(p)] = true
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		objs, err := decode(filepath.Clean(p), data)
		if err != nil {
			return nil, err
		}
		out = append(out, objs...)
	}
	return out, nil
}

// set is everything the repository ships, each object once.
type set struct {
	objects []object
	byKey   map[string]object
}

func (s *set) add(t *testing.T, objs ...object) {
	t.Helper()
	for _, o := range objs {
		if prev, dup := s.byKey[o.key()]; dup {
			if prev.file != o.file {
				t.Errorf("%s is defined in both %s and %s", o.key(), prev.file, o.file)
			}
			continue
		}
		s.byKey[o.key()] = o
		s.objects = append(s.objects, o)
	}
}

func (s *set) kind(kind string) []object {
	var out []object
	for _, o := range s.objects {
		if o.gvk.Kind == kind {
			out = append(out, o)
		}
	}
	return out
}

func (s *set) get(kind, ns, name string) (object, bool) {
	o, ok := s.byKey[kind+"/"+ns+"/"+name]
	return o, ok
}

// The directories that kustomize builds without extra input, and the
// directory of examples that are parsed but never applied as they are.
var (
	kustomizeDirs = []string{".", "base", "storageclass", "snapshot", "monitoring", "kubectl-rds"}
	examplesDir   = "examples"
)

// load parses everything: the kustomize directories (checking that every
// YAML file outside examples/ and overlays/ is listed in one) and the
// examples.
func load(t *testing.T) *set {
	t.Helper()
	s := &set{byKey: map[string]object{}}
	listed := map[string]bool{}
	for _, dir := range kustomizeDirs {
		objs, err := build(dir, listed)
		if err != nil {
			t.Fatalf("kustomization %s: %v", dir, err)
		}
		s.add(t, objs...)
	}
	examples, err := filepath.Glob(filepath.Join(examplesDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range examples {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := decode(f, data)
		if err != nil {
			t.Fatal(err)
		}
		s.add(t, objs...)
	}

	var orphans []string
	err = filepath.WalkDir(".", func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (p == examplesDir || p == "overlays") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".yaml") && filepath.Base(p) != "kustomization.yaml" && !listed[filepath.Clean(p)] {
			orphans = append(orphans, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(orphans)
	for _, o := range orphans {
		t.Errorf("%s is in no kustomization: list it, or move it to examples/", o)
	}
	return s
}

// mustGet is the object kind ns/name as its Go type (*unstructured.Unstructured
// for the CRD kinds); a missing object fails the test, a wrong T is a test
// bug and panics.
func mustGet[T runtime.Object](t *testing.T, s *set, kind, ns, name string) T {
	t.Helper()
	o, ok := s.get(kind, ns, name)
	if !ok {
		t.Fatalf("%s %s/%s missing", kind, ns, name)
	}
	return o.obj.(T)
}

func container(t *testing.T, spec *corev1.PodSpec, name string) *corev1.Container {
	t.Helper()
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	t.Fatalf("container %s missing", name)
	return nil
}

func volume(spec *corev1.PodSpec, name string) *corev1.Volume {
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == name {
			return &spec.Volumes[i]
		}
	}
	return nil
}
