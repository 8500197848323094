package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/srvlab/rds-csi/pkg/csi"
	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/nodelease"
	"github.com/srvlab/rds-csi/pkg/version"
)

// nodeLeaseOptions: the node plugin's own heartbeat (pkg/nodelease), a
// second sign of life the controller reads beside the kubelet's Lease.
type nodeLeaseOptions struct {
	// Enabled: the node plugin keeps its Lease (node and all modes).
	Enabled  bool
	Duration time.Duration
	// Namespace of the node plugins' Leases: where the node plugin writes
	// its own, and where the controller watches them ("": the pod's).
	Namespace string
}

func (o *nodeLeaseOptions) addFlags(fs *flag.FlagSet) {
	fs.BoolVar(&o.Enabled, "node-lease", false, "keep a Lease of the node plugin's own, a second sign of life beside the kubelet's")
	fs.DurationVar(&o.Duration, "node-lease-duration", nodelease.DefaultDuration, "with --node-lease: the duration the Lease states, renewed every quarter of it")
	fs.StringVar(&o.Namespace, "node-lease-namespace", "", "namespace of the node plugins' Leases (default: the pod's namespace)")
}

// validate checks the node Lease's flags (given: the flags set;
// heartbeatTimed: the controller times heartbeats, so it reads the node
// plugins' Leases).
func (o *nodeLeaseOptions) validate(mode string, given map[string]bool, heartbeatTimed bool) []string {
	var problems []string
	if given["node-lease-namespace"] && !o.Enabled && (mode == csi.ModeNode || !heartbeatTimed) {
		// Refused, not ignored: nothing would read or write a Lease there.
		problems = append(problems, "--node-lease-namespace needs --node-lease (the node plugin writes its Lease there) or, in controller and all modes, heartbeats timed (--storage-fencing=allow-host, --heartbeat-threshold above 0; the controller reads them there)")
	}
	if o.Enabled && mode == csi.ModeController {
		problems = append(problems, "--node-lease needs --mode=node or --mode=all: the controller keeps no node's Lease")
	}
	if given["node-lease-duration"] && !o.Enabled {
		problems = append(problems, "--node-lease-duration needs --node-lease: without it no node plugin Lease is kept")
	}
	if o.Duration < nodelease.MinDuration || o.Duration > nodelease.MaxDuration || o.Duration%time.Second != 0 {
		problems = append(problems, fmt.Sprintf("--node-lease-duration=%s must be whole seconds, at least %s (the kubelet's fastest opt-in cadence: a Lease of 10 s renewed every 2.5 s) and at most %s (the longest the controller honours)", o.Duration, nodelease.MinDuration, nodelease.MaxDuration))
	}
	if ns := o.Namespace; ns != "" {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			problems = append(problems, fmt.Sprintf("--node-lease-namespace %q is not a namespace name: %s", ns, strings.Join(errs, "; ")))
		} else if ns == fencing.NodeLeaseNamespace {
			problems = append(problems, "--node-lease-namespace must not be "+fencing.NodeLeaseNamespace+": the kubelets' Leases there are named after their nodes, and the controller would take a node plugin's Lease for a node's")
		}
	}
	return problems
}

// namespace is where the node plugins' Leases are: the flag, or the pod's
// namespace (that of the ServiceAccount token mounted in it); "" outside
// a pod without the flag: the controller then reads no node plugin Lease
// (its nodes are decided on their kubelets' alone), and --node-lease is
// refused.
func (o *nodeLeaseOptions) namespace() string {
	if o.Namespace != "" {
		return o.Namespace
	}
	return podNamespace()
}

// podNamespace is the namespace of the pod the driver runs in ("" outside
// a pod).
func podNamespace() string {
	if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
		return strings.TrimSpace(string(b))
	}
	return ""
}

// renewer returns the node plugin's Lease renewer for node, with a client
// of its own (in-cluster, or kubeconfig): a few writes a minute.
func (o *nodeLeaseOptions) renewer(kubeconfig, node string) (*nodelease.Renewer, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("--node-lease needs the Kubernetes API (run in a pod with the node plugin's ServiceAccount token mounted, or pass --kubeconfig): %w", err)
	}
	ns := o.namespace()
	if ns == "" {
		return nil, errors.New("--node-lease outside a pod needs --node-lease-namespace (in a pod it is the pod's namespace)")
	}
	cfg.UserAgent = "rds-csi-node/" + version.Version
	cfg.QPS, cfg.Burst = 5, 10
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("Kubernetes client for the node plugin's Lease: %w", err)
	}
	return nodelease.NewRenewer(client, ns, node, o.Duration, nil)
}

// runInBackground runs f until ctx is done; the returned func stops it
// and waits for it.
func runInBackground(ctx context.Context, f func(context.Context)) func() {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); f(ctx) }()
	return func() { cancel(); <-done }
}
