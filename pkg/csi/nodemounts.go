package csi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
)

// Whose mount is it? NodeUnstageVolume and NodeUnpublishVolume name a
// volume and a path, and unmount what is at the path only when it can be
// tied to that volume. The kernel ties it while the volume is connected:
// the mount's device is the volume's device. When it is not (the device
// vanished after the connection was lost or the volume deleted, or a
// reconnect gave the volume a new device), the node's own record ties
// it: before each mount it makes, the node writes which volume and which
// device it mounts at that path. Anything else at a path (another
// volume's mount, a mount the node did not make and whose device is not
// the volume's) is never unmounted: the RPC fails with
// FAILED_PRECONDITION naming what is there.

// mountRecord is what the node mounted at a path: the volume and the
// device number of the mount (the filesystem's device for a staging or
// filesystem publish mount, the block device for a raw block publish).
type mountRecord struct {
	Volume string `json:"volume"`
	Path   string `json:"path"`
	Device string `json:"device"`
}

// mountRecords keeps one record per mount path in dir (the node plugin's
// --node-state-dir), named by a hash of the path, so the last mount made
// at a path is the one its record describes. dir "" keeps none: a mount
// is then tied to a volume only by its current device.
type mountRecords struct{ dir string }

func (r mountRecords) file(p string) string {
	sum := sha256.Sum256([]byte(p))
	return filepath.Join(r.dir, "mount-"+hex.EncodeToString(sum[:16])+".json")
}

// write records that volume id is about to be mounted at p from device
// dev. It is written (and synced) before the mount, so that a mount the
// node made always has its record, also after a crash between the two.
func (r mountRecords) write(id, p string, dev devNumber) error {
	if r.dir == "" {
		return nil
	}
	p = canonicalPath(p)
	data, err := json.Marshal(mountRecord{Volume: id, Path: p, Device: dev.String()})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(r.dir, 0o700); err != nil {
		return fmt.Errorf("volume %s: recording its mount at %s: %w", id, p, err)
	}
	f, err := os.CreateTemp(r.dir, ".mount-*")
	if err != nil {
		return fmt.Errorf("volume %s: recording its mount at %s: %w", id, p, err)
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, r.file(p))
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("volume %s: recording its mount at %s in %s: %w", id, p, r.dir, err)
	}
	if d, err := os.Open(r.dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// read returns the record of the mount path p, or nil when there is none
// (or it cannot be read: it then ties nothing, and is logged).
func (r mountRecords) read(ctx context.Context, p string) *mountRecord {
	if r.dir == "" {
		return nil
	}
	p = canonicalPath(p)
	data, err := os.ReadFile(r.file(p))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	var rec mountRecord
	if err == nil {
		err = json.Unmarshal(data, &rec)
	}
	if err == nil && (rec.Path != p || !isVolumeID(rec.Volume)) {
		err = fmt.Errorf("it names path %q and volume %q", rec.Path, rec.Volume)
	}
	if err != nil {
		klog.FromContext(ctx).Error(err, "unreadable mount record: it ties no mount to a volume", "path", p, "file", r.file(p))
		return nil
	}
	return &rec
}

// remove deletes the record of p if it is volume id's.
func (r mountRecords) remove(ctx context.Context, id, p string) error {
	if rec := r.read(ctx, p); rec == nil || rec.Volume != id {
		return nil
	}
	if err := os.Remove(r.file(canonicalPath(p))); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("volume %s: removing the record of its mount at %s: %w", id, p, err)
	}
	return nil
}

// mountDevice is the device a mount uses: for a device node bind-mounted
// onto a file (a raw block publish), the device the node stands for;
// else the mounted filesystem's. Only such a bind mount is stat'ed, so a
// hung filesystem cannot block the call.
func mountDevice(m *mountEntry) devNumber {
	if m.Root != "/" && (m.FsType == "devtmpfs" || m.FsType == "tmpfs") {
		if n, err := deviceNumber(m.MountPoint); err == nil {
			return n
		}
	}
	return m.dev()
}

// recordedOwners are the volumes the node's records name for the mount m
// of device dev: its own record, or else the records of the other mounts
// of the same device (a filesystem publish is tied by its staging mount's
// record, and the other way round). A record counts only while its
// device is the mount's.
func (s *NodeServer) recordedOwners(ctx context.Context, m *mountEntry, dev devNumber) ([]string, error) {
	if rec := s.records.read(ctx, m.MountPoint); rec != nil && rec.Device == dev.String() {
		return []string{rec.Volume}, nil
	}
	users, err := deviceMounts(dev)
	if err != nil {
		return nil, err
	}
	var owners []string
	for _, u := range users {
		if u.MountPoint == m.MountPoint {
			continue
		}
		if rec := s.records.read(ctx, u.MountPoint); rec != nil && rec.Device == dev.String() && !slices.Contains(owners, rec.Volume) {
			owners = append(owners, rec.Volume)
		}
	}
	return owners, nil
}

// tiedToVolume reports whether the mount m can be tied to volume id: by
// the node's records (its own, or that of another mount of its device),
// or, with none, by its device being the volume's current device num
// (connected false: the volume has no device on this node). The rule
// checkOwnMount applies before an unmount; NodeGetVolumeHealth judges
// only the paths it ties.
func (s *NodeServer) tiedToVolume(ctx context.Context, id string, m *mountEntry, num devNumber, connected bool) (bool, error) {
	dev := mountDevice(m)
	owners, err := s.recordedOwners(ctx, m, dev)
	if err != nil {
		return false, err
	}
	if len(owners) > 0 {
		return len(owners) == 1 && owners[0] == id, nil
	}
	return connected && dev == num, nil
}

// checkOwnMount returns the device of the mount m at a path an RPC for
// volume id names (what is the staging path or the target path), or
// FAILED_PRECONDITION when m cannot be tied to the volume: its record
// (or that of another mount of its device) names another volume, or it
// has no record and its device is not the volume's current device (the
// volume is not connected, or connected as another device).
func (s *NodeServer) checkOwnMount(ctx context.Context, rpc, id, what string, m *mountEntry) (devNumber, error) {
	dev := mountDevice(m)
	owners, err := s.recordedOwners(ctx, m, dev)
	if err != nil {
		return devNumber{}, err
	}
	switch {
	case len(owners) == 1 && owners[0] == id:
		return dev, nil
	case len(owners) > 0:
		return devNumber{}, statusf(codes.FailedPrecondition, "%s: volume %s: %s %s holds volume %s (device %s, mounted from %s), not this one; refusing to unmount another volume", rpc, id, what, m.MountPoint, strings.Join(owners, " and "), dev, m.Source)
	}
	_, num, err := s.device(ctx, id)
	switch {
	case err == nil && num == dev:
		return dev, nil
	case err == nil:
		return devNumber{}, statusf(codes.FailedPrecondition, "%s: volume %s: %s %s holds device %s (mounted from %s), not this volume's %s, and this node has no record of mounting the volume there; refusing to unmount another volume", rpc, id, what, m.MountPoint, dev, m.Source, num)
	case status.Code(err) == codes.FailedPrecondition:
		return devNumber{}, statusf(codes.FailedPrecondition, "%s: volume %s is not connected on this node, and nothing ties what is mounted at %s %s (device %s, from %s) to it: this node has no record of mounting the volume there; refusing to unmount what may be another volume's. If it is this volume's (mounted before this node plugin kept records), unmount it by hand", rpc, id, what, m.MountPoint, dev, m.Source)
	default:
		return devNumber{}, err
	}
}

// checkUnmountedTarget checks what is at a publish's target path while
// nothing is mounted there. Nothing, or what a publish makes and an
// unpublish removes (an empty directory for a filesystem, an empty file
// for raw block), is fine. Anything else (a file with data, a directory
// with entries, a symbolic link, a device node) is not a publish's: it is
// neither mounted over (which would hide it) nor removed (an unpublish
// removes the target): FAILED_PRECONDITION naming it.
func checkUnmountedTarget(rpc, id, target string) error {
	fi, err := os.Lstat(target)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: volume %s: target path %s: %w", rpc, id, target, err)
	}
	var what string
	switch t := fi.Mode().Type(); {
	case fi.Mode().IsRegular() && fi.Size() == 0:
		return nil
	case fi.Mode().IsRegular():
		what = fmt.Sprintf("a file of %d bytes", fi.Size())
	case fi.IsDir():
		d, err := os.Open(target)
		if err != nil {
			return fmt.Errorf("%s: volume %s: target path %s: %w", rpc, id, target, err)
		}
		names, err := d.Readdirnames(1)
		d.Close()
		if errors.Is(err, io.EOF) || (err == nil && len(names) == 0) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: volume %s: target path %s: %w", rpc, id, target, err)
		}
		what = fmt.Sprintf("a directory with entries (%s, ...)", names[0])
	case t&fs.ModeSymlink != 0:
		what = "a symbolic link"
	case t&fs.ModeDevice != 0:
		what = "a device node"
	default:
		what = fmt.Sprintf("a %s", t)
	}
	return statusf(codes.FailedPrecondition, "%s: volume %s: target path %s holds %s and nothing is mounted there: not what a publish makes (an empty directory, or an empty file for raw block); refusing to mount over it or remove it", rpc, id, target, what)
}
