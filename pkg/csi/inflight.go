package csi

import "sync"

// InFlight is the set of volumes and snapshots an RPC is working on. A
// second operation on a busy key is refused (the RPC answers ABORTED and
// the CO retries), so two RPCs never race on one RouterOS disk inside this
// process. It is not a lock across controller replicas; the RDS calls are
// idempotent for that.
type InFlight struct {
	mu   sync.Mutex
	busy map[string]struct{}
}

// NewInFlight returns an empty set.
func NewInFlight() *InFlight { return &InFlight{busy: map[string]struct{}{}} }

// TryAcquire marks every key busy and returns the function that frees
// them, or returns false and marks nothing when any key is already busy.
func (f *InFlight) TryAcquire(keys ...string) (release func(), ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, k := range keys {
		if _, taken := f.busy[k]; taken {
			return nil, false
		}
	}
	for _, k := range keys {
		f.busy[k] = struct{}{}
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			defer f.mu.Unlock()
			for _, k := range keys {
				delete(f.busy, k)
			}
		})
	}, true
}

// Len is the number of busy keys.
func (f *InFlight) Len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.busy)
}
