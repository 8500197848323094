package csi

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/srvlab/rds-csi/pkg/backends"
	"github.com/srvlab/rds-csi/pkg/informers"
	"github.com/srvlab/rds-csi/pkg/nvme"
	"github.com/srvlab/rds-csi/pkg/rds"
	"github.com/srvlab/rds-csi/pkg/storagefence"
)

// The publish model check on two RDS boxes (issue 36): volumes 0 and 1 on
// the default box, 2 and 3 on rack-b, each box reached through its own
// view and router as the controller runs them, over one fake RDS (rack-b's
// disks under "rack-b-<slot>" there, so the checker follows every export
// as before, by volume ID: fakeSlot, idOfSlot). Now and then rack-b stalls for up to 30 steps: a read in two
// fails as a timeout, every export change times out and lands late, after
// the stall (or is lost). The checker holds the same invariants on both
// boxes at every step; and the default box's volumes must keep being
// published while rack-b stalls.

const modelBoxB = "rack-b"

// boxAdapter is one box's client over the model's fake RDS: its slots
// are the fake's IDs without the box's prefix.
type boxAdapter struct {
	m      *model
	prefix string // "" for the default box, "rack-b-" for rack-b
}

var _ RDS = (*boxAdapter)(nil)

func (a *boxAdapter) in(slot string) string { return a.prefix + slot }

func (a *boxAdapter) out(d *rds.Disk, err error) (*rds.Disk, error) {
	if err != nil {
		return nil, err
	}
	c := *d
	c.Slot = strings.TrimPrefix(c.Slot, a.prefix)
	return &c, nil
}

// stalled is a read that timed out (rack-b, during its stall: one read
// in two, so that some export changes are still sent, to time out).
func (a *boxAdapter) stalled() error {
	if a.prefix != "" && a.m.boxes && a.m.step < a.m.stalledUntil && a.m.rng.Intn(2) == 0 {
		a.m.stats["rack-b read timed out (stalled)"]++
		return fmt.Errorf("%w: injected: rack-b does not answer: command timed out", rds.ErrTransient)
	}
	return nil
}

func (a *boxAdapter) CreateDisk(ctx context.Context, req rds.CreateDiskRequest) (*rds.Disk, error) {
	req.Slot = a.in(req.Slot)
	return a.out(a.m.rds.CreateDisk(ctx, req))
}

func (a *boxAdapter) CopyDisk(ctx context.Context, req rds.CopyDiskRequest) (*rds.Disk, error) {
	req.Slot, req.SourceSlot = a.in(req.Slot), a.in(req.SourceSlot)
	return a.out(a.m.rds.CopyDisk(ctx, req))
}

func (a *boxAdapter) GetDisk(ctx context.Context, slot string) (*rds.Disk, error) {
	if err := a.stalled(); err != nil {
		return nil, err
	}
	return a.out(a.m.rds.GetDisk(ctx, a.in(slot)))
}

func (a *boxAdapter) ListDisks(ctx context.Context) ([]rds.Disk, error) {
	if err := a.stalled(); err != nil {
		return nil, err
	}
	all, err := a.m.rds.ListDisks(ctx)
	if err != nil {
		return nil, err
	}
	var out []rds.Disk
	for _, d := range all {
		ofB := strings.HasPrefix(d.Slot, modelBoxB+"-")
		if (a.prefix == "") != ofB {
			d.Slot = strings.TrimPrefix(d.Slot, a.prefix)
			out = append(out, d)
		}
	}
	return out, nil
}

func (a *boxAdapter) ResizeDisk(ctx context.Context, slot string, size int64) (*rds.Disk, error) {
	return a.out(a.m.rds.ResizeDisk(ctx, a.in(slot), size))
}

func (a *boxAdapter) DeleteDisk(ctx context.Context, slot, filePath string) error {
	return a.m.rds.DeleteDisk(ctx, a.in(slot), filePath)
}

func (a *boxAdapter) GetFile(ctx context.Context, path string) (*rds.File, error) {
	return a.m.rds.GetFile(ctx, path)
}

func (a *boxAdapter) FilesWithPrefix(ctx context.Context, prefix string) ([]rds.File, error) {
	return a.m.rds.FilesWithPrefix(ctx, prefix)
}

func (a *boxAdapter) DiskUsingFile(ctx context.Context, path string) (bool, error) {
	return a.m.rds.DiskUsingFile(ctx, path)
}

func (a *boxAdapter) RemoveFile(ctx context.Context, path string) error {
	return a.m.rds.RemoveFile(ctx, path)
}

func (a *boxAdapter) Capacity(ctx context.Context, pool string) (rds.Capacity, error) {
	if err := a.stalled(); err != nil {
		return rds.Capacity{}, err
	}
	return a.m.rds.Capacity(ctx, pool)
}

func (a *boxAdapter) Probe(ctx context.Context) (*rds.SystemInfo, error) {
	if err := a.stalled(); err != nil {
		return nil, err
	}
	return a.m.rds.Probe(ctx)
}

// The export changes go to the fake, which asks the model's delaySwap:
// during rack-b's stall every one of rack-b's times out (stalledSwap).
func (a *boxAdapter) SwapExport(ctx context.Context, slot string, from, to rds.ExportState) (rds.ExportState, error) {
	return a.m.rds.SwapExport(ctx, a.in(slot), from, to)
}

func (a *boxAdapter) SwapExportAuth(ctx context.Context, slot string, from, to rds.ExportState, pw rds.ExportPassword) (rds.ExportState, nvme.DHCHAPSecret, error) {
	return a.m.rds.SwapExportAuth(ctx, a.in(slot), from, to, pw)
}

func (a *boxAdapter) Retombstone(ctx context.Context, slot string, to rds.ExportState) (rds.ExportState, error) {
	if err := a.stalled(); err != nil {
		return rds.ExportState{}, err
	}
	return a.m.rds.Retombstone(ctx, a.in(slot), to)
}

// boxesDriver is a replica's driver on the default box and rack-b.
func (m *model) boxesDriver(opts Options) *Driver {
	def := opts.DefaultBackend()
	b := def
	b.Default, b.Name, b.Address, b.NVMeAddress, b.NVMePort = false, modelBoxB, "10.0.1.5", "10.0.3.5", 4421
	d, err := NewDriverBoxes(opts, []Box{{Backend: def, RDS: &boxAdapter{m: m}}, {Backend: b, RDS: &boxAdapter{m: m, prefix: modelBoxB + "-"}}})
	if err != nil {
		m.t.Fatal(err)
	}
	return d
}

// boxIndex is the index as one box's reconcile reads it.
type boxIndex struct {
	*informers.AttachmentIndex
	owns func(string) bool
}

func (b boxIndex) Retiring() []*informers.Volume {
	var out []*informers.Volume
	for _, v := range b.AttachmentIndex.Retiring() {
		if b.owns(v.Handle) {
			out = append(out, v)
		}
	}
	return out
}

// boxFences are the protocol on each box alone (the reconcile's).
func (m *model) boxFences(d *Driver, cfg storagefence.Config, index *informers.AttachmentIndex) []*storagefence.Fence {
	var out []*storagefence.Fence
	for i, b := range d.Backends() {
		c := cfg
		c.RDS = d.boxes[i].view
		c.IsVolumeID, c.IsVolumeDisk = IsVolumeIDOf(b), IsVolumeDiskOf(b)
		c.Index = boxIndex{AttachmentIndex: index, owns: c.IsVolumeID}
		f, err := storagefence.New(c)
		if err != nil {
			m.t.Fatal(err)
		}
		out = append(out, f)
	}
	return out
}

// reconcileBoxes is the leader's reconcile, box by box: a stalled box
// fails its own pass.
func (m *model) reconcileBoxes(rep *modelReplica, report func(storagefence.Mismatch)) (int, error) {
	fixed := 0
	var errs []error
	for _, f := range rep.boxFences {
		n, err := f.Reconcile(m.ctx, report)
		fixed += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	return fixed, errors.Join(errs...)
}

// fakeSlot is the fake RDS's slot of a volume ID; idOfSlot its inverse.
func (m *model) fakeSlot(id string) string {
	if box, slot := backends.SplitID(id); box != "" {
		return box + "-" + slot
	}
	return id
}

func (m *model) idOfSlot(slot string) string {
	if rest, ok := strings.CutPrefix(slot, modelBoxB+"-"); ok && m.boxes {
		return modelBoxB + "/" + rest
	}
	return slot
}

// stalls reports whether a volume ID is rack-b's while it stalls.
func (m *model) stalls(id string) bool {
	return m.boxes && m.step < m.stalledUntil && strings.HasPrefix(id, modelBoxB+"/")
}

// stalledSwap: rack-b's export change times out; it lands (or is lost)
// after the stall.
func (m *model) stalledSwap(s *lateSwap) bool {
	s.due = m.stalledUntil + m.rng.Intn(5)
	s.lost = m.rng.Intn(5) == 0
	m.stats["rack-b swap timed out (stalled)"]++
	m.logf("RDS rack-b stalls: swap #%d of %s %s -> %s in flight until step %d (lost: %t)", s.id, s.slot[len(s.slot)-3:], stateLabel(s.from), stateLabel(s.to), s.due, s.lost)
	return true
}

// maybeStall starts a stall of rack-b now and then.
func (m *model) maybeStall() {
	if m.lateOff || m.step < m.stalledUntil || m.rng.Intn(40) != 0 {
		return
	}
	m.stalledUntil = m.step + 1 + m.rng.Intn(30)
	m.stats["rack-b stalls"]++
	m.logf("RDS rack-b stalls until step %d", m.stalledUntil)
}

// countBoxPublish counts publishes by box and by whether rack-b stalls.
func (m *model) countBoxPublish(v *modelVolume, err error) {
	box, _ := backends.SplitID(v.id)
	if box == "" {
		box = testRDSName
	}
	state := "answering"
	if m.step < m.stalledUntil {
		state = "stalled"
	}
	m.stats[fmt.Sprintf("publish on %s while rack-b %s: %s", box, state, codeOf(err))]++
}

func TestPublishModelFollowsTwoBoxesOneStalling(t *testing.T) {
	totals := runModelConfig(t, modelConfig{fenced: true, boxes: true})
	for _, want := range []string{
		"rack-b stalls", "rack-b swap timed out (stalled)", "rack-b read timed out (stalled)",
		// The default box's volumes go on while rack-b stalls.
		"publish on " + testRDSName + " while rack-b stalled: OK",
		"publish on rack-b while rack-b answering: OK",
	} {
		if totals[want] == 0 {
			t.Errorf("the run never had %q: %v", want, totals)
		}
	}
}
