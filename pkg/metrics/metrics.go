package metrics

import (
	"context"
	"errors"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/srvlab/rds-csi/pkg/fencing"
)

// Namespace is the prefix of every family this package defines.
const Namespace = "rds_csi"

// Results of ControllerPublishVolume / ControllerUnpublishVolume that exist
// from the start (at 0), so that rate() and absent() work before the first
// attach. Other short results (for example "aborted", "error") are
// recorded as given.
const (
	ResultAttached         = "attached"
	ResultAlreadyPublished = "already-published"
	ResultRefused          = "refused"
	ResultDetached         = "detached"
)

// Results of an RDS command.
const (
	RDSResultSuccess = "success"
	RDSResultTimeout = "timeout"
	RDSResultError   = "error"
)

// Reasons a live migration ended.
const (
	MigrationCompleted = "completed"
	MigrationTimedOut  = "timed_out"
)

// Other replaces a label value that is not a short identifier.
const Other = "other"

// labelPattern is what a caller-supplied label value must look like: a
// short lowercase identifier. Anything else (an error message, a volume ID
// inside a command) becomes "other", keeping the number of series bounded.
var labelPattern = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,39}$`)

// reasonPattern is the same for the policy's CamelCase fence reasons.
var reasonPattern = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]{0,39}$`)

func label(v string) string {
	if labelPattern.MatchString(v) {
		return v
	}
	return Other
}

// commandLabel turns a RouterOS command into a label value: its menu path
// and verb, without arguments ("/disk add type=file file-path=..." and
// "disk add" both give "disk_add"; "/disk print detail where slot=x" gives
// "disk_print"). Arguments carry volume IDs and would make a series per
// volume.
func commandLabel(command string) string {
	var path []string
	for _, tok := range strings.Fields(strings.TrimPrefix(strings.TrimSpace(command), "/")) {
		tok = strings.ToLower(tok)
		if len(path) == maxCommandWords || commandModifiers[tok] || !commandWord.MatchString(tok) {
			break
		}
		path = append(path, tok)
	}
	return label(strings.Join(path, "_"))
}

// A RouterOS menu path and verb: at most three words ("system resource
// print"); print's modifiers and anything with "=", "[" or quotes ends it.
var (
	commandWord      = regexp.MustCompile(`^[a-z][a-z0-9_-]*$`)
	commandModifiers = map[string]bool{"detail": true, "where": true, "terse": true, "without-paging": true,
		"value-list": true, "as-value": true, "count-only": true, "brief": true, "stats": true}
)

const maxCommandWords = 3

// Buckets, in seconds. A publish decision is in-memory plus at most one
// conditional update to the API server; RDS commands include copying a
// disk for snapshots and clones, which can take minutes.
var (
	decisionBuckets   = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}
	rdsCommandBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}
)

// Metrics owns the driver's collectors and the registry they are on.
type Metrics struct {
	registry *prometheus.Registry

	publish           *prometheus.CounterVec
	unpublish         *prometheus.CounterVec
	publishDecision   prometheus.Histogram
	conflicts         prometheus.Counter
	fences            *prometheus.CounterVec
	orphanedClaims    prometheus.Gauge
	migrationsStarted prometheus.Counter
	migrationsEnded   *prometheus.CounterVec
	rdsCommand        *prometheus.HistogramVec
	rdsConnected      *prometheus.GaugeVec
	indexVolumes      prometheus.Gauge
	indexAttachments  prometheus.Gauge
	indexNodes        prometheus.Gauge
	leader            prometheus.Gauge
	exportMismatches  *prometheus.CounterVec
	guardHolding      prometheus.Gauge
	nodeFlaps         prometheus.Counter
}

// CountUnreadableEntries exports count, the RDS client's listing entries
// skipped as unreadable (rds.Client.SkippedEntries), as a counter: one
// unreadable entry never fails a listing of the driver's disks, so this
// is where an operator sees that RouterOS printed something the driver
// cannot read.
func (m *Metrics) CountUnreadableEntries(rds string, count func() int64) {
	m.registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: Namespace, Name: "rds_unreadable_entries_total",
		Help:        "Entries of RouterOS listings the RDS client could not read and skipped (each is logged with its text), by RDS; the driver's other disks are still listed.",
		ConstLabels: prometheus.Labels{LabelRDS: rds},
	}, func() float64 { return float64(count()) }))
}

// LabelRDS is the label that names the RDS box (pkg/backends) of a
// series of the RDS families.
const LabelRDS = "rds"

// New returns Metrics registered on a new registry, together with the Go
// runtime and process collectors.
func New() *Metrics {
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		exportMismatches: counterVec("export_claim_mismatch_total",
			"Volumes whose RDS export did not match their live claims when storage fencing's reconcile looked (a step that landed late, a replica that died mid-change, a change by hand), by whether the fix succeeded (fixed=true|false).", "fixed"),
		publish: counterVec("publish_total",
			"ControllerPublishVolume calls by result (attached, already-published, refused, or the failure).", "result"),
		unpublish: counterVec("unpublish_total",
			"ControllerUnpublishVolume calls by result (detached, or the failure).", "result"),
		publishDecision: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "publish_decision_duration_seconds",
			Help:    "Time to decide a ControllerPublishVolume, including committing the attachment claim to the API server.",
			Buckets: decisionBuckets,
		}),
		conflicts: counter("attach_conflicts_total",
			"Publishes refused because another healthy node holds the single-node volume."),
		fences: counterVec("fences_total",
			"Stale attachments fenced, by reason (NodeDeleted, NodeRecreated, OutOfService, NotReady, HeartbeatLost).", "reason"),
		orphanedClaims: gauge("orphaned_claims",
			"Claims that no VolumeAttachment has stood on for longer than --orphaned-claim-threshold (a force-deleted VolumeAttachment); reported, never released by the driver."),
		migrationsStarted: counter("migrations_started_total",
			"Live migrations started: a multi-writer raw block volume published to a second node."),
		migrationsEnded: counterVec("migrations_ended_total",
			"Live migrations ended, by reason (completed, timed_out).", "reason"),
		rdsCommand: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "rds_command_duration_seconds",
			Help:    "Duration of RouterOS commands, by RDS, command (disk_add, disk_print, ...) and result (success, timeout, error).",
			Buckets: rdsCommandBuckets,
		}, []string{LabelRDS, "command", "result"}),
		rdsConnected: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: "rds_ssh_connected",
			Help: "1 while the SSH connection to the RDS is established (its last command reached it), 0 otherwise, by RDS."}, []string{LabelRDS}),
		indexVolumes:     gauge("index_volumes", "Volumes of this driver in the attachment index."),
		indexAttachments: gauge("index_attachments", "Attachments (volume on node) in the attachment index."),
		indexNodes:       gauge("index_nodes", "Nodes known to the attachment index."),
		leader:           gauge("leader", "1 while this controller replica holds the leader lease, 0 otherwise."),
		guardHolding: gauge("fence_guard_holding",
			"1 while the mass-outage guard holds every timed fence (NotReady, heartbeat lost): too many nodes turned unhealthy together, as after an API server outage or a partition; 0 otherwise."),
		nodeFlaps: counter("node_flaps_total",
			"Nodes that turned unhealthy again (NotReady, heartbeat lapsed) within the recovery period after they were seen healthy."),
	}
	for _, v := range exportMismatchLabels {
		m.exportMismatches.WithLabelValues(v)
	}
	m.registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.publish, m.unpublish, m.publishDecision, m.conflicts, m.fences, m.orphanedClaims,
		m.migrationsStarted, m.migrationsEnded, m.rdsCommand, m.rdsConnected,
		m.indexVolumes, m.indexAttachments, m.indexNodes, m.leader, m.exportMismatches,
		m.guardHolding, m.nodeFlaps,
	)
	// Series that exist from the start, so that alerts and dashboards see
	// zeros instead of nothing.
	for _, r := range []string{ResultAttached, ResultAlreadyPublished, ResultRefused} {
		m.publish.WithLabelValues(r)
	}
	m.unpublish.WithLabelValues(ResultDetached)
	for _, r := range []fencing.FenceReason{fencing.FenceNodeDeleted, fencing.FenceNodeRecreated, fencing.FenceOutOfService, fencing.FenceNotReady, fencing.FenceHeartbeatLost} {
		m.fences.WithLabelValues(string(r))
	}
	for _, r := range []string{MigrationCompleted, MigrationTimedOut} {
		m.migrationsEnded.WithLabelValues(r)
	}
	return m
}

func counter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help})
}

func counterVec(name, help, label string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help}, []string{label})
}

func gauge(name, help string) prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Name: name, Help: help})
}

// Registry is the registry every collector is on (for tests and for
// adding collectors of other packages).
func (m *Metrics) Registry() *prometheus.Registry { return m.registry }

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{
		Registry:      m.registry,
		ErrorHandling: promhttp.ContinueOnError,
	})
}

// PublishResult counts a ControllerPublishVolume by its result.
func (m *Metrics) PublishResult(result string) { m.publish.WithLabelValues(label(result)).Inc() }

// UnpublishResult counts a ControllerUnpublishVolume by its result.
func (m *Metrics) UnpublishResult(result string) { m.unpublish.WithLabelValues(label(result)).Inc() }

// PublishDecision records how long a publish decision took.
func (m *Metrics) PublishDecision(d time.Duration) { m.publishDecision.Observe(d.Seconds()) }

// Conflict counts a publish refused because another node holds the volume.
func (m *Metrics) Conflict() { m.conflicts.Inc() }

// Fenced counts a stale attachment fenced for reason.
func (m *Metrics) Fenced(reason fencing.FenceReason) {
	r := string(reason)
	if !reasonPattern.MatchString(r) {
		r = Other
	}
	m.fences.WithLabelValues(r).Inc()
}

// OrphanedClaims sets the number of claims orphaned right now.
func (m *Metrics) OrphanedClaims(n int) { m.orphanedClaims.Set(float64(n)) }

// MigrationStarted counts a live migration's start.
func (m *Metrics) MigrationStarted() { m.migrationsStarted.Inc() }

// MigrationFinished counts a live migration that completed (the volume went
// back to one node).
func (m *Metrics) MigrationFinished() { m.migrationsEnded.WithLabelValues(MigrationCompleted).Inc() }

// MigrationTimedOut counts a live migration ended by its timeout.
func (m *Metrics) MigrationTimedOut() { m.migrationsEnded.WithLabelValues(MigrationTimedOut).Inc() }

// ObserveRDSCommand records one RouterOS command: command is the command
// as sent (its arguments are dropped, see commandLabel) or its path
// ("disk add"), err its outcome (a context deadline counts as a timeout).
func (m *Metrics) ObserveRDSCommand(rds, command string, d time.Duration, err error) {
	result := RDSResultSuccess
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		result = RDSResultTimeout
	case err != nil:
		result = RDSResultError
	}
	m.rdsCommand.WithLabelValues(rds, commandLabel(command), result).Observe(d.Seconds())
}

// AddRDS creates the series of the RDS box named rds that exist from the
// start (its connection gauge, 0 until a command reaches it).
func (m *Metrics) AddRDS(rds string) { m.rdsConnected.WithLabelValues(rds) }

// SetRDSConnected records whether the SSH connection to an RDS is up.
func (m *Metrics) SetRDSConnected(rds string, connected bool) {
	m.rdsConnected.WithLabelValues(rds).Set(boolValue(connected))
}

// SetIndexSize records the attachment index's size.
func (m *Metrics) SetIndexSize(volumes, attachments, nodes int) {
	m.indexVolumes.Set(float64(volumes))
	m.indexAttachments.Set(float64(attachments))
	m.indexNodes.Set(float64(nodes))
}

// exportMismatchLabels: both series exist from the start at 0, so a rule
// on their increase sees the first mismatch.
var exportMismatchLabels = []string{"true", "false"}

// ExportMismatch counts a volume whose export did not match its claims.
func (m *Metrics) ExportMismatch(fixed bool) {
	m.exportMismatches.WithLabelValues(strconv.FormatBool(fixed)).Inc()
}

// GuardHolding records whether the mass-outage guard holds.
func (m *Metrics) GuardHolding(holding bool) { m.guardHolding.Set(boolValue(holding)) }

// NodeFlapped counts a node that turned unhealthy again too soon.
func (m *Metrics) NodeFlapped() { m.nodeFlaps.Inc() }

// SetLeader records whether this replica holds the leader lease.
func (m *Metrics) SetLeader(leader bool) { m.leader.Set(boolValue(leader)) }

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
