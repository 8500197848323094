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
	"os"
	"os/signal"
	"strings"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

const usage = `kubectl rds: the rds-csi driver's volumes in one command each

usage:
  kubectl rds why (pod|pvc) NAME [-n NAMESPACE]   Pod → PVC → PV → VolumeAttachments → Nodes → claims → disk, and the verdict
  kubectl rds why pv NAME
  kubectl rds check                               cluster-wide audit; exit status 1 when something is wrong
  kubectl rds release PV --node NODE [--yes]      drop NODE's stuck claim on PV (refused while NODE is Ready or attached)

flags (every command):
  --kubeconfig FILE, --context NAME, -n/--namespace NS   as for kubectl
  --driver NAME          CSI driver name (default rds.csi.srvlab.io)
  --inventory-url URL    the controller's RDS inventory, e.g. http://localhost:8080/inventory after
                         kubectl -n rds-csi port-forward deploy/rds-csi-controller 8080
                         (without it the disks on the RDS are not checked, and the output says so)
  -o text|json           output format (why, check)
  --timeout DURATION     for the whole command (default 30s)
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
	cmd, args := args[0], args[1:]
	fs := flag.NewFlagSet("kubectl rds "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage) }
	var g globalOptions
	g.addFlags(fs)
	node := fs.String("node", "", "release: the node whose claim is dropped")
	yes := fs.Bool("yes", false, "release: do not ask for confirmation")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitError
	}
	if g.output != "text" && g.output != "json" {
		fmt.Fprintf(stderr, "kubectl rds: -o must be text or json, not %q\n", g.output)
		return exitError
	}
	if g.timeout <= 0 {
		fmt.Fprintf(stderr, "kubectl rds: --timeout must be positive, not %v\n", g.timeout)
		return exitError
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "kubectl rds %s: %v\n", cmd, err)
		return exitError
	}
	// The command line is checked before the kubeconfig is read: a usage
	// error is about the arguments, whatever the cluster.
	if err := checkArgs(cmd, pos, *node); err != nil {
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
		return why(ctx, cl, g, strings.ToLower(pos[0]), pos[1], stdout, stderr)
	case "check":
		return check(ctx, cl, g, stdout, stderr)
	default: // release
		return release(ctx, cl, g, pos[0], *node, *yes, stdin, stdout, stderr)
	}
}

var errUnknownCommand = errors.New("unknown command")

// checkArgs checks a command's arguments and required flags, each error
// saying what is missing and how to find it.
func checkArgs(cmd string, pos []string, node string) error {
	switch cmd {
	case "why":
		if len(pos) != 2 {
			return errors.New("usage: kubectl rds why (pod|pvc|pv) NAME")
		}
		if name := pos[1][strings.Index(pos[1], "/")+1:]; name == "" {
			return fmt.Errorf("why %s: the name is empty (%q)", pos[0], pos[1])
		}
	case "check":
		if len(pos) != 0 {
			return fmt.Errorf("check takes no arguments, not %q", pos)
		}
	case "release":
		switch {
		case len(pos) != 1 || pos[0] == "":
			return errors.New("usage: kubectl rds release PV --node NODE [--yes]: one PV name")
		case node == "":
			return fmt.Errorf("--node is required: the node whose claim on PV %s to drop (kubectl rds why pv %s names the nodes that claim it); usage: kubectl rds release %s --node NODE [--yes]", pos[0], pos[0], pos[0])
		}
	default:
		return fmt.Errorf("%w %q", errUnknownCommand, cmd)
	}
	return nil
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
