package framework

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// AttachmentMonitor follows VolumeAttachments through an informer and
// remembers, per PV, every moment the set of nodes reporting it attached
// changed. Watch events of one resource arrive in resourceVersion order,
// so this is the API server's own serialisation: if two nodes were ever
// attached at once according to the API, the monitor saw it.
type AttachmentMonitor struct {
	now func() time.Time

	mu       sync.Mutex
	attached map[string]map[string]string // pv -> VolumeAttachment name -> node, attached=true only
	history  map[string][]AttachmentChange
}

// AttachmentChange is the set of nodes a PV was attached to from At on.
type AttachmentChange struct {
	At    time.Time
	Nodes []string // sorted
}

// WatchAttachments starts an AttachmentMonitor until ctx ends.
func WatchAttachments(ctx context.Context, client kubernetes.Interface) (*AttachmentMonitor, error) {
	m := newAttachmentMonitor(time.Now)
	f := informers.NewSharedInformerFactory(client, 0)
	inf := f.Storage().V1().VolumeAttachments().Informer()
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { m.update(obj.(*storagev1.VolumeAttachment), false) },
		UpdateFunc: func(_, obj any) { m.update(obj.(*storagev1.VolumeAttachment), false) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if va, ok := obj.(*storagev1.VolumeAttachment); ok {
				m.update(va, true)
			}
		},
	})
	if err != nil {
		return nil, err
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil, fmt.Errorf("VolumeAttachment informer did not sync: %w", ctx.Err())
	}
	go func() {
		<-ctx.Done()
		f.Shutdown()
	}()
	return m, nil
}

func newAttachmentMonitor(now func() time.Time) *AttachmentMonitor {
	return &AttachmentMonitor{now: now, attached: map[string]map[string]string{}, history: map[string][]AttachmentChange{}}
}

func (m *AttachmentMonitor) update(va *storagev1.VolumeAttachment, deleted bool) {
	pv := ""
	if p := va.Spec.Source.PersistentVolumeName; p != nil {
		pv = *p
	}
	if pv == "" {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	cur := m.attached[pv]
	if cur == nil {
		cur = map[string]string{}
		m.attached[pv] = cur
	}
	before := nodesOf(cur)
	if deleted || !va.Status.Attached {
		delete(cur, va.Name)
	} else {
		cur[va.Name] = va.Spec.NodeName
	}
	after := nodesOf(cur)
	if fmt.Sprint(before) != fmt.Sprint(after) {
		m.history[pv] = append(m.history[pv], AttachmentChange{At: m.now(), Nodes: after})
	}
}

func nodesOf(m map[string]string) []string {
	nodes := make([]string, 0, len(m))
	for _, n := range m {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	return nodes
}

// History is every change of the PV's attached-node set, oldest first.
func (m *AttachmentMonitor) History(pv string) []AttachmentChange {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]AttachmentChange(nil), m.history[pv]...)
}

// MaxAttached is the largest number of nodes the PV was attached to at once.
func (m *AttachmentMonitor) MaxAttached(pv string) int {
	max := 0
	for _, c := range m.History(pv) {
		if len(c.Nodes) > max {
			max = len(c.Nodes)
		}
	}
	return max
}

// Handoff is how long the PV had no attached node between leaving from
// and arriving on to (the last such gap), and whether such a handoff was
// seen at all.
func (m *AttachmentMonitor) Handoff(pv, from, to string) (time.Duration, bool) {
	h := m.History(pv)
	for i := len(h) - 1; i >= 0; i-- {
		if !equalNodes(h[i].Nodes, to) {
			continue
		}
		// h[i] is an arrival on `to` alone; `from` left at the change
		// after the last one that still had it.
		for j := i - 1; j >= 0; j-- {
			if contains(h[j].Nodes, from) {
				return h[i].At.Sub(h[j+1].At), true
			}
		}
	}
	return 0, false
}

func equalNodes(nodes []string, node string) bool { return len(nodes) == 1 && nodes[0] == node }

func contains(nodes []string, node string) bool {
	for _, n := range nodes {
		if n == node {
			return true
		}
	}
	return false
}
