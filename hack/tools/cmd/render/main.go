// Command render prints the driver's install as YAML, rendered by the real
// tools (hack/tools/render): `render helm [-f FILE] [--set K=V] CHART` like
// `helm template`, `render kustomize DIR` like `kubectl kustomize`. Objects
// come out sorted by kind, namespace and name. The e2e suite runs it to
// dry-run both installs; `make chart` prints the chart's default render.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/srvlab/rds-csi/hack/tools/render"
)

type list []string

func (l *list) String() string     { return fmt.Sprint(*l) }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "render:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: render helm [-f values.yaml] [--set k=v] [--namespace ns] CHART | render kustomize DIR")
	}
	var out []byte
	var err error
	switch args[0] {
	case "helm":
		fs := flag.NewFlagSet("helm", flag.ContinueOnError)
		var o render.HelmOptions
		fs.Var((*list)(&o.ValueFiles), "f", "a values file (repeatable)")
		fs.Var((*list)(&o.Set), "set", "a value, key=value (repeatable)")
		fs.Var((*list)(&o.SetString), "set-string", "a string value, key=value (repeatable)")
		fs.StringVar(&o.Namespace, "namespace", "rds-csi", "the release's namespace")
		fs.StringVar(&o.ReleaseName, "name", "rds-csi", "the release's name")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if fs.NArg() != 1 {
			return fmt.Errorf("render helm: one chart directory, got %d arguments", fs.NArg())
		}
		out, err = render.Helm(fs.Arg(0), o)
	case "kustomize":
		if len(args) != 2 {
			return fmt.Errorf("render kustomize: one directory, got %d arguments", len(args)-1)
		}
		out, err = render.Kustomize(args[1])
	default:
		return fmt.Errorf("unknown renderer %q: helm or kustomize", args[0])
	}
	if err != nil {
		return err
	}
	objs, err := render.Objects(out)
	if err != nil {
		return err
	}
	return render.WriteStream(os.Stdout, objs)
}
