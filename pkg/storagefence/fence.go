package storagefence

import (
	"context"
	"errors"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/informers"
	"github.com/srvlab/rds-csi/pkg/nvme"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// RDS is what the protocol needs of the RouterOS client (rds.Client).
type RDS interface {
	GetDisk(ctx context.Context, slot string) (*rds.Disk, error)
	ListDisks(ctx context.Context) ([]rds.Disk, error)
	// SwapExport changes the export from one state to another in one
	// conditional command.
	SwapExport(ctx context.Context, slot string, from, to rds.ExportState) (rds.ExportState, error)
	// SwapExportAuth is SwapExport that sets the export's password in the
	// same command and reads the secret back.
	SwapExportAuth(ctx context.Context, slot string, from, to rds.ExportState, password rds.ExportPassword) (rds.ExportState, nvme.DHCHAPSecret, error)
	// Retombstone gives a closed export whose allowed host RouterOS does
	// not print a fresh one.
	Retombstone(ctx context.Context, slot string, to rds.ExportState) (rds.ExportState, error)
}

// Index is the attachment index as the protocol reads it (no API call).
type Index interface {
	Volume(handle string) *informers.Volume
	// Retiring lists the entries with released attachments whose export
	// change after the release is not known to be made.
	Retiring() []*informers.Volume
}

// Nodes reads a node from the API server, timed on this controller's
// clock (fencing.Liveness): what a fence of its claim, and the
// confirmation of a commit, stand on.
type Nodes interface {
	LiveNode(ctx context.Context, name string) (fencing.NodeState, error)
}

// Config is everything a Fence is built with.
type Config struct {
	// StorageFencing: the export follows the claims
	// (--storage-fencing=allow-host). Without it the protocol keeps the
	// claims alone and never touches an export.
	StorageFencing bool
	// ExportAuth: every attachment's export gets its own password
	// (--export-auth=dhchap; needs StorageFencing).
	ExportAuth bool
	// AttachmentKey derives attachments' host NQNs, parks and passwords
	// (LoadAttachmentKey). Required with StorageFencing.
	AttachmentKey []byte
	RDS           RDS
	Store         *claims.Store
	Index         Index
	Nodes         Nodes
	// IsVolumeID and IsVolumeDisk tell this driver's volumes: only they
	// are changed or reconciled.
	IsVolumeID   func(id string) bool
	IsVolumeDisk func(d *rds.Disk) bool
	// Reporter gets the fences and mismatches (may be nil).
	Reporter *fencing.Reporter
}

// Fence is the storage-fence protocol of one controller replica: Commit,
// Release and Reconcile are the only ways a claim is made or released
// and an export changed.
type Fence struct {
	fencing      bool
	auth         bool
	key          []byte
	rds          RDS
	store        *claims.Store
	index        Index
	nodes        Nodes
	isVolumeID   func(string) bool
	isVolumeDisk func(*rds.Disk) bool
	reporter     *fencing.Reporter
}

// New returns the protocol for cfg.
func New(cfg Config) (*Fence, error) {
	switch {
	case cfg.Store == nil || cfg.Index == nil || cfg.Nodes == nil:
		return nil, errors.New("storagefence: a claim store, an index and live node reads are required")
	case cfg.StorageFencing && (cfg.RDS == nil || len(cfg.AttachmentKey) < minAttachmentKey || cfg.IsVolumeID == nil || cfg.IsVolumeDisk == nil):
		return nil, errors.New("storagefence: storage fencing needs the RDS, an attachment key and the volume checks")
	case cfg.ExportAuth && !cfg.StorageFencing:
		return nil, errors.New("storagefence: authenticated exports need storage fencing")
	}
	return &Fence{
		fencing: cfg.StorageFencing, auth: cfg.ExportAuth, key: cfg.AttachmentKey, rds: cfg.RDS, store: cfg.Store,
		index: cfg.Index, nodes: cfg.Nodes, isVolumeID: cfg.IsVolumeID, isVolumeDisk: cfg.IsVolumeDisk,
		reporter: cfg.Reporter,
	}, nil
}

// StorageFencing reports whether the export follows the claims.
func (f *Fence) StorageFencing() bool { return f.fencing }

// LiveState reads a PV's claims and retiring attachments from the API
// server (none for a PV of another handle).
func (f *Fence) LiveState(ctx context.Context, pvName, handle string) (map[string]claims.Claim, []claims.Retiring, error) {
	return f.store.LiveState(ctx, pvName, handle)
}

// KeepsClaim reads whether a live, non-deleting VolumeAttachment of handle
// on node stands (its PV gone or not): an unpublish then releases nothing.
func (f *Fence) KeepsClaim(ctx context.Context, handle, node string, pvs []string) (bool, error) {
	return f.store.KeepsClaim(ctx, handle, node, pvs)
}
