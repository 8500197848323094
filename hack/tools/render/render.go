// Package render prints the driver's install as Kubernetes objects the way
// the real tools do: Helm's install action in client-only mode (what `helm
// template` runs) for charts/rds-csi, and kustomize's krusty (what `kubectl
// kustomize` runs) for manifests/. It is a test and build helper: the e2e
// suite applies its output with a server-side dry-run, and the chart tests
// compare the two renders object by object.
package render

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/cli/values"
	"helm.sh/helm/v3/pkg/getter"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// KubeVersion is the Kubernetes version the chart is rendered for: the
// e2e control plane's (hack/build-controlplane.sh).
const KubeVersion = "v1.36.3"

// HelmOptions are the inputs of a chart render, as on helm's command line.
type HelmOptions struct {
	ReleaseName string   // default "rds-csi"
	Namespace   string   // the release's namespace; default "rds-csi"
	ValueFiles  []string // -f
	Set         []string // --set
	SetString   []string // --set-string
}

// Helm renders the chart in chartDir and returns its manifest (a YAML
// stream; NOTES.txt and hooks are not part of it).
func Helm(chartDir string, o HelmOptions) ([]byte, error) {
	chrt, err := loader.Load(chartDir)
	if err != nil {
		return nil, fmt.Errorf("loading chart %s: %w", chartDir, err)
	}
	vo := values.Options{ValueFiles: o.ValueFiles, Values: o.Set, StringValues: o.SetString}
	vals, err := vo.MergeValues(getter.Providers{})
	if err != nil {
		return nil, fmt.Errorf("chart values: %w", err)
	}
	kv, err := chartutil.ParseKubeVersion(KubeVersion)
	if err != nil {
		return nil, err
	}
	cfg := &action.Configuration{Log: func(string, ...interface{}) {}}
	in := action.NewInstall(cfg)
	in.ClientOnly, in.DryRun, in.Replace = true, true, true
	in.ReleaseName = or(o.ReleaseName, "rds-csi")
	in.Namespace = or(o.Namespace, "rds-csi")
	in.KubeVersion = kv
	rel, err := in.Run(chrt, vals)
	if err != nil {
		return nil, fmt.Errorf("rendering chart %s: %w", chartDir, err)
	}
	return []byte(rel.Manifest), nil
}

// Kustomize builds the kustomization in dir (a directory on disk).
func Kustomize(dir string) ([]byte, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	return m.AsYaml()
}

// Object is one rendered Kubernetes object.
type Object map[string]interface{}

// Key names an object: kind, namespace and name (apiVersion aside, since
// no kind here is served at two versions).
func (o Object) Key() string {
	md, _ := o["metadata"].(map[string]interface{})
	ns, _ := md["namespace"].(string)
	name, _ := md["name"].(string)
	kind, _ := o["kind"].(string)
	return kind + "/" + ns + "/" + name
}

// Objects splits a YAML stream into objects keyed by Key; a key seen twice
// is an error, since the cluster would keep only one of them.
func Objects(stream []byte) (map[string]Object, error) {
	out := map[string]Object{}
	for i, doc := range splitYAML(stream) {
		var o Object
		if err := yaml.Unmarshal(doc, &o); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if len(o) == 0 {
			continue
		}
		k := o.Key()
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("%s appears twice", k)
		}
		out[k] = o
	}
	return out, nil
}

// splitYAML splits at document separators ("---" alone on a line).
func splitYAML(stream []byte) [][]byte {
	var docs [][]byte
	var cur bytes.Buffer
	for _, line := range strings.SplitAfter(string(stream), "\n") {
		if strings.TrimRight(line, " \r\n") == "---" {
			docs = append(docs, bytes.Clone(cur.Bytes()))
			cur.Reset()
			continue
		}
		cur.WriteString(line)
	}
	return append(docs, cur.Bytes())
}

// Diff describes how two sets of objects differ: objects only in one, and
// for objects in both, their YAML side by side. Empty means equal.
func Diff(aName string, a map[string]Object, bName string, b map[string]Object) string {
	var out strings.Builder
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	for _, k := range sorted {
		x, inA := a[k]
		y, inB := b[k]
		switch {
		case !inA:
			fmt.Fprintf(&out, "%s: only in %s\n", k, bName)
		case !inB:
			fmt.Fprintf(&out, "%s: only in %s\n", k, aName)
		default:
			xa, _ := yaml.Marshal(x)
			yb, _ := yaml.Marshal(y)
			if !bytes.Equal(xa, yb) {
				fmt.Fprintf(&out, "%s differs:\n%s\n", k, lineDiff(aName, string(xa), bName, string(yb)))
			}
		}
	}
	return out.String()
}

// lineDiff lists the lines of a not in b and of b not in a, in order: enough
// to spot a differing field in objects marshalled with sorted keys.
func lineDiff(aName, a, bName, b string) string {
	count := func(s string) map[string]int {
		m := map[string]int{}
		for _, l := range strings.Split(s, "\n") {
			m[l]++
		}
		return m
	}
	ca, cb := count(a), count(b)
	var out strings.Builder
	for _, l := range strings.Split(a, "\n") {
		if cb[l] > 0 {
			cb[l]--
			continue
		}
		fmt.Fprintf(&out, "  -%s| %s\n", aName, l)
	}
	for _, l := range strings.Split(b, "\n") {
		if ca[l] > 0 {
			ca[l]--
			continue
		}
		fmt.Fprintf(&out, "  +%s| %s\n", bName, l)
	}
	return out.String()
}

// WriteStream writes objects as one YAML stream, sorted by key, so that a
// render is the same bytes every time.
func WriteStream(w io.Writer, objs map[string]Object) error {
	keys := make([]string, 0, len(objs))
	for k := range objs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		b, err := yaml.Marshal(objs[k])
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "---\n%s", b); err != nil {
			return err
		}
	}
	return nil
}

// RepoRoot finds the repository's root from the working directory (the
// directory holding charts/ and manifests/).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if fi, err := os.Stat(dir + "/manifests/base/kustomization.yaml"); err == nil && !fi.IsDir() {
			return dir, nil
		}
		parent := dir[:max(strings.LastIndex(dir, "/"), 0)]
		if parent == dir || parent == "" {
			return "", errors.New("no repository root (manifests/base) above the working directory")
		}
		dir = parent
	}
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
