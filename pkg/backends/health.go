package backends

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/srvlab/rds-csi/pkg/rds"
)

// Health is a box's reachability as last seen by its own probe (Run),
// and by every command that got an answer from it (Answered): what
// placement reads to pass a box over without waiting on it. A command
// that failed does not take the box down by itself: it may have failed
// because its caller gave up (a CO's deadline, another box answering
// first), which the client's error does not always tell apart from a
// timeout; the probe, which nobody cancels, decides. It starts up (a box
// nobody has tried yet is tried).
type Health struct {
	name string
	mu   sync.Mutex
	err  error
	at   time.Time
}

// NewHealth is the health of the box named name.
func NewHealth(name string) *Health { return &Health{name: name} }

// Unreachable reports whether err says the box cannot be used now: the
// command did not reach RouterOS (rds.Reached: the transport failed, its
// host key is not the pinned one, it refuses the driver's SSH key), it
// timed out, or it answers what cannot be read. A
// refusal of a command (no space, no such disk) is an answer: the box is
// up.
func Unreachable(err error) bool {
	return !rds.Reached(err) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, rds.ErrBadOutput)
}

// Observe records the outcome of a command or probe. A command its
// caller gave up on (context.Canceled: another box answered first, the
// RPC ended) says nothing about the box and changes nothing.
func (h *Health) Observe(err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if Unreachable(err) {
		h.err = err
	} else {
		h.err = nil
	}
	h.at = time.Now()
}

// Answered records that the box answered a command: it is up.
func (h *Health) Answered() { h.Observe(nil) }

// Err is nil while the box is up, else the failure that took it down.
func (h *Health) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err == nil {
		return nil
	}
	return fmt.Errorf("RDS %s unreachable since %s: %w", h.name, h.at.Format(time.RFC3339), h.err)
}

// Run probes the box every interval, each probe bounded by timeout, until
// ctx is done: a box that is passed over gets no commands, so only the
// probe brings it back.
func (h *Health) Run(ctx context.Context, probe func(context.Context) error, interval, timeout time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, timeout)
		err := probe(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		h.Observe(err)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
