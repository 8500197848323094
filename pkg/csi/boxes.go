package csi

import (
	"fmt"
	"path"

	"google.golang.org/grpc/codes"

	"github.com/srvlab/rds-csi/pkg/backends"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// Box is one RDS the driver serves (pkg/backends): its configuration and,
// on the controller, its own RouterOS client, whose slots are the box's
// own; nil on a node, which never talks to an RDS.
type Box struct {
	backends.Backend
	RDS RDS
	// Health is the box's last known reachability (nil: always
	// reachable): a box that is down is passed over by CreateVolume and
	// GetCapacity without waiting on it; its own volumes' calls still go
	// to it, and fail there.
	Health func() error
}

// box is a Box as the services use it: its client as a view that speaks
// volume and snapshot IDs (backends.View).
type rdsBox struct {
	backends.Backend
	view   *backends.View // nil on a node
	health func() error
}

// id is the ID of a slot of this box.
func (b *rdsBox) id(slot string) string { return backends.JoinID(b.Name, b.Default, slot) }

// owns reports whether id names this box.
func (b *rdsBox) owns(id string) bool {
	name, _ := backends.SplitID(id)
	return (b.Default && name == "") || (!b.Default && name == b.Name)
}

func (b *rdsBox) up() error {
	if b.health == nil {
		return nil
	}
	return b.health()
}

// filePath is the backing file of volume id on this box.
func (b *rdsBox) filePath(id string) string {
	_, slot := backends.SplitID(id)
	return rds.VolumeFilePath(b.VolumePath, slot)
}

// snapshotDir is where this box keeps snapshot files.
func (b *rdsBox) snapshotDir() string { return path.Join(b.VolumePath, snapshotDir) }

// nvmeAddress is where nodes connect to this box's volumes.
func (b *rdsBox) nvmeAddress() string {
	if b.NVMeAddress != "" {
		return b.NVMeAddress
	}
	return b.Address
}

// isVolumeDisk reports whether a disk of this box (its Slot an ID, as the
// view returns it) is one of this driver's volumes: its slot a volume ID
// and its file that volume's file. Snapshots, foreign disks and disks of
// another volume path are not.
func (b *rdsBox) isVolumeDisk(d *rds.Disk) bool {
	return isVolumeID(d.Slot) && b.owns(d.Slot) && d.FilePath == b.filePath(d.Slot)
}

// boxOf is the box an ID names. An ID of a box this driver is not
// configured with is FAILED_PRECONDITION, never another box's: the box
// may be missing from --rds-config only for now.
func (d *Driver) boxOf(id string) (*rdsBox, error) {
	name, _ := backends.SplitID(id)
	if name == "" {
		return d.boxes[0], nil
	}
	if b := d.byName[name]; b != nil && !b.Default {
		return b, nil
	}
	return nil, statusf(codes.FailedPrecondition, "%q names RDS %q, which this driver is not configured with: add it to --rds-config (docs/deploy.md), or delete the object that names it", id, name)
}

// boxNamed is the box of that name (nil: none).
func (d *Driver) boxNamed(name string) *rdsBox { return d.byName[name] }

// defaultBox is the box of the --rds-* flags.
func (d *Driver) defaultBox() *rdsBox { return d.boxes[0] }

// Backends are the boxes' configurations, the default first.
func (d *Driver) Backends() []backends.Backend {
	out := make([]backends.Backend, len(d.boxes))
	for i, b := range d.boxes {
		out[i] = b.Backend
	}
	return out
}

func newBoxes(boxes []Box) ([]*rdsBox, map[string]*rdsBox, error) {
	if len(boxes) == 0 || !boxes[0].Default {
		return nil, nil, fmt.Errorf("csi: the default RDS comes first")
	}
	var out []*rdsBox
	byName := map[string]*rdsBox{}
	for i := range boxes {
		b := &rdsBox{Backend: boxes[i].Backend, health: boxes[i].Health}
		if boxes[i].RDS != nil {
			b.view = backends.NewView(&b.Backend, boxes[i].RDS)
		}
		if _, dup := byName[b.Name]; dup {
			return nil, nil, fmt.Errorf("csi: two RDS named %q", b.Name)
		}
		byName[b.Name] = b
		out = append(out, b)
	}
	return out, byName, nil
}

// IsVolumeDiskOf reports, for box b, whether a disk its view returned
// (its Slot an ID) is one of this driver's volumes on b: what b's own
// export reconcile changes, and nothing else.
func IsVolumeDiskOf(b backends.Backend) func(*rds.Disk) bool {
	rb := &rdsBox{Backend: b}
	return rb.isVolumeDisk
}

// IsVolumeIDOf reports whether id is a volume ID of box b.
func IsVolumeIDOf(b backends.Backend) func(string) bool {
	rb := &rdsBox{Backend: b}
	return func(id string) bool { return isVolumeID(id) && rb.owns(id) }
}
