package backends

import (
	"context"
	"fmt"

	"github.com/srvlab/rds-csi/pkg/nvme"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// RDS is a box's RouterOS client (rds.Client) as the controller uses it;
// its slots are the box's own.
type RDS interface {
	CreateDisk(ctx context.Context, req rds.CreateDiskRequest) (*rds.Disk, error)
	CopyDisk(ctx context.Context, req rds.CopyDiskRequest) (*rds.Disk, error)
	GetDisk(ctx context.Context, slot string) (*rds.Disk, error)
	ListDisks(ctx context.Context) ([]rds.Disk, error)
	ResizeDisk(ctx context.Context, slot string, size int64) (*rds.Disk, error)
	DeleteDisk(ctx context.Context, slot, filePath string) error
	GetFile(ctx context.Context, path string) (*rds.File, error)
	FilesWithPrefix(ctx context.Context, prefix string) ([]rds.File, error)
	DiskUsingFile(ctx context.Context, path string) (bool, error)
	RemoveFile(ctx context.Context, path string) error
	Capacity(ctx context.Context, pool string) (rds.Capacity, error)
	Probe(ctx context.Context) (*rds.SystemInfo, error)
	// Storage fencing (--storage-fencing=allow-host).
	// SwapExport changes the export from one state to another in one
	// conditional command (rds.Client.SwapExport).
	SwapExport(ctx context.Context, slot string, from, to rds.ExportState) (rds.ExportState, error)
	// SwapExportAuth is SwapExport that sets the export's password in the
	// same command and reads the secret back (rds.Client.SwapExportAuth;
	// --export-auth=dhchap).
	SwapExportAuth(ctx context.Context, slot string, from, to rds.ExportState, password rds.ExportPassword) (rds.ExportState, nvme.DHCHAPSecret, error)
	// Retombstone gives a closed export whose allowed host RouterOS does
	// not print a fresh one (rds.Client.Retombstone).
	Retombstone(ctx context.Context, slot string, to rds.ExportState) (rds.ExportState, error)
}

// View is one box's client as the rest of the driver speaks to it: in
// volume and snapshot IDs, not slots. Every ID it is given must name its
// box; every disk it returns carries its ID in Slot; every error names
// the box.
type View struct {
	name string
	def  bool
	rds  RDS
}

var _ RDS = (*View)(nil)

// NewView returns the view of box b through its client c.
func NewView(b *Backend, c RDS) *View { return &View{name: b.Name, def: b.Default, rds: c} }

// Name is the box's name.
func (v *View) Name() string { return v.name }

// Default reports whether the box is the default one.
func (v *View) Default() bool { return v.def }

// ID is the ID of a slot of this box.
func (v *View) ID(slot string) string { return JoinID(v.name, v.def, slot) }

// Slot is the slot on this box of an ID of it; an ID of another box is
// an error (a routing bug: never sent to this box).
func (v *View) Slot(id string) (string, error) {
	box, slot := SplitID(id)
	if (v.def && box == "") || (!v.def && box == v.name) {
		return slot, nil
	}
	return "", fmt.Errorf("%w: %q is not an ID of RDS %s", rds.ErrInvalidArgument, id, v.name)
}

// Owns reports whether id names this box.
func (v *View) Owns(id string) bool {
	_, err := v.Slot(id)
	return err == nil
}

func (v *View) fail(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("RDS %s: %w", v.name, err)
}

func (v *View) disk(d *rds.Disk, err error) (*rds.Disk, error) {
	if err != nil {
		return nil, v.fail(err)
	}
	c := *d
	c.Slot = v.ID(d.Slot)
	return &c, nil
}

func (v *View) CreateDisk(ctx context.Context, req rds.CreateDiskRequest) (*rds.Disk, error) {
	slot, err := v.Slot(req.Slot)
	if err != nil {
		return nil, err
	}
	req.Slot = slot
	return v.disk(v.rds.CreateDisk(ctx, req))
}

func (v *View) CopyDisk(ctx context.Context, req rds.CopyDiskRequest) (*rds.Disk, error) {
	slot, err := v.Slot(req.Slot)
	if err != nil {
		return nil, err
	}
	src, err := v.Slot(req.SourceSlot)
	if err != nil {
		return nil, fmt.Errorf("%w: a copy stays on its source's RDS", err)
	}
	req.Slot, req.SourceSlot = slot, src
	return v.disk(v.rds.CopyDisk(ctx, req))
}

func (v *View) GetDisk(ctx context.Context, id string) (*rds.Disk, error) {
	slot, err := v.Slot(id)
	if err != nil {
		return nil, err
	}
	return v.disk(v.rds.GetDisk(ctx, slot))
}

func (v *View) ListDisks(ctx context.Context) ([]rds.Disk, error) {
	disks, err := v.rds.ListDisks(ctx)
	if err != nil {
		return nil, v.fail(err)
	}
	for i := range disks {
		disks[i].Slot = v.ID(disks[i].Slot)
	}
	return disks, nil
}

func (v *View) ResizeDisk(ctx context.Context, id string, size int64) (*rds.Disk, error) {
	slot, err := v.Slot(id)
	if err != nil {
		return nil, err
	}
	return v.disk(v.rds.ResizeDisk(ctx, slot, size))
}

func (v *View) DeleteDisk(ctx context.Context, id, filePath string) error {
	slot, err := v.Slot(id)
	if err != nil {
		return err
	}
	return v.fail(v.rds.DeleteDisk(ctx, slot, filePath))
}

func (v *View) GetFile(ctx context.Context, path string) (*rds.File, error) {
	f, err := v.rds.GetFile(ctx, path)
	return f, v.fail(err)
}

func (v *View) FilesWithPrefix(ctx context.Context, prefix string) ([]rds.File, error) {
	fs, err := v.rds.FilesWithPrefix(ctx, prefix)
	return fs, v.fail(err)
}

func (v *View) DiskUsingFile(ctx context.Context, path string) (bool, error) {
	used, err := v.rds.DiskUsingFile(ctx, path)
	return used, v.fail(err)
}

func (v *View) RemoveFile(ctx context.Context, path string) error {
	return v.fail(v.rds.RemoveFile(ctx, path))
}

func (v *View) Capacity(ctx context.Context, pool string) (rds.Capacity, error) {
	c, err := v.rds.Capacity(ctx, pool)
	return c, v.fail(err)
}

func (v *View) Probe(ctx context.Context) (*rds.SystemInfo, error) {
	i, err := v.rds.Probe(ctx)
	return i, v.fail(err)
}

func (v *View) SwapExport(ctx context.Context, id string, from, to rds.ExportState) (rds.ExportState, error) {
	slot, err := v.Slot(id)
	if err != nil {
		return rds.ExportState{}, err
	}
	s, err := v.rds.SwapExport(ctx, slot, from, to)
	return s, v.fail(err)
}

func (v *View) SwapExportAuth(ctx context.Context, id string, from, to rds.ExportState, password rds.ExportPassword) (rds.ExportState, nvme.DHCHAPSecret, error) {
	slot, err := v.Slot(id)
	if err != nil {
		return rds.ExportState{}, nvme.DHCHAPSecret{}, err
	}
	s, sec, err := v.rds.SwapExportAuth(ctx, slot, from, to, password)
	return s, sec, v.fail(err)
}

func (v *View) Retombstone(ctx context.Context, id string, to rds.ExportState) (rds.ExportState, error) {
	slot, err := v.Slot(id)
	if err != nil {
		return rds.ExportState{}, err
	}
	s, err := v.rds.Retombstone(ctx, slot, to)
	return s, v.fail(err)
}
