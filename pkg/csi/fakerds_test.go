package csi

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/srvlab/rds-csi/pkg/nvme"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// fakeRDS is an in-memory RDS with the semantics of rds.Client: sizes
// rounded up to rds.Granularity, idempotent adds, "not enough space",
// deletes that remove the disk and its file. Errors can be injected per
// method.
type fakeRDS struct {
	mu       sync.Mutex
	disks    map[string]rds.Disk
	files    map[string]int64 // absolute path -> bytes
	poolSize int64
	fail     map[string]error // method -> error for its next call
	calls    map[string]int
	hold     map[string]*hold
	drops    map[string]int // slot -> connections dropped (export turned off)
	changes  map[string]int // slot -> export state changes

	// Late commands (the publish model check). Every hook runs with f.mu
	// held and must not call f's methods (only the *Locked ones).
	//
	// delaySwap, when set, is asked about every SwapExport that sends a
	// command: timedOut makes its caller see a timeout (an error that is
	// not rds.ErrExportChanged, as rds.Client's after a command was sent)
	// while the command stays in flight (inFlight), to land or be lost
	// later (landLocked, loseLocked). rds.Client never re-sends a
	// compare-and-swap whose outcome is unknown, so neither does this.
	delaySwap func(s *lateSwap) (timedOut bool)
	inFlight  []*lateSwap
	lateSeq   int
	// atCall runs as every call arrives, before its body: commands in
	// flight may land then, in the middle of another operation.
	atCall func(method string)
	// onChange runs after every change of a disk's export state (a swap
	// landing, on time or late).
	onChange func(slot string, before, after rds.Disk)
	// secrets: the secret each password set so far makes (as RouterOS is
	// assumed to: the same password, the same secret), compared with
	// ExportPassword.Equal, which never shows one.
	secrets []fakeSecret
	// keepPasswordOnHostChange: a broken RouterOS, or client, that keeps
	// the old password when a swap moves the allowed host (the model
	// check's negative control).
	keepPasswordOnHostChange bool
	// hideSecrets: a RouterOS user without the sensitive policy, who
	// sees no nvme-tcp-server-secret although a password is set
	// (GetDisk, ListDisks and a swap's read back print none).
	hideSecrets bool
}

// printedLocked is d as a read of it prints.
func (f *fakeRDS) printedLocked(d rds.Disk) rds.Disk {
	if f.hideSecrets {
		d.Secret = nvme.DHCHAPSecret{}
	}
	return d
}

type fakeSecret struct {
	pw     rds.ExportPassword
	secret nvme.DHCHAPSecret
}

// secretLocked is the secret pw makes.
func (f *fakeRDS) secretLocked(pw rds.ExportPassword) nvme.DHCHAPSecret {
	if pw.IsZero() {
		return nvme.DHCHAPSecret{}
	}
	for _, s := range f.secrets {
		if s.pw.Equal(pw) {
			return s.secret
		}
	}
	sec, err := nvme.NewDHCHAPSecret(rand.Reader)
	if err != nil {
		panic(err)
	}
	f.secrets = append(f.secrets, fakeSecret{pw, sec})
	return sec
}

// lateSwap is a SwapExport command in flight after its caller saw a
// timeout: a compare-and-swap on the state it was sent with, evaluated
// against the disk's state when (if ever) it lands.
type lateSwap struct {
	id       int
	slot     string
	from, to rds.ExportState
	// changes: the disk's export state changes when it was sent; a
	// command that matches after others changed the state found its
	// `from` state again (ABA).
	changes int
	// due and lost are for whoever schedules the landing (the model:
	// the step by which it lands, or is lost).
	due  int
	lost bool
	// password: what the command sets (nil: SwapExport, it keeps it).
	password *rds.ExportPassword
}

// hold stops the next call of a method until released, so a test can keep
// an RPC in flight.
type hold struct {
	entered chan struct{} // closed when the call has arrived
	release chan struct{} // close to let it go on
}

func newFakeRDS(poolSize int64) *fakeRDS {
	return &fakeRDS{
		disks:    map[string]rds.Disk{},
		files:    map[string]int64{},
		poolSize: poolSize,
		fail:     map[string]error{},
		calls:    map[string]int{},
		drops:    map[string]int{},
		changes:  map[string]int{},
		hold:     map[string]*hold{},
	}
}

// failNext makes the next call of method return err.
func (f *fakeRDS) failNext(method string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[method] = err
}

// holdNext arms a hold on the next call of method.
func (f *fakeRDS) holdNext(method string) *hold {
	f.mu.Lock()
	defer f.mu.Unlock()
	h := &hold{entered: make(chan struct{}), release: make(chan struct{})}
	f.hold[method] = h
	return h
}

func (f *fakeRDS) enter(method string) error {
	f.mu.Lock()
	h := f.hold[method]
	delete(f.hold, method)
	f.mu.Unlock()
	if h != nil {
		close(h.entered)
		<-h.release
	}
	f.mu.Lock()
	if f.atCall != nil {
		f.atCall(method)
	}
	f.calls[method]++
	err := f.fail[method]
	delete(f.fail, method)
	return err // f.mu stays locked for the method body
}

func (f *fakeRDS) used() int64 {
	var n int64
	for _, s := range f.files {
		n += s
	}
	return n
}

// putDisk adds a disk and its file directly, for test setup.
func (f *fakeRDS) putDisk(d rds.Disk) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.disks[d.Slot] = d
	f.files[d.FilePath] = d.Size
}

func (f *fakeRDS) disk(slot string) (rds.Disk, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.disks[slot]
	return d, ok
}

func (f *fakeRDS) fileExists(path string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.files[path]
	return ok
}

func (f *fakeRDS) add(slot, path string, size int64, e *rds.Export, owns bool, matches func(rds.Disk) bool) (*rds.Disk, error) {
	if d, ok := f.disks[slot]; ok {
		if d.FilePath == path && matches(d) {
			return &d, nil
		}
		return nil, fmt.Errorf("%w: disk %q exists with file %s", rds.ErrAlreadyExists, slot, d.FilePath)
	}
	if _, ok := f.files[path]; ok {
		if !owns || f.usedBy(path) {
			return nil, fmt.Errorf("%w: file %s", rds.ErrAlreadyExists, path)
		}
		delete(f.files, path) // an orphan of an earlier attempt, as rds.Client reclaims it
	}
	if size > f.poolSize-f.used() {
		return nil, fmt.Errorf("%w: failure: not enough space", rds.ErrNoSpace)
	}
	d := rds.Disk{Slot: slot, Type: "file", FilePath: path, Size: size}
	if e != nil {
		d.Exported, d.Port, d.NQN = !e.Closed, e.Port, e.NQN
	}
	f.disks[slot] = d
	f.files[path] = size
	return &d, nil
}

func (f *fakeRDS) usedBy(path string) bool {
	for _, d := range f.disks {
		if d.FilePath == path {
			return true
		}
	}
	return false
}

func (f *fakeRDS) FilesWithPrefix(_ context.Context, prefix string) ([]rds.File, error) {
	err := f.enter("FilesWithPrefix")
	defer f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var out []rds.File
	for p, size := range f.files {
		if strings.HasPrefix(p, prefix) {
			out = append(out, rds.File{Name: strings.TrimPrefix(p, "/"), Type: ".img file", Size: size})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (f *fakeRDS) DiskUsingFile(_ context.Context, path string) (bool, error) {
	err := f.enter("DiskUsingFile")
	defer f.mu.Unlock()
	return err == nil && f.usedBy(path), err
}

func (f *fakeRDS) RemoveFile(_ context.Context, path string) error {
	err := f.enter("RemoveFile")
	defer f.mu.Unlock()
	if err == nil {
		delete(f.files, path)
	}
	return err
}

func sameExportFake(d rds.Disk, e *rds.Export) bool {
	if e == nil {
		return !d.Exported
	}
	return (d.Exported || e.Closed) && d.Port == e.Port && d.NQN == e.NQN
}

// SwapExport models rds.Client's: one compare-and-swap on the export
// state, evaluated when the call lands (after any hold), read back
// afterwards; turning an export off counts a drop. A held call therefore
// lands late exactly as a slow RouterOS command does; with delaySwap a
// call is answered as a timeout and its command lands later, or never
// (landLocked, loseLocked).
func (f *fakeRDS) SwapExport(_ context.Context, slot string, from, to rds.ExportState) (rds.ExportState, error) {
	err := f.enter("SwapExport")
	defer f.mu.Unlock()
	if err != nil {
		return rds.ExportState{}, err
	}
	after, _, err := f.swapCallLocked(slot, from, to, nil)
	return after, err
}

// SwapExportAuth models rds.Client's: SwapExport that also sets the
// password (a zero one clears it), returning the secret read back; a
// password set and no secret read back is an error.
func (f *fakeRDS) SwapExportAuth(_ context.Context, slot string, from, to rds.ExportState, pw rds.ExportPassword) (rds.ExportState, nvme.DHCHAPSecret, error) {
	err := f.enter("SwapExportAuth")
	defer f.mu.Unlock()
	if err != nil {
		return rds.ExportState{}, nvme.DHCHAPSecret{}, err
	}
	after, d, err := f.swapCallLocked(slot, from, to, &pw)
	if err != nil {
		return after, nvme.DHCHAPSecret{}, err
	}
	d = f.printedLocked(d)
	if to.Open && !pw.IsZero() && from != to && d.Secret.IsZero() {
		return after, nvme.DHCHAPSecret{}, fmt.Errorf("%w: disk %q prints no secret", rds.ErrBadOutput, slot)
	}
	return after, d.Secret, nil
}

func (f *fakeRDS) swapCallLocked(slot string, from, to rds.ExportState, pw *rds.ExportPassword) (rds.ExportState, rds.Disk, error) {
	if _, ok := f.disks[slot]; ok && from != to && f.delaySwap != nil {
		// rds.Client sends no command when from == to (a read back only).
		f.lateSeq++
		s := &lateSwap{id: f.lateSeq, slot: slot, from: from, to: to, changes: f.changes[slot], password: pw}
		if f.delaySwap(s) {
			f.inFlight = append(f.inFlight, s)
			return rds.ExportState{}, rds.Disk{}, fmt.Errorf("exporting disk %q: %s -> %s: %w: command timed out after it was sent: %v",
				slot, from, to, rds.ErrOutcomeUnknown, context.DeadlineExceeded)
		}
	}
	d, ok := f.disks[slot]
	if !ok {
		return rds.ExportState{}, rds.Disk{}, fmt.Errorf("%w: disk %q", rds.ErrNotFound, slot)
	}
	if from != to {
		f.swapLocked(slot, from, to, pw)
	}
	d = f.disks[slot]
	if after := rds.StateOf(&d); after != to {
		return after, d, fmt.Errorf("%w: disk %q is %s, not %s", rds.ErrExportChanged, slot, after, to)
	}
	return to, d, nil
}

// Retombstone models rds.Client's: a closed export gets the fresh closed
// state `to`, whatever its allowed host. (The fake always prints the
// allowed host, so storage fencing reaches it only through a test.)
func (f *fakeRDS) Retombstone(_ context.Context, slot string, to rds.ExportState) (rds.ExportState, error) {
	err := f.enter("Retombstone")
	defer f.mu.Unlock()
	if err != nil {
		return rds.ExportState{}, err
	}
	d, ok := f.disks[slot]
	if !ok {
		return rds.ExportState{}, fmt.Errorf("%w: disk %q", rds.ErrNotFound, slot)
	}
	if d.Exported {
		return rds.StateOf(&d), fmt.Errorf("%w: disk %q is open", rds.ErrExportChanged, slot)
	}
	f.swapLocked(slot, rds.StateOf(&d), to, nil)
	return to, nil
}

// swapLocked is the compare-and-swap of one SwapExport command landing
// now; it reports whether it matched.
func (f *fakeRDS) swapLocked(slot string, from, to rds.ExportState, pw *rds.ExportPassword) bool {
	d, ok := f.disks[slot]
	if !ok || rds.StateOf(&d) != from {
		return false
	}
	before := d
	if d.Exported && !to.Open {
		f.drops[slot]++
	}
	if pw != nil && !(f.keepPasswordOnHostChange && d.AllowHost != to.Host && !d.Secret.IsZero()) {
		d.Secret = f.secretLocked(*pw)
	}
	d.Exported, d.AllowHost = to.Open, to.Host
	f.disks[slot] = d
	if before != d {
		f.changes[slot]++
	}
	if f.onChange != nil && before != d {
		f.onChange(slot, before, d)
	}
	return true
}

// landLocked lands the command in flight s now (against the disk's state
// at this moment) and reports whether it matched; loseLocked drops it
// unlanded.
func (f *fakeRDS) landLocked(s *lateSwap) bool {
	f.loseLocked(s)
	return f.swapLocked(s.slot, s.from, s.to, s.password)
}

func (f *fakeRDS) loseLocked(s *lateSwap) {
	for i, x := range f.inFlight {
		if x == s {
			f.inFlight = append(f.inFlight[:i:i], f.inFlight[i+1:]...)
			return
		}
	}
}

func (f *fakeRDS) CreateDisk(_ context.Context, req rds.CreateDiskRequest) (*rds.Disk, error) {
	err := f.enter("CreateDisk")
	defer f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if err := rds.ValidateSlot(req.Slot); err != nil {
		return nil, err
	}
	size, err := rds.RoundUpSize(req.Size)
	if err != nil {
		return nil, err
	}
	return f.add(req.Slot, req.FilePath, size, req.Export, req.OwnsFilePath, func(d rds.Disk) bool {
		return d.Size >= size && sameExportFake(d, req.Export)
	})
}

func (f *fakeRDS) CopyDisk(_ context.Context, req rds.CopyDiskRequest) (*rds.Disk, error) {
	err := f.enter("CopyDisk")
	defer f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	src, ok := f.disks[req.SourceSlot]
	if !ok {
		return nil, fmt.Errorf("copy source %q: %w", req.SourceSlot, rds.ErrNotFound)
	}
	want := src.Size
	if req.Size > 0 {
		if want, err = rds.RoundUpSize(req.Size); err != nil {
			return nil, err
		}
		if want < src.Size {
			return nil, fmt.Errorf("%w: copy smaller than source", rds.ErrInvalidArgument)
		}
	}
	return f.add(req.Slot, req.FilePath, want, req.Export, false, func(d rds.Disk) bool { return sameExportFake(d, req.Export) })
}

func (f *fakeRDS) GetDisk(_ context.Context, slot string) (*rds.Disk, error) {
	err := f.enter("GetDisk")
	defer f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if err := rds.ValidateSlot(slot); err != nil {
		return nil, err
	}
	d, ok := f.disks[slot]
	if !ok {
		return nil, fmt.Errorf("%w: disk %q", rds.ErrNotFound, slot)
	}
	d = f.printedLocked(d)
	return &d, nil
}

func (f *fakeRDS) ListDisks(context.Context) ([]rds.Disk, error) {
	err := f.enter("ListDisks")
	defer f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	out := make([]rds.Disk, 0, len(f.disks))
	for _, d := range f.disks {
		out = append(out, f.printedLocked(d))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Slot < out[j].Slot })
	return out, nil
}

func (f *fakeRDS) ResizeDisk(_ context.Context, slot string, size int64) (*rds.Disk, error) {
	err := f.enter("ResizeDisk")
	defer f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	want, err := rds.RoundUpSize(size)
	if err != nil {
		return nil, err
	}
	d, ok := f.disks[slot]
	if !ok {
		return nil, fmt.Errorf("%w: disk %q", rds.ErrNotFound, slot)
	}
	if d.Size >= want {
		return &d, nil
	}
	if want-d.Size > f.poolSize-f.used() {
		return nil, fmt.Errorf("%w: failure: not enough space", rds.ErrNoSpace)
	}
	d.Size = want
	f.disks[slot] = d
	f.files[d.FilePath] = want
	return &d, nil
}

func (f *fakeRDS) DeleteDisk(_ context.Context, slot, filePath string) error {
	err := f.enter("DeleteDisk")
	defer f.mu.Unlock()
	if err != nil {
		return err
	}
	if d, ok := f.disks[slot]; ok {
		if d.FilePath != filePath {
			return fmt.Errorf("%w: disk %q uses %s, not %s; refusing to delete", rds.ErrInvalidArgument, slot, d.FilePath, filePath)
		}
		delete(f.disks, slot)
	}
	delete(f.files, filePath)
	return nil
}

func (f *fakeRDS) GetFile(_ context.Context, path string) (*rds.File, error) {
	err := f.enter("GetFile")
	defer f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	size, ok := f.files[path]
	if !ok {
		return nil, fmt.Errorf("%w: file %s", rds.ErrNotFound, path)
	}
	return &rds.File{Name: strings.TrimPrefix(path, "/"), Type: ".img file", Size: size}, nil
}

func (f *fakeRDS) Capacity(_ context.Context, pool string) (rds.Capacity, error) {
	err := f.enter("Capacity")
	defer f.mu.Unlock()
	if err != nil {
		return rds.Capacity{}, err
	}
	return rds.Capacity{Total: f.poolSize, Free: f.poolSize - f.used()}, nil
}

func (f *fakeRDS) Probe(context.Context) (*rds.SystemInfo, error) {
	err := f.enter("Probe")
	defer f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return &rds.SystemInfo{Version: "7.20.4 (stable)", BoardName: "RDS2216"}, nil
}

// callCount is how many calls of method arrived.
func (f *fakeRDS) callCount(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

// failSwapAfter makes the n-th SwapExport from now on fail as a command
// whose outcome is unknown (it never lands).
func failSwapAfter(f *fakeRDS, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	seen := 0
	f.atCall = func(method string) {
		if method != "SwapExport" {
			return
		}
		if seen++; seen == n {
			f.fail[method] = fmt.Errorf("exporting disk: %w: command timed out after it was sent", rds.ErrOutcomeUnknown)
		}
	}
}

// failGetDiskAt makes the n-th GetDisk from now on fail (an RDS that
// stopped answering).
func failGetDiskAt(f *fakeRDS, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	seen := 0
	f.atCall = func(method string) {
		if method != "GetDisk" {
			return
		}
		if seen++; seen == n {
			f.fail[method] = errors.New("ssh: the RDS stopped answering")
		}
	}
}
