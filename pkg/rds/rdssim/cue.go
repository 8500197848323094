package rdssim

import (
	"context"
	"sync"
)

// DeadlineOnCue returns a context whose deadline passes when expire is
// called, for tests: with CopyGate, a caller's deadline passes at a chosen
// step of a copy (the copy sent, not yet done), not after a time the
// machine's speed decides what fits into.
func DeadlineOnCue(parent context.Context) (ctx context.Context, expire func()) {
	c := &cueContext{Context: parent, done: make(chan struct{})}
	var once sync.Once
	return c, func() { once.Do(func() { close(c.done) }) }
}

type cueContext struct {
	context.Context
	done chan struct{}
}

func (c *cueContext) Done() <-chan struct{} { return c.done }

func (c *cueContext) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}
