// Command rds-csi-driver is the CSI plugin for MikroTik ROSE Data Server:
// one binary, run as the controller (--mode=controller), on every node
// (--mode=node) or both (--mode=all). Settings are flags; secrets (the SSH
// key, the pinned known_hosts) are files mounted from a Kubernetes Secret.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	csispec "github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/srvlab/rds-csi/pkg/backends"
	"github.com/srvlab/rds-csi/pkg/csi"
	"github.com/srvlab/rds-csi/pkg/flagonce"
	"github.com/srvlab/rds-csi/pkg/health"
	"github.com/srvlab/rds-csi/pkg/inventory"
	"github.com/srvlab/rds-csi/pkg/metrics"
	"github.com/srvlab/rds-csi/pkg/nodelease"
	"github.com/srvlab/rds-csi/pkg/rds"
	"github.com/srvlab/rds-csi/pkg/storagefence"
	"github.com/srvlab/rds-csi/pkg/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	klog.Flush()
	os.Exit(code)
}

// run starts the driver and serves until ctx is done (SIGTERM, SIGINT),
// then stops gracefully. A usage error (a flag the driver does not know or
// cannot parse, a value or a combination its checks refuse, a stray
// argument; nothing done) is one line on stderr and exit status 2; a start
// that fails on what the flags name (an unreadable file, an address in
// use, a live driver on the socket) is one line and exit status 1, and
// leaves nothing behind it created.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("rds-csi-driver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	klog.InitFlags(fs)
	var opts csi.Options
	opts.AddFlags(fs)
	var copts controllerOptions
	copts.addFlags(fs)
	var nopts connectorOptions
	nopts.addFlags(fs)
	var lopts nodeLeaseOptions
	lopts.addFlags(fs)
	publish := fs.Bool("publish", true, "serve ControllerPublish/Unpublish on the attachment index (false: without attach)")
	showVersion := fs.Bool("version", false, "print the version and exit")
	// A flag error is one line (the flag package would add the whole
	// usage, burying it in a pod's log); -h prints the usage.
	fs.SetOutput(io.Discard)
	if err := flagonce.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stdout, "usage: rds-csi-driver [flags]; every setting is a flag, given once (docs/flags.md says each in full)")
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return 0
		}
		fmt.Fprintf(stderr, "rds-csi-driver: %v (rds-csi-driver -h lists the flags)\n", err)
		return 2
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	copts.storageFencingDefaults(opts, fs)
	if *showVersion {
		fmt.Fprintln(stdout, version.Version)
		return 0
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "rds-csi-driver: "+format+"\n", a...)
		return 1
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "rds-csi-driver: unexpected arguments %q; every setting is a flag (rds-csi-driver -h lists the flags)\n", fs.Args())
		return 2
	}
	if err := validateFlags(&opts, copts, nopts, *publish, given); err != nil {
		fmt.Fprintf(stderr, "rds-csi-driver: %v\n", err)
		return 2
	}
	if problems := lopts.validate(opts.Mode, given, opts.Mode != csi.ModeNode && *publish && copts.HeartbeatThreshold > 0); len(problems) > 0 {
		fmt.Fprintf(stderr, "rds-csi-driver: invalid configuration: %s\n", strings.Join(problems, "; "))
		return 2
	}
	boxCfgs, err := loadBoxes(opts, copts.RDSCommandTimeout) // backends.go
	if err != nil {
		if errors.As(err, new(fileError)) {
			return fail("invalid configuration: %v", err)
		}
		fmt.Fprintf(stderr, "rds-csi-driver: %v\n", err)
		return 2
	}
	// The files the flags name are read before the endpoints are opened:
	// a bad one stops the driver without touching a socket. Reading them
	// touches nothing.
	var kube kubernetes.Interface
	var boxes *rdsBoxes // the controller's RDS clients, one per box
	var m *metrics.Metrics
	copts.nodeLeaseNamespace = lopts.namespace()
	var renewer *nodelease.Renewer // nil: no node plugin Lease
	if lopts.Enabled {
		r, err := lopts.renewer(copts.Kubeconfig, opts.NodeID)
		if err != nil {
			return fail("invalid configuration: %v", err)
		}
		renewer = r
	}
	if opts.Mode != csi.ModeNode {
		// The controller talks to the RDS over SSH; the node only connects
		// volumes over NVMe/TCP and needs no RDS credentials.
		if *publish {
			restCfg, err := copts.restConfig()
			if err != nil {
				return fail("invalid configuration: the controller needs the Kubernetes API for its attachment index (run it in a pod, or pass --kubeconfig; without attach, e.g. CSIDriver attachRequired: false or a local test, pass --publish=false): %v", err)
			}
			if kube, err = kubernetes.NewForConfig(restCfg); err != nil {
				return fail("invalid configuration: Kubernetes client: %v", err)
			}
		}
		if opts.AllowHostFencing() {
			key, err := storagefence.LoadAttachmentKey(opts.AttachmentKeyFile, opts.RDSKeyFile)
			if err != nil {
				return fail("invalid configuration: storage fencing: %v", err)
			}
			opts.AttachmentKey = key
		}
		m = metrics.New()
		if boxes, err = newRDSBoxes(boxCfgs, m); err != nil {
			return fail("invalid configuration: %v", err)
		}
		defer boxes.Close()
	}
	// Both endpoints are opened before anything touches the host (the
	// node's /etc/nvme identity): a port in use, or a live driver on the
	// socket, stops the driver here and leaves nothing behind.
	var httpLis net.Listener
	if copts.HTTPEndpoint != "" {
		l, err := net.Listen("tcp", copts.HTTPEndpoint)
		if err != nil {
			return fail("invalid configuration: --http-endpoint: %v", err)
		}
		defer l.Close() // after serving: a no-op; before it: frees the port
		httpLis = l
	}
	// A start that fails from here on removes the socket (closing the
	// listener unlinks it) and the directories Listen created for it.
	started := false
	if dirs := missingSocketDirs(opts.Endpoint); len(dirs) > 0 {
		defer func() {
			if !started {
				removeEmptyDirs(dirs)
			}
		}()
	}
	lis, err := csi.Listen(opts.Endpoint)
	if err != nil {
		return fail("listening on %s: %v", opts.Endpoint, err)
	}
	defer lis.Close()
	var cs *csi.ControllerServer
	var d *csi.Driver
	var proc *controllerProcess // nil: none (node mode, --publish=false)
	diag := newDiagnostics()    // --http-endpoint in every mode
	if opts.Mode == csi.ModeNode {
		nodeBoxes := make([]csi.Box, len(boxCfgs))
		for i := range boxCfgs {
			nodeBoxes[i] = csi.Box{Backend: boxCfgs[i]}
		}
		if d, err = csi.NewDriverBoxes(opts, nodeBoxes); err != nil {
			return fail("invalid configuration: %v", err)
		}
	} else {
		if kube != nil {
			chooseInitialSync(ctx, kube) // watch-list or LIST (watchlist.go)
		}
		probe := boxes.probeAny
		diag.registry, diag.checks = m.Registry(), []health.Check{{Name: "rds", Func: probe}}
		var pub *csi.Publisher
		var ready []csi.ReadinessCheck
		if kube != nil {
			if proc, err = newControllerProcess(copts, opts, kube, boxes, m, probe, httpLis); err != nil {
				return fail("invalid configuration: %v", err)
			}
			diag.servedByController = true
			// Read-only, cached, no credentials: docs/kubectl-rds.md.
			proc.health.Handle(inventory.Path, boxes.inventory(opts.VolumePath))
			pub, ready = proc.Publisher, []csi.ReadinessCheck{proc.Ready}
		}
		if d, err = csi.NewDriverBoxes(opts, boxes.csiBoxes(), ready...); err != nil {
			return fail("invalid configuration: %v", err)
		}
		cs = csi.NewControllerServer(d, pub)
		defer runInBackground(ctx, boxes.runHealth)()
	}
	// The node service settles the host's NVMe identity (creating
	// /etc/nvme/hostnqn once): last, when everything else has passed.
	var node csispec.NodeServer // nil: not registered
	if opts.Mode != csi.ModeController {
		ns, err := nopts.nodeServer(ctx, d, opts)
		if err != nil {
			return fail("invalid configuration: %v", err)
		}
		node = timedNode{NodeServer: ns,
			m: metrics.NewNodeMetrics(diag.registry, connectedSubsystems("/sys", opts.NQNPrefix))}
	}
	if renewer != nil {
		// Beside the gRPC server, never in its way: a failed renewal is
		// logged and retried.
		defer runInBackground(ctx, renewer.Run)()
	}
	if boxes != nil {
		// Beside it too: the first contact with each RDS box, said in the
		// log at start rather than first by a /readyz or Probe; each box
		// on its own, so that one that hangs delays no other's line.
		for i := range boxes.cfgs {
			defer runInBackground(ctx, func(ctx context.Context) { logFirstRDSContact(ctx, boxes.clients[i], boxes.cfgs[i]) })()
		}
	}
	if proc != nil {
		procCtx, stopProc := context.WithCancel(ctx)
		procDone := make(chan struct{})
		go func() { proc.run(procCtx); close(procDone) }()
		defer func() { stopProc(); <-procDone }()
	}
	httpCtx, stopHTTP := context.WithCancel(ctx)
	waitHTTP, err := diag.start(httpCtx, httpLis)
	if err != nil {
		stopHTTP()
		return fail("invalid configuration: %v", err)
	}
	defer func() { stopHTTP(); waitHTTP() }()
	srv := csi.NewGRPCServer(csi.NewIdentityServer(d), controllerService(cs), node)
	logger := klog.FromContext(ctx)
	logger.Info("serving", "version", version.Version, "driver", opts.DriverName, "mode", opts.Mode,
		"endpoint", opts.Endpoint, "rds", opts.RDSAddress, "rdsName", opts.RDSName, "node", opts.NodeID, "boxes", len(boxCfgs))
	started = true
	if err := csi.Serve(ctx, srv, lis, opts.ShutdownGrace); err != nil {
		logger.Error(err, "gRPC server failed")
		return 1
	}
	logger.Info("stopped")
	return 0
}

// logFirstRDSContact probes one RDS box once at start and logs the outcome:
// a box that does not answer (a wrong address, a firewall, a host key
// that is not the pinned one) is named with its name, address and the reason,
// once; later failures are the /readyz and Probe answers' and the
// metrics'.
func logFirstRDSContact(ctx context.Context, client *rds.Client, box backends.Backend) {
	address := net.JoinHostPort(box.Address, strconv.Itoa(box.Port))
	info, err := client.Probe(ctx)
	if ctx.Err() != nil {
		return // stopping before it answered: nothing learnt
	}
	logger := klog.FromContext(ctx)
	if err != nil {
		logger.Error(err, "the RDS does not answer: volume operations fail until it does (readiness and Probe report it)", "rds", box.Name, "address", address, "user", box.User)
		return
	}
	logger.Info("the RDS answers", "rds", box.Name, "address", address, "board", info.BoardName, "version", info.Version)
}

// missingSocketDirs lists the directories of a unix endpoint's socket that
// do not exist yet, deepest first: what csi.Listen will create.
func missingSocketDirs(endpoint string) []string {
	network, address, err := csi.ParseEndpoint(endpoint)
	if err != nil || network != "unix" {
		return nil
	}
	var dirs []string
	for dir := filepath.Dir(address); ; dir = filepath.Dir(dir) {
		if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
			return dirs
		}
		dirs = append(dirs, dir)
		if dir == filepath.Dir(dir) {
			return dirs
		}
	}
}

// removeEmptyDirs removes dirs in order, each only if it is empty: what a
// failed start created, and nothing anyone put there since.
func removeEmptyDirs(dirs []string) {
	for _, d := range dirs {
		_ = os.Remove(d)
	}
}

// validateFlags checks every flag before anything is read or opened: the
// mode first (every other check depends on it), then the driver's, the
// controller's and the connector's options and their combinations.
func validateFlags(opts *csi.Options, copts controllerOptions, nopts connectorOptions, publish bool, given map[string]bool) error {
	switch opts.Mode {
	case csi.ModeController, csi.ModeNode, csi.ModeAll:
	default:
		return fmt.Errorf("invalid configuration: --mode must be %s, %s or %s, not %q", csi.ModeController, csi.ModeNode, csi.ModeAll, opts.Mode)
	}
	if err := opts.Validate(); err != nil {
		return err
	}
	if err := copts.validate(); err != nil {
		return err
	}
	if err := nopts.validate(opts.Mode); err != nil {
		return err
	}
	return validateProcess(*opts, copts, nopts, publish, given)
}

// Bounds of --shutdown-grace: in-flight RPCs need some time to finish; a
// kubelet or attacher waits far less than ten minutes for an answer.
const (
	minShutdownGrace = time.Second
	maxShutdownGrace = 10 * time.Minute
)

// validateProcess checks what csi.Options.Validate, the controller's and
// the connector's options leave to the binary: the combinations of flags
// of different groups and the ranges of ports and timeouts, so that every
// flag error stops the driver before it touches the host.
func validateProcess(opts csi.Options, copts controllerOptions, nopts connectorOptions, publish bool, given map[string]bool) error {
	var problems []string
	add := func(format string, a ...any) { problems = append(problems, fmt.Sprintf(format, a...)) }
	if err := validateDriverName(opts.DriverName); err != nil {
		add("%v", err)
	}
	// The node ID is the Kubernetes node name the node plugin registers:
	// checked here, not first by the node service after it has settled
	// the host's NVMe identity.
	if opts.NodeID != "" {
		if errs := validation.IsDNS1123Subdomain(opts.NodeID); len(errs) > 0 {
			add("--node-id %q is not a Kubernetes node name (spec.nodeName): %s", opts.NodeID, strings.Join(errs, "; "))
		} else if _, err := csi.FormatNodeID(opts.NodeID, ""); err != nil {
			add("--node-id: %v", err)
		}
	}
	// The controller dials --rds-address and hands --nvme-address to every
	// node in the volume context: a port or a space in either would fail
	// only there, as a name lookup or an nvme connect.
	for _, a := range []struct{ flag, value, port string }{
		{"--rds-address", opts.RDSAddress, "--rds-port"},
		{"--nvme-address", opts.NVMeAddress, "--nvme-port"},
	} {
		if a.value == "" {
			continue
		}
		if err := rds.ValidateHost(a.value); err != nil {
			add("%s: %v (the port is %s)", a.flag, err, a.port)
		}
	}
	if opts.Mode != csi.ModeNode {
		if err := rds.ValidatePort(opts.RDSPort); err != nil {
			add("--rds-port: %v", err)
		}
		if copts.guardShareSet && copts.NotReadyThreshold <= 0 && copts.HeartbeatThreshold <= 0 {
			// The guard holds off the NotReady and heartbeat fences only.
			add("--fence-guard-share needs a positive --not-ready-threshold or --heartbeat-threshold: with both 0 no node is fenced, so the mass-outage guard guards nothing")
		}
		if opts.AllowHostFencing() && !publish {
			add("--storage-fencing=allow-host needs --publish: with allow-host a volume's export is opened only by ControllerPublish, to the host of the attachment that holds it, so without publish no volume would ever be opened to anyone (use --storage-fencing=off without attach)")
		}
	}
	if opts.Mode != csi.ModeController {
		switch {
		case nopts.StateDir != "" && !filepath.IsAbs(nopts.StateDir):
			add("--node-state-dir %q must be an absolute path: the node's records of its mounts must stay where the next start of the node plugin finds them", nopts.StateDir)
		case nopts.stateDir(opts.Endpoint) == "":
			add("--node-state-dir is required with a tcp:// --endpoint (with a unix:// one it defaults to %s beside the socket)", defaultStateDirName)
		}
	}
	if network, address, err := csi.ParseEndpoint(opts.Endpoint); err == nil && network == "tcp" {
		if err := validateListenAddress(address); err != nil {
			add("--endpoint %s: %v", opts.Endpoint, err)
		}
	}
	// A Lease in a namespace that cannot exist would make the election
	// fail at every attempt, in the log only: this replica never leads.
	if ns := copts.LeaderElectionNamespace; ns != "" {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			add("--leader-election-namespace %q is not a namespace name: %s", ns, strings.Join(errs, "; "))
		}
	}
	if copts.HTTPEndpoint != "" {
		if err := validateListenAddress(copts.HTTPEndpoint); err != nil {
			add("--http-endpoint %q: %v (want host:port or :port, e.g. :8080)", copts.HTTPEndpoint, err)
		}
	}
	if opts.ShutdownGrace < minShutdownGrace || opts.ShutdownGrace > maxShutdownGrace {
		add("--shutdown-grace=%s is outside %s..%s: in-flight RPCs (a stage's mkfs, a publish's API writes) need that long to finish", opts.ShutdownGrace, minShutdownGrace, maxShutdownGrace)
	}
	// A volume's NQN is the prefix and its ID: a prefix that leaves no
	// room for the provisioner's IDs would fail every CreateVolume, far
	// from the flag.
	if room := maxNQNLength - len(opts.NQNPrefix); room < len(exampleVolumeID) {
		add("--nqn-prefix is %d bytes and leaves %d for a volume ID: a volume's NQN is the prefix and its ID, at most %d bytes in all, and the provisioner's IDs (pvc-<uuid>) are %d; shorten the prefix to at most %d bytes", len(opts.NQNPrefix), max(room, 0), maxNQNLength, len(exampleVolumeID), maxNQNLength-len(exampleVolumeID))
	}
	for _, n := range needs(opts, copts, nopts, publish) {
		for _, f := range n.flags {
			if given[f] {
				add("--%s needs %s: %s", f, n.feature, n.why)
			}
		}
	}
	for _, f := range otherModesFlags(opts.Mode, nopts.Kind, given) {
		add("%s", f)
	}
	if copts.GracePeriod < 0 {
		add("--attach-grace-period must not be negative (it is deprecated and ignored; drop it)")
	}
	if len(problems) > 0 {
		return fmt.Errorf("invalid configuration: %s", strings.Join(problems, "; "))
	}
	return nil
}

// maxNQNLength is the NVMe base specification's limit on an NQN.
const maxNQNLength = 223

// exampleVolumeID is as long as the volume IDs the external-provisioner
// asks for (pvc-<uuid>).
const exampleVolumeID = "pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789"

// featureFlags are flags that only mean something with a feature on.
type featureFlags struct {
	feature string // the flag that turns it on
	why     string
	flags   []string
}

// needs lists the flags that are refused when given, because their
// feature is off and they would be taken and silently ignored (a flag of
// the other mode: otherModesFlags).
func needs(opts csi.Options, copts controllerOptions, nopts connectorOptions, publish bool) []featureFlags {
	var n []featureFlags
	if !copts.LeaderElection {
		n = append(n, featureFlags{"--leader-election", "without it every replica acts as the leader and no Lease is taken",
			[]string{"leader-election-namespace", "leader-election-lease-duration", "leader-election-renew-deadline", "leader-election-retry-period"}})
	}
	if !opts.AllowHostFencing() {
		n = append(n, featureFlags{"--storage-fencing=allow-host", "without storage fencing no export is restricted to a host, so there is no attachment NQN to derive and no export to reconcile",
			[]string{"attachment-key-file", "export-reconcile-period"}})
	}
	if opts.Mode != csi.ModeNode && !publish {
		// --heartbeat-threshold and --fence-guard-share keep their own
		// rules (controllerOptions.validate).
		n = append(n, featureFlags{"--publish", "with --publish=false the controller uses no Kubernetes API and runs no attachment index, fencing, leader election or RDS health poll",
			[]string{"kubeconfig", "kube-api-content-type", "leader-election", "not-ready-threshold", "migration-timeout", "orphaned-claim-threshold",
				"watch-disconnect-threshold", "fence-call-timeout", "rds-health-interval"}})
	}
	if nopts.Kind != connectorTCP {
		n = append(n, featureFlags{"--node-connector=tcp", "the loop connector makes no NVMe/TCP connection",
			[]string{"nvme-ctrl-loss-timeout", "nvme-fast-io-fail-timeout"}})
	}
	return n
}

// controllerFlags are read by the controller only: given to a node plugin
// (--mode=node) each would be taken and ignored. The loop connector reads
// the RDS's layout (--rds-pool, --rds-volume-path) to find the
// simulator's files, and --node-lease reads --kubeconfig; the RDS address
// names the RDS in topology and --nvme-address and --nvme-port are a
// node's fallbacks, so those are flags of both.
var controllerFlags = []string{
	"rds-port", "rds-user", "rds-key-file", "rds-known-hosts-file", "rds-insecure-skip-host-key-check", "rds-login-options",
	"rds-pool", "rds-volume-path", "rds-command-timeout", "rds-health-interval",
	"storage-fencing", "attachment-key-file", "export-auth", "copy-from-data", "publish", "kubeconfig", "kube-api-content-type",
	"leader-election", "leader-election-namespace", "leader-election-lease-duration", "leader-election-renew-deadline", "leader-election-retry-period",
	"attach-grace-period", "not-ready-threshold", "heartbeat-threshold", "fence-guard-share", "migration-timeout", "orphaned-claim-threshold",
	"watch-disconnect-threshold", "fence-call-timeout", "out-of-service-taint", "export-reconcile-period",
}

// nodeFlags are read by the node plugin only (--node-lease and
// --node-lease-duration have their own rule: nodeLeaseOptions.validate).
var nodeFlags = []string{
	"node-connector", "node-loop-data-dir", "node-nvme-dir", "node-state-dir", "nvme-ctrl-loss-timeout", "nvme-fast-io-fail-timeout",
	"max-volumes-per-node",
}

// otherModesFlags are the problems of flags given to a mode that does not
// read them: refused, not ignored.
func otherModesFlags(mode, connector string, given map[string]bool) []string {
	var problems []string
	switch mode {
	case csi.ModeNode:
		for _, f := range controllerFlags {
			switch {
			case !given[f]:
			case (f == "rds-pool" || f == "rds-volume-path") && connector == connectorLoop:
			case f == "kubeconfig" && given["node-lease"]:
			default:
				problems = append(problems, fmt.Sprintf("--%s is a flag of the controller (--mode=controller or all); the node plugin does not read it", f))
			}
		}
	case csi.ModeController:
		for _, f := range nodeFlags {
			if given[f] {
				problems = append(problems, fmt.Sprintf("--%s is a flag of the node plugin (--mode=node or all); the controller does not read it", f))
			}
		}
	}
	return problems
}

// maxDriverNameLength is CSI's limit on a plugin name (and Kubernetes' on
// a CSIDriver's).
const maxDriverNameLength = 63

// validateDriverName checks --driver-name as CSI and Kubernetes require it:
// at most 63 characters in domain name notation, lower case because the
// CSIDriver object (and the kubelet's plugin registration) is named by it.
func validateDriverName(name string) error {
	if len(name) > maxDriverNameLength || len(validation.IsDNS1123Subdomain(name)) > 0 {
		return fmt.Errorf("--driver-name %q must be at most %d characters of a-z, 0-9, '-' and '.', starting and ending alphanumeric (a domain name, e.g. %s), as CSI and the CSIDriver object require", name, maxDriverNameLength, csi.DefaultDriverName)
	}
	return nil
}

// validateListenAddress checks a host:port to listen on: the port a
// number in 1..65535 (0 would pick a port nobody can find).
func validateListenAddress(address string) error {
	_, port, err := net.SplitHostPort(address)
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		return fmt.Errorf("port %q is not a number", port)
	}
	return rds.ValidatePort(n)
}

// controllerService keeps a nil server a nil interface, so that
// NewGRPCServer leaves the service unregistered.
func controllerService(cs *csi.ControllerServer) csispec.ControllerServer {
	if cs == nil {
		return nil
	}
	return cs
}
