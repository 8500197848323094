package csi

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	mount "k8s.io/mount-utils"
)

// The node service asks the kernel, not its own memory, what is staged
// and published: the mount table (/proc/self/mountinfo) and the device
// numbers of block devices. Device numbers, not names, identify a
// volume's device, because a mount table entry keeps the name the device
// had when it was mounted (and bind mounts show the source filesystem's
// name), while the number is what the kernel compares.

// mountInfoPath is this process's view of the mount table.
const mountInfoPath = "/proc/self/mountinfo"

// devNumber is a block device's major:minor.
type devNumber struct{ major, minor uint32 }

func (n devNumber) String() string { return fmt.Sprintf("%d:%d", n.major, n.minor) }

// deviceNumber returns the device number of the block device node at p
// (also when p is a file a device node is bind-mounted on).
func deviceNumber(p string) (devNumber, error) {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return devNumber{}, fmt.Errorf("stat %s: %w", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return devNumber{}, fmt.Errorf("%s is not a block device", p)
	}
	return devNumber{unix.Major(st.Rdev), unix.Minor(st.Rdev)}, nil
}

// isBlockDevice reports whether p is (or has bound on it) a block device.
func isBlockDevice(p string) bool {
	_, err := deviceNumber(p)
	return err == nil
}

// mountEntry is one line of the mount table.
type mountEntry struct{ mount.MountInfo }

// dev is the device of the mounted filesystem (for a bind-mounted device
// node: of the filesystem holding the node, e.g. devtmpfs).
func (m *mountEntry) dev() devNumber {
	return devNumber{uint32(m.Major), uint32(m.Minor)}
}

// readOnly reports a read-only mount (this mount point).
func (m *mountEntry) readOnly() bool { return slices.Contains(m.MountOptions, "ro") }

// superReadOnly reports a read-only filesystem (the superblock, shared by
// every mount of it): set by the kernel after an error, or by a read-only
// first mount.
func (m *mountEntry) superReadOnly() bool { return slices.Contains(m.SuperOptions, "ro") }

func readMounts() ([]mountEntry, error) {
	infos, err := mount.ParseMountInfo(mountInfoPath)
	if err != nil {
		return nil, fmt.Errorf("reading the mount table: %w", err)
	}
	out := make([]mountEntry, len(infos))
	for i := range infos {
		infos[i].MountPoint = unescapeMountPath(infos[i].MountPoint)
		infos[i].Root = unescapeMountPath(infos[i].Root)
		out[i] = mountEntry{infos[i]}
	}
	return out, nil
}

// unescapeMountPath undoes the kernel's octal escapes (\040 for a space,
// \011, \012, \134) in mountinfo paths.
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, ok := octal3(s[i+1 : i+4]); ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func octal3(s string) (byte, bool) {
	if len(s) != 3 {
		return 0, false
	}
	var v int
	for _, c := range []byte(s) {
		if c < '0' || c > '7' {
			return 0, false
		}
		v = v*8 + int(c-'0')
	}
	if v > 255 {
		return 0, false
	}
	return byte(v), true
}

// mountAt returns the topmost mount at path p, or nil when nothing is
// mounted there. p is compared as canonicalPath resolves it, as the
// kernel records it.
func mountAt(p string) (*mountEntry, error) {
	p = canonicalPath(p)
	mounts, err := readMounts()
	if err != nil {
		return nil, err
	}
	// Later lines are mounted on top of earlier ones.
	for i := len(mounts) - 1; i >= 0; i-- {
		if mounts[i].MountPoint == p {
			return &mounts[i], nil
		}
	}
	return nil, nil
}

// canonicalPath resolves p as the kernel does when it mounts or unmounts
// there: symbolic links first, then "..", so "<dir>/link/../x" is x in
// the link's target's parent, not (as filepath.Clean alone would have
// it) <dir>/x. A last component that is a symbolic link is not followed
// (nothing is mounted on a link), unless p ends in "/" or in "." or "..",
// where the kernel follows it too. A path whose directory does not exist
// is only cleaned.
func canonicalPath(p string) string {
	trimmed := strings.TrimRight(p, "/")
	if trimmed == "" {
		return filepath.Clean(p)
	}
	i := strings.LastIndexByte(trimmed, '/')
	dir, base := trimmed[:i+1], trimmed[i+1:]
	if trimmed != p || base == "." || base == ".." || dir == "" {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			return r
		}
		return filepath.Clean(p)
	}
	if r, err := filepath.EvalSymlinks(dir); err == nil {
		return filepath.Join(r, base)
	}
	return filepath.Clean(p)
}

// deviceMounts lists the mounts that use the block device num: mounted
// filesystems on it, and the device node bind-mounted onto a file (a raw
// block publish).
func deviceMounts(num devNumber) ([]mountEntry, error) {
	mounts, err := readMounts()
	if err != nil {
		return nil, err
	}
	var out []mountEntry
	for _, m := range mounts {
		switch {
		case m.dev() == num:
			out = append(out, m)
		case m.Root != "/" && (m.FsType == "devtmpfs" || m.FsType == "tmpfs"):
			// A bind mount of a single device node shows the node's
			// path inside its filesystem as Root; only such mounts are
			// stat'ed, so a hung network filesystem elsewhere on the
			// node cannot block this scan.
			if got, err := deviceNumber(m.MountPoint); err == nil && got == num {
				out = append(out, m)
			}
		}
	}
	return out, nil
}

// blankProbeBytes is how much of each end of a device must read as zeros
// before it counts as blank. It covers every on-disk signature blkid
// knows at the start (partition tables, ext*, xfs, btrfs at 64 KiB, LVM,
// ZFS labels 0-1) and at the end (GPT backup, ZFS labels 2-3, MD 1.0).
const blankProbeBytes = 1 << 20

// verifyBlank is the second opinion before mkfs. blkid exits 2 ("nothing
// found") also when it could not read the device, and SafeFormatAndMount
// formats on exit 2; so a device is formatted only if its first and last
// MiB read back as zeros. A read error is an error, never a reason to
// format.
func verifyBlank(id, dev string) error {
	f, err := os.Open(dev)
	if err != nil {
		return fmt.Errorf("volume %s: opening %s to check it is blank: %w; a device that cannot be read is never formatted", id, dev, err)
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return fmt.Errorf("volume %s: size of %s: %w", id, dev, err)
	}
	check := func(off int64) error {
		n := min(int64(blankProbeBytes), size-off)
		buf := make([]byte, n)
		if _, err := f.ReadAt(buf, off); err != nil {
			return fmt.Errorf("volume %s: reading %d bytes of %s at offset %d: %w; a device that cannot be read is never formatted", id, n, dev, off, err)
		}
		if i := slices.IndexFunc(buf, func(b byte) bool { return b != 0 }); i >= 0 {
			return statusf(codes.FailedPrecondition, "volume %s: %s holds data at byte %d but no filesystem that blkid recognises; it is not formatted, so nothing is overwritten. Check the volume's contents (a partition table, an encrypted or foreign filesystem); wipe it (wipefs -a) only if the data is not wanted", id, dev, off+int64(i))
		}
		return nil
	}
	if err := check(0); err != nil {
		return err
	}
	if size > blankProbeBytes {
		return check(max(size-blankProbeBytes, blankProbeBytes))
	}
	return nil
}

// blockDeviceSize is the size of the block device at p in bytes.
func blockDeviceSize(p string) (int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return 0, fmt.Errorf("size of %s: %w", p, err)
	}
	return size, nil
}

// filesystemUsage reports bytes and inodes of the filesystem at p.
// Available bytes are what an unprivileged writer may still use.
func filesystemUsage(p string) ([]*csi.VolumeUsage, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		return nil, fmt.Errorf("statfs %s: %w", p, err)
	}
	bs := st.Bsize
	return []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: int64(st.Blocks) * bs, Available: int64(st.Bavail) * bs, Used: int64(st.Blocks-st.Bfree) * bs},
		{Unit: csi.VolumeUsage_INODES, Total: int64(st.Files), Available: int64(st.Ffree), Used: int64(st.Files - st.Ffree)},
	}, nil
}

// pathMissing reports whether p does not exist.
func pathMissing(p string) bool {
	_, err := os.Lstat(p)
	return errors.Is(err, fs.ErrNotExist)
}
