package csi

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/srvlab/rds-csi/pkg/nvme"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// RDS is what the controller needs from the RouterOS client.
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

// ReadinessCheck reports why the driver cannot serve yet (nil: ready).
type ReadinessCheck func(ctx context.Context) error

// Driver holds what the CSI services share. It is built once in main.
type Driver struct {
	opts      Options
	rds       RDS
	readiness []ReadinessCheck
}

// NewDriver returns a driver for validated options. rds may be nil in node
// mode. Probe passes once the RDS answers and every check of ready passes
// (for example: the attachment index's informers have synced).
func NewDriver(opts Options, client RDS, ready ...ReadinessCheck) *Driver {
	d := &Driver{opts: opts, rds: client}
	if client != nil {
		d.readiness = append(d.readiness, func(ctx context.Context) error {
			_, err := client.Probe(ctx)
			return err
		})
	}
	d.readiness = append(d.readiness, ready...)
	return d
}

// Ready runs every readiness check.
func (d *Driver) Ready(ctx context.Context) error {
	for _, c := range d.readiness {
		if err := c(ctx); err != nil {
			return err
		}
	}
	return nil
}

// TopologyKey is the topology segment naming the RDS a volume lives on and
// the RDS a node can reach.
func (d *Driver) TopologyKey() string { return "topology." + d.opts.DriverName + "/rds" }

func (d *Driver) controllerEnabled() bool { return d.opts.Mode != ModeNode }

// topology is where this driver's volumes are accessible from: nodes that
// reach this RDS.
func (d *Driver) topology() *csi.Topology {
	return &csi.Topology{Segments: map[string]string{d.TopologyKey(): d.opts.RDSName}}
}

// topologyAllowed reports whether volumes on this RDS satisfy a request's
// requisite topologies (preferred ones are only hints). A requisite segment
// is satisfied when it names this RDS under TopologyKey.
func (d *Driver) topologyAllowed(req *csi.TopologyRequirement) bool {
	if len(req.GetRequisite()) == 0 {
		return true
	}
	for _, t := range req.GetRequisite() {
		if t.GetSegments()[d.TopologyKey()] == d.opts.RDSName {
			return true
		}
	}
	return false
}
