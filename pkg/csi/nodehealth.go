package csi

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	mount "k8s.io/mount-utils"

	"github.com/srvlab/rds-csi/pkg/nvme"
)

// Health reasons (CamelCase, for machines) the node reports.
const (
	// HealthDeviceGone: the volume is still mounted here but its device
	// is gone (the NVMe/TCP connection was lost past ctrl_loss_tmo, or the
	// volume was deleted on the RDS).
	HealthDeviceGone = "DeviceGone"
	// HealthDeviceReplaced: a path is mounted from an old device while
	// the volume is now connected as another one (reconnect renumbered it).
	HealthDeviceReplaced = "DeviceReplaced"
	// HealthPathInaccessible: a mounted path fails with an I/O error.
	HealthPathInaccessible = "PathInaccessible"
	// HealthPathDown: the volume's device is there but none of its
	// NVMe/TCP controllers is live: the kernel is reconnecting; I/O waits
	// until the RDS answers again or fast_io_fail_tmo runs out, and the
	// device stays until ctrl_loss_tmo runs out.
	HealthPathDown = "PathDown"
	// HealthFilesystemReadOnly: the kernel turned a read-write
	// filesystem read-only after an error.
	HealthFilesystemReadOnly = "FilesystemReadOnly"
)

// pathReporter is implemented by connectors that know a volume's
// transport paths (nvme.TCPConnector); a loop device has none.
type pathReporter interface {
	Paths(ctx context.Context, nqn string) (live, total int, err error)
}

// NodeGetVolumeHealth reports, from this node's view: INACCESSIBLE when
// the volume's device vanished under its mounts or was replaced by a new
// device, no NVMe/TCP path to it is live (reconnecting), or a mounted path
// fails with an I/O error; DEGRADED when the
// kernel made its filesystem read-only after an error (reads still work).
// Only the volume ID is required; given paths are checked as well, and
// only when what is mounted there can be tied to the volume (its device,
// or the node's record of mounting it there, as for an unstage): another
// volume's path is NOT_FOUND, never reported as this volume's trouble.
func (s *NodeServer) NodeGetVolumeHealth(ctx context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	const rpc = "NodeGetVolumeHealth"
	id := req.GetVolumeId()
	if id == "" {
		return nil, statusf(codes.InvalidArgument, "%s: volume ID is required", rpc)
	}
	var paths []string
	for _, p := range []string{req.GetVolumePublishPath(), req.GetStagingTargetPath()} {
		if p == "" {
			continue
		}
		if err := checkPath(rpc, id, "path", p); err != nil {
			return nil, err
		}
		paths = append(paths, p)
	}
	if err := checkVolumeID(rpc, id); err != nil {
		return nil, err
	}
	health := &csi.VolumeHealth{VolumeId: id}
	add := func(kind csi.VolumeHealthErrorType, reason, format string, args ...any) {
		for _, e := range health.HealthStatuses {
			if e.Status == kind && e.Reason == reason {
				return
			}
		}
		health.HealthStatuses = append(health.HealthStatuses, healthEntry(kind, reason, format, args...))
	}

	var mounted []*mountEntry
	for _, p := range paths {
		m, err := mountAt(p)
		if err != nil {
			return nil, err
		}
		if m != nil {
			mounted = append(mounted, m)
		}
	}

	dev, err := s.connector.DevicePath(ctx, s.d.nqn(id))
	var num devNumber
	if err == nil {
		num, err = deviceNumber(dev)
		if errors.Is(err, fs.ErrNotExist) {
			err = fmt.Errorf("%w: device %s is gone", nvme.ErrNoDevice, dev)
		}
	}
	gone := errors.Is(err, nvme.ErrNotConnected) || errors.Is(err, nvme.ErrNoDevice)
	if err != nil && !gone {
		return nil, fmt.Errorf("volume %s: finding its device: %w", id, err)
	}
	// Only what can be tied to this volume is judged: a path that holds
	// another volume (or anything the node cannot tie to this one) says
	// nothing about this volume's health, so the volume is not there.
	for _, m := range mounted {
		ok, err := s.tiedToVolume(ctx, id, m, num, !gone)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, statusf(codes.NotFound, "%s: volume %s is not at %s: what is mounted there (device %s, from %s) is not this volume's, and this node has no record of mounting the volume there", rpc, id, m.MountPoint, mountDevice(m), m.Source)
		}
	}
	if gone {
		if len(mounted) == 0 {
			return nil, statusf(codes.NotFound, "volume %s is not staged on this node (%v)", id, err)
		}
		add(csi.VolumeHealthErrorType_INACCESSIBLE, HealthDeviceGone,
			"volume %s is still mounted at %s but its device is gone from this node (%v): the NVMe/TCP connection to the RDS was lost for longer than ctrl_loss_tmo, or the volume was deleted on the RDS; I/O fails until the pod is restarted",
			id, mounted[0].MountPoint, err)
		return &csi.NodeGetVolumeHealthResponse{VolumeHealth: health}, nil
	}

	if pr, ok := s.connector.(pathReporter); ok {
		live, total, err := pr.Paths(ctx, s.d.nqn(id))
		if err != nil {
			return nil, fmt.Errorf("volume %s: reading its NVMe/TCP paths: %w", id, err)
		}
		if total > 0 && live == 0 {
			add(csi.VolumeHealthErrorType_INACCESSIBLE, HealthPathDown,
				"volume %s: its NVMe/TCP connection to the RDS is down (%d controller(s) reconnecting); I/O waits, and fails once fast_io_fail_tmo has passed; the path resumes on the same device if the RDS is reachable again within ctrl_loss_tmo",
				id, total)
		}
	}
	for _, m := range mounted {
		if _, err := os.Stat(m.MountPoint); err != nil && mount.IsCorruptedMnt(err) {
			add(csi.VolumeHealthErrorType_INACCESSIBLE, HealthPathInaccessible,
				"volume %s: %s cannot be accessed (%v); the pod must be restarted once the RDS is reachable", id, m.MountPoint, err)
			continue
		}
		if got := mountDevice(m); got != num {
			add(csi.VolumeHealthErrorType_INACCESSIBLE, HealthDeviceReplaced,
				"volume %s: %s uses device %s, but the volume is now connected as %s (%s): the old device is gone and the pod must be restarted to use the new one",
				id, m.MountPoint, got, dev, num)
		}
	}
	users, err := deviceMounts(num)
	if err != nil {
		return nil, err
	}
	for _, m := range users {
		if m.dev() == num && m.superReadOnly() && !m.readOnly() {
			// The superblock went read-only under a read-write mount:
			// the kernel did that after an error (errors=remount-ro, or
			// a journal abort after I/O errors).
			add(csi.VolumeHealthErrorType_DEGRADED, HealthFilesystemReadOnly,
				"volume %s: the %s filesystem on %s went read-only after an error (see the node's kernel log); writes fail until it is checked (fsck) and restaged",
				id, m.FsType, dev)
		}
	}
	return &csi.NodeGetVolumeHealthResponse{VolumeHealth: health}, nil
}
