package informers

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
)

// StreamHealth tracks whether each informer's watch on the API server is
// open. A watch that closes (an API server restart, a network failure)
// counts as disconnected until the informer opens the next one; an index
// fed by a disconnected stream silently falls behind, which readiness
// must show.
type StreamHealth struct {
	clock     clock.PassiveClock
	mu        sync.Mutex
	open      map[string]int       // stream -> watches open
	downSince map[string]time.Time // stream -> when it last had none open
	// restored, when set, is called when a stream's watch opens after it
	// had none for longer than restoreGap (the first open included): what
	// the API showed meanwhile was not seen.
	restored func(stream string)
}

// restoreGap: a watch that reopens within this (the reflector's routine
// re-watch) is no gap in what the controller saw.
const restoreGap = time.Second

// NewStreamHealth returns a tracker; every stream added counts as
// disconnected from now until its first watch opens.
func NewStreamHealth(c clock.PassiveClock) *StreamHealth {
	if c == nil {
		c = clock.RealClock{}
	}
	return &StreamHealth{clock: c, open: map[string]int{}, downSince: map[string]time.Time{}}
}

// Check returns an error naming every stream disconnected for longer than
// threshold.
func (s *StreamHealth) Check(threshold time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	var down []string
	for stream, since := range s.downSince {
		if s.open[stream] == 0 && now.Sub(since) > threshold {
			down = append(down, fmt.Sprintf("%s for %s", stream, now.Sub(since).Round(time.Second)))
		}
	}
	if len(down) == 0 {
		return nil
	}
	sort.Strings(down)
	return fmt.Errorf("watch disconnected from the API server: %s", strings.Join(down, ", "))
}

func (s *StreamHealth) add(stream string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.downSince[stream]; !ok {
		s.downSince[stream] = s.clock.Now()
	}
}

func (s *StreamHealth) opened(stream string) {
	s.mu.Lock()
	s.open[stream]++
	gap := s.open[stream] == 1 && s.clock.Now().Sub(s.downSince[stream]) > restoreGap
	restored := s.restored
	s.mu.Unlock()
	if gap && restored != nil {
		restored(stream)
	}
}

func (s *StreamHealth) closed(stream string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.open[stream]--
	if s.open[stream] <= 0 {
		s.open[stream] = 0
		s.downSince[stream] = s.clock.Now()
	}
}

// listWatch builds an informer's ListerWatcher from typed list and watch
// calls, counting its watches in s. client decides whether the reflector
// may use streaming lists (fake clientsets may not).
func (s *StreamHealth) listWatch(stream string, client any,
	list func(context.Context, metav1.ListOptions) (runtime.Object, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) cache.ListerWatcher {
	s.add(stream)
	return cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: list,
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			w, err := watchFn(ctx, opts)
			if err != nil {
				return nil, err
			}
			return s.track(stream, w), nil
		},
	}, client)
}

// trackedWatch forwards a watch's events and reports when it closes.
type trackedWatch struct {
	inner watch.Interface
	out   chan watch.Event
	stop  chan struct{}
	once  sync.Once
}

func (s *StreamHealth) track(stream string, w watch.Interface) watch.Interface {
	t := &trackedWatch{inner: w, out: make(chan watch.Event), stop: make(chan struct{})}
	s.opened(stream)
	go func() {
		defer s.closed(stream)
		defer close(t.out)
		for ev := range w.ResultChan() {
			select {
			case t.out <- ev:
			case <-t.stop:
				return
			}
		}
	}()
	return t
}

func (t *trackedWatch) ResultChan() <-chan watch.Event { return t.out }

func (t *trackedWatch) Stop() {
	t.once.Do(func() { close(t.stop) })
	t.inner.Stop()
}
