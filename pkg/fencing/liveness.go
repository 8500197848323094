package fencing

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/srvlab/rds-csi/pkg/nodelease"
)

// NodeLeaseNamespace holds the kubelets' heartbeat Leases, one per node,
// named after it.
const NodeLeaseNamespace = "kube-node-lease"

// DefaultGuardShare is the default share of nodes that, suspect at once,
// hold every timed fence (Liveness): kube-controller-manager's
// --unhealthy-zone-threshold, above which it slows evictions down.
const DefaultGuardShare = 0.55

// DefaultNodeLeaseDuration is a kubelet's nodeLeaseDurationSeconds by
// default; a Lease that states none is taken to renew at its cadence.
const DefaultNodeLeaseDuration = 40 * time.Second

// HeartbeatFloor is the shortest heartbeat threshold a kubelet whose Lease
// lasts leaseDuration (its spec.leaseDurationSeconds; 0: unknown, the
// kubelet's default) allows: two of its renewals. A kubelet renews every
// quarter of the duration (nodeLeaseRenewIntervalFraction 0.25 in
// pkg/kubelet, Kubernetes 1.36), each period starting when the last
// renewal ended and stretched by up to 4 % jitter, so two renewals leave
// one renewal nearly a whole interval to be late: the margin the default
// (20 s at the default 10 s renewals) has always had. A shorter threshold
// would fence a healthy node for one late renewal: as bad as a double
// attach.
func HeartbeatFloor(leaseDuration time.Duration) time.Duration {
	if leaseDuration <= 0 {
		leaseDuration = DefaultNodeLeaseDuration
	}
	return 2 * (leaseDuration / 4)
}

// LeaseDuration is a Lease's spec.leaseDurationSeconds (0: none stated).
func LeaseDuration(l *coordinationv1.Lease) time.Duration {
	if l.Spec.LeaseDurationSeconds == nil || *l.Spec.LeaseDurationSeconds <= 0 {
		return 0
	}
	return time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
}

// GuardEvent reports a change of the mass-outage guard: Holding, and how
// many of the nodes known were suspect when it changed.
type GuardEvent struct {
	Holding        bool
	Suspect, Total int
	// Nodes: the suspect nodes, sorted, at most guardEventNodes of them.
	Nodes []string
}

const guardEventNodes = 20

// Liveness is what this controller has seen of its nodes' health, timed
// on its own clock, never on a timestamp another machine wrote (issue 23:
// after a 60 s API server outage kube-controller-manager stamped every
// node NotReady at once, with LastTransitionTime from the outage, and a
// threshold counted from it fenced three healthy nodes 16 s later).
//
//   - NotReadySeen: when this controller first saw the incarnation not
//     Ready, since it last saw it Ready.
//   - RenewedSeen: when it last saw the node's heartbeat: its kubelet's
//     Lease change, or its node plugin's (pkg/nodelease), whichever is
//     heard from later.
//
// A node has up to two heartbeats, each timed against its own threshold:
// the configured one, raised to HeartbeatFloor of the duration its Lease
// states, so a threshold set for kubelets that renew fast never times out
// one still on the 10 s default. The node is heard from as long as either
// is within its threshold: a kubelet away for longer than its threshold
// (a restart, an upgrade, a crash loop) on a node whose plugin still
// renews is no dead node. A node without a plugin Lease is decided on its
// kubelet's alone. NotReady is timed from the later of the node's turning
// NotReady and its plugin's last renewal, and runs out no sooner than the
// plugin's Lease does: a NotReady condition is the kubelet's (or kube-
// controller-manager's about the kubelet), and a renewing plugin says the
// node runs.
//
// Both are floored at the moment this controller's view of the API was
// last restored (its start, a watch reconnected after a gap) and at the
// moment the mass-outage guard last let go: nothing is timed across a
// stretch this controller could not see.
//
// The mass-outage guard: while at least two nodes, and more than Share of
// all known, are suspect at once (not Ready, or their heartbeat older than
// half the threshold), no node is timed out at all (both stamps read as
// now): a partition between the nodes and the API server, or the API
// server's own outage, looks like every node failing together, and
// fencing them all would cut every live workload off its disks. Fences of
// deleted, re-created or out-of-service nodes do not depend on timing and
// are never held.
type Liveness struct {
	clock  clock.PassiveClock
	cfg    Config
	share  float64
	client kubernetes.Interface
	// onGuard, when set, is told every change of the guard; onFlap every
	// flap (a node that went unhealthy again within the recovery period
	// after it was seen healthy).
	onGuard func(GuardEvent)
	onFlap  func(node string)
	logger  klog.Logger

	mu    sync.Mutex
	nodes map[string]*nodeSeen
	// lastRenewal: when any Lease of each Signal was last seen renewed.
	lastRenewal [signals]time.Time
	restored    time.Time
	released    time.Time
	holding     bool
	// evaluated: when the guard was last evaluated; dirty: a node's
	// health changed since.
	evaluated time.Time
	dirty     bool
	// leasesFor counts the nodes by the Lease duration last seen, per
	// Signal (the longest one paces the silence rule of observe).
	leasesFor [signals]map[time.Duration]int
	// pluginNamespace holds the node plugins' Leases ("": none are
	// read); pluginListed: their watch has listed them.
	pluginNamespace string
	pluginListed    atomic.Bool
}

// LivenessConfig is what a Liveness is built with.
type LivenessConfig struct {
	// Clock times everything (nil: the real clock).
	Clock clock.PassiveClock
	// Policy holds the thresholds.
	Policy Config
	// GuardShare is the mass-outage guard's share (0: DefaultGuardShare).
	GuardShare float64
	// Client makes the live reads that back a fence (LiveNode): the Node
	// and its heartbeat Leases. Nil: no live reads (a unit test of the
	// timing alone).
	Client kubernetes.Interface
	// PluginLeaseNamespace, when set (and heartbeats are timed), holds
	// the node plugins' Leases (pkg/nodelease): a second heartbeat.
	PluginLeaseNamespace string
	// OnGuard, when set, is told every change of the mass-outage guard;
	// OnFlap every node that turned unhealthy again within the recovery
	// period. Both are called with the Liveness locked: they must not
	// call it.
	OnGuard func(GuardEvent)
	OnFlap  func(node string)
}

// Signal is one of a node's heartbeats.
type Signal int

const (
	// KubeletLease: the kubelet's Lease in kube-node-lease.
	KubeletLease Signal = iota
	// PluginLease: the node plugin's Lease (pkg/nodelease).
	PluginLease
	signals
)

func (s Signal) String() string {
	if s == PluginLease {
		return "node plugin"
	}
	return "kubelet"
}

// beat is what this controller saw of one heartbeat of a node.
type beat struct {
	renewed  time.Time     // last seen renewed (zero: no Lease seen)
	rv       string        // the Lease's resourceVersion as last seen
	leaseFor time.Duration // the Lease's duration as last seen (0: none stated)
	// floorBefore: the floor of a longer duration the Lease stated before
	// its last one, kept until a renewal at the shorter one shows the
	// writer renews at it (0: none).
	floorBefore time.Duration
}

// floor is the HeartbeatFloor of b's writer: of its Lease's duration, or
// of a longer one it stated before until a renewal at the new one.
func (b *beat) floor() time.Duration {
	return max(HeartbeatFloor(b.leaseFor), b.floorBefore)
}

type nodeSeen struct {
	uid      string
	known    bool      // the Node object was seen
	ready    bool      // as last seen
	down     bool      // tainted out of service: declared down, not counted
	notReady time.Time // first seen not Ready since last seen Ready
	readyAt  time.Time // last seen turning Ready
	resumed  time.Time // last seen renewed after a lapse
	// back: last seen renewed after no renewal for longer than the
	// threshold, whether or not this controller's view was restored
	// meanwhile (Recovered times the recovery period from it).
	back  time.Time
	beats [signals]beat
}

// hasBeat: some heartbeat of e's was seen.
func (e *nodeSeen) hasBeat() bool {
	for i := range e.beats {
		if e.beats[i].rv != "" {
			return true
		}
	}
	return false
}

// flapWindows: two returns from a lapse within this many recovery
// periods are a flap.
const flapWindows = 3

// guardEvaluatePeriod bounds how often the guard counts suspects when no
// node's health changed (an O(nodes) pass).
const guardEvaluatePeriod = time.Second

// NewLiveness returns a tracker timing cfg's thresholds on its clock. Its
// view counts as restored now.
func NewLiveness(cfg LivenessConfig) *Liveness {
	c := cfg.Clock
	if c == nil {
		c = clock.RealClock{}
	}
	share := cfg.GuardShare
	if share <= 0 {
		share = DefaultGuardShare
	}
	l := &Liveness{clock: c, cfg: cfg.Policy, share: share, client: cfg.Client, nodes: map[string]*nodeSeen{}, restored: c.Now(),
		onGuard: cfg.OnGuard, onFlap: cfg.OnFlap, logger: klog.Background().WithName("liveness")}
	if cfg.Policy.HeartbeatThreshold > 0 {
		l.pluginNamespace = cfg.PluginLeaseNamespace
	}
	for i := range l.leasesFor {
		l.leasesFor[i] = map[time.Duration]int{}
	}
	return l
}

// PluginLeaseNamespace is where the node plugins' Leases are read as a
// second heartbeat ("": they are not).
func (l *Liveness) PluginLeaseNamespace() string { return l.pluginNamespace }

// PluginLeasesListed records that the watch of the node plugins' Leases
// has listed them: from now on a node with none known has none. Until
// then a live read that fails for one fails closed.
func (l *Liveness) PluginLeasesListed() { l.pluginListed.Store(true) }

// Restored records that this controller's view of the API was restored
// (a watch reconnected after a gap): nothing before now is timed.
func (l *Liveness) Restored() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.restored = l.clock.Now()
	l.dirty = true
}

func (l *Liveness) entry(name string) *nodeSeen {
	e := l.nodes[name]
	if e == nil {
		e = &nodeSeen{}
		l.nodes[name] = e
	}
	return e
}

// ObserveNode records a node's state as the API shows it.
func (l *Liveness) ObserveNode(name string, s NodeState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	if !s.Exists {
		if e := l.nodes[name]; e != nil {
			for sig := range signals {
				l.countLease(sig, &e.beats[sig], 0, false)
			}
		}
		delete(l.nodes, name)
		l.dirty = true
		return
	}
	e := l.entry(name)
	if e.uid != s.UID {
		// Another incarnation: nothing seen of the old one applies but
		// its Leases (named after the node, not the incarnation).
		beats := e.beats
		for i := range beats {
			if e.uid != "" && !beats[i].renewed.IsZero() {
				// The old one's last renewal is not the new one's: its
				// kubelet (or plugin) has not had the chance to renew
				// yet. Timed from now, as its NotReady condition is.
				beats[i].renewed = now
			}
		}
		*e = nodeSeen{uid: s.UID, beats: beats}
	}
	switch {
	case s.Ready && (!e.known || !e.ready):
		e.readyAt = now
		e.notReady = time.Time{}
		l.dirty = true
	case !s.Ready && e.notReady.IsZero():
		if e.known && e.ready && l.recovering(e, now) && l.onFlap != nil {
			l.onFlap(name)
		}
		e.notReady = now
		l.dirty = true
	}
	e.known, e.ready, e.down = true, s.Ready, s.OutOfService
}

// recovering: e turned Ready less than the recovery period ago.
func (l *Liveness) recovering(e *nodeSeen, now time.Time) bool {
	return !e.readyAt.IsZero() && now.Sub(e.readyAt) < l.recoveryPeriod(e)
}

// recoveryPeriod is how long node e must stay healthy before a fence's
// out-of-service taint is lifted (Recovered): its longer threshold.
func (l *Liveness) recoveryPeriod(e *nodeSeen) time.Duration {
	return max(l.cfg.NotReadyThreshold, l.heartbeatThreshold(e))
}

// beatThreshold is the threshold of heartbeat b (0: not timed).
func (l *Liveness) beatThreshold(b *beat) time.Duration {
	return l.cfg.HeartbeatThresholdOf(NodeState{HeartbeatFloor: b.floor()})
}

// heard is the heartbeat e was heard from last, by deadline: of the ones
// seen, the one whose threshold runs out last, each renewal floored at f
// (zero: not floored). nil: none seen.
func (l *Liveness) heard(e *nodeSeen, f time.Time) *beat {
	var best *beat
	var deadline time.Time
	for i := range e.beats {
		b := &e.beats[i]
		if b.renewed.IsZero() {
			continue
		}
		if d := later(b.renewed, f).Add(l.beatThreshold(b)); best == nil || d.After(deadline) {
			best, deadline = b, d
		}
	}
	return best
}

// heartbeatThreshold is e's own (0: heartbeats are not timed): of the
// heartbeat it was heard from last, or its kubelet's.
func (l *Liveness) heartbeatThreshold(e *nodeSeen) time.Duration {
	if b := l.heard(e, l.floor()); b != nil {
		return l.beatThreshold(b)
	}
	return l.beatThreshold(&e.beats[KubeletLease])
}

// HeartbeatThreshold is node name's heartbeat threshold: the configured
// one, raised to what its kubelet's cadence allows (0: not timed).
func (l *Liveness) HeartbeatThreshold(name string) time.Duration {
	return l.ThresholdOf(KubeletLease, name)
}

// ThresholdOf is the threshold of node name's heartbeat sig.
func (l *Liveness) ThresholdOf(sig Signal, name string) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.nodes[name]; e != nil {
		return l.beatThreshold(&e.beats[sig])
	}
	return l.cfg.HeartbeatThresholdOf(NodeState{HeartbeatFloor: HeartbeatFloor(0)})
}

// countLease moves b's count in leasesFor[sig] to the Lease duration d
// (known: b has a Lease then); l.mu held.
func (l *Liveness) countLease(sig Signal, b *beat, d time.Duration, known bool) {
	counts := l.leasesFor[sig]
	if b.rv != "" {
		if counts[b.leaseFor]--; counts[b.leaseFor] <= 0 {
			delete(counts, b.leaseFor)
		}
	}
	if known {
		counts[d]++
	}
	b.leaseFor = d
}

// silence: every heartbeat silent this long is a gap in what this
// controller saw: longer than any healthy node stays silent, the age at
// which the slowest known kubelet turns suspect. (Not half the threshold:
// a real kubelet's renewals come a little over its interval apart, and
// with one node left renewing every renewal would count as a gap, its
// dead neighbour timed from it and never fenced.)
//
// Each Signal is its own watch stream: silence is counted per Signal.
func (l *Liveness) silence(sig Signal) time.Duration {
	longest := l.cfg.HeartbeatThresholdOf(NodeState{})
	for d := range l.leasesFor[sig] {
		longest = max(longest, l.cfg.HeartbeatThresholdOf(NodeState{HeartbeatFloor: HeartbeatFloor(d)}))
	}
	return longest / 10 * suspectShare
}

// observeLease records a node's kubelet Lease at resourceVersion rv,
// stating a duration of leaseFor (0: none): a new version is a renewal
// seen now. Reports whether it was one.
func (l *Liveness) observeLease(name, rv string, leaseFor time.Duration) bool {
	return l.Observe(KubeletLease, name, rv, leaseFor)
}

func (l *Liveness) Observe(sig Signal, name, rv string, leaseFor time.Duration) bool {
	if sig == PluginLease {
		// No node plugin states more; a Lease that does (edited by hand,
		// another writer's) must not hold a dead node's fence off for
		// half of whatever it says.
		leaseFor = min(leaseFor, nodelease.MaxDuration)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.entry(name)
	b := &e.beats[sig]
	if b.rv == rv {
		return false
	}
	if b.rv != "" && b.leaseFor != leaseFor && HeartbeatFloor(leaseFor) < b.floor() {
		// Shorter: one write stating it is no sign yet that the
		// writer renews at it (a patched Lease, which the kubelet
		// overwrites at its next renewal at the old cadence).
		b.floorBefore = b.floor()
	} else {
		b.floorBefore = 0
	}
	if b.rv == "" || b.leaseFor != leaseFor {
		l.countLease(sig, b, leaseFor, true)
		if floor := HeartbeatFloor(leaseFor); l.cfg.HeartbeatThreshold > 0 && floor > l.cfg.HeartbeatThreshold {
			stated := leaseFor
			if stated <= 0 {
				stated = DefaultNodeLeaseDuration
			}
			l.logger.Info("heartbeat threshold raised for this node to two of its Lease's renewals: a shorter one would fence it for one late renewal",
				"node", name, "heartbeat", sig.String(), "leaseDurationSeconds", int(leaseFor.Seconds()), "renewInterval", stated/4, "configured", l.cfg.HeartbeatThreshold, "threshold", floor)
		}
	}
	now := l.clock.Now()
	if last := l.lastRenewal[sig]; !last.IsZero() && l.cfg.HeartbeatThreshold > 0 && now.Sub(last) > l.silence(sig) {
		// Every heartbeat of this stream fell silent at once and now
		// one is back: a watch that stalled without closing, an API
		// server that froze. What happened meanwhile was not seen.
		l.restored = now
	}
	if e.hasBeat() && l.lapsed(e, now) {
		// Back after a lapse; back again after another lapse within
		// flapWindows recovery periods (a lapse itself lasts one) is a
		// flap.
		if !e.resumed.IsZero() && now.Sub(e.resumed)/flapWindows < l.recoveryPeriod(e) && l.onFlap != nil {
			l.onFlap(name)
		}
		e.resumed, e.back = now, now
	}
	if e.hasBeat() && l.heartbeatLapsed(e, now, time.Time{}) {
		// Healthy only from now, also when this controller's view was
		// restored during the lapse and the floored heartbeat no
		// longer looks lapsed (not a flap: after an API server outage
		// every node is back like this).
		e.back = now
	}
	b.rv, b.renewed, l.lastRenewal[sig] = rv, now, now
	l.dirty = true
	return true
}

// forgetLease: the node's kubelet Lease is gone; that heartbeat is not
// known.
func (l *Liveness) forgetLease(name string) { l.Forget(KubeletLease, name) }

func (l *Liveness) Forget(sig Signal, name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.nodes[name]; e != nil {
		b := &e.beats[sig]
		l.countLease(sig, b, 0, false)
		*b = beat{}
		if !e.known && !e.hasBeat() {
			delete(l.nodes, name)
		}
		l.dirty = true
	}
}

// LeaseVersion is the resourceVersion of the node's Lease as last seen
// ("" when none).
func (l *Liveness) LeaseVersion(name string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.nodes[name]; e != nil {
		return e.beats[KubeletLease].rv
	}
	return ""
}

// floor is the earliest moment anything is timed from.
func (l *Liveness) floor() time.Time {
	if l.released.After(l.restored) {
		return l.released
	}
	return l.restored
}

func later(t, floor time.Time) time.Time {
	if t.IsZero() || t.After(floor) {
		return t
	}
	return floor
}

// lapsed: e is past a threshold, ignoring the guard.
func (l *Liveness) lapsed(e *nodeSeen, now time.Time) bool {
	f := l.floor()
	return (l.cfg.NotReadyThreshold > 0 && !e.notReady.IsZero() && now.Sub(l.notReadyFrom(e, f)) > l.cfg.NotReadyThreshold) ||
		l.heartbeatLapsed(e, now, f)
}

// heartbeatLapsed: every heartbeat of e is past its threshold, timed from
// f (zero: unfloored).
func (l *Liveness) heartbeatLapsed(e *nodeSeen, now, f time.Time) bool {
	if l.cfg.HeartbeatThreshold <= 0 {
		return false
	}
	b := l.heard(e, f)
	return b != nil && now.Sub(later(b.renewed, f)) > l.beatThreshold(b)
}

// notReadyFrom is when e's NotReady is timed from (e.notReady set): not
// before f, nor before its node plugin holds it off (pluginHolds).
func (l *Liveness) notReadyFrom(e *nodeSeen, f time.Time) time.Time {
	return later(later(e.notReady, f), l.pluginHolds(e))
}

// pluginHolds is the earliest moment e's NotReady may be timed from while
// its node plugin renews (zero: no plugin Lease seen, or e nil): its last
// renewal, and late enough that the NotReady threshold runs out no sooner
// than the plugin Lease's own. A plugin renewing less often than the
// NotReady threshold (a long --node-lease-duration, a short
// --not-ready-threshold) would otherwise have its live node fenced
// between two renewals.
func (l *Liveness) pluginHolds(e *nodeSeen) time.Time {
	if e == nil || e.beats[PluginLease].renewed.IsZero() {
		return time.Time{}
	}
	p := &e.beats[PluginLease]
	return p.renewed.Add(max(0, l.beatThreshold(p)-l.cfg.NotReadyThreshold))
}

// suspect: e is not Ready, or its heartbeat is older than suspectShare of
// its threshold. A kubelet renews every 10 s by default: with a 20 s
// threshold a healthy node's heartbeat is at most a little over 10 s old,
// while every node of a partition has been silent for 10 to 20 s by the
// time the first one lapses; 12 s leaves a healthy node's late renewal out
// and counts four in five of a partition's nodes.
//
// A node whose plugin renews within its suspect age is not suspect for
// being not Ready: it runs, and is not timed for NotReady either
// (notReadyFrom).
func (l *Liveness) suspect(e *nodeSeen, now time.Time) bool {
	f := l.floor()
	if e.known && !e.ready {
		p := &e.beats[PluginLease]
		if l.cfg.HeartbeatThreshold <= 0 || p.renewed.IsZero() || now.Sub(later(p.renewed, f)) > l.beatThreshold(p)/10*suspectShare {
			return true
		}
	}
	age, ok := l.heartbeatAge(e, now)
	return ok && age > l.heartbeatThreshold(e)/10*suspectShare
}

// heartbeatAge is how long e has not been heard from (the heartbeat of
// heartbeatThreshold), timed from the floor (ok: heartbeats are timed and
// e has one).
func (l *Liveness) heartbeatAge(e *nodeSeen, now time.Time) (time.Duration, bool) {
	if l.cfg.HeartbeatThreshold <= 0 {
		return 0, false
	}
	f := l.floor()
	b := l.heard(e, f)
	if b == nil {
		return 0, false
	}
	return now.Sub(later(b.renewed, f)), true
}

// suspectShare, in tenths of the heartbeat threshold (see suspect); the
// threshold is divided first, as it may be up to the largest duration.
const suspectShare = 6

// evaluate updates the guard; l.mu held.
func (l *Liveness) evaluate(now time.Time) {
	if !l.dirty && now.Sub(l.evaluated) < guardEvaluatePeriod && !now.Before(l.evaluated) {
		return
	}
	l.evaluated, l.dirty = now, false
	// With kubelets of mixed cadences a fast one lapses before a slow one
	// has been silent long enough to look suspect by its own threshold: a
	// partition of every node would show only the fast ones. A node
	// silent at least as long as the most recently lapsed heartbeat looks
	// as dead as that one and counts as suspect too.
	//
	// Only nodes count: a Lease whose Node this controller has not seen
	// (a node plugin's Lease outlives its node, it has no owner; a Lease
	// an operator made) is no node, and leftovers of deleted nodes
	// counted as suspects would hold the guard for good.
	lapsedAge := time.Duration(-1)
	for _, e := range l.nodes {
		if age, ok := l.heartbeatAge(e, now); ok && e.known && !e.down && age > l.heartbeatThreshold(e) && (lapsedAge < 0 || age < lapsedAge) {
			lapsedAge = age
		}
	}
	suspects := 0
	var names []string
	total := 0
	for name, e := range l.nodes {
		if e.down || !e.known {
			// An operator's (or a fence's) statement that the node is
			// down: no sign of a partition. No Node: no node.
			continue
		}
		total++
		if age, ok := l.heartbeatAge(e, now); l.suspect(e, now) || (ok && lapsedAge >= 0 && age >= lapsedAge) {
			suspects++
			names = append(names, name)
		}
	}
	hold := suspects >= 2 && float64(suspects) > l.share*float64(total)
	if hold == l.holding {
		return
	}
	l.holding = hold
	if !hold {
		// Nothing is timed across the hold: a node that recovers a
		// moment after the others is not fenced for it.
		l.released = now
	}
	if l.onGuard != nil {
		sort.Strings(names)
		if len(names) > guardEventNodes {
			names = names[:guardEventNodes]
		}
		l.onGuard(GuardEvent{Holding: hold, Suspect: suspects, Total: total, Nodes: names})
	}
}

// Holding reports whether the mass-outage guard holds now.
func (l *Liveness) Holding() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.evaluate(l.clock.Now())
	return l.holding
}

// Decorate sets s's NotReadySeen and RenewedSeen (NodeState) from
// what this controller has seen of node name. s is the node as read from
// the API (a cache or a live read): a node this controller has not seen
// not Ready (or not as this incarnation) starts being timed now.
func (l *Liveness) Decorate(name string, s NodeState) NodeState {
	s.NotReadySeen, s.RenewedSeen = time.Time{}, time.Time{}
	if l == nil || !s.Exists {
		return s
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	e := l.nodes[name]
	if e != nil {
		if age, ok := l.heartbeatAge(e, now); ok && age > l.heartbeatThreshold(e) && !l.evaluated.After(now.Add(l.heartbeatThreshold(e)-age)) {
			// It lapsed since the guard was last counted: count again,
			// with it.
			l.dirty = true
		}
	}
	l.evaluate(now)
	f := l.floor()
	if l.holding {
		f = now
	}
	if !s.Ready {
		seen := now
		if e != nil && e.uid == s.UID && !e.notReady.IsZero() {
			seen = e.notReady
		}
		s.NotReadySeen = later(later(seen, f), l.pluginHolds(e))
	}
	if e != nil {
		if b := l.heard(e, f); b != nil {
			s.RenewedSeen = later(b.renewed, f)
			s.HeartbeatFloor = b.floor()
		}
	}
	return s
}

// timedLapse: s (decorated) is past the heartbeat threshold, or NotReady
// past the NotReady threshold, now.
func (l *Liveness) timedLapse(s NodeState) bool {
	now := l.clock.Now()
	return l.HeartbeatLost(s) || (l.cfg.NotReadyThreshold > 0 && !s.Ready && !s.NotReadySeen.IsZero() && now.Sub(s.NotReadySeen) > l.cfg.NotReadyThreshold)
}

// LiveNode reads node name from the API server (not a cache) and times
// it (confirmLive); a node that does not exist is NodeState{}. This is
// the read every fence of a node's claim stands on.
func (l *Liveness) LiveNode(ctx context.Context, name string) (NodeState, error) {
	n, err := l.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return NodeState{}, nil
	}
	if err != nil {
		return NodeState{}, fmt.Errorf("reading node %s: %w", name, err)
	}
	return l.confirmLive(ctx, l.client, name, NodeStateOf(n))
}

// confirmLive times s, a live read of node name, and when it looks lost
// to a timed rule (its heartbeat, NotReady), confirms that with live
// reads of its Leases, the kubelet's and the node plugin's: a renewal this
// controller has not seen yet (a paused process, a slow watch) clears it.
// A Lease that cannot be read leaves the node unconfirmed: an error.
func (l *Liveness) confirmLive(ctx context.Context, client kubernetes.Interface, name string, s NodeState) (NodeState, error) {
	timed := l.Decorate(name, s)
	if l == nil || l.cfg.HeartbeatThreshold <= 0 || !l.timedLapse(timed) {
		return timed, nil
	}
	reads := []struct {
		sig       Signal
		namespace string
		name      string
	}{{KubeletLease, NodeLeaseNamespace, name}}
	if l.pluginNamespace != "" {
		if lease, err := nodelease.Name(name); err == nil {
			reads = append(reads, struct {
				sig       Signal
				namespace string
				name      string
			}{PluginLease, l.pluginNamespace, lease})
		}
	}
	for _, r := range reads {
		lease, err := client.CoordinationV1().Leases(r.namespace).Get(ctx, r.name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			l.Forget(r.sig, name)
		case err != nil && r.sig == PluginLease && !l.knows(PluginLease, name) && l.listedPlugins():
			// A node without a known plugin Lease is decided on its
			// kubelet's alone: a plugin Lease that cannot be read (no
			// access to the namespace, an API error) must not stop every
			// fence of such nodes. Only once the plugin Leases were
			// listed: before, "none known" says nothing, and the node's
			// plugin may be renewing (fail closed).
			l.logger.V(2).Info("node plugin Lease not readable; the node has none known and is decided on its kubelet's Lease", "node", name, "lease", r.namespace+"/"+r.name, "err", err)
		case err != nil:
			return NodeState{}, fmt.Errorf("reading node %s's %s heartbeat Lease %s/%s: %w", name, r.sig, r.namespace, r.name, err)
		default:
			l.Observe(r.sig, name, lease.ResourceVersion, LeaseDuration(lease))
		}
	}
	return l.Decorate(name, s), nil
}

// listedPlugins: the node plugins' Leases have been listed, so a node
// with none known has none (or a new one, not yet seen).
func (l *Liveness) listedPlugins() bool {
	return l.pluginListed.Load()
}

// knows: a Lease of node name's heartbeat sig has been seen.
func (l *Liveness) knows(sig Signal, name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.nodes[name]
	return e != nil && e.beats[sig].rv != ""
}

// HeartbeatLost reports whether s (timed by Decorate) is past the
// heartbeat threshold.
func (l *Liveness) HeartbeatLost(s NodeState) bool {
	return l != nil && l.cfg.HeartbeatThreshold > 0 && !s.RenewedSeen.IsZero() && l.clock.Now().Sub(s.RenewedSeen) > l.cfg.HeartbeatThresholdOf(s)
}

// Recovered reports whether node name, as s shows it, has been seen
// healthy (Ready, its heartbeat within the threshold) for the recovery
// period, and if not, how long until it may be. Healthy since the later
// of its turning Ready and its heartbeat's return after a lapse: a node
// whose Lease lapsed while its Ready condition stayed True (the kubelet
// stalled for less than kube-controller-manager's grace) is not healthy
// from the moment it renews again, or a flapping node's taint would come
// and go with every lapse.
func (l *Liveness) Recovered(name string, s NodeState) (bool, time.Duration) {
	if !s.Exists || !s.Ready {
		return false, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	e := l.nodes[name]
	if e == nil || e.readyAt.IsZero() {
		return false, 0
	}
	if l.heartbeatLapsed(e, now, time.Time{}) {
		return false, 0
	}
	since := e.readyAt
	if e.back.After(since) {
		since = e.back
	}
	if wait := l.recoveryPeriod(e) - now.Sub(later(since, l.floor())); wait > 0 {
		return false, wait
	}
	return true, 0
}
