package csi

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/srvlab/rds-csi/pkg/backends"
	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// Keys of a volume's volume_context: what NodeStageVolume needs to connect.
const (
	VolumeContextNVMeAddress = "nvmeAddress"
	VolumeContextNVMePort    = "nvmePort"
	VolumeContextNQN         = "nqn"
)

// DefaultVolumeSize is created when a CreateVolume request names no size.
const DefaultVolumeSize = rds.GiB

// ControllerServer implements the CSI Controller service on the RDS.
//
// ControllerPublishVolume and ControllerUnpublishVolume are served, and
// PUBLISH_UNPUBLISH_VOLUME advertised, only with a Publisher (the
// attachment index and the storage-fence protocol): answering them
// without enforcing anything would pretend a safety the driver lacks.
type ControllerServer struct {
	csi.UnimplementedControllerServer
	d        *Driver
	inflight *InFlight
	now      func() time.Time // snapshot creation times
	pub      *Publisher
	sent     sentTo
}

// NewControllerServer returns the Controller service of d, serving
// ControllerPublish/Unpublish with pub (nil: not served).
func NewControllerServer(d *Driver, pub *Publisher) *ControllerServer {
	if pub != nil {
		if pub.Clock == nil {
			pub.Clock = clock.RealClock{}
		}
		if pub.CatchUp <= 0 {
			pub.CatchUp = publishCatchUpLimit
		}
	}
	return &ControllerServer{d: d, inflight: NewInFlight(), now: time.Now, pub: pub}
}

func volumeKey(id string) string   { return "volume/" + id }
func snapshotKey(id string) string { return "snapshot/" + id }

func (s *ControllerServer) acquire(what, id, key string) (func(), error) {
	release, ok := s.inflight.TryAcquire(key)
	if !ok {
		return nil, statusf(codes.Aborted, "an operation on %s %s is already in progress; the request is retried later", what, id)
	}
	return release, nil
}

func (s *ControllerServer) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	rpcs := []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csi.ControllerServiceCapability_RPC_GET_CAPACITY,
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
		csi.ControllerServiceCapability_RPC_GET_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
		csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
		csi.ControllerServiceCapability_RPC_GET_VOLUME,
		csi.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH,
		csi.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH,
		csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
	}
	if s.pub != nil {
		rpcs = append(rpcs, csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME)
	}
	var caps []*csi.ControllerServiceCapability
	for _, t := range rpcs {
		caps = append(caps, &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{
			Rpc: &csi.ControllerServiceCapability_RPC{Type: t}}})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

// sizeRange is a request's capacity range after validation.
type sizeRange struct {
	required, limit int64 // limit 0: none
}

func (r sizeRange) fits(size int64) bool {
	return size >= r.required && (r.limit == 0 || size <= r.limit)
}

func (r sizeRange) String() string {
	if r.limit == 0 {
		return fmt.Sprintf("at least %d bytes", r.required)
	}
	return fmt.Sprintf("%d to %d bytes", r.required, r.limit)
}

func parseRange(volume string, c *csi.CapacityRange) (sizeRange, error) {
	r := sizeRange{required: c.GetRequiredBytes(), limit: c.GetLimitBytes()}
	if r.required < 0 || r.limit < 0 {
		return r, statusf(codes.InvalidArgument, "volume %s: capacity range must not be negative", volume)
	}
	if r.limit > 0 && r.required > r.limit {
		return r, statusf(codes.InvalidArgument, "volume %s: required_bytes %d exceeds limit_bytes %d", volume, r.required, r.limit)
	}
	return r, nil
}

// createSize picks the size to create (or, with no source, to grow to):
// the request's required bytes (at least the content source's size, the
// default when neither is given), rounded up to the RDS granularity, never
// down. A size that cannot fit the limit is OUT_OF_RANGE.
func createSize(volume string, r sizeRange, sourceSize int64) (int64, error) {
	want := r.required
	if sourceSize > 0 {
		if r.limit > 0 && sourceSize > r.limit {
			return 0, statusf(codes.OutOfRange, "volume %s: its content source has %d bytes, more than limit_bytes %d; a volume cannot be smaller than its source", volume, sourceSize, r.limit)
		}
		// The source's size is what its own request was rounded up to, so
		// the same request again (3 GiB + 12 KiB for a source of 3 GiB +
		// 1 MiB) is compared after the same rounding.
		switch rounded, err := rds.RoundUpSize(want); {
		case want == 0:
			want = sourceSize
		case err == nil && rounded < sourceSize:
			return 0, statusf(codes.OutOfRange, "volume %s: %d bytes requested (%d rounded up to whole MiB), but its content source has %d; request at least the source's size", volume, want, rounded, sourceSize)
		}
	}
	if want == 0 {
		want = DefaultVolumeSize
		if r.limit > 0 && want > r.limit {
			want = r.limit
		}
	}
	size, err := rds.RoundUpSize(want)
	if err != nil {
		return 0, statusf(codes.OutOfRange, "volume %s: %v", volume, err)
	}
	if r.limit > 0 && size > r.limit {
		return 0, statusf(codes.OutOfRange, "volume %s: RDS disks are whole MiB, so %d bytes rounds up to %d, above limit_bytes %d; raise the limit or request a multiple of 1 MiB", volume, want, size, r.limit)
	}
	return size, nil
}

func (s *ControllerServer) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	name := req.GetName()
	if name == "" {
		return nil, statusf(codes.InvalidArgument, "CreateVolume: name is required")
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return nil, statusf(codes.InvalidArgument, "volume %q: %v", name, err)
	}
	if err := checkParameters(req.GetParameters()); err != nil {
		return nil, statusf(codes.InvalidArgument, "volume %q: %v", name, err)
	}
	if err := checkContentSource(req.GetVolumeContentSource()); err != nil {
		return nil, statusf(codes.InvalidArgument, "volume %q: %v", name, err)
	}
	if len(req.GetMutableParameters()) > 0 {
		return nil, statusf(codes.InvalidArgument, "volume %q: mutable parameters (VolumeAttributesClass) are not supported by this driver; remove volumeAttributesClassName from the claim", name)
	}
	slot := VolumeIDFromName(name)
	rng, err := parseRange(slot, req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	// In flight by the name's slot: the box is not known yet.
	release, err := s.acquire("volume", slot, volumeKey(slot))
	if err != nil {
		return nil, err
	}
	defer release()
	logger := klog.FromContext(ctx).WithValues("name", name)

	// A copy stays on its source's box.
	var srcBox *rdsBox
	if src := req.GetVolumeContentSource(); src != nil {
		srcID := src.GetSnapshot().GetSnapshotId() + src.GetVolume().GetVolumeId()
		if srcBox, err = s.d.boxOf(srcID); err != nil {
			return nil, err
		}
	}
	cands, err := s.candidates(name, req, srcBox)
	if err != nil {
		return nil, err
	}
	// A retry goes back to the box an earlier attempt was sent to.
	cands = s.sent.narrow(slot, cands)
	// An earlier attempt may have created the volume already, on any box
	// the request allows; a new one needs a box with room.
	looks, down := s.lookAround(ctx, cands, slot)
	if len(down) == len(cands) {
		return nil, fmt.Errorf("volume %q: every RDS the request allows is down: %w", name, withTransient(errors.Join(down...)))
	}
	b, existing, err := place(name, looks, rng.required)
	if err != nil {
		return nil, err
	}
	id := b.id(slot)
	logger = logger.WithValues("volume", id, "rds", b.Name)
	if existing != nil {
		if err := s.matchesRequest(existing, name, rng); err != nil {
			return nil, err
		}
		logger.V(2).Info("volume exists already", "bytes", existing.Size)
		if ctx.Err() == nil {
			s.sent.forget(slot)
		}
		return &csi.CreateVolumeResponse{Volume: s.volume(existing, req.GetVolumeContentSource())}, nil
	}
	filePath := b.filePath(id)

	if src := req.GetVolumeContentSource(); src != nil {
		if err := s.refuseCopy(fmt.Sprintf("volume %s (name %q) from %s", id, name, describeSource(src))); err != nil {
			return nil, err
		}
	}
	source, err := s.contentSource(ctx, req.GetVolumeContentSource())
	if err != nil {
		return nil, err
	}
	var sourceSize int64
	var sourceSlot string
	if source != nil {
		sourceSize, sourceSlot = source.Size, source.Slot
	}
	size, err := createSize(id, rng, sourceSize)
	if err != nil {
		return nil, err
	}
	// With storage fencing a new volume is exported to no host until a
	// publish opens it to the node's host NQN.
	export := &rds.Export{Port: b.NVMePort, NQN: s.d.nqn(id), Closed: s.d.opts.AllowHostFencing()}
	var disk *rds.Disk
	s.sent.record(slot, b.Name)
	if source == nil {
		// The file path is derived from the volume ID, so a file there
		// without a disk is debris of an earlier attempt: ours to reclaim.
		disk, err = b.view.CreateDisk(ctx, rds.CreateDiskRequest{Slot: id, FilePath: filePath, Size: size, Export: export, OwnsFilePath: true})
	} else {
		// A file without a disk here is debris of an earlier copy whose
		// clean-up failed, or a copy still running: the client reclaims
		// it only once the RDS's clock says no copy can still be writing
		// it, and answers ErrCopyPending (UNAVAILABLE, retried) until then.
		disk, err = b.view.CopyDisk(ctx, rds.CopyDiskRequest{Slot: id, FilePath: filePath, SourceSlot: source.Slot, Size: size, Export: export, OwnsFilePath: true})
	}
	switch {
	case errors.Is(err, rds.ErrNoSpace):
		s.sent.forget(slot) // refused: nothing there to come back to
		return nil, fmt.Errorf("volume %s (name %q, %d bytes): the pool of RDS %s is full, nothing was created; free space on the RDS or request less: %w", id, name, size, b.Name, err)
	case errors.Is(err, rds.ErrAlreadyExists):
		return nil, fmt.Errorf("volume %s (name %q): RDS %s already has a different disk or file for it: %w", id, name, b.Name, err)
	case err != nil:
		return nil, fmt.Errorf("volume %s (name %q): creating it on RDS %s: %w", id, name, b.Name, err)
	}
	// A concurrent replica may have made it with another size.
	if err := s.matchesRequest(disk, name, rng); err != nil {
		return nil, err
	}
	logger.Info("volume created", "bytes", disk.Size, "source", sourceSlot)
	if ctx.Err() == nil {
		s.sent.forget(slot)
	}
	return &csi.CreateVolumeResponse{Volume: s.volume(disk, req.GetVolumeContentSource())}, nil
}

// matchesRequest checks that an existing disk is the volume a CreateVolume
// request describes: this driver's file, exported as NodeStage expects, and
// a size within the requested range. RouterOS keeps no record of the
// content source, so a volume's source cannot be compared.
func (s *ControllerServer) matchesRequest(d *rds.Disk, name string, rng sizeRange) error {
	b, err := s.d.boxOf(d.Slot)
	if err != nil {
		return err
	}
	switch {
	case !b.isVolumeDisk(d):
		return statusf(codes.AlreadyExists, "volume %s (name %q): the slot on RDS %s is taken by a disk with file %s, not %s; it was not created by this driver with this volume path", d.Slot, name, b.Name, d.FilePath, b.filePath(d.Slot))
	case !rng.fits(d.Size):
		return statusf(codes.AlreadyExists, "volume %s (name %q) already exists with %d bytes, but %s were requested; use another name or the existing size", d.Slot, name, d.Size, rng)
	case (!d.Exported && !s.d.opts.AllowHostFencing()) || d.Port != b.NVMePort || d.NQN != s.d.nqn(d.Slot):
		return statusf(codes.AlreadyExists, "volume %s (name %q) exists but is exported as nvme-tcp-export=%t port %d NQN %q, not port %d NQN %q; fix the disk on RDS %s (/disk set) or delete it", d.Slot, name, d.Exported, d.Port, d.NQN, b.NVMePort, s.d.nqn(d.Slot), b.Name)
	}
	return nil
}

// checkContentSource validates a CreateVolume content source's form.
func checkContentSource(src *csi.VolumeContentSource) error {
	switch t := src.GetType().(type) {
	case nil:
	case *csi.VolumeContentSource_Snapshot:
		if t.Snapshot.GetSnapshotId() == "" {
			return fmt.Errorf("the snapshot content source has no snapshot ID")
		}
	case *csi.VolumeContentSource_Volume:
		if t.Volume.GetVolumeId() == "" {
			return fmt.Errorf("the volume content source has no volume ID")
		}
	default:
		return fmt.Errorf("unsupported content source %T", t)
	}
	return nil
}

// describeSource names a checked content source for messages.
func describeSource(src *csi.VolumeContentSource) string {
	if id := src.GetSnapshot().GetSnapshotId(); id != "" {
		return "snapshot " + id
	}
	return "volume " + src.GetVolume().GetVolumeId()
}

// contentSource resolves a checked content source to the disk to copy.
func (s *ControllerServer) contentSource(ctx context.Context, src *csi.VolumeContentSource) (*rds.Disk, error) {
	if id := src.GetSnapshot().GetSnapshotId(); id != "" {
		d, _, err := s.getSnapshot(ctx, id)
		return d, err
	}
	if id := src.GetVolume().GetVolumeId(); id != "" {
		return s.getVolume(ctx, id)
	}
	return nil, nil
}

// volume describes a volume disk (its Slot its ID) for the CO.
func (s *ControllerServer) volume(d *rds.Disk, src *csi.VolumeContentSource) *csi.Volume {
	b, _ := s.d.boxOf(d.Slot) // a disk the view of a box returned
	return &csi.Volume{
		VolumeId:      d.Slot,
		CapacityBytes: d.Size,
		VolumeContext: map[string]string{
			VolumeContextNVMeAddress: b.nvmeAddress(),
			VolumeContextNVMePort:    strconv.Itoa(b.NVMePort),
			VolumeContextNQN:         s.d.nqn(d.Slot),
		},
		ContentSource:      src,
		AccessibleTopology: []*csi.Topology{s.d.topology(b)},
	}
}

// getVolume returns the disk of one of this driver's volumes. An ID this
// driver cannot have made, or a slot without a disk, is NOT_FOUND; a slot
// holding something else is FAILED_PRECONDITION, for an operator to look at.
func (s *ControllerServer) getVolume(ctx context.Context, id string) (*rds.Disk, error) {
	if !isVolumeID(id) {
		return nil, statusf(codes.NotFound, "volume %q does not exist: this driver's volume IDs are pvc-<uuid> or vol-<32 hex digits>, after <RDS name>/ on an RDS other than the default", id)
	}
	b, err := s.d.boxOf(id)
	if err != nil {
		return nil, err
	}
	d, err := b.view.GetDisk(ctx, id)
	if errors.Is(err, rds.ErrNotFound) {
		return nil, statusf(codes.NotFound, "volume %s does not exist on RDS %s", id, b.Name)
	}
	if err != nil {
		return nil, fmt.Errorf("volume %s: looking it up on the RDS: %w", id, err)
	}
	if !b.isVolumeDisk(d) {
		return nil, s.foreignDisk(b, d, b.filePath(id))
	}
	return d, nil
}

func (s *ControllerServer) foreignDisk(b *rdsBox, d *rds.Disk, want string) error {
	_, slot := backends.SplitID(d.Slot)
	return statusf(codes.FailedPrecondition, "the disk in slot %s of RDS %s uses file %s, not %s: it was not made by this driver with the volume path %s; check the disk on the RDS (/disk print detail where slot=%q)", slot, b.Name, d.FilePath, want, b.VolumePath, slot)
}

func (s *ControllerServer) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, statusf(codes.InvalidArgument, "DeleteVolume: volume ID is required")
	}
	logger := klog.FromContext(ctx).WithValues("volume", id)
	if !isVolumeID(id) {
		// Never ours, so there is nothing to delete (CSI: that is success).
		logger.V(2).Info("not a volume ID of this driver; nothing to delete")
		return &csi.DeleteVolumeResponse{}, nil
	}
	b, err := s.d.boxOf(id)
	if err != nil {
		// Never "nothing to delete": the disk may be on a box that is
		// only missing from the configuration.
		return nil, err
	}
	release, err := s.acquire("volume", id, volumeKey(id))
	if err != nil {
		return nil, err
	}
	defer release()
	d, err := b.view.GetDisk(ctx, id)
	switch {
	case err == nil && !b.isVolumeDisk(d):
		return nil, s.foreignDisk(b, d, b.filePath(id))
	case err != nil && !errors.Is(err, rds.ErrNotFound):
		return nil, fmt.Errorf("volume %s: looking it up on the RDS: %w", id, err)
	}
	existed := err == nil
	// With the disk gone, DeleteDisk still removes a backing file left by
	// an interrupted delete. Snapshots are independent copies in their own
	// files, so they are not affected.
	if err := b.view.DeleteDisk(ctx, id, b.filePath(id)); err != nil {
		return nil, fmt.Errorf("volume %s: deleting it on the RDS: %w", id, err)
	}
	logger.Info("volume deleted", "diskExisted", existed)
	return &csi.DeleteVolumeResponse{}, nil
}

func (s *ControllerServer) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, statusf(codes.InvalidArgument, "ValidateVolumeCapabilities: volume ID is required")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, statusf(codes.InvalidArgument, "ValidateVolumeCapabilities: volume %s: volume capabilities are required", id)
	}
	if _, err := s.getVolume(ctx, id); err != nil {
		return nil, err
	}
	unconfirmed := func(format string, args ...any) (*csi.ValidateVolumeCapabilitiesResponse, error) {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: fmt.Sprintf("volume %s: ", id) + fmt.Sprintf(format, args...)}, nil
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return unconfirmed("%v", err)
	}
	if err := checkParameters(req.GetParameters()); err != nil {
		return unconfirmed("%v", err)
	}
	if len(req.GetMutableParameters()) > 0 {
		return unconfirmed("mutable parameters are not supported")
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

// page returns the items (sorted by key) from the one whose key is at
// least token, at most max of them (0: all), and the key of the next item
// when more remain. Keys as tokens stay valid when items come and go
// between calls: nothing is listed twice.
func page[T any](items []T, key func(T) string, token string, max int32) ([]T, string) {
	start := sort.Search(len(items), func(i int) bool { return key(items[i]) >= token })
	items = items[start:]
	if max > 0 && len(items) > int(max) {
		return items[:max], key(items[max])
	}
	return items, ""
}

// volumeDisks lists this driver's volumes on every box, sorted by ID. A
// box that fails fails the listing: a list without its volumes would
// tell the CO they are gone.
func (s *ControllerServer) volumeDisks(ctx context.Context) ([]rds.Disk, error) {
	var out []rds.Disk
	for _, b := range s.d.boxes {
		disks, err := b.view.ListDisks(ctx)
		if err != nil {
			return nil, fmt.Errorf("listing disks on the RDS: %w", err)
		}
		for _, d := range disks {
			if b.isVolumeDisk(&d) {
				out = append(out, d)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Slot < out[j].Slot })
	return out, nil
}

func checkListArgs(what string, maxEntries int32, token string, valid func(string) bool) error {
	if maxEntries < 0 {
		return statusf(codes.InvalidArgument, "%s: max_entries must not be negative", what)
	}
	if token != "" && !valid(token) {
		return statusf(codes.Aborted, "%s: starting_token %q is not one this driver returned; list again without a token", what, token)
	}
	return nil
}

func (s *ControllerServer) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	if err := checkListArgs("ListVolumes", req.GetMaxEntries(), req.GetStartingToken(), isVolumeID); err != nil {
		return nil, err
	}
	disks, err := s.volumeDisks(ctx)
	if err != nil {
		return nil, err
	}
	disks, next := page(disks, func(d rds.Disk) string { return d.Slot }, req.GetStartingToken(), req.GetMaxEntries())
	resp := &csi.ListVolumesResponse{NextToken: next}
	for i := range disks {
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{Volume: s.volume(&disks[i], nil)})
	}
	return resp, nil
}

func (s *ControllerServer) ControllerGetVolume(ctx context.Context, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, statusf(codes.InvalidArgument, "ControllerGetVolume: volume ID is required")
	}
	d, err := s.getVolume(ctx, id)
	if err != nil {
		return nil, err
	}
	return &csi.ControllerGetVolumeResponse{
		Volume: s.volume(d, nil),
		// LIST_VOLUMES_PUBLISHED_NODES is not advertised, so the status
		// names no nodes.
		Status: &csi.ControllerGetVolumeResponse_VolumeStatus{},
	}, nil
}

// Health reasons (CamelCase, for machines) of abnormal volumes.
const (
	HealthDiskMissing        = "DiskMissing"
	HealthNotExported        = "NotExported"
	HealthExportMismatch     = "ExportMismatch"
	HealthBackingFileMissing = "BackingFileMissing"
	HealthHolderShutOut      = "HolderShutOut"
)

func healthEntry(kind csi.VolumeHealthErrorType, reason, format string, args ...any) *csi.VolumeHealth_VolumeHealthEntry {
	return &csi.VolumeHealth_VolumeHealthEntry{Status: kind, Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// exportHealth checks that nodes can connect to a volume disk: exported
// over NVMe/TCP on the port and NQN its volume_context names.
func (s *ControllerServer) exportHealth(d *rds.Disk) []*csi.VolumeHealth_VolumeHealthEntry {
	b, err := s.d.boxOf(d.Slot)
	if err != nil {
		return nil
	}
	_, slot := backends.SplitID(d.Slot)
	port := b.NVMePort
	switch {
	case s.d.opts.AllowHostFencing() && (!d.Exported || (d.Port == port && d.NQN == s.d.nqn(d.Slot))):
		// Closed while unpublished is how storage fencing keeps it; a
		// published volume must be open to its holder (and, open, at the
		// address nodes dial: below).
		return s.holderHealth(d)
	case !d.Exported:
		return []*csi.VolumeHealth_VolumeHealthEntry{healthEntry(csi.VolumeHealthErrorType_INACCESSIBLE, HealthNotExported,
			"volume %s is not exported over NVMe/TCP (nvme-tcp-export=no), so no node can connect; on RDS %s: /disk set [find slot=%q] nvme-tcp-export=yes nvme-tcp-server-port=%d nvme-tcp-server-nqn=%q",
			d.Slot, b.Name, slot, port, s.d.nqn(d.Slot))}
	case d.Port != port || d.NQN != s.d.nqn(d.Slot):
		return []*csi.VolumeHealth_VolumeHealthEntry{healthEntry(csi.VolumeHealthErrorType_INACCESSIBLE, HealthExportMismatch,
			"volume %s is exported on port %d as %q, but nodes connect to port %d as %q; on RDS %s: /disk set [find slot=%q] nvme-tcp-server-port=%d nvme-tcp-server-nqn=%q",
			d.Slot, d.Port, d.NQN, port, s.d.nqn(d.Slot), b.Name, slot, port, s.d.nqn(d.Slot))}
	}
	return nil
}

// holderHealth (storage fencing): a volume this replica's index shows
// claimed must be exported to its holder's attachment (or to one of two
// in a migration, or on its way between them); closed, or open to another
// host, the holder cannot connect (storagefence.Fence.ShutOut).
func (s *ControllerServer) holderHealth(d *rds.Disk) []*csi.VolumeHealth_VolumeHealthEntry {
	if s.pub == nil {
		return nil
	}
	holders := s.pub.Fence.ShutOut(d)
	if len(holders) == 0 {
		return nil
	}
	found := "closed"
	if d.Exported {
		found = fmt.Sprintf("open to another host (%s)", d.AllowHost)
	}
	return []*csi.VolumeHealth_VolumeHealthEntry{healthEntry(csi.VolumeHealthErrorType_INACCESSIBLE, HealthHolderShutOut,
		"volume %s is published to node %s, but its export on the RDS is %s, so that node cannot connect; the leader's export reconcile brings it back in line with the live claims at its next pass (--export-reconcile-period): it reopens the export to the holder whose VolumeAttachment still stands, or closes it (event %s, metric rds_csi_export_claim_mismatch_total)",
		d.Slot, strings.Join(holders, " and "), found, fencing.ReasonExportMismatch)}
}

// ControllerGetVolumeHealth reports a volume as INACCESSIBLE when its disk
// is gone but its backing file is still there, or when the disk is not
// exported as nodes expect, and as DATA_LOSS when the disk's backing file
// is gone. (CSI 1.13 replaced ControllerGetVolume's VolumeCondition with
// this RPC.)
func (s *ControllerServer) ControllerGetVolumeHealth(ctx context.Context, req *csi.ControllerGetVolumeHealthRequest) (*csi.ControllerGetVolumeHealthResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, statusf(codes.InvalidArgument, "ControllerGetVolumeHealth: volume ID is required")
	}
	health := &csi.VolumeHealth{VolumeId: id}
	resp := &csi.ControllerGetVolumeHealthResponse{VolumeHealth: health}
	d, err := s.getVolume(ctx, id)
	if err != nil {
		if status.Code(err) != codes.NotFound || !isVolumeID(id) {
			return nil, err
		}
		// No disk: the volume is gone, unless its data still is.
		b, _ := s.d.boxOf(id) // getVolume found its box
		filePath := b.filePath(id)
		_, slot := backends.SplitID(id)
		if _, ferr := b.view.GetFile(ctx, filePath); ferr != nil {
			if errors.Is(ferr, rds.ErrNotFound) {
				return nil, err
			}
			return nil, fmt.Errorf("volume %s: looking up its backing file %s: %w", id, filePath, ferr)
		}
		health.HealthStatuses = append(health.HealthStatuses, healthEntry(csi.VolumeHealthErrorType_INACCESSIBLE, HealthDiskMissing,
			"RDS %s has no disk for volume %s, but its backing file %s is there; re-add the disk (/disk add type=file file-path=%s slot=%q nvme-tcp-export=yes nvme-tcp-server-port=%d nvme-tcp-server-nqn=%q) or delete the volume",
			b.Name, id, filePath, filePath, slot, b.NVMePort, s.d.nqn(id)))
		return resp, nil
	}
	health.HealthStatuses = s.exportHealth(d)
	b, _ := s.d.boxOf(id)
	if _, err := b.view.GetFile(ctx, d.FilePath); errors.Is(err, rds.ErrNotFound) {
		health.HealthStatuses = append(health.HealthStatuses, healthEntry(csi.VolumeHealthErrorType_DATA_LOSS, HealthBackingFileMissing,
			"the backing file %s of volume %s is missing on the RDS; restore it from a snapshot or backup", d.FilePath, id))
	} else if err != nil {
		return nil, fmt.Errorf("volume %s: looking up its backing file %s: %w", id, d.FilePath, err)
	}
	return resp, nil
}

// ControllerListVolumeHealth lists the volumes whose disks are not exported
// as nodes expect. It reads one disk listing; the per-volume checks of the
// backing file are ControllerGetVolumeHealth's.
func (s *ControllerServer) ControllerListVolumeHealth(ctx context.Context, req *csi.ControllerListVolumeHealthRequest) (*csi.ControllerListVolumeHealthResponse, error) {
	if err := checkListArgs("ControllerListVolumeHealth", req.GetMaxEntries(), req.GetStartingToken(), isVolumeID); err != nil {
		return nil, err
	}
	disks, err := s.volumeDisks(ctx)
	if err != nil {
		return nil, err
	}
	var abnormal []*csi.VolumeHealth
	for i := range disks {
		if h := s.exportHealth(&disks[i]); len(h) > 0 {
			abnormal = append(abnormal, &csi.VolumeHealth{VolumeId: disks[i].Slot, HealthStatuses: h})
		}
	}
	entries, next := page(abnormal, (*csi.VolumeHealth).GetVolumeId, req.GetStartingToken(), req.GetMaxEntries())
	return &csi.ControllerListVolumeHealthResponse{Entries: entries, NextToken: next}, nil
}

func (s *ControllerServer) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, statusf(codes.InvalidArgument, "ControllerExpandVolume: volume ID is required")
	}
	if req.GetCapacityRange() == nil {
		return nil, statusf(codes.InvalidArgument, "ControllerExpandVolume: volume %s: capacity range is required", id)
	}
	rng, err := parseRange(id, req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	if rng.required == 0 {
		return nil, statusf(codes.InvalidArgument, "ControllerExpandVolume: volume %s: required_bytes is required", id)
	}
	if c := req.GetVolumeCapability(); c != nil {
		if err := checkCapability(c); err != nil {
			return nil, statusf(codes.InvalidArgument, "volume %s: %v", id, err)
		}
	}
	size, err := createSize(id, rng, 0)
	if err != nil {
		return nil, err
	}
	release, err := s.acquire("volume", id, volumeKey(id))
	if err != nil {
		return nil, err
	}
	defer release()
	d, err := s.getVolume(ctx, id)
	if err != nil {
		return nil, err
	}
	if !rng.fits(d.Size) {
		if d.Size >= rng.required {
			return nil, statusf(codes.OutOfRange, "volume %s has %d bytes, more than limit_bytes %d; volumes never shrink", id, d.Size, rng.limit)
		}
		b, _ := s.d.boxOf(id) // getVolume found its box
		d, err = b.view.ResizeDisk(ctx, id, size)
		switch {
		case errors.Is(err, rds.ErrNoSpace):
			return nil, fmt.Errorf("volume %s: the RDS pool has no room to grow it to %d bytes; free space on the RDS: %w", id, size, err)
		case err != nil:
			return nil, fmt.Errorf("volume %s: growing it to %d bytes on the RDS: %w", id, size, err)
		}
		klog.FromContext(ctx).Info("volume expanded", "volume", id, "bytes", d.Size)
	}
	return &csi.ControllerExpandVolumeResponse{
		CapacityBytes: d.Size,
		// A filesystem must grow on the node; a raw block device is the
		// disk itself. Without a capability, assume a filesystem: a node
		// expansion of a block volume does nothing.
		NodeExpansionRequired: !isBlockOnly(req.GetVolumeCapability()),
	}, nil
}
