package informers

import (
	"context"
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
)

// Feed is a Controller's source of objects when something other than
// informers decides what the index sees and when: a simulation that lags,
// reorders or pauses each watch stream on its own, as informers on a real
// API server may. The caller delivers objects with Apply and Remove and
// runs the controller with Drain; there are no goroutines of its own.
type Feed struct {
	c               *Controller
	vas, pvs, nodes cache.Indexer
	kindOf          func(runtime.Object) (kind, cache.Indexer, error)
}

// NewFedController returns a Controller whose index is fed by the returned
// Feed instead of informers. It counts as synced from the start: what it
// has been fed is, by definition, everything it knows.
func NewFedController(index *AttachmentIndex, cfg Config) (*Controller, *Feed) {
	c := newController(index, cfg)
	f := &Feed{
		c:     c,
		vas:   cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}),
		pvs:   cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}),
		nodes: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}),
	}
	c.vas, c.pvs, c.nodes = f.vas, f.pvs, f.nodes
	c.indexed.Store(true)
	close(c.indexedCh)
	c.live.PluginLeasesListed()
	return c, f
}

func (f *Feed) store(obj runtime.Object) (kind, cache.Indexer, error) {
	switch obj.(type) {
	case *storagev1.VolumeAttachment:
		return kindVA, f.vas, nil
	case *corev1.PersistentVolume:
		return kindPV, f.pvs, nil
	case *corev1.Node:
		return kindNode, f.nodes, nil
	case *coordinationv1.Lease:
		return kindLease, nil, nil
	}
	return 0, nil, fmt.Errorf("feed: unsupported object %T", obj)
}

// Apply delivers an added or updated object (its record is kept, as the
// informers keep it).
func (f *Feed) Apply(obj runtime.Object) error {
	k, store, err := f.store(obj)
	if err != nil {
		return err
	}
	rec, err := f.c.records.record(obj)
	if err != nil {
		return err
	}
	if k == kindLease {
		f.c.leaseSeen(rec)
		return nil
	}
	if err := store.Update(rec); err != nil {
		return err
	}
	name, err := cache.MetaNamespaceKeyFunc(rec)
	if err != nil {
		return err
	}
	f.c.queue.Add(key{kind: k, name: name})
	return nil
}

// Remove delivers the deletion of an object.
func (f *Feed) Remove(obj runtime.Object) error {
	k, store, err := f.store(obj)
	if err != nil {
		return err
	}
	if k == kindLease {
		rec, err := f.c.records.record(obj)
		if err != nil {
			return err
		}
		f.c.leaseGone(rec.(*leaseRecord))
		return nil
	}
	if err := store.Delete(obj); err != nil {
		return err
	}
	name, err := cache.MetaNamespaceKeyFunc(obj)
	if err != nil {
		return err
	}
	f.c.queue.Add(key{kind: k, name: name})
	return nil
}

// Drain runs the index's worker and then the reactions in the caller's
// goroutine until both queues are empty (items waiting for a later time
// stay queued). Only for a Controller that is not Run.
func (c *Controller) Drain(ctx context.Context) {
	for c.queue.Len() > 0 || c.reactions.Len() > 0 {
		for c.queue.Len() > 0 {
			c.processNext(ctx)
		}
		for c.reactions.Len() > 0 && c.queue.Len() == 0 {
			c.processReaction(ctx)
		}
	}
}
