package rds

import (
	"path"
	"strings"
)

// DefaultVolumePath is the directory on the RDS holding the driver's
// backing files: the driver's --rds-volume-path and rdsctl's --base-path
// default to it, so both name the same files.
const DefaultVolumePath = "/storage-pool/kubernetes-volumes"

// SnapshotDir is the subdirectory of the volume path holding snapshot
// backing files (<slot>.<metadata>.img, see pkg/csi).
const SnapshotDir = "snapshots"

// Kinds of backing file under a volume path (FileKind).
const (
	FileVolume   = "volume"
	FileSnapshot = "snapshot"
)

// VolumeFilePath is the backing file of the volume in slot.
func VolumeFilePath(volumePath, slot string) string {
	return path.Join(volumePath, slot+".img")
}

// FileKind says whether d's backing file is a volume (<volumePath>/<slot>.img)
// or a snapshot (<volumePath>/snapshots/<slot>.*.img) of the driver, and
// "" for any other disk.
func FileKind(volumePath string, d Disk) string {
	switch dir, base := path.Split(d.FilePath); {
	case d.FilePath == VolumeFilePath(volumePath, d.Slot):
		return FileVolume
	case path.Clean(dir) == path.Join(volumePath, SnapshotDir) && strings.HasPrefix(base, d.Slot+".") && strings.HasSuffix(base, ".img"):
		return FileSnapshot
	}
	return ""
}
