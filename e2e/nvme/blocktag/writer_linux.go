package blocktag

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Now is CLOCK_MONOTONIC in nanoseconds, the clock of every timestamp in
// tags and histories.
func Now() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(fmt.Sprintf("clock_gettime(CLOCK_MONOTONIC): %v", err))
	}
	return ts.Nano()
}

// OpenDirect opens a block device (or file) for O_DIRECT|O_DSYNC writes:
// a write's success means the target acknowledged it, not that it sits in
// this kernel's page cache.
func OpenDirect(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|unix.O_DIRECT|unix.O_DSYNC, 0)
}

// Record is one write as its writer saw it.
type Record struct {
	Tag
	CompleteNS int64 // CLOCK_MONOTONIC when the write returned
	Err        error // nil: acknowledged
}

// OK reports whether the write was acknowledged.
func (r Record) OK() bool { return r.Err == nil }

// Writer writes tagged blocks to the slots [FirstSlot, FirstSlot+Slots)
// in turn, one write in flight, until its context ends or Limit writes
// were made, and records every answer.
type Writer struct {
	Host      uint32
	FirstSlot uint32
	Slots     uint32
	// Limit stops the writer after this many writes; 0: no limit.
	Limit int
	// FailurePause is waited after a failed write before the next one, so
	// that a writer whose every write fails at once does not take the
	// (single) CPU from the rest of the test. It only paces the load.
	FailurePause time.Duration

	mu      sync.Mutex
	records []Record
	done    chan struct{}
}

// Start runs the writer on f in a goroutine of its own OS thread (so a
// completion is timestamped as soon as the write returns). Wait for it
// with Wait.
func (w *Writer) Start(ctx context.Context, f *os.File) {
	w.done = make(chan struct{})
	go func() {
		defer close(w.done)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		w.run(ctx, f)
	}()
}

// Wait returns once the writer has stopped (its context ended or Limit
// was reached) and returns its history.
func (w *Writer) Wait() []Record {
	<-w.done
	return w.Records()
}

// Done is closed when the writer has stopped.
func (w *Writer) Done() <-chan struct{} { return w.done }

// Records returns the answers so far, in submission order. The slice is
// shared and must not be modified.
func (w *Writer) Records() []Record {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.records[:len(w.records):len(w.records)]
}

func (w *Writer) run(ctx context.Context, f *os.File) {
	if w.Slots == 0 {
		panic("blocktag: a writer needs at least one slot")
	}
	// O_DIRECT needs an aligned buffer; an anonymous mapping is
	// page-aligned.
	buf, err := unix.Mmap(-1, 0, BlockSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		w.append(Record{Err: fmt.Errorf("allocating an aligned buffer: %w", err)})
		return
	}
	defer unix.Munmap(buf)
	for seq := uint64(1); ctx.Err() == nil && (w.Limit == 0 || seq <= uint64(w.Limit)); seq++ {
		slot := w.FirstSlot + uint32((seq-1)%uint64(w.Slots))
		t := Tag{Host: w.Host, Slot: slot, Seq: seq}
		t.SubmitNS = Now()
		Encode(buf, t)
		n, err := unix.Pwrite(int(f.Fd()), buf, int64(slot)*BlockSize)
		done := Now()
		if err == nil && n != BlockSize {
			err = fmt.Errorf("short write: %d bytes", n)
		}
		if err != nil {
			err = &os.PathError{Op: "pwrite", Path: f.Name(), Err: err}
		}
		w.append(Record{Tag: t, CompleteNS: done, Err: err})
		if err != nil && w.FailurePause > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(w.FailurePause):
			}
		}
	}
}

func (w *Writer) append(r Record) {
	w.mu.Lock()
	w.records = append(w.records, r)
	w.mu.Unlock()
}

// Errno returns the errno of a failed write, 0 if there is none.
func Errno(err error) unix.Errno {
	var e unix.Errno
	if errors.As(err, &e) {
		return e
	}
	return 0
}
