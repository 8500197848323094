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
// made (what storage fencing may change the export of).
func IsVolumeID(id string) bool { return isVolumeID(id) }

// IsVolumeDisk reports whether a disk is one of the volumes of a driver
// with these options (Driver.isVolumeDisk).
func (o *Options) IsVolumeDisk(disk *rds.Disk) bool {
	return isVolumeID(disk.Slot) && disk.FilePath == rds.VolumeFilePath(o.VolumePath, disk.Slot)
}

// isVolumeID reports whether id is a volume ID this driver could have made.
func isVolumeID(id string) bool {
	return volumeIDRE.MatchString(id) && rds.ValidateSlot(id) == nil
}

// isSnapshotID reports whether id is a snapshot ID this driver could have made.
func isSnapshotID(id string) bool {
	return snapshotIDRE.MatchString(id) && rds.ValidateSlot(id) == nil
}

// volumeFilePath is the backing file of a volume.
func (d *Driver) volumeFilePath(volumeID string) string {
	return rds.VolumeFilePath(d.opts.VolumePath, volumeID)
}

// nqn is the NVMe qualified name a volume is exported under.
func (d *Driver) nqn(volumeID string) string { return d.opts.NQNPrefix + volumeID }

// isVolumeDisk reports whether a disk is one of this driver's volumes: its
// slot is a volume ID and its file is that volume's file. Snapshots,
// foreign disks and disks of another --rds-volume-path are not.
func (d *Driver) isVolumeDisk(disk *rds.Disk) bool { return d.opts.IsVolumeDisk(disk) }

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

// snapshotFilePath names a snapshot's backing file:
// <volume-path>/snapshots/<snapshot-id>.src-<volume-id>.t-<unix-nanoseconds>.img
func (d *Driver) snapshotFilePath(m snapshotMeta) string {
	name := m.SnapshotID + srcMarker + m.SourceVolumeID + timeMarker + strconv.FormatInt(m.CreatedAt.UnixNano(), 10) + imgSuffix
	return path.Join(d.opts.VolumePath, snapshotDir, name)
}

// parseSnapshotDisk reads the metadata of a snapshot disk. It fails for
// any disk that is not one of this driver's snapshots under the current
// volume path.
func (d *Driver) parseSnapshotDisk(disk *rds.Disk) (snapshotMeta, error) {
	dir, base := path.Split(disk.FilePath)
	if path.Clean(dir) != path.Join(d.opts.VolumePath, snapshotDir) {
		return snapshotMeta{}, fmt.Errorf("file %s is not in %s", disk.FilePath, path.Join(d.opts.VolumePath, snapshotDir))
	}
	m, err := parseSnapshotFileName(base)
	if err != nil {
		return snapshotMeta{}, err
	}
	if m.SnapshotID != disk.Slot {
		return snapshotMeta{}, fmt.Errorf("file %s names snapshot %s, but the disk's slot is %s", disk.FilePath, m.SnapshotID, disk.Slot)
	}
	return m, nil
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
