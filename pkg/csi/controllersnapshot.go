package csi

import (
	"context"
	"errors"
	"fmt"
	"path"
	"sort"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/klog/v2"

	"github.com/srvlab/rds-csi/pkg/backends"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// Snapshots are full copies of a volume's disk (/disk add copy-from=),
// not exported, with their source volume and creation time in the backing
// file name (see snapshotFilePath and docs/volumes-and-snapshots.md). A
// copy is complete when its /disk add returns, and its disk appears only
// then; a copy whose reply was lost is reported not ready until its disk
// appears, and is never started twice while it may still run. A snapshot's
// export is set in full (closed, its own NQN, no allowed host), so it
// takes nothing of its source's export (copy-from may inherit properties,
// docs/routeros.md). With --copy-from-data=unsupported no copy is made.

// refuseCopy is FAILED_PRECONDITION when the operator has said that
// RouterOS' copy-from copies no data on this RDS (--copy-from-data=
// unsupported): a snapshot, clone or restore would be an empty disk handed
// out as a copy of something. what names the copy asked for.
func (s *ControllerServer) refuseCopy(what string) error {
	if s.d.opts.CopyFromData != CopyFromDataUnsupported {
		return nil
	}
	return statusf(codes.FailedPrecondition, "%s: not made, since it would be empty: this driver runs with --copy-from-data=unsupported, set because RouterOS' /disk add copy-from on this RDS makes a disk of the right size without its source's data (rdsctl selftest --data); snapshots, clones and restores stay off until a selftest --data confirms that copy-from copies data and the flag is set to supported", what)
}

// pendingCopyTimeout is how long a snapshot file without a disk counts as
// a copy still running (rds.Config.CopyTimeout's default); older, it is
// the debris of a copy that died, removed before copying again.
const pendingCopyTimeout = time.Hour

func snapshotOf(d *rds.Disk, m snapshotMeta) *csi.Snapshot {
	return &csi.Snapshot{
		SnapshotId:     m.SnapshotID,
		SourceVolumeId: m.SourceVolumeID,
		SizeBytes:      d.Size,
		CreationTime:   timestamppb.New(m.CreatedAt),
		ReadyToUse:     true,
	}
}

// pendingSnapshot is a snapshot whose copy is not confirmed complete.
func pendingSnapshot(size int64, m snapshotMeta) *csi.CreateSnapshotResponse {
	return &csi.CreateSnapshotResponse{Snapshot: &csi.Snapshot{
		SnapshotId:     m.SnapshotID,
		SourceVolumeId: m.SourceVolumeID,
		SizeBytes:      size,
		CreationTime:   timestamppb.New(m.CreatedAt),
		ReadyToUse:     false,
	}}
}

// runningCopy finds a copy of snapshot id that may still be running: its
// file without a disk, younger than pendingCopyTimeout. Older ones are
// removed.
func (s *ControllerServer) runningCopy(ctx context.Context, b *rdsBox, id string) (*snapshotMeta, error) {
	dir := b.snapshotDir()
	_, slot := backends.SplitID(id)
	files, err := b.view.FilesWithPrefix(ctx, path.Join(dir, slot)+srcMarker)
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		file := "/" + f.Name
		m, err := parseSnapshotFileName(path.Base(file))
		if err != nil || m.SnapshotID != slot || path.Dir(file) != dir {
			continue
		}
		if s.now().Sub(m.CreatedAt) < pendingCopyTimeout {
			m = b.qualify(m)
			return &m, nil
		}
		if used, err := b.view.DiskUsingFile(ctx, file); err != nil || used {
			return nil, err
		}
		if err := b.view.RemoveFile(ctx, file); err != nil {
			return nil, err
		}
		klog.FromContext(ctx).Info("removed the file of a snapshot copy that never completed", "snapshot", id, "file", file)
	}
	return nil, nil
}

// getSnapshot returns a snapshot's disk and metadata, or NOT_FOUND.
func (s *ControllerServer) getSnapshot(ctx context.Context, id string) (*rds.Disk, snapshotMeta, error) {
	if !isSnapshotID(id) {
		return nil, snapshotMeta{}, statusf(codes.NotFound, "snapshot %q does not exist: this driver's snapshot IDs are snap-<uuid> or snap-<32 hex digits>, after <RDS name>/ on an RDS other than the default", id)
	}
	b, err := s.d.boxOf(id)
	if err != nil {
		return nil, snapshotMeta{}, err
	}
	d, err := b.view.GetDisk(ctx, id)
	if errors.Is(err, rds.ErrNotFound) {
		return nil, snapshotMeta{}, statusf(codes.NotFound, "snapshot %s does not exist on RDS %s", id, b.Name)
	}
	if err != nil {
		return nil, snapshotMeta{}, fmt.Errorf("snapshot %s: looking it up on the RDS: %w", id, err)
	}
	m, err := b.parseSnapshotDisk(d)
	if err != nil {
		return nil, snapshotMeta{}, statusf(codes.FailedPrecondition, "the disk of snapshot %s on RDS %s is not a snapshot of this driver with the volume path %s: %v", id, b.Name, b.VolumePath, err)
	}
	return d, m, nil
}

func (s *ControllerServer) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	name, source := req.GetName(), req.GetSourceVolumeId()
	if name == "" {
		return nil, statusf(codes.InvalidArgument, "CreateSnapshot: name is required")
	}
	if source == "" {
		return nil, statusf(codes.InvalidArgument, "CreateSnapshot: snapshot %q: source volume ID is required", name)
	}
	if err := checkParameters(req.GetParameters()); err != nil {
		return nil, statusf(codes.InvalidArgument, "snapshot %q: %v", name, err)
	}
	if _, ok := req.GetParameters()[ParameterRDS]; ok {
		return nil, statusf(codes.InvalidArgument, "snapshot %q: parameter %s: a snapshot is made on its source volume's RDS; remove it from the VolumeSnapshotClass", name, ParameterRDS)
	}
	// The snapshot goes on its source's box: its ID names that box.
	b, err := s.d.boxOf(source)
	if err != nil {
		return nil, err
	}
	id := b.id(SnapshotIDFromName(name))
	release, err := s.acquire("snapshot", id, snapshotKey(id))
	if err != nil {
		return nil, err
	}
	defer release()
	logger := klog.FromContext(ctx).WithValues("snapshot", id, "name", name, "sourceVolume", source, "rds", b.Name)

	// An earlier attempt may have made it already.
	existing, err := b.view.GetDisk(ctx, id)
	switch {
	case err == nil:
		return s.existingSnapshot(existing, name, source)
	case !errors.Is(err, rds.ErrNotFound):
		return nil, fmt.Errorf("snapshot %s (name %q): looking it up on the RDS: %w", id, name, err)
	}
	if err := s.refuseCopy(fmt.Sprintf("snapshot %s (name %q) of volume %s", id, name, source)); err != nil {
		return nil, err
	}
	src, err := s.getVolume(ctx, source)
	if err != nil {
		return nil, err
	}
	// A copy sent earlier whose reply was lost may still be running.
	switch running, err := s.runningCopy(ctx, b, id); {
	case err != nil:
		return nil, fmt.Errorf("snapshot %s (name %q): looking for a copy in progress on the RDS: %w", id, name, err)
	case running != nil && running.SourceVolumeID != source:
		return nil, statusf(codes.AlreadyExists, "snapshot %s (name %q) is being made of volume %s, not %s; use another name", id, name, running.SourceVolumeID, source)
	case running != nil:
		logger.Info("snapshot copy still in progress", "file", b.snapshotFilePath(*running))
		return pendingSnapshot(src.Size, *running), nil
	}
	meta := snapshotMeta{SnapshotID: id, SourceVolumeID: source, CreatedAt: s.now().UTC()}
	d, err := b.view.CopyDisk(ctx, rds.CopyDiskRequest{Slot: id, FilePath: b.snapshotFilePath(meta), SourceSlot: source,
		Export: &rds.Export{Port: b.NVMePort, NQN: s.d.nqn(id), Closed: true}})
	switch {
	case errors.Is(err, rds.ErrCopyPending):
		// Sent, not confirmed: ready once its disk appears.
		logger.Info("snapshot copy sent, completion not confirmed yet", "err", err)
		return pendingSnapshot(src.Size, meta), nil
	case errors.Is(err, rds.ErrAlreadyExists):
		// Made meanwhile by another controller replica, with its own
		// creation time in the file name: that one is the snapshot.
		if existing, gerr := b.view.GetDisk(ctx, id); gerr == nil {
			return s.existingSnapshot(existing, name, source)
		}
		return nil, fmt.Errorf("snapshot %s (name %q): the RDS already has a different disk or file for it: %w", id, name, err)
	case errors.Is(err, rds.ErrNoSpace):
		return nil, fmt.Errorf("snapshot %s (name %q) of volume %s: the RDS pool is full, nothing was created; free space on the RDS: %w", id, name, source, err)
	case err != nil:
		return nil, fmt.Errorf("snapshot %s (name %q) of volume %s: copying on the RDS: %w", id, name, source, err)
	}
	logger.Info("snapshot created", "bytes", d.Size, "file", d.FilePath)
	return &csi.CreateSnapshotResponse{Snapshot: snapshotOf(d, meta)}, nil
}

func (s *ControllerServer) existingSnapshot(d *rds.Disk, name, source string) (*csi.CreateSnapshotResponse, error) {
	b, err := s.d.boxOf(d.Slot)
	if err != nil {
		return nil, err
	}
	m, err := b.parseSnapshotDisk(d)
	if err != nil {
		return nil, statusf(codes.AlreadyExists, "snapshot %s (name %q): the RDS slot is taken by a disk that is not a snapshot of this driver: %v", d.Slot, name, err)
	}
	if m.SourceVolumeID != source {
		return nil, statusf(codes.AlreadyExists, "snapshot %s (name %q) already exists of volume %s, not %s; use another name", d.Slot, name, m.SourceVolumeID, source)
	}
	return &csi.CreateSnapshotResponse{Snapshot: snapshotOf(d, m)}, nil
}

func (s *ControllerServer) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	id := req.GetSnapshotId()
	if id == "" {
		return nil, statusf(codes.InvalidArgument, "DeleteSnapshot: snapshot ID is required")
	}
	logger := klog.FromContext(ctx).WithValues("snapshot", id)
	if !isSnapshotID(id) {
		logger.V(2).Info("not a snapshot ID of this driver; nothing to delete")
		return &csi.DeleteSnapshotResponse{}, nil
	}
	b, err := s.d.boxOf(id)
	if err != nil {
		return nil, err
	}
	release, err := s.acquire("snapshot", id, snapshotKey(id))
	if err != nil {
		return nil, err
	}
	defer release()
	d, _, err := s.getSnapshot(ctx, id)
	if status.Code(err) == codes.NotFound {
		// A delete interrupted between its two steps (disk removed, file
		// not) is finished here: the file name starts with the ID.
		if err := s.removeSnapshotFiles(ctx, b, id); err != nil {
			return nil, fmt.Errorf("snapshot %s: its disk is gone; removing its leftover file on the RDS: %w", id, err)
		}
		return &csi.DeleteSnapshotResponse{}, nil
	} else if err != nil {
		return nil, err
	}
	if err := b.view.DeleteDisk(ctx, id, d.FilePath); err != nil {
		return nil, fmt.Errorf("snapshot %s: deleting it on the RDS: %w", id, err)
	}
	logger.Info("snapshot deleted", "file", d.FilePath)
	return &csi.DeleteSnapshotResponse{}, nil
}

// removeSnapshotFiles removes the backing files of snapshot id that no disk
// uses: <volume-path>/snapshots/<id>.*.img, matched by name.
func (s *ControllerServer) removeSnapshotFiles(ctx context.Context, b *rdsBox, id string) error {
	dir := b.snapshotDir()
	_, slot := backends.SplitID(id)
	files, err := b.view.FilesWithPrefix(ctx, path.Join(dir, slot)+srcMarker)
	if err != nil {
		return err
	}
	for _, f := range files {
		file := "/" + f.Name
		if m, err := parseSnapshotFileName(path.Base(file)); err != nil || m.SnapshotID != slot || path.Dir(file) != dir {
			continue
		}
		if used, err := b.view.DiskUsingFile(ctx, file); err != nil || used {
			if err != nil {
				return err
			}
			continue
		}
		if err := b.view.RemoveFile(ctx, file); err != nil {
			return err
		}
		klog.FromContext(ctx).Info("removed the file of a snapshot whose disk was already gone", "snapshot", id, "file", file)
	}
	return nil
}

func (s *ControllerServer) GetSnapshot(ctx context.Context, req *csi.GetSnapshotRequest) (*csi.GetSnapshotResponse, error) {
	id := req.GetSnapshotId()
	if id == "" {
		return nil, statusf(codes.InvalidArgument, "GetSnapshot: snapshot ID is required")
	}
	d, m, err := s.getSnapshot(ctx, id)
	if err != nil {
		return nil, err
	}
	return &csi.GetSnapshotResponse{Snapshot: snapshotOf(d, m)}, nil
}

func (s *ControllerServer) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	if err := checkListArgs("ListSnapshots", req.GetMaxEntries(), req.GetStartingToken(), isSnapshotID); err != nil {
		return nil, err
	}
	wantSource := req.GetSourceVolumeId()
	var snaps []*csi.Snapshot
	if id := req.GetSnapshotId(); id != "" {
		// One snapshot; a missing one is an empty list, not an error.
		// One of a box missing from the configuration is not known to
		// be missing: FAILED_PRECONDITION (boxOf), as in every call.
		if isSnapshotID(id) {
			if _, err := s.d.boxOf(id); err != nil {
				return nil, err
			}
		}
		d, m, err := s.getSnapshot(ctx, id)
		switch {
		case status.Code(err) == codes.NotFound || status.Code(err) == codes.FailedPrecondition:
		case err != nil:
			return nil, err
		case wantSource == "" || m.SourceVolumeID == wantSource:
			snaps = append(snaps, snapshotOf(d, m))
		}
	} else {
		boxes := s.d.boxes
		if wantSource != "" {
			// Snapshots of a volume are on its box alone.
			b, err := s.d.boxOf(wantSource)
			if err != nil {
				return &csi.ListSnapshotsResponse{}, nil // no snapshot of it here
			}
			boxes = []*rdsBox{b}
		}
		for _, b := range boxes {
			disks, err := b.view.ListDisks(ctx)
			if err != nil {
				return nil, fmt.Errorf("listing disks on the RDS: %w", err)
			}
			for i := range disks {
				d := &disks[i]
				if !isSnapshotID(d.Slot) {
					continue
				}
				m, err := b.parseSnapshotDisk(d)
				if err != nil || (wantSource != "" && m.SourceVolumeID != wantSource) {
					continue
				}
				snaps = append(snaps, snapshotOf(d, m))
			}
		}
		sort.Slice(snaps, func(i, j int) bool { return snaps[i].SnapshotId < snaps[j].SnapshotId })
	}
	snaps, next := page(snaps, (*csi.Snapshot).GetSnapshotId, req.GetStartingToken(), req.GetMaxEntries())
	resp := &csi.ListSnapshotsResponse{NextToken: next}
	for _, sn := range snaps {
		resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: sn})
	}
	return resp, nil
}
