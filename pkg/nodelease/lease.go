package nodelease

import (
	"context"
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Prefix starts the name of every node plugin's Lease: Prefix and the
// node's name (Name).
const Prefix = "rds-csi-node-"

// Label marks the node plugins' Leases (value LabelValue), so that the
// controller watches them and not the leader election Leases of the same
// namespace.
const (
	Label      = "rds.csi.srvlab.io/heartbeat"
	LabelValue = "node-plugin"
)

// DefaultDuration is the Lease's duration by default: the kubelet's
// nodeLeaseDurationSeconds (40), renewed every quarter of it (10 s).
const DefaultDuration = 40 * time.Second

// MinDuration is the shortest duration a Lease may state: the kubelet's
// fast opt-in (nodeLeaseDurationSeconds 10, renewed every 2.5 s) is the
// fastest the controller's threshold rule is made for.
const MinDuration = 10 * time.Second

// MaxDuration is the longest duration a Lease may state, and the longest
// the controller honours: a node is heard from for half of it after its
// plugin's last renewal, so a longer one (a Lease edited by hand, a
// writer not of this driver's making) would hold off its heartbeat fence
// and the lifting of its out-of-service taint for as long.
const MaxDuration = 2 * time.Minute

// Name is the Lease of node's plugin. A Lease name is a DNS subdomain of
// at most 253 characters, a node name too: the name of a node longer
// than 253-len(Prefix) does not fit, and such a node keeps no Lease (it
// is decided on its kubelet's Lease alone).
func Name(node string) (string, error) {
	name := Prefix + node
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return "", fmt.Errorf("node %q: the node plugin's Lease name %q is not a valid name (%s); this node keeps no Lease of its own and is timed by its kubelet's Lease alone", node, name, strings.Join(errs, "; "))
	}
	return name, nil
}

// NodeOf is the node whose plugin keeps the Lease name (ok: a node
// plugin's Lease name).
func NodeOf(name string) (string, bool) {
	node, ok := strings.CutPrefix(name, Prefix)
	return node, ok && node != ""
}

// Renewer keeps one node's Lease renewed every quarter of its duration.
type Renewer struct {
	client    kubernetes.Interface
	namespace string
	node      string
	name      string
	duration  time.Duration
	clock     clock.WithTicker
	logger    klog.Logger
	// lease is the Lease as last written (nil: to be read or created).
	lease *coordinationv1.Lease
	// failing: since when renewals fail (zero: the last one worked);
	// logged: when a failure was last logged.
	failing, logged time.Time
	failures        int
}

// NewRenewer returns a Renewer of node's Lease in namespace, stating
// duration. c nil: the real clock.
func NewRenewer(client kubernetes.Interface, namespace, node string, duration time.Duration, c clock.WithTicker) (*Renewer, error) {
	name, err := Name(node)
	if err != nil {
		return nil, err
	}
	if duration < MinDuration || duration > MaxDuration {
		return nil, fmt.Errorf("node plugin Lease duration %s is not between %s and %s", duration, MinDuration, MaxDuration)
	}
	if c == nil {
		c = clock.RealClock{}
	}
	return &Renewer{client: client, namespace: namespace, node: node, name: name, duration: duration, clock: c,
		logger: klog.Background().WithName("node-lease").WithValues("lease", namespace+"/"+name)}, nil
}

// Interval is how often the Lease is renewed: a quarter of its duration,
// the kubelet's nodeLeaseRenewIntervalFraction.
func (r *Renewer) Interval() time.Duration { return r.duration / 4 }

// attemptTimeout bounds one renewal (its read and its write): half an
// interval. The controller gives a node plugin's Lease two renewals before
// it counts as silent (fencing.HeartbeatFloor): a renewal left to hang
// for a whole interval and retried after that lands more than two
// intervals after the last one, and a node whose kubelet was away (a
// restart, a crash loop) was fenced for one hung request. Half an interval
// leaves the retry (200 ms later) most of the other half.
func (r *Renewer) attemptTimeout() time.Duration { return r.Interval() / 2 }

// Renew writes the Lease once: created when it does not exist, else its
// renewTime (and holder and duration) updated. A conflict (another
// writer, a Lease deleted and re-created) reads it again next time.
func (r *Renewer) Renew(ctx context.Context) error {
	now := metav1.NewMicroTime(r.clock.Now())
	leases := r.client.CoordinationV1().Leases(r.namespace)
	if r.lease == nil {
		l, err := leases.Get(ctx, r.name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			created, err := leases.Create(ctx, r.newLease(now), metav1.CreateOptions{})
			if err != nil {
				return fmt.Errorf("creating the node plugin's Lease %s/%s: %w", r.namespace, r.name, err)
			}
			r.lease = created
			return nil
		case err != nil:
			return fmt.Errorf("reading the node plugin's Lease %s/%s: %w", r.namespace, r.name, err)
		}
		r.lease = l
	}
	l := r.lease.DeepCopy()
	r.stamp(l, now)
	updated, err := leases.Update(ctx, l, metav1.UpdateOptions{})
	if err != nil {
		// Read again next time: a conflict means the stored copy is old,
		// NotFound that the Lease is gone.
		r.lease = nil
		return fmt.Errorf("renewing the node plugin's Lease %s/%s: %w", r.namespace, r.name, err)
	}
	r.lease = updated
	return nil
}

func (r *Renewer) newLease(now metav1.MicroTime) *coordinationv1.Lease {
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: r.name, Namespace: r.namespace}}
	r.stamp(l, now)
	l.Spec.AcquireTime = &now
	return l
}

// stamp sets what every write of the Lease states.
func (r *Renewer) stamp(l *coordinationv1.Lease, now metav1.MicroTime) {
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	l.Labels[Label] = LabelValue
	holder := r.node
	seconds := int32(r.duration / time.Second)
	l.Spec.HolderIdentity = &holder
	l.Spec.LeaseDurationSeconds = &seconds
	l.Spec.RenewTime = &now
}

// retryAfter is when to try again after failures in a row: from 200 ms,
// doubled each time, never later than a renewal would come (the kubelet
// backs off the same way).
func (r *Renewer) retryAfter(failures int) time.Duration {
	d := 200 * time.Millisecond
	for i := 1; i < failures && d < r.Interval(); i++ {
		d *= 2
	}
	return min(d, r.Interval())
}

// failureLogEvery bounds the log of a Lease that keeps failing.
const failureLogEvery = time.Minute

// record notes the outcome of a renewal and logs what an operator needs:
// the first failure, then at most one a minute, and the recovery.
func (r *Renewer) record(err error) {
	now := r.clock.Now()
	if err == nil {
		if !r.failing.IsZero() {
			r.logger.Info("node plugin Lease renewed again", "failedFor", now.Sub(r.failing).Round(time.Millisecond), "failures", r.failures)
		}
		r.failing, r.failures = time.Time{}, 0
		return
	}
	r.failures++
	if r.failing.IsZero() {
		r.failing = now
	}
	if r.failures == 1 || now.Sub(r.logged) >= failureLogEvery {
		r.logged = now
		r.logger.Error(err, "node plugin Lease not renewed: the controller times this node by its kubelet's Lease alone until it is (the CSI service is not affected)",
			"failures", r.failures, "failingFor", now.Sub(r.failing).Round(time.Millisecond))
	}
}

// Run renews the Lease until ctx is done: at once, then every Interval,
// sooner after a failure. It never returns an error: a failure costs the
// node its second sign of life, never its CSI service.
func (r *Renewer) Run(ctx context.Context) {
	r.logger.Info("keeping the node plugin's Lease", "node", r.node, "duration", r.duration, "renewInterval", r.Interval())
	for {
		rctx, cancel := context.WithTimeout(ctx, r.attemptTimeout())
		err := r.Renew(rctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		r.record(err)
		next := r.Interval()
		if err != nil {
			next = r.retryAfter(r.failures)
		}
		t := r.clock.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}
