package csi

import (
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// laggingClient is one controller replica's view of a shared API server
// (a client from newFakeAPI): every read and write goes straight to the
// shared server, but the replica's watches, one per resource, pass through
// a gate the test holds shut or open. A shut gate is an informer that has
// fallen behind on that stream while the others keep up, as each watch of
// a real replica lags on its own.
type laggingClient struct {
	*fake.Clientset
	mu     sync.Mutex
	paused map[string]bool
	held   map[string][]watch.Event
	out    map[string][]*watch.RaceFreeFakeWatcher
}

func newLaggingClient(t *testing.T, shared *fake.Clientset) *laggingClient {
	t.Helper()
	l := &laggingClient{Clientset: &fake.Clientset{}, paused: map[string]bool{}, held: map[string][]watch.Event{}, out: map[string][]*watch.RaceFreeFakeWatcher{}}
	l.AddReactor("*", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		obj, err := shared.Invokes(a, nil)
		return true, obj, err
	})
	l.AddWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		resource := a.GetResource().Resource
		src, err := shared.Tracker().Watch(a.GetResource(), a.GetNamespace())
		if err != nil {
			return true, nil, err
		}
		w := watch.NewRaceFreeFake()
		l.mu.Lock()
		l.out[resource] = append(l.out[resource], w)
		l.mu.Unlock()
		go func() {
			for ev := range src.ResultChan() {
				l.deliver(resource, ev)
			}
		}()
		t.Cleanup(src.Stop)
		return true, w, nil
	})
	return l
}

func (l *laggingClient) deliver(resource string, ev watch.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.paused[resource] {
		l.held[resource] = append(l.held[resource], ev)
		return
	}
	for _, w := range l.out[resource] {
		w.Action(ev.Type, ev.Object)
	}
}

// pause holds back the events of one resource ("persistentvolumes",
// "nodes", "volumeattachments") from now on.
func (l *laggingClient) pause(resource string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.paused[resource] = true
}

// resume delivers what was held back, in order, and lets events through.
func (l *laggingClient) resume(resource string) {
	l.mu.Lock()
	held := l.held[resource]
	l.held[resource] = nil
	l.paused[resource] = false
	outs := l.out[resource]
	l.mu.Unlock()
	for _, ev := range held {
		for _, w := range outs {
			w.Action(ev.Type, ev.Object)
		}
	}
}
