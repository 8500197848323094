package framework

import (
	"sync"
	"testing"
)

// Tests side by side take their ports from FreePort at the same moments:
// no two callers may get the same port (a control plane or driver that
// loses the bind fails its test, or worse, a health check is answered by
// another test's component), and none may lie in the kernel's ephemeral
// range, where an outgoing connection can take it before the bind.
func TestFreePortNeverRepeats(t *testing.T) {
	const callers, each = 8, 125
	var mu sync.Mutex
	seen := map[int]int{}
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				p, err := FreePort()
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if other, dup := seen[p]; dup {
					t.Errorf("port %d handed to caller %d and to caller %d", p, other, c)
				}
				seen[p] = c
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	lo := ephemeralLow()
	for p := range seen {
		if p < portRangeLow || p >= lo {
			t.Errorf("port %d outside %d-%d (below the ephemeral range)", p, portRangeLow, lo-1)
		}
	}
	if len(seen) != callers*each {
		t.Errorf("%d distinct ports for %d calls", len(seen), callers*each)
	}
}
