package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/srvlab/rds-csi/pkg/backends"
	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/csi"
	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/health"
	"github.com/srvlab/rds-csi/pkg/informers"
	"github.com/srvlab/rds-csi/pkg/metrics"
	"github.com/srvlab/rds-csi/pkg/rds"
	"github.com/srvlab/rds-csi/pkg/rdshealth"
	"github.com/srvlab/rds-csi/pkg/storagefence"
	"github.com/srvlab/rds-csi/pkg/version"
)

// controllerOptions are the controller process's settings beyond the CSI
// driver's: the Kubernetes API, leader election, the HTTP endpoint and the
// publish policy.
type controllerOptions struct {
	Kubeconfig   string
	HTTPEndpoint string
	// KubeAPIContentType is how the controller's requests and watches
	// are encoded (protobuf or JSON; every object it reads or writes is
	// a built-in type, which kube-apiserver serves as protobuf).
	KubeAPIContentType string

	LeaderElection          bool
	LeaderElectionNamespace string
	LeaseDuration           time.Duration
	RenewDeadline           time.Duration
	RetryPeriod             time.Duration

	// GracePeriod is accepted for compatibility and ignored (deprecated).
	GracePeriod        time.Duration
	NotReadyThreshold  time.Duration
	HeartbeatThreshold time.Duration
	FenceGuardShare    float64
	MigrationTimeout   time.Duration

	OrphanedClaimThreshold time.Duration
	WatchStallThreshold    time.Duration
	ReactionTimeout        time.Duration
	ExportReconcilePeriod  time.Duration
	// RDSCommandTimeout bounds one attempt of one RDS command (rds.Config
	// CommandTimeout; copies have their own).
	RDSCommandTimeout time.Duration
	// RDSHealthInterval paces the leader's poll of the RDS's own health
	// and load (pkg/rdshealth); 0: off.
	RDSHealthInterval time.Duration

	// OutOfServiceTaint: taint a node out of service once a NotReady fence
	// has cut it off (storage fencing only).
	OutOfServiceTaint bool
	// nodeLeaseNamespace holds the node plugins' Leases, watched as a
	// second heartbeat with --heartbeat-threshold (nodeLeaseOptions).
	nodeLeaseNamespace string
	storageFencing     bool
	// guardShareSet: --fence-guard-share was given (0 is then an error,
	// not the default).
	guardShareSet bool
}

func (o *controllerOptions) addFlags(fs *flag.FlagSet) {
	def := fencing.DefaultConfig()
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file for the Kubernetes API (default: in-cluster configuration)")
	fs.StringVar(&o.KubeAPIContentType, "kube-api-content-type", contentTypeProtobuf, "encoding of Kubernetes API requests: "+contentTypeProtobuf+" or "+contentTypeJSON)
	fs.StringVar(&o.HTTPEndpoint, "http-endpoint", "", "address of /healthz, /readyz and /metrics, e.g. :8080 (empty: none)")
	fs.BoolVar(&o.LeaderElection, "leader-election", false, "elect one controller replica to run the background actions")
	fs.StringVar(&o.LeaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader election Lease (default: the pod's namespace)")
	fs.DurationVar(&o.LeaseDuration, "leader-election-lease-duration", 15*time.Second, "how long a leader's Lease is valid without renewal (whole seconds)")
	fs.DurationVar(&o.RenewDeadline, "leader-election-renew-deadline", 10*time.Second, "how long the leader retries renewing before giving up leadership")
	fs.DurationVar(&o.RetryPeriod, "leader-election-retry-period", 5*time.Second, "how often candidates try to acquire or renew the Lease")
	fs.DurationVar(&o.GracePeriod, "attach-grace-period", 0, "deprecated, ignored")
	fs.DurationVar(&o.NotReadyThreshold, "not-ready-threshold", 0, "fence a node NotReady this long (0: never; default with storage fencing: 20s)")
	fs.DurationVar(&o.HeartbeatThreshold, "heartbeat-threshold", 0, "with storage fencing: fence a node whose heartbeat is lost this long (default 20s; 0: never)")
	fs.Float64Var(&o.FenceGuardShare, "fence-guard-share", fencing.DefaultGuardShare, "mass-outage guard: no heartbeat or NotReady fence while more than this share are unhealthy")
	fs.DurationVar(&o.MigrationTimeout, "migration-timeout", def.MigrationTimeout, "how long a raw-block ReadWriteMany volume may stay on two nodes")
	fs.DurationVar(&o.OrphanedClaimThreshold, "orphaned-claim-threshold", 5*time.Minute, "report a claim no VolumeAttachment stood on for this long (0: never)")
	fs.DurationVar(&o.WatchStallThreshold, "watch-disconnect-threshold", 30*time.Second, "/readyz and Probe fail while a watch is disconnected this long")
	fs.BoolVar(&o.OutOfServiceTaint, "out-of-service-taint", false, "with storage fencing: taint a fenced node node.kubernetes.io/out-of-service")
	fs.DurationVar(&o.ExportReconcilePeriod, "export-reconcile-period", time.Minute, "with storage fencing: how often the leader reconciles exports with claims")
	fs.DurationVar(&o.RDSHealthInterval, "rds-health-interval", 30*time.Second, "how often the leader polls the RDS's health for /metrics (0: off)")
	fs.DurationVar(&o.ReactionTimeout, "fence-call-timeout", 15*time.Second, "timeout of each API call a fence reaction makes")
	fs.DurationVar(&o.RDSCommandTimeout, "rds-command-timeout", DefaultRDSCommandTimeout, "how long one attempt of one RDS command is waited for")
}

// DefaultRDSCommandTimeout is --rds-command-timeout's default (rds.Config's).
const DefaultRDSCommandTimeout = 30 * time.Second

// Bounds of --rds-command-timeout: below a second a busy RDS times out
// healthy commands; beyond ten minutes a hung one holds a publish (and one
// of the client's SSH sessions) for longer than any attacher waits.
const (
	minRDSCommandTimeout = time.Second
	maxRDSCommandTimeout = 10 * time.Minute
)

// StorageFencedNotReadyThreshold is --not-ready-threshold's default with
// --storage-fencing=allow-host. Without storage fencing NotReady alone may
// be a partition with the node still writing, so it never fences by
// default; with it, a fence cuts the node's host off the RDS first, so
// fencing a node that is only partitioned costs its workload I/O errors,
// never a second writer. 20s after kube-controller-manager marks the node
// NotReady (its --node-monitor-grace-period, 40-50s by default) rides out
// a short blip and still moves volumes about a minute after a node dies.
const StorageFencedNotReadyThreshold = 20 * time.Second

// StorageFencedHeartbeatThreshold is --heartbeat-threshold's default with
// --storage-fencing=allow-host: two of a kubelet's renewals (every 10 s
// by default). One late renewal is not a lost heartbeat, and by the time
// the first node of a partition lapses every other has been silent for
// over half of it, which the mass-outage guard counts.
const StorageFencedHeartbeatThreshold = 20 * time.Second

// storageFencingDefaults applies the defaults that depend on
// --storage-fencing, after parsing: an explicit flag always wins.
func (o *controllerOptions) storageFencingDefaults(d csi.Options, fs *flag.FlagSet) {
	o.storageFencing = d.AllowHostFencing()
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	o.guardShareSet = set["fence-guard-share"]
	if !d.AllowHostFencing() {
		return
	}
	if !set["not-ready-threshold"] {
		o.NotReadyThreshold = StorageFencedNotReadyThreshold
	}
	if !set["heartbeat-threshold"] {
		o.HeartbeatThreshold = StorageFencedHeartbeatThreshold
	}
}

func (o *controllerOptions) validate() error {
	var problems []string
	add := func(format string, a ...any) { problems = append(problems, fmt.Sprintf(format, a...)) }
	if o.LeaderElection {
		o.validateLeaderElection(add)
	}
	if ct := o.contentType(); ct != contentTypeProtobuf && ct != contentTypeJSON {
		add("--kube-api-content-type=%q is neither %s nor %s", o.KubeAPIContentType, contentTypeProtobuf, contentTypeJSON)
	}
	// Each duration has the floor its meaning needs: below it the flag
	// is taken and quietly does something else than what it says.
	switch {
	case o.NotReadyThreshold < 0:
		add("--not-ready-threshold must not be negative (have %s; 0: never)", o.NotReadyThreshold)
	case o.NotReadyThreshold > 0 && o.NotReadyThreshold < minNotReadyThreshold:
		add("--not-ready-threshold=%s is shorter than %s: a node NotReady for less is a status flapping (a kubelet restart posts NotReady, then Ready), not a node gone (0: never)", o.NotReadyThreshold, minNotReadyThreshold)
	}
	switch {
	case o.OrphanedClaimThreshold < 0:
		add("--orphaned-claim-threshold must not be negative (have %s; 0: never)", o.OrphanedClaimThreshold)
	case o.OrphanedClaimThreshold > 0 && o.OrphanedClaimThreshold < minOrphanedClaimThreshold:
		add("--orphaned-claim-threshold=%s is shorter than %s: a claim is briefly without its VolumeAttachment while the index catches up with a detach, which is no orphan (0: never)", o.OrphanedClaimThreshold, minOrphanedClaimThreshold)
	case o.OrphanedClaimThreshold > maxOrphanedClaimThreshold:
		add("--orphaned-claim-threshold=%s is longer than %s: an orphaned claim keeps every other node off its volume, and one not reported within a day is as good as never (0 turns the report off)", o.OrphanedClaimThreshold, maxOrphanedClaimThreshold)
	}
	// And the ceiling where a larger value quietly turns off what the
	// flag bounds.
	switch {
	case o.MigrationTimeout < minMigrationTimeout:
		add("--migration-timeout=%s is shorter than %s: a live migration copies a VM's memory, and the holders' times have one-second resolution", o.MigrationTimeout, minMigrationTimeout)
	case o.MigrationTimeout > maxMigrationTimeout:
		add("--migration-timeout=%s is longer than %s: it bounds how long two nodes may write one volume, and a longer one is no bound", o.MigrationTimeout, maxMigrationTimeout)
	}
	switch {
	case o.ExportReconcilePeriod < time.Second:
		add("--export-reconcile-period must be at least 1s (have %s)", o.ExportReconcilePeriod)
	case o.ExportReconcilePeriod > maxExportReconcilePeriod:
		add("--export-reconcile-period=%s is longer than %s: an export a late RDS command left open to the wrong host would stand that long", o.ExportReconcilePeriod, maxExportReconcilePeriod)
	}
	if o.RDSCommandTimeout < minRDSCommandTimeout || o.RDSCommandTimeout > maxRDSCommandTimeout {
		add("--rds-command-timeout=%s is outside %s..%s (default %s)", o.RDSCommandTimeout, minRDSCommandTimeout, maxRDSCommandTimeout, DefaultRDSCommandTimeout)
	}
	if err := rdshealth.ValidateInterval(o.RDSHealthInterval); err != nil {
		add("%v", err)
	}
	switch {
	case o.WatchStallThreshold < minWatchStallThreshold:
		add("--watch-disconnect-threshold=%s is shorter than %s: a watch the API server ends (every few minutes) takes about a second to reconnect, and readiness would drop each time", o.WatchStallThreshold, minWatchStallThreshold)
	case o.WatchStallThreshold > maxWatchStallThreshold:
		add("--watch-disconnect-threshold=%s is longer than %s: the replica would stay ready that long deciding from a cache that stopped following the API server", o.WatchStallThreshold, maxWatchStallThreshold)
	}
	switch {
	case o.ReactionTimeout < minReactionTimeout:
		add("--fence-call-timeout=%s is shorter than %s: an API call does not answer sooner, so every fence would time out", o.ReactionTimeout, minReactionTimeout)
	case o.ReactionTimeout > maxReactionTimeout:
		add("--fence-call-timeout=%s is longer than %s: one API call that hangs would hold a dead node's fence that long", o.ReactionTimeout, maxReactionTimeout)
	}
	if o.OutOfServiceTaint && (!o.storageFencing || (o.NotReadyThreshold <= 0 && o.HeartbeatThreshold <= 0)) {
		add("--out-of-service-taint needs --storage-fencing=allow-host and a positive --not-ready-threshold or --heartbeat-threshold: without storage fencing a NotReady node may still be writing")
	}
	switch {
	case o.HeartbeatThreshold < 0:
		add("--heartbeat-threshold must not be negative (have %s)", o.HeartbeatThreshold)
	case o.HeartbeatThreshold > 0 && !o.storageFencing:
		add("--heartbeat-threshold needs --storage-fencing=allow-host: without it a node whose heartbeat stopped may still be writing, and nothing cuts it off the RDS")
	case o.HeartbeatThreshold > maxFenceThreshold || o.NotReadyThreshold > maxFenceThreshold:
		add("--heartbeat-threshold and --not-ready-threshold must be at most %s (have %s, %s): a longer wait is no fence at all (0 turns it off)", maxFenceThreshold, o.HeartbeatThreshold, o.NotReadyThreshold)
	case o.HeartbeatThreshold > 0 && o.HeartbeatThreshold < minHeartbeatThreshold:
		add("--heartbeat-threshold=%s is shorter than %s: that needs kubelets renewing their Leases more often than every %s (nodeLeaseDurationSeconds below %ds), a heartbeat write load no cluster should carry for it (docs/attachments.md)", o.HeartbeatThreshold, minHeartbeatThreshold, minHeartbeatThreshold/2, int(2*minHeartbeatThreshold/time.Second))
	}
	// NaN compares false with everything: written as "inside", not as
	// "not outside", so that it is refused with the rest.
	if !(o.FenceGuardShare > 0 && o.FenceGuardShare <= 1) && (o.guardShareSet || o.FenceGuardShare != 0) {
		add("--fence-guard-share must be a number in (0, 1] (have %g)", o.FenceGuardShare)
	}
	if len(problems) > 0 {
		return fmt.Errorf("invalid configuration: %s", strings.Join(problems, "; "))
	}
	return nil
}

// validateLeaderElection checks the election's timings as client-go's
// elector needs them, which otherwise refuses them only once running (the
// replica then never leads, and says so in its log only): the Lease states
// its duration in whole seconds, and renewals are retried with a jitter.
func (o *controllerOptions) validateLeaderElection(add func(string, ...any)) {
	switch {
	case o.RetryPeriod < minLeaderElectionRetry:
		add("--leader-election-retry-period=%s is shorter than %s: each retry reads or writes the Lease on the API server, which records its times to the second", o.RetryPeriod, minLeaderElectionRetry)
	case o.RenewDeadline <= time.Duration(leaderelection.JitterFactor*float64(o.RetryPeriod)):
		add("leader election needs --leader-election-renew-deadline above %g times --leader-election-retry-period (have %s, %s): renewals are retried with that jitter, and client-go's elector refuses less once running", leaderelection.JitterFactor, o.RenewDeadline, o.RetryPeriod)
	case o.LeaseDuration <= o.RenewDeadline:
		add("leader election needs lease-duration > renew-deadline > retry-period > 0 (have %s, %s, %s)", o.LeaseDuration, o.RenewDeadline, o.RetryPeriod)
	case o.LeaseDuration%time.Second != 0:
		add("--leader-election-lease-duration=%s must be whole seconds: the Lease states it in seconds, and the other replicas would read %s", o.LeaseDuration, o.LeaseDuration.Truncate(time.Second))
	case o.LeaseDuration > maxLeaderElectionLease:
		add("--leader-election-lease-duration=%s is longer than %s: a leader that dies holds every background action (the fences of dead nodes, the export reconcile) off that long", o.LeaseDuration, maxLeaderElectionLease)
	}
}

// Floors and ceilings of the controller's durations (validate says why
// each).
const (
	minNotReadyThreshold      = 5 * time.Second
	minOrphanedClaimThreshold = time.Minute
	maxOrphanedClaimThreshold = 24 * time.Hour
	minMigrationTimeout       = 10 * time.Second
	maxMigrationTimeout       = 24 * time.Hour
	maxExportReconcilePeriod  = time.Hour
	minWatchStallThreshold    = 5 * time.Second
	maxWatchStallThreshold    = 10 * time.Minute
	minReactionTimeout        = time.Second
	maxReactionTimeout        = 10 * time.Minute
	minLeaderElectionRetry    = time.Second
	maxLeaderElectionLease    = 5 * time.Minute
)

// The encodings --kube-api-content-type accepts.
const (
	contentTypeProtobuf = runtime.ContentTypeProtobuf
	contentTypeJSON     = runtime.ContentTypeJSON
)

// contentType is --kube-api-content-type; protobuf when not set (options
// built without the flags).
func (o *controllerOptions) contentType() string {
	if o.KubeAPIContentType == "" {
		return contentTypeProtobuf
	}
	return o.KubeAPIContentType
}

// maxFenceThreshold bounds --heartbeat-threshold and --not-ready-threshold:
// a day is no automatic fence in practice, and the timing arithmetic
// (thresholds added to clock readings and to one another) stays far from
// time.Duration's 292 years.
const maxFenceThreshold = 24 * time.Hour

// minHeartbeatThreshold: the shortest --heartbeat-threshold, two renewals
// of a kubelet with nodeLeaseDurationSeconds=10 (every 2.5 s). Per node it
// is raised further to two of that node's own renewals
// (fencing.HeartbeatFloor), so a node on the default cadence (10 s) is
// still timed against 20 s.
const minHeartbeatThreshold = 5 * time.Second

func (o *controllerOptions) policy() fencing.Config {
	return fencing.Config{NotReadyThreshold: o.NotReadyThreshold, HeartbeatThreshold: o.HeartbeatThreshold, MigrationTimeout: o.MigrationTimeout}
}

func (o *controllerOptions) restConfig() (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if o.Kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, err
	}
	cfg.UserAgent = "rds-csi-controller/" + version.Version
	// Protobuf for the built-in types the controller reads and writes;
	// JSON stays acceptable in answers (a patch's body keeps its own
	// type whatever this says).
	cfg.ContentType = o.contentType()
	cfg.AcceptContentTypes = cfg.ContentType
	if cfg.ContentType == contentTypeProtobuf {
		cfg.AcceptContentTypes = contentTypeProtobuf + "," + contentTypeJSON
	}
	// Informers do the reading; writes are claims, events and the Lease.
	cfg.QPS, cfg.Burst = 50, 100
	return cfg, nil
}

// controllerProcess is everything the controller runs besides the gRPC
// server: the informers' index, the Fencer, leader election, the HTTP
// endpoint.
type controllerProcess struct {
	opts     controllerOptions
	driver   csi.Options
	client   kubernetes.Interface
	index    *informers.AttachmentIndex
	ctrl     *informers.Controller
	metrics  *metrics.Metrics
	health   *health.Server
	leader   atomic.Bool
	events   record.EventBroadcaster
	rec      record.EventRecorder
	reporter *fencing.Reporter
	fence    *storagefence.Fence
	// boxFences are the protocol on each box alone, for the leader's
	// reconcile: a box that is down fails only its own pass.
	boxFences []boxFence
	// Publisher is what the ControllerServer serves publish with, and
	// Ready what the driver's Probe checks beside the RDS.
	Publisher *csi.Publisher
	Ready     csi.ReadinessCheck
	// httpLis is --http-endpoint, opened at start (nil: none).
	httpLis net.Listener
	// rdsHealth polls each box's health while this replica leads, one
	// poller per box (none: --rds-health-interval=0).
	rdsHealth []*rdshealth.Poller
}

// newControllerProcess builds everything the controller runs beside the
// gRPC server, each part given what it needs when it is made: the
// controller's view of node health (Liveness), the attachment index and
// its informers, the claim store, the storage-fence protocol, the node
// fencer, the events and metrics. Publisher and Ready are what the CSI
// driver is built with. Nothing runs until run.
func newControllerProcess(opts controllerOptions, driverOpts csi.Options, client kubernetes.Interface, boxes *rdsBoxes, m *metrics.Metrics, rdsProbe func(context.Context) error, httpLis net.Listener) (*controllerProcess, error) {
	p := &controllerProcess{opts: opts, driver: driverOpts, client: client, metrics: m, index: informers.NewAttachmentIndex(), httpLis: httpLis}
	p.events = record.NewBroadcaster()
	p.rec = p.events.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "rds-csi-controller"})
	reporter := fencing.NewReporter(p.rec, m)
	p.reporter = reporter
	// Node health on this controller's clock: the index reads it, and
	// every live read that backs a fence (and the taint after one) is
	// timed by it.
	live := fencing.NewLiveness(fencing.LivenessConfig{
		Policy: opts.policy(), GuardShare: opts.FenceGuardShare, Client: client, PluginLeaseNamespace: opts.nodeLeaseNamespace,
		OnGuard: func(e fencing.GuardEvent) {
			klog.Background().Info("storage fencing: mass-outage guard", "holding", e.Holding, "suspect", e.Suspect, "nodes", e.Total, "some", e.Nodes)
			reporter.GuardChanged(e.Holding, e.Suspect, e.Total, e.Nodes)
		},
		OnFlap: reporter.NodeFlapped,
	})
	// One protocol for publish, unpublish and fences, its RDS calls routed
	// to each volume's box; and one per box for that box's reconcile.
	views := boxes.views()
	router, err := backends.NewRouter(views...)
	if err != nil {
		return nil, err
	}
	store := claims.NewStore(client, driverOpts.DriverName, driverOpts.AllowHostFencing())
	fenceConfig := func(client storagefence.RDS, index storagefence.Index, isID func(string) bool, isDisk func(*rds.Disk) bool) storagefence.Config {
		return storagefence.Config{
			StorageFencing: driverOpts.AllowHostFencing(), ExportAuth: driverOpts.ExportAuthOn(), AttachmentKey: driverOpts.AttachmentKey,
			RDS: client, Store: store, Index: index, Nodes: live, IsVolumeID: isID, IsVolumeDisk: isDisk, Reporter: reporter,
		}
	}
	anyBox := func(d *rds.Disk) bool {
		for _, b := range boxes.cfgs {
			if csi.IsVolumeDiskOf(b)(d) {
				return true
			}
		}
		return false
	}
	fence, err := storagefence.New(fenceConfig(router, p.index, csi.IsVolumeID, anyBox))
	if err != nil {
		return nil, err
	}
	p.fence = fence
	for i, b := range boxes.cfgs {
		owns := csi.IsVolumeIDOf(b)
		f, err := storagefence.New(fenceConfig(views[i], boxIndex{AttachmentIndex: p.index, owns: owns}, owns, csi.IsVolumeDiskOf(b)))
		if err != nil {
			return nil, err
		}
		p.boxFences = append(p.boxFences, boxFence{name: b.Name, fence: f})
	}
	// The node fencer reacts to node failures through the protocol; with
	// --out-of-service-taint it taints a node it cut off every volume.
	var (
		tainter   storagefence.NodeTainter
		recovered func(context.Context, string) error
	)
	if opts.OutOfServiceTaint {
		t := fencing.NewTainter(client, driverOpts.DriverName, live)
		tainter = t
		recovered = func(ctx context.Context, node string) error {
			if !p.isLeader() {
				return nil
			}
			return t.RemoveTaint(ctx, node)
		}
	}
	fencer := storagefence.NewNodeFencer(storagefence.NodeFencerConfig{
		Fence: fence, Nodes: live, Policy: opts.policy(), Tainter: tainter, Reporter: reporter, IsLeader: p.isLeader,
		Group: func(handle string) string { box, _ := backends.SplitID(handle); return box },
	})
	malformed := p.malformedSet(reporter)
	ctrl, err := informers.NewController(client, p.index, informers.Config{
		DriverName: driverOpts.DriverName, Policy: opts.policy(), Reactor: fencer, NodeRecovered: recovered,
		ReactionTimeout: opts.ReactionTimeout, OrphanedClaimThreshold: opts.OrphanedClaimThreshold,
		OrphanedClaims: reporter.OrphanedClaimsNow, Liveness: live, Malformed: malformed,
	})
	if err != nil {
		return nil, err
	}
	p.ctrl = ctrl
	p.Publisher = &csi.Publisher{Index: p.index, Fence: fence, Nodes: live, Synced: ctrl.Synced, Policy: opts.policy(), Reporter: reporter, Malformed: malformed}
	informersSynced := func(context.Context) error {
		if !ctrl.Synced() {
			return errors.New("the attachment index has not synced with the API server yet")
		}
		// A watch that stays disconnected leaves the index behind by an
		// unknown amount: decisions still confirm with the API server,
		// but a replica in that state should not be chosen to serve.
		return ctrl.WatchesHealthy(opts.WatchStallThreshold)
	}
	p.Ready = informersSynced
	p.health, err = health.New(health.Check{Name: "informers-synced", Func: informersSynced}, health.Check{Name: "rds", Func: rdsProbe})
	if err != nil {
		return nil, err
	}
	p.health.Handle("/metrics", m.Handler())
	if opts.RDSHealthInterval > 0 {
		// Per box, its own SSH connection (dialled by the leader only), so
		// that a poll never holds a session the volume operations need.
		var sources []metrics.RDSHealthSource
		for _, b := range boxes.cfgs {
			cfg := b.RDSConfig()
			cfg.MaxSessions = 1
			if cfg.CommandTimeout == 0 {
				cfg.CommandTimeout = opts.RDSCommandTimeout
			}
			name := b.Name
			cfg.Observer = func(r rds.CommandRecord) { m.ObserveRDSCommand(name, r.Command, r.Duration, r.Err) }
			client, err := rds.NewClient(cfg)
			if err != nil {
				return nil, fmt.Errorf("RDS client of %s for health polls: %w", describeBox(b), err)
			}
			view := backends.NewView(&b, nil)
			pvName := func(slot string) (string, bool) {
				if v := p.index.Volume(view.ID(slot)); v != nil && v.PVName != "" {
					return v.PVName, true
				}
				return "", false
			}
			poller, err := rdshealth.New(client, rdshealth.Config{Pool: b.Pool, Interval: opts.RDSHealthInterval, PVName: pvName})
			if err != nil {
				return nil, err
			}
			p.rdsHealth = append(p.rdsHealth, poller)
			sources = append(sources, metrics.RDSHealthSource{RDS: name, View: poller.View})
		}
		m.ReportRDSHealth(sources...)
	}
	return p, nil
}

// pollRDSHealth polls the RDS's health while ctx (the leadership's) lasts,
// once the index has synced (per-volume series are labelled by PV name).
func (p *controllerProcess) pollRDSHealth(ctx context.Context) {
	if len(p.rdsHealth) == 0 || !p.ctrl.WaitForSync(ctx) {
		return
	}
	var wg sync.WaitGroup
	for _, poller := range p.rdsHealth {
		wg.Add(1)
		go func() { defer wg.Done(); poller.Run(ctx) }()
	}
	wg.Wait()
}

func (p *controllerProcess) isLeader() bool { return p.leader.Load() }

func (p *controllerProcess) setLeader(v bool) {
	p.leader.Store(v)
	p.metrics.SetLeader(v)
}

// run runs until ctx is done. Failures of a part are logged, never fatal
// for the gRPC server: a replica without leadership still serves publishes.
func (p *controllerProcess) run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	if p.opts.GracePeriod != 0 {
		logger.Info("WARNING: --attach-grace-period is deprecated and ignored: a volume moves to another node once its detach has completed or its node is fenced", "value", p.opts.GracePeriod)
	}
	p.events.StartStructuredLogging(4)
	p.events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: p.client.CoreV1().Events("")})
	defer p.events.Shutdown()

	var wg sync.WaitGroup
	start := func(f func()) { wg.Add(1); go func() { defer wg.Done(); f() }() }
	start(func() { p.ctrl.Run(ctx) })
	start(func() { p.reportIndexSize(ctx) })
	if p.httpLis != nil {
		start(func() {
			if err := p.health.Serve(ctx, p.httpLis); err != nil {
				logger.Error(err, "HTTP endpoint failed", "address", p.opts.HTTPEndpoint)
			}
		})
	}
	if p.opts.LeaderElection {
		start(func() { p.elect(ctx, start) })
	} else {
		p.setLeader(true)
		start(func() { p.reconcileExports(ctx) })
		start(func() { p.pollRDSHealth(ctx) })
		start(func() { p.retireMarked(ctx) })
	}
	wg.Wait()
}

// reconcileExports runs storage fencing's reconcile of every export
// against the live claims (storagefence.Fence.Reconcile) while this replica
// leads: once the index has synced (at start and after each takeover),
// then every --export-reconcile-period. ctx is the leadership's: losing
// the lease stops the pass before its next RDS write.
func (p *controllerProcess) reconcileExports(ctx context.Context) {
	if !p.driver.AllowHostFencing() || !p.ctrl.WaitForSync(ctx) {
		return
	}
	var wg sync.WaitGroup
	for _, bf := range p.boxFences {
		wg.Add(1)
		go func() { defer wg.Done(); p.reconcileBox(ctx, bf) }()
	}
	wg.Wait()
}

// boxFence is the storage-fence protocol on one box alone.
type boxFence struct {
	name  string
	fence *storagefence.Fence
}

// reconcileBox is one box's reconcile loop: its passes neither wait on
// nor fail with another box's.
func (p *controllerProcess) reconcileBox(ctx context.Context, bf boxFence) {
	logger := klog.FromContext(ctx).WithValues("rds", bf.name)
	report := p.reportMismatch(ctx)
	for {
		rctx, cancel := context.WithTimeout(ctx, p.opts.ExportReconcilePeriod+5*time.Minute)
		n, err := bf.fence.Reconcile(rctx, report)
		cancel()
		if err != nil {
			logger.Error(err, "storage fencing: reconciling exports with claims", "fixed", n)
		} else {
			logger.V(2).Info("storage fencing: exports reconciled with claims", "fixed", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(p.opts.ExportReconcilePeriod):
		}
	}
}

// reportMismatch logs, counts and events an export that did not match its
// volume's live claims.
func (p *controllerProcess) reportMismatch(ctx context.Context) func(storagefence.Mismatch) {
	logger := klog.FromContext(ctx)
	return func(m storagefence.Mismatch) {
		logger.Info("storage fencing: export did not match the live claims", "volume", m.Volume, "pv", m.PV, "found", m.Found.String(), "now", m.Now.String(), "err", m.Err)
		p.reporter.ExportMismatch(fencing.VolumeRef{PV: m.PV, Handle: m.Volume}, m.Found.String(), m.Now.String(), m.Err)
	}
}

// retireMarked makes, while this replica leads, the export changes after
// a release that the releasing replica failed to make or did not live to
// (storagefence.Fence.RetireMarked, from the records the releases left on the PVs):
// until one is made, an open of the retired attachment that was in
// flight can still land.
func (p *controllerProcess) retireMarked(ctx context.Context) {
	if !p.driver.AllowHostFencing() || !p.ctrl.WaitForSync(ctx) {
		return
	}
	var wg sync.WaitGroup
	for _, bf := range p.boxFences {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(retireRetryPeriod)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				if left, err := bf.fence.RetireMarked(ctx, p.reportMismatch(ctx)); err != nil {
					klog.FromContext(ctx).Error(err, "storage fencing: export changes after a release still pending", "rds", bf.name, "volumes", left)
				}
			}
		}()
	}
	wg.Wait()
}

// retireRetryPeriod: how often the leader looks for export changes after
// a release still to be made; the window in which a late open of the
// retired attachment can land is this long after the RDS answers again
// (or after the index shows the release).
const retireRetryPeriod = 5 * time.Second

func (p *controllerProcess) reportIndexSize(ctx context.Context) {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		s := p.index.Stats()
		p.metrics.SetIndexSize(s.Volumes, s.Attachments, s.Nodes)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// leaseName is the Lease of the driver's controller election, a DNS label
// derived from the driver name.
func leaseName(driver string) string {
	return strings.NewReplacer(".", "-", "/", "-").Replace(driver) + "-controller"
}

func (p *controllerProcess) namespace() string {
	if p.opts.LeaderElectionNamespace != "" {
		return p.opts.LeaderElectionNamespace
	}
	if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
		return strings.TrimSpace(string(b))
	}
	return metav1.NamespaceDefault
}

// elect campaigns for the Lease until ctx is done. Losing it stops the
// background work at once (the Fencer checks leadership before every
// write) and the replica campaigns again; the process does not exit.
func (p *controllerProcess) elect(ctx context.Context, start func(func())) {
	logger := klog.FromContext(ctx)
	host, _ := os.Hostname()
	id := fmt.Sprintf("%s_%d", host, os.Getpid())
	if p.driver.NodeID != "" {
		id = p.driver.NodeID + "_" + id
	}
	lock := &heldLease{LeaseLock: &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: p.namespace(), Name: leaseName(p.driver.DriverName)},
		Client:     p.client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: id, EventRecorder: p.rec},
	}}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   p.opts.LeaseDuration,
			RenewDeadline:   p.opts.RenewDeadline,
			RetryPeriod:     p.opts.RetryPeriod,
			ReleaseOnCancel: true,
			Name:            lock.LeaseMeta.Name,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(leading context.Context) {
					p.setLeader(true)
					logger.Info("became the leader: running node-failure fencing", "identity", id)
					// Failures that happened while another replica led (or
					// none did) are fenced now.
					p.ctrl.RefenceStale()
					start(func() { p.reconcileExports(leading) })
					start(func() { p.pollRDSHealth(leading) })
					start(func() { p.retireMarked(leading) })
				},
				OnStoppedLeading: func() {
					p.setLeader(false)
					logger.Info("lost the leadership: background actions stopped, still serving publishes", "identity", id)
				},
			},
		})
		if err != nil {
			logger.Error(err, "leader election misconfigured")
			return
		}
		le.Run(ctx)
	}
}
