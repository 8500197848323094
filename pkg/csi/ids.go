package csi

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/srvlab/rds-csi/pkg/backends"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// Volume and snapshot IDs are derived from the CO's names, so a retried
// Create finds what an earlier attempt made without any state in the
// driver. The ID is also the RouterOS disk slot, so it must pass
// rds.ValidateSlot. Names the Kubernetes sidecars generate
// (pvc-<uuid>, snapshot-<uuid>) stay readable on the RDS; any other name
// is hashed. The two ID families never overlap, and neither contains '.',
// which the snapshot file name relies on.
const (
	hashedVolumePrefix = "vol-"
	snapshotPrefix     = "snap-"
	hashedIDHexLen     = 32

	// snapshotDir is where snapshot backing files live, under the volume
	// path. Volumes live directly in the volume path, so the two never mix.
	snapshotDir = rds.SnapshotDir
	// Markers in a snapshot's file name; see snapshotFileName.
	srcMarker  = ".src-"
	timeMarker = ".t-"
	imgSuffix  = ".img"
)

const uuidRE = `[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`

var (
	pvcNameRE      = regexp.MustCompile(`^pvc-` + uuidRE + `$`)
	snapshotNameRE = regexp.MustCompile(`^snapshot-(` + uuidRE + `)$`)
	volumeIDRE     = regexp.MustCompile(`^(pvc-` + uuidRE + `|vol-[0-9a-f]{32})$`)
	snapshotIDRE   = regexp.MustCompile(`^snap-(` + uuidRE + `|[0-9a-f]{32})$`)
)

// VolumeIDFromName maps a CreateVolume name to the volume ID (and RDS slot).
func VolumeIDFromName(name string) string {
	if pvcNameRE.MatchString(name) {
		return name
	}
	return hashedVolumePrefix + hashHex(name)
}

// SnapshotIDFromName maps a CreateSnapshot name to the snapshot ID.
func SnapshotIDFromName(name string) string {
	if m := snapshotNameRE.FindStringSubmatch(name); m != nil {
		return snapshotPrefix + m[1]
	}
	return snapshotPrefix + hashHex(name)
}

func hashHex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:hashedIDHexLen]
}

// IsVolumeID reports whether id is a volume ID this driver could have
// made (what storage fencing may change the export of), on any box.
func IsVolumeID(id string) bool { return isVolumeID(id) }

// IsVolumeDisk reports whether a disk of the default box (its slot as
// RouterOS prints it) is one of the volumes of a driver with these
// options.
func (o *Options) IsVolumeDisk(disk *rds.Disk) bool {
	return isVolumeID(disk.Slot) && disk.FilePath == rds.VolumeFilePath(o.VolumePath, disk.Slot)
}

// IsVolumeDisk reports whether a disk a box's view returned (its Slot an
// ID) is one of this driver's volumes on that box.
func (d *Driver) IsVolumeDisk(disk *rds.Disk) bool {
	b, err := d.boxOf(disk.Slot)
	return err == nil && b.view != nil && b.isVolumeDisk(disk)
}

// isVolumeID reports whether id is a volume ID this driver could have
// made: a volume slot, alone (the default box's) or after the name of
// another box (backends.JoinID).
func isVolumeID(id string) bool {
	box, slot := backends.SplitID(id)
	return backends.ValidIDBox(box) && volumeIDRE.MatchString(slot) && rds.ValidateSlot(slot) == nil
}

// isSnapshotID reports whether id is a snapshot ID this driver could have
// made, on any box.
func isSnapshotID(id string) bool {
	box, slot := backends.SplitID(id)
	return backends.ValidIDBox(box) && snapshotIDRE.MatchString(slot) && rds.ValidateSlot(slot) == nil
}

// nqn is the NVMe qualified name a volume is exported under: the prefix
// and its slot on its box (slots are made from the CO's unique names, so
// no two boxes export one), derived from the ID alone, as a node does.
func (d *Driver) nqn(volumeID string) string {
	_, slot := backends.SplitID(volumeID)
	return d.opts.NQNPrefix + slot
}

// snapshotMeta is what a snapshot's file name records. RouterOS keeps no
// source or creation time for a copied disk, so the driver writes both into
// the backing file name in the same /disk add that creates the copy: the
// metadata exists exactly when the snapshot does, survives driver restarts
// and is visible to an operator in /disk print (file-path=).
type snapshotMeta struct {
	SnapshotID     string
	SourceVolumeID string
	CreatedAt      time.Time
}

// snapshotFilePath names a snapshot's backing file on its box b, with
// the IDs' slots on b:
// <volume-path>/snapshots/<snapshot-id>.src-<volume-id>.t-<unix-nanoseconds>.img
func (b *rdsBox) snapshotFilePath(m snapshotMeta) string {
	_, snap := backends.SplitID(m.SnapshotID)
	_, src := backends.SplitID(m.SourceVolumeID)
	name := snap + srcMarker + src + timeMarker + strconv.FormatInt(m.CreatedAt.UnixNano(), 10) + imgSuffix
	return path.Join(b.snapshotDir(), name)
}

// parseSnapshotDisk reads the metadata of a snapshot disk of b (its Slot
// an ID, as the view returns it), the IDs in it b's. It fails for any
// disk that is not one of this driver's snapshots under b's volume path.
func (b *rdsBox) parseSnapshotDisk(disk *rds.Disk) (snapshotMeta, error) {
	dir, base := path.Split(disk.FilePath)
	if path.Clean(dir) != b.snapshotDir() {
		return snapshotMeta{}, fmt.Errorf("file %s is not in %s", disk.FilePath, b.snapshotDir())
	}
	m, err := parseSnapshotFileName(base)
	if err != nil {
		return snapshotMeta{}, err
	}
	m = b.qualify(m)
	if m.SnapshotID != disk.Slot {
		return snapshotMeta{}, fmt.Errorf("file %s names snapshot %s, but the disk's slot is %s", disk.FilePath, m.SnapshotID, disk.Slot)
	}
	return m, nil
}

// qualify turns the slots of a snapshot file name into IDs of b.
func (b *rdsBox) qualify(m snapshotMeta) snapshotMeta {
	m.SnapshotID, m.SourceVolumeID = b.id(m.SnapshotID), b.id(m.SourceVolumeID)
	return m
}

// snapshotFilePath is the default box's (rdsBox.snapshotFilePath).
func (d *Driver) snapshotFilePath(m snapshotMeta) string { return d.defaultBox().snapshotFilePath(m) }

// parseSnapshotDisk is rdsBox.parseSnapshotDisk on the box of the disk.
func (d *Driver) parseSnapshotDisk(disk *rds.Disk) (snapshotMeta, error) {
	b, err := d.boxOf(disk.Slot)
	if err != nil {
		return snapshotMeta{}, err
	}
	return b.parseSnapshotDisk(disk)
}

// volumeFilePath is the backing file of volume id on its box.
func (d *Driver) volumeFilePath(id string) string {
	b, err := d.boxOf(id)
	if err != nil {
		return ""
	}
	return b.filePath(id)
}

// parseSnapshotFileName parses the base name written by snapshotFilePath.
// IDs contain no '.', so the markers are unambiguous.
func parseSnapshotFileName(base string) (snapshotMeta, error) {
	bad := func(why string) (snapshotMeta, error) {
		return snapshotMeta{}, fmt.Errorf("%q is not a snapshot file name (%s)", base, why)
	}
	rest, ok := strings.CutSuffix(base, imgSuffix)
	if !ok {
		return bad("no " + imgSuffix + " suffix")
	}
	snapID, rest, ok := strings.Cut(rest, srcMarker)
	if !ok {
		return bad("no " + srcMarker + " marker")
	}
	volID, nanos, ok := strings.Cut(rest, timeMarker)
	if !ok {
		return bad("no " + timeMarker + " marker")
	}
	if !isSnapshotID(snapID) {
		return bad("bad snapshot ID")
	}
	if !isVolumeID(volID) {
		return bad("bad source volume ID")
	}
	n, err := strconv.ParseInt(nanos, 10, 64)
	if err != nil || n <= 0 || strconv.FormatInt(n, 10) != nanos {
		return bad("bad creation time")
	}
	return snapshotMeta{SnapshotID: snapID, SourceVolumeID: volID, CreatedAt: time.Unix(0, n).UTC()}, nil
}
