package informers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/nodelease"
)

// kind of object behind a queue key.
type kind int

const (
	kindVA kind = iota
	kindPV
	kindNode

	// Reactions, on their own queue (see Controller.reactions).

	// kindFence: a node became stale (or was re-created); tell the
	// Reactor. A separate key so that a failed reaction is retried with
	// backoff on its own.
	kindFence
	// kindMigration: check a multi-writer PV for a live migration past its
	// timeout (queued on every change of the PV or its attachments, and
	// for the moment the timeout passes).
	kindMigration
	// kindOrphan: check a volume handle's claims for ones no
	// VolumeAttachment stands on.
	kindOrphan
	// kindRecovered: a node carrying the driver's out-of-service taint is
	// Ready again (Config.NodeRecovered).
	kindRecovered

	// kindLease: a kubelet's heartbeat Lease (Feed only; never queued).
	kindLease
)

// key is a workqueue item: handlers enqueue keys, the worker reads the
// records from the informer caches.
type key struct {
	kind kind
	name string
}

func (k key) String() string { return fmt.Sprintf("%d/%s", k.kind, k.name) }

// Reactor acts on what the index shows, without waiting for a publish:
// node failures, overdue migrations, orphaned claims. The controller calls
// it from its reactions goroutine, never from the index's worker, each call
// bounded by Config.ReactionTimeout; an error retries the item with
// backoff, except fencing.ErrNotLeader: the Reactor does not act on this
// replica, nothing is taken as reported, and RefenceStale (a new
// leader's) checks again.
type Reactor interface {
	NodeStale(ctx context.Context, s fencing.StaleHolder) error
	// MigrationTimedOut: a raw-block RWX volume is still on two nodes
	// after the migration timeout.
	MigrationTimedOut(ctx context.Context, v fencing.VolumeRef, m fencing.Migration) error
	// OrphanedClaim: node's claim on v has had no VolumeAttachment for
	// age, longer than Config.OrphanedClaimThreshold.
	OrphanedClaim(ctx context.Context, v fencing.VolumeRef, node string, age time.Duration) error
}

// Config of the controller.
type Config struct {
	DriverName string
	Policy     fencing.Config
	// NodeRecovered, when set, is called (on the reaction queue) for a node
	// that carries the driver's out-of-service taint and is Ready again.
	NodeRecovered func(ctx context.Context, node string) error
	// Reactor, when set, is told about stale holders (event-driven fencing),
	// overdue migrations and orphaned claims.
	Reactor Reactor
	// Clock for NotReady timing; default the real clock.
	Clock clock.WithTicker
	// ReactionTimeout bounds each Reactor call; default 15s.
	ReactionTimeout time.Duration
	// OrphanedClaimThreshold: a claim that no VolumeAttachment of its node
	// has stood on for this long is reported (0: never).
	OrphanedClaimThreshold time.Duration
	// OrphanedClaims, when set, is told the number of claims orphaned past
	// the threshold whenever it may have changed.
	OrphanedClaims func(n int)
	// Liveness times the nodes' health on this controller's clock and is
	// fed the heartbeat Leases the controller watches (its plugin Lease
	// namespace, when set, is watched too). Nil: one of its own, of Policy
	// and Clock, with no live reads (tests of the index).
	Liveness *fencing.Liveness
	// Malformed, when set, collects the objects the index skips as
	// unreadable (reported once per resourceVersion, never retried).
	Malformed *MalformedSet

	// queueMetrics, when set, observes the index's work queue (tests).
	queueMetrics workqueue.MetricsProvider
}

// Controller keeps an AttachmentIndex in step with the API server.
type Controller struct {
	cfg   Config
	index *AttachmentIndex
	// queue feeds the index's single worker, which does no network I/O.
	queue workqueue.TypedRateLimitingInterface[key]
	// reactions feeds the goroutine that calls the Reactor: API calls that
	// may hang never hold up the index.
	reactions workqueue.TypedRateLimitingInterface[key]
	// reacting counts reactions being run (ReactionsIdle).
	reacting atomic.Int32
	// records makes the records the caches hold (records.go); vas, pvs
	// and nodes are the caches, by name.
	records   *recordMaker
	vas       cache.Store
	pvs       cache.Store
	nodes     cache.Store
	synced    []cache.InformerSynced
	informers []cache.SharedIndexInformer
	streams   *StreamHealth
	live      *fencing.Liveness
	clock     clock.WithTicker
	// reacted: the stale state each node was last reported in. Only the
	// worker touches it.
	reacted map[string]fencing.FenceReason
	// overdue: the migration (target node and deadline) each volume handle was last
	// reported overdue for; orphanSince: since when each handle/node claim
	// has had no VolumeAttachment, and orphanPast those past the threshold.
	// Only the reactions goroutine touches them.
	overdue     map[string]fencing.Migration
	orphanSince map[string]time.Time
	orphanPast  map[string]bool
	// pluginLeases is the node plugins' Lease watch (nil: none).
	pluginLeases cache.ResourceEventHandlerRegistration
	// indexed is set (and indexedCh closed) when the initial list is in
	// the index.
	indexed   atomic.Bool
	indexedCh chan struct{}
}

func newController(index *AttachmentIndex, cfg Config) *Controller {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.ReactionTimeout <= 0 {
		cfg.ReactionTimeout = 15 * time.Second
	}
	limiter := func() workqueue.TypedRateLimiter[key] {
		return workqueue.NewTypedMaxOfRateLimiter(
			workqueue.NewTypedItemExponentialFailureRateLimiter[key](5*time.Millisecond, 5*time.Minute),
			&workqueue.TypedBucketRateLimiter[key]{Limiter: rate.NewLimiter(rate.Limit(100), 1000)},
		)
	}
	live := cfg.Liveness
	if live == nil {
		live = fencing.NewLiveness(fencing.LivenessConfig{Clock: cfg.Clock, Policy: cfg.Policy})
	}
	index.setLiveness(live)
	return &Controller{
		cfg:         cfg,
		index:       index,
		live:        live,
		records:     newRecordMaker(cfg.DriverName),
		queue:       workqueue.NewTypedRateLimitingQueueWithConfig(limiter(), workqueue.TypedRateLimitingQueueConfig[key]{Name: "rds-csi-attachments", Clock: cfg.Clock, MetricsProvider: cfg.queueMetrics}),
		reactions:   workqueue.NewTypedRateLimitingQueueWithConfig(limiter(), workqueue.TypedRateLimitingQueueConfig[key]{Name: "rds-csi-reactions", Clock: cfg.Clock}),
		clock:       cfg.Clock,
		reacted:     map[string]fencing.FenceReason{},
		overdue:     map[string]fencing.Migration{},
		orphanSince: map[string]time.Time{},
		orphanPast:  map[string]bool{},
		indexedCh:   make(chan struct{}),
	}
}

// NewController wires informers on VolumeAttachments, PersistentVolumes and
// Nodes into a workqueue that maintains index. It does not start anything.
func NewController(client kubernetes.Interface, index *AttachmentIndex, cfg Config) (*Controller, error) {
	c := newController(index, cfg)
	c.streams = NewStreamHealth(c.clock)
	c.streams.restored = func(stream string) {
		klog.Background().V(2).Info("watch restored after a gap: node health is timed from now", "stream", stream)
		c.live.Restored()
	}
	newInformer := func(stream string, example runtime.Object, lw cache.ListerWatcher) cache.SharedIndexInformer {
		inf := cache.NewSharedIndexInformerWithOptions(lw, example, cache.SharedIndexInformerOptions{})
		_ = inf.SetTransform(c.records.record) // only fails once started
		return inf
	}
	vaInf := newInformer("volumeattachments", &storagev1.VolumeAttachment{}, c.streams.listWatch("volumeattachments", client,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return client.StorageV1().VolumeAttachments().List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return client.StorageV1().VolumeAttachments().Watch(ctx, o)
		}))
	pvInf := newInformer("persistentvolumes", &corev1.PersistentVolume{}, c.streams.listWatch("persistentvolumes", client,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return client.CoreV1().PersistentVolumes().List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return client.CoreV1().PersistentVolumes().Watch(ctx, o)
		}))
	nodeInf := newInformer("nodes", &corev1.Node{}, c.streams.listWatch("nodes", client,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return client.CoreV1().Nodes().List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return client.CoreV1().Nodes().Watch(ctx, o)
		}))
	if cfg.Policy.HeartbeatThreshold > 0 {
		if err := c.watchLeases(client, newInformer); err != nil {
			return nil, err
		}
		if ns := c.live.PluginLeaseNamespace(); ns != "" {
			if err := c.watchPluginLeases(client, ns, newInformer); err != nil {
				return nil, err
			}
		}
	}
	c.vas, c.pvs, c.nodes = vaInf.GetStore(), pvInf.GetStore(), nodeInf.GetStore()
	for inf, k := range map[cache.SharedIndexInformer]kind{vaInf: kindVA, pvInf: kindPV, nodeInf: kindNode} {
		enqueue := func(obj any) {
			// Cluster-scoped objects: the key is the name; tombstones of
			// missed deletions are unwrapped.
			if name, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
				c.queue.Add(key{kind: k, name: name})
			}
		}
		reg, err := inf.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
			// The initial list is not queued: Run indexes it from the
			// caches (indexListed).
			AddFunc: func(obj any, initial bool) {
				if !initial {
					enqueue(obj)
				}
			},
			UpdateFunc: func(old, obj any) {
				if !sameRecord(old, obj) {
					enqueue(obj)
				}
			},
			DeleteFunc: enqueue,
		})
		if err != nil {
			return nil, err
		}
		// The registration has synced once this handler has been given
		// every object of the initial list: each is in the cache, and
		// every later change is queued.
		c.synced = append(c.synced, reg.HasSynced)
		c.informers = append(c.informers, inf)
	}
	return c, nil
}

// watchLeases times the nodes' heartbeats: every change of a kubelet's
// Lease in kube-node-lease is a renewal, seen now on this controller's
// clock. The cache keeps each Lease's name, resourceVersion and
// duration only.
func (c *Controller) watchLeases(client kubernetes.Interface, newInformer func(string, runtime.Object, cache.ListerWatcher) cache.SharedIndexInformer) error {
	leases := client.CoordinationV1().Leases(fencing.NodeLeaseNamespace)
	inf := newInformer("leases", &coordinationv1.Lease{}, c.streams.listWatch("leases", client,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return leases.List(ctx, o) },
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return leases.Watch(ctx, o) }))
	_, err := c.handleLeases(inf)
	return err
}

// watchPluginLeases times the nodes' second heartbeat: the node plugins'
// Leases in namespace (pkg/nodelease), selected by their label so that
// the leader election Leases there are not cached. The cache keeps the
// same compact records as the kubelets'.
func (c *Controller) watchPluginLeases(client kubernetes.Interface, namespace string, newInformer func(string, runtime.Object, cache.ListerWatcher) cache.SharedIndexInformer) error {
	leases := client.CoordinationV1().Leases(namespace)
	selector := nodelease.Label + "=" + nodelease.LabelValue
	inf := newInformer("node-plugin-leases", &coordinationv1.Lease{}, c.streams.listWatch("node-plugin-leases", client,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			return leases.List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return leases.Watch(ctx, o)
		}))
	reg, err := c.handleLeases(inf)
	// Until they are listed, a node with no plugin Lease known may have
	// one: the fence's live read fails closed. Run tells the Liveness
	// once they are.
	c.pluginLeases = reg
	return err
}

// handleLeases feeds a Lease informer's changes to the fencing.Liveness.
func (c *Controller) handleLeases(inf cache.SharedIndexInformer) (cache.ResourceEventHandlerRegistration, error) {
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.leaseSeen(obj) },
		UpdateFunc: func(_, obj any) { c.leaseSeen(obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if l, ok := obj.(*leaseRecord); ok {
				c.leaseGone(l)
			}
		},
	})
	c.informers = append(c.informers, inf)
	return reg, err
}

// heartbeatOf is the node and the heartbeat a Lease record stands for
// (ok false: neither a kubelet's nor a node plugin's).
func heartbeatOf(l *leaseRecord) (node string, sig fencing.Signal, ok bool) {
	if l.namespace == fencing.NodeLeaseNamespace {
		return l.name, fencing.KubeletLease, true
	}
	if !l.nodePlugin {
		return "", 0, false
	}
	node, ok = nodelease.NodeOf(l.name)
	return node, fencing.PluginLease, ok
}

// leaseSeen records a heartbeat Lease as seen; a renewal brings the node
// back to the worker when that heartbeat would pass its threshold.
func (c *Controller) leaseSeen(obj any) {
	l, ok := obj.(*leaseRecord)
	if !ok {
		return
	}
	node, sig, ok := heartbeatOf(l)
	if ok && c.live.Observe(sig, node, l.resourceVersion, l.duration) {
		c.queue.AddAfter(key{kind: kindNode, name: node}, c.live.ThresholdOf(sig, node)+time.Millisecond)
	}
}

// leaseGone forgets a deleted heartbeat Lease.
func (c *Controller) leaseGone(l *leaseRecord) {
	if node, sig, ok := heartbeatOf(l); ok {
		c.live.Forget(sig, node)
	}
}

// Run starts the informers, the index's worker and the reactions, and
// blocks until ctx is done.
func (c *Controller) Run(ctx context.Context) {
	defer utilruntime.HandleCrash()
	defer c.queue.ShutDown()
	defer c.reactions.ShutDown()
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, inf := range c.informers {
		wg.Add(1)
		go func() { defer wg.Done(); inf.Run(ctx.Done()) }()
	}
	if c.pluginLeases != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if cache.WaitForCacheSync(ctx.Done(), c.pluginLeases.HasSynced) {
				c.live.PluginLeasesListed()
			}
		}()
	}
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return
	}
	c.indexListed(ctx)
	// One worker: the index has one writer.
	go wait.UntilWithContext(ctx, c.runWorker, time.Second)
	go wait.UntilWithContext(ctx, c.runReactions, time.Second)
	<-ctx.Done()
}

// WatchesHealthy returns an error while an informer's watch has been
// disconnected from the API server for longer than threshold: the index
// may be behind by an unknown amount. Readiness reports it.
func (c *Controller) WatchesHealthy(threshold time.Duration) error {
	if c.streams == nil {
		return nil
	}
	return c.streams.Check(threshold)
}

// RefenceStale queues a fence reaction for every stale node that still
// holds volumes. A new leader calls it: reactions a follower skipped (its
// Reactor acts only as leader) are not lost across a failover.
func (c *Controller) RefenceStale() {
	now := c.clock.Now()
	stale := map[string]bool{}
	// One pass over the volumes (not one per node): a new leader at 100k
	// volumes on 10k nodes must not stall.
	for _, v := range c.index.Volumes() {
		for _, h := range v.Holders() {
			if _, ok := fencing.HolderStale(h, c.index.Node(h.Node), now, c.cfg.Policy); ok && !stale[h.Node] {
				stale[h.Node] = true
				c.reactions.Add(key{kind: kindFence, name: h.Node})
			}
		}
		// Orphaned claims and overdue migrations are reported by the
		// leader only: a follower's Reactor reported none of them.
		c.reactions.Add(key{kind: kindOrphan, name: v.Handle})
		if multiWriter(v) {
			for _, pv := range v.PVs {
				c.reactions.Add(key{kind: kindMigration, name: pv.Name})
			}
		}
	}
}

// Synced reports whether the index is complete: every informer has
// synced and the worker has processed everything they listed at start-up.
// Until then publish decisions must not be made.
func (c *Controller) Synced() bool { return c.indexed.Load() }

// WaitForSync blocks until Synced or ctx is done, and reports Synced.
func (c *Controller) WaitForSync(ctx context.Context) bool {
	select {
	case <-c.indexedCh:
		return true
	case <-ctx.Done():
		return c.Synced()
	}
}

// indexListed indexes what the informers listed at start-up, straight
// from their caches, and marks the index synced. It runs before the
// worker starts, so the index keeps one writer. The initial list never
// passes through the work queue: a queue that once held a key per object
// keeps sets of that size for good (Go maps do not shrink), at 100k
// volumes megabytes of nothing. Changes since the list are queued by the
// handlers and indexed after (indexing an object twice changes nothing).
func (c *Controller) indexListed(ctx context.Context) {
	logger := klog.FromContext(ctx)
	listed := 0
	for _, kinds := range []struct {
		kind  kind
		store cache.Store
	}{{kindNode, c.nodes}, {kindPV, c.pvs}, {kindVA, c.vas}} {
		for _, name := range kinds.store.ListKeys() {
			if ctx.Err() != nil {
				return // stopping: never synced
			}
			listed++
			k := key{kind: kinds.kind, name: name}
			if err := c.sync(ctx, k); err != nil {
				logger.Error(err, "syncing attachment index", "key", k.String())
				c.queue.AddRateLimited(k)
			}
		}
	}
	c.indexed.Store(true)
	close(c.indexedCh)
	logger.Info("attachment index synced", "listed", listed, "stats", c.index.Stats())
}

// queueLen lets tests drain the queue deterministically.
func (c *Controller) queueLen() int { return c.queue.Len() }

func (c *Controller) runWorker(ctx context.Context) {
	for c.processNext(ctx) {
	}
}

func (c *Controller) processNext(ctx context.Context) bool {
	k, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(k)
	if err := c.sync(ctx, k); err != nil {
		klog.FromContext(ctx).Error(err, "syncing attachment index", "key", k.String())
		c.queue.AddRateLimited(k)
		return true
	}
	c.queue.Forget(k)
	return true
}

// ReactionsIdle reports that no reaction is queued or running (a failed
// one waiting for its retry counts as queued only once its backoff ends).
func (c *Controller) ReactionsIdle() bool {
	return c.reacting.Load() == 0 && c.reactions.Len() == 0
}

func (c *Controller) runReactions(ctx context.Context) {
	for c.processReaction(ctx) {
	}
}

// processReaction runs one reaction, bounded by the reaction timeout.
func (c *Controller) processReaction(ctx context.Context) bool {
	k, quit := c.reactions.Get()
	if quit {
		return false
	}
	c.reacting.Add(1)
	defer c.reacting.Add(-1)
	defer c.reactions.Done(k)
	rctx, cancel := context.WithTimeout(ctx, c.cfg.ReactionTimeout)
	defer cancel()
	var err error
	switch k.kind {
	case kindFence:
		err = c.syncFence(rctx, k.name)
	case kindMigration:
		err = c.syncMigration(rctx, k.name)
	case kindOrphan:
		err = c.syncOrphans(rctx, k.name)
	case kindRecovered:
		if c.cfg.NodeRecovered != nil {
			err = c.cfg.NodeRecovered(rctx, k.name)
		}
	}
	if err != nil {
		klog.FromContext(ctx).Error(err, "reacting to the attachment index", "key", k.String())
		c.reactions.AddRateLimited(k)
		return true
	}
	c.reactions.Forget(k)
	return true
}

// sync indexes one object. It reads the informer caches only: no network
// I/O, so a hung API call can never freeze the index.
func (c *Controller) sync(ctx context.Context, k key) error {
	switch k.kind {
	case kindVA:
		return c.syncVA(k.name)
	case kindPV:
		return c.syncPV(k.name)
	case kindNode:
		return c.syncNode(k.name)
	}
	return nil
}

// cached returns the record of name in an informer's cache, or nil.
func cached[T any](store cache.Store, name string) (T, error) {
	var none T
	obj, exists, err := store.GetByKey(name)
	if err != nil || !exists {
		return none, err
	}
	r, ok := obj.(T)
	if !ok {
		return none, fmt.Errorf("informer cache holds a %T for %s, not a record", obj, name)
	}
	return r, nil
}

func (c *Controller) syncVA(name string) error {
	va, err := cached[*vaRecord](c.vas, name)
	if err != nil {
		return err
	}
	if va == nil || va.attacher != c.records.driver || !va.hasPV {
		c.forgetAttachment(name)
		return nil
	}
	a := Attachment{Node: va.node.Value(), VAName: name, Attached: va.attached, Since: va.created, DetachingSince: va.deleting}
	c.index.setAttachment(name, va.pv, a)
	c.recheck(va.pv, "")
	return nil
}

func (c *Controller) syncPV(name string) error {
	var handle string
	if old := c.index.volumeByPV(name); old != nil {
		handle = old.Handle
	}
	pv, err := cached[*pvRecord](c.pvs, name)
	if err != nil {
		return err
	}
	if pv == nil || pv.foreign {
		c.index.deletePV(name)
		c.malformedPV(name, nil, nil, nil)
		c.recheck(name, handle)
		return nil
	}
	held, err := claims.ParseClaims(pv.claims)
	retiring, retiringErr := claims.ParseRetiring(pv.retiring)
	// Skipped and reported once per resourceVersion, never retried: the
	// same version parses the same way, and a fixed one comes back here.
	c.malformedPV(name, pv, err, retiringErr)
	if err != nil {
		// Keep the previous claims: a corrupted annotation must not free a
		// volume. Publishes of it are refused (MalformedSet.ForHandle).
		return nil
	}
	if retiringErr != nil {
		// Not a reason to stop following the PV (its claims are what
		// decisions stand on): the leader does not act on it; a release
		// with storage fencing refuses it until it is fixed.
		retiring = nil
	}
	c.index.setPV(name, func(v *Volume) {
		v.Handle = pv.handle
		v.AccessModes = pv.accessModes
		v.Block = pv.block
		v.ClaimRef = pv.claimRef
		v.ResourceVersion = pv.resourceVersion
		v.Claims = claims.NewSet(held)
		v.Retiring = retiring
		v.created = pv.created
		v.bound = pv.bound
	})
	c.recheck(name, handle)
	return nil
}

// staleOn reports whether any holding of node is stale in the index's
// view: the node deleted, out of service, NotReady past the threshold, or
// re-created since a claim of it was made.
func (c *Controller) staleOn(node string, now time.Time) (fencing.FenceReason, bool) {
	n := c.index.Node(node)
	if reason, stale := fencing.Stale(n, now, c.cfg.Policy); stale {
		return reason, true
	}
	for _, v := range c.index.VolumesOnNode(node) {
		if cl, ok := v.Claims.Get(node); ok {
			if reason, stale := fencing.HolderStale(fencing.Holder{Node: node, UID: cl.NodeUID}, n, now, c.cfg.Policy); stale {
				return reason, true
			}
		}
	}
	return "", false
}

func (c *Controller) syncNode(name string) error {
	node, err := cached[*nodeRecord](c.nodes, name)
	prev := c.index.Node(name)
	var cur NodeState
	switch {
	case err != nil:
		return err
	case node == nil:
		c.index.deleteNode(name)
		c.live.ObserveNode(name, cur)
	default:
		cur = node.state
		c.index.setNode(name, cur)
		c.live.ObserveNode(name, cur)
		if cur.Ready && node.driverTaint {
			// The driver's taint is lifted once the node has stayed
			// healthy for the recovery period (hysteresis: a flapping
			// node is not fenced and unfenced in a loop).
			if ok, wait := c.live.Recovered(name, cur); ok {
				c.reactions.Add(key{kind: kindRecovered, name: name})
			} else if wait > 0 {
				c.queue.AddAfter(key{kind: kindNode, name: name}, wait+time.Millisecond)
			}
		}
	}
	now := c.clock.Now()
	cur = c.live.Decorate(name, cur)
	reason, stale := fencing.Stale(cur, now, c.cfg.Policy)
	// A NotReady node, or one whose heartbeat stopped, becomes stale when
	// the threshold passes: come back then, so the reaction does not wait
	// for another event.
	if !stale && cur.Exists {
		c.wakeAtThreshold(name, cur, now)
	}
	// React once per stale state: a resync or an unrelated update of an
	// already-fenced node is not a new failure. A new incarnation of the
	// node (another UID) may make claims of the old one stale.
	recreated := cur.Exists && prev.UID != "" && cur.UID != prev.UID
	if (stale && c.reacted[name] != reason) || recreated {
		c.reactions.Add(key{kind: kindFence, name: name})
	}
	// Nothing of a deleted node is kept; a repeated delete event only
	// repeats an idempotent reaction.
	if stale && cur.Exists {
		c.reacted[name] = reason
	} else {
		delete(c.reacted, name)
	}
	return nil
}

// wakeAtThreshold queues node name for when its timed state (cur, at now)
// passes a threshold.
func (c *Controller) wakeAtThreshold(name string, cur NodeState, now time.Time) {
	p := c.cfg.Policy
	var at time.Time
	if !cur.Ready && !cur.NotReadySeen.IsZero() && p.NotReadyThreshold > 0 {
		at = cur.NotReadySeen.Add(p.NotReadyThreshold)
	}
	if !cur.RenewedSeen.IsZero() && p.HeartbeatThreshold > 0 {
		if hb := cur.RenewedSeen.Add(p.HeartbeatThresholdOf(cur)); at.IsZero() || hb.Before(at) {
			at = hb
		}
	}
	if !at.IsZero() {
		c.queue.AddAfter(key{kind: kindNode, name: name}, at.Sub(now)+time.Millisecond)
	}
}

// Liveness is the controller's view of its nodes' health, timed on its
// own clock; live reads that back a fence are timed by it too
// (fencing.Liveness.LiveNode).
func (c *Controller) Liveness() *fencing.Liveness { return c.live }

// syncFence tells the Reactor about the volumes a stale node holds. The
// node is looked up in the index again: if it recovered meanwhile, nothing
// is fenced. The Reactor confirms with a live read before releasing.
func (c *Controller) syncFence(ctx context.Context, name string) error {
	reason, stale := c.staleOn(name, c.clock.Now())
	if !stale || c.cfg.Reactor == nil {
		return nil
	}
	var vols []fencing.VolumeRef
	for _, v := range c.index.VolumesOnNode(name) {
		vols = append(vols, v.Ref())
	}
	if len(vols) == 0 {
		return nil
	}
	if err := c.cfg.Reactor.NodeStale(ctx, fencing.StaleHolder{Node: name, Reason: reason, Volumes: vols}); err != nil {
		return fmt.Errorf("fencing node %s: %w", name, err)
	}
	return nil
}

// forgetAttachment drops a VolumeAttachment from the index and rechecks
// its volume.
func (c *Controller) forgetAttachment(vaName string) {
	if pv := c.index.deleteAttachment(vaName); pv != "" {
		c.recheck(pv, "")
	}
}

// multiWriter: only raw-block ReadWriteMany volumes migrate live.
func multiWriter(v *Volume) bool {
	return v != nil && v.Block && v.Grants(corev1.ReadWriteMany)
}

// recheck queues the reactions that depend on a volume after a change of
// one of its PVs or attachments: the migration check for multi-writer
// volumes, the orphaned-claims check. handle is the PV's handle before
// the change, when it may be gone from the index now.
func (c *Controller) recheck(pvName, handle string) {
	v := c.index.volumeByPV(pvName)
	if multiWriter(v) {
		c.reactions.Add(key{kind: kindMigration, name: pvName})
	}
	if c.cfg.OrphanedClaimThreshold <= 0 {
		return
	}
	if v != nil && v.Handle != "" {
		c.reactions.Add(key{kind: kindOrphan, name: v.Handle})
	}
	if handle != "" && (v == nil || v.Handle != handle) {
		c.reactions.Add(key{kind: kindOrphan, name: handle})
	}
}

// syncMigration reports a raw-block RWX volume that is still on two live
// nodes after the migration timeout, once per migration, and comes back
// when a running migration's timeout passes.
func (c *Controller) syncMigration(ctx context.Context, pvName string) error {
	v := c.index.volumeByPV(pvName)
	if v == nil || v.Handle == "" {
		return nil
	}
	// One migration per volume, whatever PVs name its handle: each PV
	// queues its own check, and the report is made once.
	handle := v.Handle
	if !multiWriter(v) {
		delete(c.overdue, handle)
		return nil
	}
	now := c.clock.Now()
	m, migrating := fencing.MigrationOf(v.Holders(), c.index.Node, now, c.cfg.Policy)
	switch {
	case !migrating:
		delete(c.overdue, handle)
	case now.Before(m.Deadline):
		c.reactions.AddAfter(key{kind: kindMigration, name: pvName}, m.Deadline.Sub(now)+time.Millisecond)
	case !sameMigration(c.overdue[handle], m) && c.cfg.Reactor != nil:
		err := c.cfg.Reactor.MigrationTimedOut(ctx, v.Ref(), m)
		switch {
		case errors.Is(err, fencing.ErrNotLeader):
			// Not reported: the next leader's RefenceStale checks again.
			return nil
		case err != nil:
			return fmt.Errorf("reporting the overdue migration of PV %s: %w", pvName, err)
		}
		c.overdue[handle] = m
	}
	return nil
}

func sameMigration(a, b fencing.Migration) bool {
	return a.Source == b.Source && a.Target == b.Target && a.Deadline.Equal(b.Deadline)
}

// syncOrphans follows the claims of a volume handle that no
// VolumeAttachment of their node stands on (its VolumeAttachment was
// force-deleted, so no unpublish ran), and reports each once it has been
// so for longer than the threshold. It never releases one: the node may
// still be writing.
func (c *Controller) syncOrphans(ctx context.Context, handle string) error {
	if c.cfg.OrphanedClaimThreshold <= 0 {
		return nil // never reported (RefenceStale queues every volume)
	}
	v := c.index.Volume(handle)
	now := c.clock.Now()
	prefix := handle + "\x00"
	current := map[string]bool{}
	var errs []error
	if v != nil {
		for node := range v.Claims.All() {
			if _, attached := v.AttachmentOn(node); attached {
				continue
			}
			k := prefix + node
			current[k] = true
			since, seen := c.orphanSince[k]
			if !seen {
				since = now
				c.orphanSince[k] = now
			}
			age := now.Sub(since)
			if age < c.cfg.OrphanedClaimThreshold {
				c.reactions.AddAfter(key{kind: kindOrphan, name: handle}, c.cfg.OrphanedClaimThreshold-age+time.Millisecond)
				continue
			}
			if !c.orphanPast[k] && c.cfg.Reactor != nil {
				err := c.cfg.Reactor.OrphanedClaim(ctx, v.Ref(), node, age)
				if errors.Is(err, fencing.ErrNotLeader) {
					// Not reported (counted, though): the next leader's
					// RefenceStale checks again.
					current[k] = true
					continue
				}
				if err != nil {
					errs = append(errs, err)
					continue
				}
			}
			c.orphanPast[k] = true
		}
	}
	for k := range c.orphanSince {
		if strings.HasPrefix(k, prefix) && !current[k] {
			delete(c.orphanSince, k)
			delete(c.orphanPast, k)
		}
	}
	if c.cfg.OrphanedClaims != nil {
		c.cfg.OrphanedClaims(len(c.orphanPast))
	}
	return errors.Join(errs...)
}
