// Command kubectl-rds is a kubectl plugin for the rds-csi driver: put the
// binary on PATH and run `kubectl rds`. It answers, each in one command,
// why a pod's volume does not attach (why), what is wrong cluster-wide
// (check), and it drops a stuck claim the safe way (release).
//
// It reads the cluster with client-go under the caller's kubeconfig, and
// the RDS side from the controller's read-only inventory
// (--inventory-url, reached with kubectl port-forward). The verdicts are
// pkg/diagnose's pure functions of what it gathered.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/srvlab/rds-csi/pkg/diagnose"
	"github.com/srvlab/rds-csi/pkg/inventory"
	"github.com/srvlab/rds-csi/pkg/version"
)

const usage = `kubectl rds: the rds-csi driver's volumes in one command each

usage:
  kubectl rds why (pod|pvc) NAME [-n NAMESPACE]   Pod → PVC → PV → VolumeAttachments → Nodes → claims → disk, and the verdict
  kubectl rds why (pod|pvc) NAMESPACE/NAME
  kubectl rds why pv NAME
  kubectl rds check                               cluster-wide audit; exit status 1 when something is wrong
  kubectl rds release PV --node NODE [--yes]      drop NODE's stuck claim on PV (refused while NODE is Ready or attached)
  kubectl rds version                             this plugin's version (also --version)

flags (every command):
  --kubeconfig FILE, --context NAME    as for kubectl
  --driver NAME          CSI driver name (default rds.csi.srvlab.io)
  --inventory-url URL    the controller's RDS inventory (why, check), e.g. http://localhost:8080/inventory
                         after kubectl -n rds-csi port-forward deploy/rds-csi-controller 8080
                         (without it the disks on the RDS are not checked, and the output says so)
  --timeout DURATION     for the whole command (default 30s)
flags (why, check):
  -n/--namespace NS      why pod, why pvc: the namespace (default: the context's)
  -o text|json           output format
flags (release):
  --node NODE            the node whose claim is dropped (required)
  --yes                  do not ask for confirmation

Flags may come before or after the command and its arguments. A flag a command does
not use, or a flag given twice, is a usage error.
`

// Exit statuses.
const (
	exitOK       = 0
	exitFindings = 1 // check found something wrong
	exitError    = 2 // the command could not do its job
)

// clients is what the commands talk to; tests pass fakes.
type clients struct {
	kube    kubernetes.Interface
	dynamic dynamic.Interface
}

// globalOptions are the flags every command takes.
type globalOptions struct {
	kubeconfig   string
	context      string
	namespace    string
	driver       string
	inventoryURL string
	output       string
	timeout      time.Duration
}

func (o *globalOptions) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
	fs.StringVar(&o.context, "context", "", "kubeconfig context")
	fs.StringVar(&o.namespace, "namespace", "", "namespace of a pod or PVC (default: the context's)")
	fs.StringVar(&o.namespace, "n", "", "short for --namespace")
	fs.StringVar(&o.driver, "driver", "rds.csi.srvlab.io", "CSI driver name")
	fs.StringVar(&o.inventoryURL, "inventory-url", "", "URL of the controller's /inventory")
	fs.StringVar(&o.output, "o", "text", "output: text or json")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "timeout of the whole command")
}

// connect builds the clients from the kubeconfig, as kubectl does, and
// fills in the namespace.
func (o *globalOptions) connect() (clients, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.kubeconfig
	cfg := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: o.context})
	rc, err := cfg.ClientConfig()
	if clientcmd.IsEmptyConfig(err) {
		// client-go would say "try setting KUBERNETES_MASTER", naming
		// none of the files it looked for.
		return clients{}, noKubeconfig(rules)
	}
	if err != nil {
		return clients{}, fmt.Errorf("kubeconfig: %w", err)
	}
	if o.namespace == "" {
		if o.namespace, _, err = cfg.Namespace(); err != nil {
			return clients{}, fmt.Errorf("kubeconfig namespace: %w", err)
		}
	}
	rc.UserAgent = "kubectl-rds"
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return clients{}, err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return clients{}, err
	}
	return clients{kube: kube, dynamic: dyn}, nil
}

// noKubeconfig says which kubeconfig files were looked for and what was
// wrong with them, when none gave a cluster.
func noKubeconfig(rules *clientcmd.ClientConfigLoadingRules) error {
	var missing, empty []string
	for _, f := range rules.Precedence {
		if _, err := os.Stat(f); err != nil {
			missing = append(missing, f)
		} else {
			empty = append(empty, f)
		}
	}
	const how = "kubectl rds reads the kubeconfig as kubectl does: --kubeconfig FILE, else the files in $KUBECONFIG, else ~/.kube/config"
	var what []string
	if len(missing) > 0 {
		what = append(what, strings.Join(missing, ", ")+" does not exist")
	}
	if len(empty) > 0 {
		what = append(what, strings.Join(empty, ", ")+" names no cluster")
	}
	if env := os.Getenv(clientcmd.RecommendedConfigPathEnvVar); env != "" {
		return fmt.Errorf("no kubeconfig: $KUBECONFIG is %q, and %s (%s)", env, strings.Join(what, "; "), how)
	}
	return fmt.Errorf("no kubeconfig: %s, and $KUBECONFIG is not set (%s)", strings.Join(what, "; "), how)
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, nil)
	stop()
	os.Exit(code)
}

// run runs one command. fake is nil in production (the clients come from
// the kubeconfig); tests pass fake clients.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, fake *clients) int {
	klog.SetOutput(stderr) // client-go's warnings, not mixed into -o json
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	if len(args) == 1 && (args[0] == "--version" || args[0] == "-version" || args[0] == "version") {
		fmt.Fprintln(stdout, version.Version)
		return exitOK
	}
	fs := flag.NewFlagSet("kubectl rds", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {} // printed below: asked for (stdout) or after a mistake (stderr)
	var g globalOptions
	g.addFlags(fs)
	var inv invocation
	fs.StringVar(&inv.node, "node", "", "release: the node whose claim is dropped")
	fs.BoolVar(&inv.yes, "yes", false, "release: do not ask for confirmation")
	given := recordFlags(fs)
	// Flags go anywhere, before the command too (`kubectl rds --context
	// prod check`): the command is the first argument that is not one.
	pos, err := parseInterspersed(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, usage) // pipe-able, as kubectl's own -h
		return exitOK
	}
	if err != nil { // the flag package has said what is wrong
		fmt.Fprint(stderr, usage)
		return exitError
	}
	if len(pos) == 0 {
		fmt.Fprint(stderr, usage)
		fmt.Fprintln(stderr, "kubectl rds: no command: why, check or release")
		return exitError
	}
	cmd := pos[0]
	inv.cmd, pos = cmd, pos[1:]
	fail := func(err error) int {
		fmt.Fprintf(stderr, "kubectl rds %s: %v\n", cmd, err)
		return exitError
	}
	// The command line is checked before the kubeconfig is read: a usage
	// error is about the arguments, whatever the cluster.
	if err := inv.check(pos, &g, given); err != nil {
		if errors.Is(err, errUnknownCommand) {
			fmt.Fprint(stderr, usage)
		}
		return fail(err)
	}
	var cl clients
	if fake != nil {
		cl = *fake
		if g.namespace == "" {
			g.namespace = "default"
		}
	} else if cl, err = g.connect(); err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	switch cmd {
	case "why":
		return why(ctx, cl, g, inv.kind, inv.name, stdout, stderr)
	case "check":
		return check(ctx, cl, g, stdout, stderr)
	default: // release
		return release(ctx, cl, g, inv.name, inv.node, inv.yes, stdin, stdout, stderr)
	}
}

var errUnknownCommand = errors.New("unknown command")

// minTimeout is the shortest --timeout: a command makes several API calls,
// and less would fail every one.
const minTimeout = time.Second

// invocation is a command line, checked.
type invocation struct {
	cmd  string
	kind string // why: diagnose.KindPod, KindPVC or KindPV
	name string // why: the object's name (its namespace goes to -n); release: the PV
	node string // release
	yes  bool   // release
}

// commandFlags are the flags each command uses beyond those that say
// where to look, which every command takes (kubeconfig, context, driver,
// inventory-url, timeout: a script may give them to each command alike);
// another is refused rather than ignored.
var commandFlags = map[string][]string{
	"why":     {"namespace", "o"},
	"check":   {"o"},
	"release": {"node", "yes"},
}

// notUsed says why a command has no use for a flag.
var notUsed = map[string]string{
	"namespace": "PVs and the cluster-wide audit are not namespaced",
	"o":         "release's output is for the person who confirms it",
	"node":      "it names the node of a release",
	"yes":       "it confirms a release",
}

// check checks the arguments and flags, each error saying what is wrong
// and how to find the right value; it fills in inv and g's namespace.
func (inv *invocation) check(pos []string, g *globalOptions, given map[string][]string) error {
	wanted, ok := commandFlags[inv.cmd]
	if !ok {
		return fmt.Errorf("%w %q", errUnknownCommand, inv.cmd)
	}
	for _, name := range slices.Sorted(maps.Keys(given)) {
		if v := given[name]; len(v) > 1 {
			return fmt.Errorf("%s is given %d times (%s): give it once", flagName(name), len(v), quoteAll(v))
		}
		switch name {
		case "kubeconfig", "context", "driver", "inventory-url", "timeout":
		default:
			if !slices.Contains(wanted, name) {
				return fmt.Errorf("%s does not apply to %s: %s", flagName(name), inv.cmd, notUsed[name])
			}
		}
	}
	if g.output != "text" && g.output != "json" {
		return fmt.Errorf("-o must be text or json, not %q", g.output)
	}
	if g.timeout < minTimeout {
		return fmt.Errorf("--timeout must be at least %v (the API calls of one command), not %v", minTimeout, g.timeout)
	}
	// A CSIDriver's name: a DNS subdomain of at most 63 characters.
	if errs := validation.IsDNS1123Subdomain(g.driver); len(errs) > 0 || len(g.driver) > 63 {
		return fmt.Errorf("--driver %q is not a CSI driver name (at most 63 characters of a-z, 0-9, '-' and '.'; kubectl get csidrivers lists them)", g.driver)
	}
	if _, ok := given["namespace"]; ok {
		if err := checkNamespace(g.namespace); err != nil {
			return fmt.Errorf("-n/--namespace: %w", err)
		}
	}
	if _, ok := given["inventory-url"]; ok {
		if err := checkInventoryURL(g.inventoryURL); err != nil {
			return fmt.Errorf("--inventory-url: %w", err)
		}
	}
	switch inv.cmd {
	case "why":
		return inv.checkWhy(pos, g, given)
	case "check":
		if len(pos) != 0 {
			return fmt.Errorf("check takes no arguments, not %q", pos)
		}
	case "release":
		switch {
		case len(pos) != 1 || pos[0] == "":
			return errors.New("usage: kubectl rds release PV --node NODE [--yes]: one PV name")
		case inv.node == "":
			return fmt.Errorf("--node is required: the node whose claim on PV %s to drop (kubectl rds why pv %s names the nodes that claim it); usage: kubectl rds release %s --node NODE [--yes]", pos[0], pos[0], pos[0])
		}
		inv.name = pos[0]
		if err := checkName("PV", inv.name); err != nil {
			return err
		}
		if err := checkName("node", inv.node); err != nil {
			return fmt.Errorf("--node: %w", err)
		}
	}
	return nil
}

// whyKinds are the kinds why takes, spelt as kubectl takes them.
var whyKinds = map[string]string{
	"pod": diagnose.KindPod, "pods": diagnose.KindPod, "po": diagnose.KindPod,
	"pvc": diagnose.KindPVC, "pvcs": diagnose.KindPVC, "persistentvolumeclaim": diagnose.KindPVC, "persistentvolumeclaims": diagnose.KindPVC,
	"pv": diagnose.KindPV, "pvs": diagnose.KindPV, "persistentvolume": diagnose.KindPV, "persistentvolumes": diagnose.KindPV,
}

func (inv *invocation) checkWhy(pos []string, g *globalOptions, given map[string][]string) error {
	if len(pos) != 2 {
		return errors.New("usage: kubectl rds why (pod|pvc|pv) NAME")
	}
	kind, ok := whyKinds[strings.ToLower(pos[0])]
	if !ok {
		return fmt.Errorf("%q is not pod, pvc or pv: why follows a pod, a PVC or a PV (usage: kubectl rds why (pod|pvc|pv) NAME)", pos[0])
	}
	inv.kind, inv.name = kind, pos[1]
	if ns, name, ok := strings.Cut(pos[1], "/"); ok && kind != diagnose.KindPV {
		if err := checkNamespace(ns); err != nil {
			return fmt.Errorf("why %s %s: %w", pos[0], pos[1], err)
		}
		if _, ok := given["namespace"]; ok && g.namespace != ns {
			return fmt.Errorf("why %s %s: two namespaces, %s and -n %s: give one", pos[0], pos[1], ns, g.namespace)
		}
		g.namespace, inv.name = ns, name
	}
	if inv.name == "" {
		return fmt.Errorf("why %s: the name is empty (%q)", pos[0], pos[1])
	}
	if _, ok := given["namespace"]; ok && kind == diagnose.KindPV {
		return fmt.Errorf("-n/--namespace does not apply to why pv: %s", notUsed["namespace"])
	}
	return checkName(kind, inv.name)
}

// checkName checks the name of a pod, PVC, PV or node: a DNS subdomain,
// as the API server requires of each.
func checkName(what, name string) error {
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Errorf("%q cannot be the name of a %s: %s", name, what, strings.Join(errs, "; "))
	}
	return nil
}

func checkNamespace(ns string) error {
	if ns == "" {
		return errors.New("the namespace is empty (leave -n out for the context's namespace)")
	}
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return fmt.Errorf("%q cannot be the name of a namespace: %s", ns, strings.Join(errs, "; "))
	}
	return nil
}

// checkInventoryURL checks an --inventory-url before anything is read with
// it: an http(s) URL with a host and a path (the controller serves the
// inventory at /inventory).
func checkInventoryURL(s string) error {
	const example = "e.g. http://localhost:8080" + inventory.Path + " after kubectl -n rds-csi port-forward deploy/rds-csi-controller 8080"
	if s == "" {
		return fmt.Errorf("the URL is empty (leave the flag out to skip the disks on the RDS, or give one, %s)", example)
	}
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return fmt.Errorf("%q is not a URL (%v); %s", s, err, example)
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("%q is not an http:// or https:// URL; %s", s, example)
	case u.Host == "" || u.Hostname() == "":
		return fmt.Errorf("%q names no host; %s", s, example)
	case u.Path == "" || u.Path == "/":
		return fmt.Errorf("%q names no path: the controller serves the inventory at %s (%s)", s, inventory.Path, strings.TrimSuffix(s, "/")+inventory.Path)
	}
	return nil
}

// recordFlags makes every flag of fs record the values it is given, by
// canonical name (-n is namespace), so that a flag given twice is refused
// instead of the last value silently winning, and a flag given to a
// command that does not use it is refused instead of ignored.
func recordFlags(fs *flag.FlagSet) map[string][]string {
	given := map[string][]string{}
	fs.VisitAll(func(f *flag.Flag) {
		name := f.Name
		if name == "n" {
			name = "namespace"
		}
		f.Value = recordedValue{Value: f.Value, name: name, given: given}
	})
	return given
}

type recordedValue struct {
	flag.Value
	name  string
	given map[string][]string
}

func (v recordedValue) Set(s string) error {
	v.given[v.name] = append(v.given[v.name], s)
	return v.Value.Set(s)
}

// IsBoolFlag keeps --yes a flag without a value.
func (v recordedValue) IsBoolFlag() bool {
	b, ok := v.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// flagName is a flag as the usage spells it.
func flagName(name string) string {
	switch name {
	case "namespace":
		return "-n/--namespace"
	case "o":
		return "-o"
	}
	return "--" + name
}

func quoteAll(vs []string) string {
	q := make([]string, len(vs))
	for i, v := range vs {
		q[i] = strconv.Quote(v)
	}
	return strings.Join(q, ", ")
}

// parseInterspersed parses flags placed anywhere among the arguments, as
// kubectl allows (`why pod web-0 -n shop`), and returns the positionals.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}
