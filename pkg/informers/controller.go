package informers

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/srvlab/rds-csi/pkg/fencing"
)

// OutOfServiceTaint is the taint an operator puts on a node that is down
// for good (non-graceful node shutdown).
const OutOfServiceTaint = "node.kubernetes.io/out-of-service"

// kind of object behind a queue key.
type kind int

const (
	kindVA kind = iota
	kindPV
	kindNode
	// kindFence: a node became stale; tell the Reactor. A separate key so
	// that a failed reaction is retried with backoff on its own.
	kindFence
	// kindMigration: check a multi-writer PV for a live migration past its
	// timeout (queued on every change of the PV or its attachments, and
	// for the moment the timeout passes).
	kindMigration
	// kindSynced marks the end of the initial list in the queue: when the
	// single worker reaches it, every object listed at start-up is in the
	// index.
	kindSynced
)

// key is a workqueue item: handlers enqueue keys, the worker reads the
// objects from the informer caches.
type key struct {
	kind kind
	name string
}

func (k key) String() string { return fmt.Sprintf("%d/%s", k.kind, k.name) }

// Reactor acts on node failures; the controller calls it from its worker,
// once per node state change, without waiting for a publish. An error
// requeues the node with backoff.
type Reactor interface {
	NodeStale(ctx context.Context, s fencing.StaleHolder) error
	// MigrationTimedOut: a raw-block RWX volume is still on two nodes
	// after the migration timeout.
	MigrationTimedOut(ctx context.Context, v fencing.VolumeRef, m fencing.Migration) error
}

// Config of the controller.
type Config struct {
	DriverName string
	Policy     fencing.Config
	// Reactor, when set, is told about stale holders (event-driven fencing).
	Reactor Reactor
	// Clock for NotReady timing; default the real clock.
	Clock clock.WithTicker
}

// Controller keeps an AttachmentIndex in step with the API server.
type Controller struct {
	cfg     Config
	index   *AttachmentIndex
	queue   workqueue.TypedRateLimitingInterface[key]
	vas     storagelisters.VolumeAttachmentLister
	pvs     corelisters.PersistentVolumeLister
	nodes   corelisters.NodeLister
	synced  []cache.InformerSynced
	factory informers.SharedInformerFactory
	clock   clock.WithTicker
	// reacted: the stale state each node was last reported in. Only the
	// worker touches it.
	reacted map[string]fencing.FenceReason
	// overdue: the migration (target node and deadline) each PV was last
	// reported overdue for. Only the worker touches it.
	overdue map[string]fencing.Migration
	// indexed is set (and indexedCh closed) when the initial list is in
	// the index.
	indexed   atomic.Bool
	indexedCh chan struct{}
}

// NewController wires informers on VolumeAttachments, PersistentVolumes and
// Nodes into a workqueue that maintains index. It does not start anything.
func NewController(client kubernetes.Interface, index *AttachmentIndex, cfg Config) (*Controller, error) {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(trim))
	vaInf := factory.Storage().V1().VolumeAttachments()
	pvInf := factory.Core().V1().PersistentVolumes()
	nodeInf := factory.Core().V1().Nodes()

	limiter := workqueue.NewTypedMaxOfRateLimiter(
		workqueue.NewTypedItemExponentialFailureRateLimiter[key](5*time.Millisecond, 5*time.Minute),
		&workqueue.TypedBucketRateLimiter[key]{Limiter: rate.NewLimiter(rate.Limit(100), 1000)},
	)
	c := &Controller{
		cfg:       cfg,
		index:     index,
		queue:     workqueue.NewTypedRateLimitingQueueWithConfig(limiter, workqueue.TypedRateLimitingQueueConfig[key]{Name: "rds-csi-attachments", Clock: cfg.Clock}),
		vas:       vaInf.Lister(),
		pvs:       pvInf.Lister(),
		nodes:     nodeInf.Lister(),
		factory:   factory,
		clock:     cfg.Clock,
		reacted:   map[string]fencing.FenceReason{},
		overdue:   map[string]fencing.Migration{},
		indexedCh: make(chan struct{}),
	}
	for inf, k := range map[cache.SharedIndexInformer]kind{vaInf.Informer(): kindVA, pvInf.Informer(): kindPV, nodeInf.Informer(): kindNode} {
		enqueue := func(obj any) {
			// Cluster-scoped objects: the key is the name; tombstones of
			// missed deletions are unwrapped.
			if name, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
				c.queue.Add(key{kind: k, name: name})
			}
		}
		reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    enqueue,
			UpdateFunc: func(_, obj any) { enqueue(obj) },
			DeleteFunc: enqueue,
		})
		if err != nil {
			return nil, err
		}
		// The registration has synced once this handler has been given
		// every object of the initial list, i.e. every key is queued.
		c.synced = append(c.synced, reg.HasSynced)
	}
	return c, nil
}

// Run starts the informers and the worker, and blocks until ctx is done.
func (c *Controller) Run(ctx context.Context) {
	defer utilruntime.HandleCrash()
	defer c.queue.ShutDown()
	logger := klog.FromContext(ctx)
	c.factory.Start(ctx.Done())
	defer c.factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return
	}
	logger.V(2).Info("informers synced; indexing what they listed", "queued", c.queue.Len())
	c.queue.Add(key{kind: kindSynced})
	// One worker: the index has one writer.
	go wait.UntilWithContext(ctx, c.runWorker, time.Second)
	<-ctx.Done()
}

// RefenceStale queues a fence reaction for every stale node that still
// holds volumes. A new leader calls it: reactions a follower skipped (its
// Reactor acts only as leader) are not lost across a failover.
func (c *Controller) RefenceStale() {
	now := c.clock.Now()
	for _, n := range c.index.HolderNodes() {
		if _, stale := fencing.Stale(c.index.Node(n), now, c.cfg.Policy); stale {
			c.queue.Add(key{kind: kindFence, name: n})
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

func (c *Controller) sync(ctx context.Context, k key) error {
	switch k.kind {
	case kindVA:
		return c.syncVA(k.name)
	case kindPV:
		return c.syncPV(k.name)
	case kindNode:
		return c.syncNode(k.name)
	case kindFence:
		return c.syncFence(ctx, k.name)
	case kindMigration:
		return c.syncMigration(ctx, k.name)
	case kindSynced:
		if c.indexed.CompareAndSwap(false, true) {
			close(c.indexedCh)
			klog.FromContext(ctx).Info("attachment index synced", "stats", c.index.Stats())
		}
	}
	return nil
}

func (c *Controller) syncVA(name string) error {
	va, err := c.vas.Get(name)
	if apierrors.IsNotFound(err) {
		c.forgetAttachment(name)
		return nil
	}
	if err != nil {
		return err
	}
	pvName := va.Spec.Source.PersistentVolumeName
	if va.Spec.Attacher != c.cfg.DriverName || pvName == nil {
		c.forgetAttachment(name)
		return nil
	}
	a := Attachment{Node: va.Spec.NodeName, VAName: name, Attached: va.Status.Attached, Since: va.CreationTimestamp.Time}
	if va.DeletionTimestamp != nil {
		a.DetachingSince = va.DeletionTimestamp.Time
	}
	c.index.setAttachment(name, *pvName, a)
	c.recheckMigration(*pvName)
	return nil
}

func (c *Controller) syncPV(name string) error {
	pv, err := c.pvs.Get(name)
	if apierrors.IsNotFound(err) {
		c.index.deletePV(name)
		delete(c.overdue, name)
		return nil
	}
	if err != nil {
		return err
	}
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != c.cfg.DriverName {
		c.index.deletePV(name)
		return nil
	}
	claims, err := decodeClaims(pv.Annotations)
	if err != nil {
		// Keep the previous claims: a corrupted annotation must not free a
		// volume. Retried with backoff, and logged, until someone fixes it.
		return fmt.Errorf("PV %s: %w", name, err)
	}
	c.index.setPV(name, func(v *Volume) {
		v.Handle = pv.Spec.CSI.VolumeHandle
		v.AccessModes = pv.Spec.AccessModes
		v.Block = pv.Spec.VolumeMode != nil && *pv.Spec.VolumeMode == corev1.PersistentVolumeBlock
		v.ClaimRef = pv.Spec.ClaimRef
		v.ResourceVersion = pv.ResourceVersion
		v.Claims = claims
	})
	c.recheckMigration(name)
	return nil
}

func (c *Controller) syncNode(name string) error {
	node, err := c.nodes.Get(name)
	var cur NodeState
	switch {
	case apierrors.IsNotFound(err):
		c.index.deleteNode(name)
	case err != nil:
		return err
	default:
		cur = nodeState(node)
		c.index.setNode(name, cur)
	}
	now := c.clock.Now()
	reason, stale := fencing.Stale(cur, now, c.cfg.Policy)
	// A NotReady node becomes stale when the threshold passes: come back
	// then, so the reaction does not wait for another event.
	if !stale && cur.Exists && !cur.Ready && !cur.NotReadySince.IsZero() && c.cfg.Policy.NotReadyThreshold > 0 {
		c.queue.AddAfter(key{kind: kindNode, name: name}, cur.NotReadySince.Add(c.cfg.Policy.NotReadyThreshold).Sub(now)+time.Millisecond)
	}
	// React once per stale state: a resync or an unrelated update of an
	// already-fenced node is not a new failure.
	if stale && c.reacted[name] != reason {
		c.queue.Add(key{kind: kindFence, name: name})
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

// syncFence tells the Reactor about the volumes a stale node holds. The
// node is looked up again: if it recovered meanwhile, nothing is fenced.
func (c *Controller) syncFence(ctx context.Context, name string) error {
	reason, stale := fencing.Stale(c.index.Node(name), c.clock.Now(), c.cfg.Policy)
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
// its volume's migration state.
func (c *Controller) forgetAttachment(vaName string) {
	if pv := c.index.deleteAttachment(vaName); pv != "" {
		c.recheckMigration(pv)
	}
}

// multiWriter: only raw-block ReadWriteMany volumes migrate live.
func multiWriter(v *Volume) bool {
	return v != nil && v.Block && v.Grants(corev1.ReadWriteMany)
}

// recheckMigration queues a migration check after a change of a
// multi-writer volume or its attachments.
func (c *Controller) recheckMigration(pvName string) {
	if multiWriter(c.index.volumeByPV(pvName)) {
		c.queue.Add(key{kind: kindMigration, name: pvName})
	}
}

// syncMigration reports a raw-block RWX volume that is still on two live
// nodes after the migration timeout, once per migration, and comes back
// when a running migration's timeout passes.
func (c *Controller) syncMigration(ctx context.Context, pvName string) error {
	v := c.index.volumeByPV(pvName)
	if !multiWriter(v) {
		delete(c.overdue, pvName)
		return nil
	}
	now := c.clock.Now()
	m, migrating := fencing.MigrationOf(v.Holders(), c.index.Node, now, c.cfg.Policy)
	switch {
	case !migrating:
		delete(c.overdue, pvName)
	case now.Before(m.Deadline):
		c.queue.AddAfter(key{kind: kindMigration, name: pvName}, m.Deadline.Sub(now)+time.Millisecond)
	case !sameMigration(c.overdue[pvName], m) && c.cfg.Reactor != nil:
		if err := c.cfg.Reactor.MigrationTimedOut(ctx, v.Ref(), m); err != nil {
			return fmt.Errorf("reporting the overdue migration of PV %s: %w", pvName, err)
		}
		c.overdue[pvName] = m
	}
	return nil
}

func sameMigration(a, b fencing.Migration) bool {
	return a.Source == b.Source && a.Target == b.Target && a.Deadline.Equal(b.Deadline)
}

// nodeState extracts what the policy needs from a Node.
func nodeState(n *corev1.Node) NodeState {
	s := NodeState{Exists: true}
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			s.Ready = cond.Status == corev1.ConditionTrue
			if !s.Ready {
				s.NotReadySince = cond.LastTransitionTime.Time
			}
		}
	}
	for _, t := range n.Spec.Taints {
		if t.Key == OutOfServiceTaint {
			s.OutOfService = true
		}
	}
	return s
}

// trim keeps only what the index needs of each object, so the caches stay
// small at 10k+ objects: no managed fields, no foreign annotations, no node
// images or addresses.
func trim(obj any) (any, error) {
	switch o := obj.(type) {
	case *storagev1.VolumeAttachment:
		o.ManagedFields = nil
		o.Annotations = nil
		o.Labels = nil
		o.Status.AttachmentMetadata = nil
		o.Status.AttachError = nil
		o.Status.DetachError = nil
		o.Spec.Source.InlineVolumeSpec = nil
	case *corev1.PersistentVolume:
		o.ManagedFields = nil
		o.Labels = nil
		if v, ok := o.Annotations[ClaimsAnnotation]; ok {
			o.Annotations = map[string]string{ClaimsAnnotation: v}
		} else {
			o.Annotations = nil
		}
		o.Spec.MountOptions = nil
		o.Spec.NodeAffinity = nil
		if o.Spec.CSI != nil {
			o.Spec.CSI = &corev1.CSIPersistentVolumeSource{Driver: o.Spec.CSI.Driver, VolumeHandle: o.Spec.CSI.VolumeHandle}
		}
		if o.Spec.ClaimRef != nil {
			o.Spec.ClaimRef = &corev1.ObjectReference{Kind: o.Spec.ClaimRef.Kind, Namespace: o.Spec.ClaimRef.Namespace, Name: o.Spec.ClaimRef.Name, UID: o.Spec.ClaimRef.UID}
		}
		o.Status = corev1.PersistentVolumeStatus{Phase: o.Status.Phase}
	case *corev1.Node:
		o.ManagedFields = nil
		o.Annotations = nil
		o.Labels = nil
		var ready []corev1.NodeCondition
		for _, c := range o.Status.Conditions {
			if c.Type == corev1.NodeReady {
				ready = append(ready, corev1.NodeCondition{Type: c.Type, Status: c.Status, LastTransitionTime: c.LastTransitionTime})
			}
		}
		o.Status = corev1.NodeStatus{Conditions: ready}
		o.Spec = corev1.NodeSpec{Taints: o.Spec.Taints}
	}
	return obj, nil
}
