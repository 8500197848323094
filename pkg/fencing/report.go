package fencing

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
)

// Event reasons this driver records. They are part of the operator's
// interface (kubectl get events --field-selector reason=...), so they do not
// change casually.
const (
	ReasonAttached          = "Attached"
	ReasonDetached          = "Detached"
	ReasonAttachConflict    = "AttachConflict"
	ReasonFenced            = "StaleAttachmentFenced"
	ReasonOrphanedClaim     = "OrphanedClaim"
	ReasonMigrationStarted  = "LiveMigrationStarted"
	ReasonMigrationFinished = "LiveMigrationFinished"
	ReasonMigrationTimedOut = "LiveMigrationTimedOut"
	ReasonExportMismatch    = "ExportClaimMismatch"
	// On Node objects.
	ReasonFencingHeld    = "FencingHeld"
	ReasonFencingResumed = "FencingResumed"
	ReasonNodeFlapping   = "NodeFlapping"
)

// VolumeRef names a volume in events: its PersistentVolume, the bound
// claim (events go to both, so `kubectl describe pvc` shows them) and the
// CSI volume handle.
type VolumeRef struct {
	PV     string
	Handle string
	Claim  *corev1.ObjectReference
	// PVs: every PersistentVolume of the handle (claims are kept on each);
	// usually just PV.
	PVs []string
}

// Metrics is what the policy's outcomes are counted with. The metrics
// package implements it; nil-safe wrappers below make it optional.
type Metrics interface {
	PublishResult(result string)
	UnpublishResult(result string)
	PublishDecision(d time.Duration)
	Conflict()
	Fenced(reason FenceReason)
	OrphanedClaims(n int)
	MigrationStarted()
	MigrationFinished()
	MigrationTimedOut()
	ExportMismatch(fixed bool)
	GuardHolding(holding bool)
	NodeFlapped()
}

// Reporter turns decisions into Kubernetes events and metrics. Every method
// is safe on a Reporter built with nil recorder or metrics.
type Reporter struct {
	events  record.EventRecorder
	metrics Metrics
}

// NewReporter returns a Reporter; either argument may be nil.
func NewReporter(events record.EventRecorder, metrics Metrics) *Reporter {
	return &Reporter{events: events, metrics: metrics}
}

func (r *Reporter) event(v VolumeRef, eventType, reason, format string, args ...any) {
	if r == nil || r.events == nil {
		return
	}
	if v.PV != "" {
		r.events.Eventf(&corev1.ObjectReference{APIVersion: "v1", Kind: "PersistentVolume", Name: v.PV}, eventType, reason, format, args...)
	}
	if v.Claim != nil && v.Claim.Name != "" {
		ref := *v.Claim
		ref.APIVersion, ref.Kind = "v1", "PersistentVolumeClaim"
		r.events.Eventf(&ref, eventType, reason, format, args...)
	}
}

func (r *Reporter) nodeEvent(node, eventType, reason, format string, args ...any) {
	if r == nil || r.events == nil {
		return
	}
	// As the kubelet names its node in events: kubectl describe node
	// shows them.
	r.events.Eventf(&corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: node, UID: types.UID(node)}, eventType, reason, format, args...)
}

// GuardChanged reports the mass-outage guard (Liveness)
// taking hold or letting go, with the suspect nodes (at most a few
// named), suspect of total counted.
func (r *Reporter) GuardChanged(holding bool, suspect, total int, nodes []string) {
	r.count(func(m Metrics) { m.GuardHolding(holding) })
	for _, n := range nodes {
		if holding {
			r.nodeEvent(n, corev1.EventTypeWarning, ReasonFencingHeld,
				"%d of %d nodes turned unhealthy together (an API server outage or a partition looks like this): no node is fenced for being NotReady or for a lost heartbeat until fewer are", suspect, total)
		} else {
			r.nodeEvent(n, corev1.EventTypeNormal, ReasonFencingResumed,
				"%d of %d nodes unhealthy: timed fencing resumes; a node still unhealthy is timed from now", suspect, total)
		}
	}
}

// NodeFlapped reports a node that turned unhealthy again within the
// recovery period after it was seen healthy.
func (r *Reporter) NodeFlapped(node string) {
	r.count(func(m Metrics) { m.NodeFlapped() })
	r.nodeEvent(node, corev1.EventTypeWarning, ReasonNodeFlapping,
		"node %s turned unhealthy again soon after it recovered; a driver out-of-service taint stays until it has been healthy for the whole recovery period", node)
}

func (r *Reporter) count(f func(Metrics)) {
	if r != nil && r.metrics != nil {
		f(r.metrics)
	}
}

// Decided records how long a decision took.
func (r *Reporter) Decided(d time.Duration) { r.count(func(m Metrics) { m.PublishDecision(d) }) }

// Refused reports a publish refused because another node holds the volume.
func (r *Reporter) Refused(v VolumeRef, node string, d Decision) {
	r.count(func(m Metrics) { m.PublishResult("refused"); m.Conflict() })
	r.event(v, corev1.EventTypeWarning, ReasonAttachConflict, "not attaching volume %s to node %s: %s", v.Handle, node, d.Reason)
}

// PublishFailed reports a publish that failed for another reason (an API
// conflict, the RDS unreachable); result is a short label.
func (r *Reporter) PublishFailed(result string) {
	r.count(func(m Metrics) { m.PublishResult(result) })
}

// Published reports a successful publish and a migration it started.
// The stale holders it fenced were reported when its commit released
// them (Fenced), whatever came of the publish after.
func (r *Reporter) Published(v VolumeRef, node string, d Decision) {
	if d.Verdict == AlreadyPublished {
		r.count(func(m Metrics) { m.PublishResult("already-published") })
		return
	}
	r.count(func(m Metrics) { m.PublishResult("attached") })
	if d.MigrationStart {
		r.count(func(m Metrics) { m.MigrationStarted() })
		r.event(v, corev1.EventTypeNormal, ReasonMigrationStarted, "%s", d.Reason)
	}
	r.event(v, corev1.EventTypeNormal, ReasonAttached, "volume %s attached to node %s", v.Handle, node)
}

// Fenced reports that node's hold on the volume was declared stale.
func (r *Reporter) Fenced(v VolumeRef, node string, reason FenceReason) {
	r.count(func(m Metrics) { m.Fenced(reason) })
	r.event(v, corev1.EventTypeWarning, ReasonFenced, "stale attachment of volume %s on node %s fenced: %s", v.Handle, node, describe(reason))
}

// MigrationTimedOut reports a live migration that outlived the timeout:
// both nodes still hold the volume.
func (r *Reporter) MigrationTimedOut(v VolumeRef, m Migration) {
	r.count(func(m Metrics) { m.MigrationTimedOut() })
	r.event(v, corev1.EventTypeWarning, ReasonMigrationTimedOut,
		"volume %s is still on %s and %s after the migration timeout (due %s); the driver refuses %s's further publishes until one of them detaches it",
		v.Handle, m.Source, m.Target, m.Deadline.UTC().Format(time.RFC3339), m.Target)
}

// Unpublished reports a detach; migrationEnded says a multi-writer volume
// went back to one node.
func (r *Reporter) Unpublished(v VolumeRef, node string, migrationEnded bool) {
	r.count(func(m Metrics) { m.UnpublishResult("detached") })
	if migrationEnded {
		r.count(func(m Metrics) { m.MigrationFinished() })
		r.event(v, corev1.EventTypeNormal, ReasonMigrationFinished, "volume %s: live migration finished, %s detached", v.Handle, node)
	}
	r.event(v, corev1.EventTypeNormal, ReasonDetached, "volume %s detached from node %s", v.Handle, node)
}

// OrphanedClaim reports a claim that no VolumeAttachment has stood on for
// longer than the threshold: its VolumeAttachment was force-deleted (its
// finalizer stripped), so no unpublish ran. The driver does not release
// it, since the node may still be writing.
func (r *Reporter) OrphanedClaim(v VolumeRef, node string, age time.Duration) {
	r.event(v, corev1.EventTypeWarning, ReasonOrphanedClaim,
		"volume %s is still claimed by node %s, but no VolumeAttachment to that node has existed for %s (force-deleted?); "+
			"if %s no longer uses it, release the claim with `kubectl rds release %s --node %s`",
		v.Handle, node, age.Round(time.Second), node, v.PV, node)
}

// OrphanedClaimsNow sets how many claims are orphaned right now.
func (r *Reporter) OrphanedClaimsNow(n int) { r.count(func(m Metrics) { m.OrphanedClaims(n) }) }

// UnpublishFailed counts a failed detach.
func (r *Reporter) UnpublishFailed(result string) {
	r.count(func(m Metrics) { m.UnpublishResult(result) })
}

func describe(reason FenceReason) string {
	switch reason {
	case FenceNodeDeleted:
		return "the node object was deleted"
	case FenceOutOfService:
		return "the node is tainted node.kubernetes.io/out-of-service"
	case FenceNotReady:
		return "the node has been NotReady longer than the configured threshold"
	case FenceHeartbeatLost:
		return "the node's heartbeat (its kubelet's Lease, and its node plugin's where it keeps one) has not been renewed for longer than the configured threshold"
	case FenceNodeRecreated:
		return "the node object was deleted and re-created (another UID) since the volume was published to it"
	}
	return string(reason)
}

// ExportMismatch reports a volume whose RDS export did not match its live
// claims (storage fencing's reconcile): found is what the RDS had, now
// what it has after the fix (or err when the fix failed).
func (r *Reporter) ExportMismatch(v VolumeRef, found, now string, err error) {
	r.count(func(m Metrics) { m.ExportMismatch(err == nil) })
	if err != nil {
		r.event(v, corev1.EventTypeWarning, ReasonExportMismatch,
			"volume %s: its export on the RDS was %s, which its claims do not call for, and bringing it in line failed: %v; the next reconcile retries",
			v.Handle, found, err)
		return
	}
	r.event(v, corev1.EventTypeWarning, ReasonExportMismatch,
		"volume %s: its export on the RDS was %s, which its claims do not call for; it is now %s", v.Handle, found, now)
}
