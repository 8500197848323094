package csi

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	mount "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"github.com/srvlab/rds-csi/pkg/nvme"
)

// Connector is what the node service needs from the volume transport:
// nvme.TCPConnector in production, nvme.LoopConnector on test machines.
// Device paths are never cached: the kernel may renumber them on every
// reconnect, so each RPC asks DevicePath afresh. RefreshSize makes the
// kernel re-read a grown volume's size (a namespace rescan for NVMe,
// losetup --set-capacity for a loop device) before the filesystem grows.
type Connector interface {
	Connect(ctx context.Context, t nvme.Target) (devicePath string, err error)
	Disconnect(ctx context.Context, nqn string, inUse nvme.InUseFunc) error
	DevicePath(ctx context.Context, nqn string) (string, error)
	RefreshSize(ctx context.Context, nqn string) error
}

var (
	_ Connector = (*nvme.TCPConnector)(nil)
	_ Connector = (*nvme.LoopConnector)(nil)
)

// mkfsOptions make mkfs fast on a large, fresh volume: ext4 leaves the
// inode tables and the journal to the kernel's background initialisation
// (lazy init), and neither mkfs discards the device first: a new RDS disk
// is a fresh sparse file, and discarding a terabyte over NVMe/TCP only
// costs time. xfs allocates inodes dynamically, so its mkfs is fast anyway.
var mkfsOptions = map[string][]string{
	"ext4": {"-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard"},
	"xfs":  {"-K"},
}

// expandWait bounds how long NodeExpandVolume waits for the kernel to
// report the grown size after RefreshSize (an NVMe rescan is asynchronous).
const expandWait = 30 * time.Second

// NodeServer implements the CSI Node service on this node's NVMe/TCP
// initiator.
//
// Staging connects the volume and, for a filesystem volume, mounts it at
// the staging path, formatting only a device that is verifiably blank.
// Publishing bind-mounts the staging path (filesystem) or the device node
// (raw block) at the target path. All state lives in the kernel (the
// connection, the mount table); the server keeps none, so every RPC is
// idempotent and survives a restart of the node plugin. Beside it, the
// node records which volume it mounted where (nodemounts.go): that only
// ties a mount to its volume once the kernel no longer can.
type NodeServer struct {
	csi.UnimplementedNodeServer
	d         *Driver
	connector Connector
	mounter   *mount.SafeFormatAndMount
	resizer   *mount.ResizeFs
	inflight  *InFlight
	auth      nodeAuth
	records   mountRecords
}

// NewNodeServer returns the Node service of d on the host's mount and
// exec. stateDir is where it records the mounts it makes (nodemounts.go),
// so that an unstage or unpublish can tie a mount to its volume after the
// volume's device is gone; "" records none (a mount is then tied by its
// current device alone).
func NewNodeServer(d *Driver, c Connector, stateDir string) *NodeServer {
	m := mount.NewSafeFormatAndMount(mount.New(""), utilexec.New())
	return &NodeServer{d: d, connector: c, mounter: m, resizer: mount.NewResizeFs(m.Exec), inflight: NewInFlight(), records: mountRecords{dir: stateDir}}
}

func nodeKey(id string) string { return "node-volume/" + id }

// acquire serializes the RPCs that change one volume on this node; kubelet
// retries one that finds the volume busy.
func (s *NodeServer) acquire(id string) (func(), error) {
	release, ok := s.inflight.TryAcquire(nodeKey(id))
	if !ok {
		return nil, statusf(codes.Aborted, "an operation on volume %s is already in progress on this node; the request is retried later", id)
	}
	return release, nil
}

// NodeGetCapabilities: CSI 1.13 replaced VOLUME_CONDITION (a condition in
// NodeGetVolumeStats) with GET_VOLUME_HEALTH (NodeGetVolumeHealth); the
// node reports a vanished device or a filesystem the kernel made
// read-only there.
func (s *NodeServer) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	var caps []*csi.NodeServiceCapability
	for _, t := range []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH,
		csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
	} {
		caps = append(caps, &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{
			Rpc: &csi.NodeServiceCapability_RPC{Type: t}}})
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

// hostIdentifier is a connector that presents a host identity to the
// target: nvme.TCPConnector. The loop connector has none.
type hostIdentifier interface {
	HostIdentity() (nvme.HostIdentity, error)
}

var _ hostIdentifier = (*nvme.TCPConnector)(nil)

// NodeID is the CSI node ID this node registers (nodeid.go): the node
// name, and the node key when the node can authenticate (nodeauth.go).
// Storage fencing gives every attachment its own host NQN in
// publish_context, so the node's own NQN says nothing the controller
// needs. The node's NVMe identity is still read (and on first use
// created) in /etc/nvme, for attachments made before per-attachment host
// NQNs: main calls NodeID at startup so that a broken /etc/nvme stops the
// plugin there, before the kubelet registers it.
func (s *NodeServer) NodeID() (string, error) {
	if hi, ok := s.connector.(hostIdentifier); ok {
		if _, err := hi.HostIdentity(); err != nil {
			return "", fmt.Errorf("node %s: NVMe host identity: %w", s.d.opts.NodeID, err)
		}
	}
	return FormatNodeID(s.d.opts.NodeID, s.auth.nodeIDSuffix())
}

func (s *NodeServer) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	if s.d.opts.RDSName == "" {
		// A node without the topology segment would never be chosen for
		// this driver's volumes; refusing to register says why.
		return nil, statusf(codes.FailedPrecondition, "node %s: the RDS this node reaches is not named: set --rds-name (or --rds-address) on the node plugin to the controller's value", s.d.opts.NodeID)
	}
	nodeID, err := s.NodeID()
	if err != nil {
		// The node must not register without the identity the RDS will
		// see; the kubelet retries registration.
		return nil, statusf(codes.FailedPrecondition, "%v", err)
	}
	return &csi.NodeGetInfoResponse{
		NodeId:             nodeID,
		MaxVolumesPerNode:  s.d.opts.MaxVolumesPerNode,
		AccessibleTopology: s.d.nodeTopology(s.d.opts.NodeID),
	}, nil
}

// checkVolumeID validates the volume ID every node RPC carries. An ID this
// driver cannot have made names no volume.
func checkVolumeID(rpc, id string) error {
	if id == "" {
		return statusf(codes.InvalidArgument, "%s: volume ID is required", rpc)
	}
	if !isVolumeID(id) {
		return statusf(codes.NotFound, "%s: volume %q does not exist: this driver's volume IDs are pvc-<uuid> or vol-<32 hex digits>", rpc, id)
	}
	return nil
}

// beginPathRPC validates the volume ID and one path argument of an RPC
// and marks the volume busy; release must be called when the RPC ends.
func (s *NodeServer) beginPathRPC(rpc, id, what, p string) (release func(), err error) {
	if id == "" {
		return nil, statusf(codes.InvalidArgument, "%s: volume ID is required", rpc)
	}
	if err := checkPath(rpc, id, what, p); err != nil {
		return nil, err
	}
	if err := checkVolumeID(rpc, id); err != nil {
		return nil, err
	}
	return s.acquire(id)
}

// checkPath validates a path argument: required and absolute.
func checkPath(rpc, id, what, p string) error {
	if p == "" {
		return statusf(codes.InvalidArgument, "%s: volume %s: %s is required", rpc, id, what)
	}
	if !filepath.IsAbs(p) {
		return statusf(codes.InvalidArgument, "%s: volume %s: %s %q is not an absolute path", rpc, id, what, p)
	}
	return nil
}

// checkCapabilityArg validates a request's volume capability.
func checkCapabilityArg(rpc, id string, c *csi.VolumeCapability) error {
	if c == nil {
		return statusf(codes.InvalidArgument, "%s: volume %s: volume capability is required", rpc, id)
	}
	if err := checkCapability(c); err != nil {
		return statusf(codes.InvalidArgument, "%s: volume %s: %v", rpc, id, err)
	}
	return nil
}

// target is where a volume is exported. The NQN is always derived from
// the volume ID (the rule CreateVolume used), because NodeUnstageVolume
// gets nothing else; a volume_context that names another NQN is refused,
// or the volume could be connected under one name and never disconnected.
func (s *NodeServer) target(id string, vc map[string]string) (nvme.Target, error) {
	nqn := s.d.nqn(id)
	if v, ok := vc[VolumeContextNQN]; ok && v != nqn {
		return nvme.Target{}, statusf(codes.InvalidArgument, "volume %s: volume_context nqn %q is not the NQN this driver exports the volume under (%q, --nqn-prefix %q); fix the PersistentVolume's volumeAttributes", id, v, nqn, s.d.opts.NQNPrefix)
	}
	// Without a target in the context, the volume's own box's: the
	// default box's is the --nvme-address flag, as before there were
	// several boxes; never another box's, which exports its own volume of
	// the same slot under the same NQN.
	b, err := s.d.boxOf(id)
	if err != nil {
		return nvme.Target{}, err
	}
	addr, port := vc[VolumeContextNVMeAddress], b.NVMePort
	if addr == "" && !b.Default {
		addr = b.nvmeAddress()
	}
	if addr == "" && b.Default {
		addr = s.d.opts.NVMeAddress
	}
	if addr == "" {
		return nvme.Target{}, statusf(codes.InvalidArgument, "volume %s: volume_context has no %s and the node plugin has no NVMe/TCP address of RDS %s to fall back on (--nvme-address, or the box's nvmeAddress or address in --rds-config)", id, VolumeContextNVMeAddress, b.Name)
	}
	if v, ok := vc[VolumeContextNVMePort]; ok {
		p, err := strconv.Atoi(v)
		if err != nil || p < 1 || p > 65535 {
			return nvme.Target{}, statusf(codes.InvalidArgument, "volume %s: volume_context %s %q is not a TCP port", id, VolumeContextNVMePort, v)
		}
		port = p
	}
	return nvme.Target{Address: addr, Port: port, NQN: nqn}, nil
}

// stageContext merges the publish_context over the volume_context: both
// carry the target (same keys), and the controller's answer at attach time
// is fresher than what was recorded in the PV at provisioning.
func stageContext(volume, publish map[string]string) map[string]string {
	if len(publish) == 0 {
		return volume
	}
	merged := make(map[string]string, len(volume)+len(publish))
	for k, v := range volume {
		merged[k] = v
	}
	for k, v := range publish {
		merged[k] = v
	}
	return merged
}

// attachmentHost is the host NQN NodeStageVolume connects with: the
// attachment's own, from publish_context (storage fencing gives every
// attachment one, and the RDS export allows exactly it), validated here so
// that a bad one is the CO's InvalidArgument and never reaches the
// kernel. "" when absent: an attachment made before per-attachment host
// NQNs, or without storage fencing, connects as the node, as before. Only
// publish_context counts: the host belongs to the attachment, which a
// volume_context (the PV's attributes) does not know.
func attachmentHost(id string, pc map[string]string) (string, error) {
	nqn, ok := pc[PublishContextHostNQN]
	if !ok {
		return "", nil
	}
	if _, err := nvme.AttachmentHostIdentity(nqn); err != nil {
		return "", statusf(codes.InvalidArgument, "volume %s: publish_context %s: %v; ControllerPublishVolume derives it, so check that the controller and the node plugin run the same release", id, PublishContextHostNQN, err)
	}
	return nqn, nil
}

// device resolves a volume's current device and its number. A volume that
// is not connected on this node is FAILED_PRECONDITION with the next step.
func (s *NodeServer) device(ctx context.Context, id string) (string, devNumber, error) {
	dev, err := s.connector.DevicePath(ctx, s.d.nqn(id))
	if errors.Is(err, nvme.ErrNotConnected) || errors.Is(err, nvme.ErrNoDevice) {
		return "", devNumber{}, statusf(codes.FailedPrecondition, "volume %s is not connected on this node (%v); NodeStageVolume must succeed first", id, err)
	}
	if err != nil {
		return "", devNumber{}, fmt.Errorf("volume %s: finding its device: %w", id, err)
	}
	num, err := deviceNumber(dev)
	if err != nil {
		return "", devNumber{}, fmt.Errorf("volume %s: %w", id, err)
	}
	return dev, num, nil
}

func (s *NodeServer) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	const rpc = "NodeStageVolume"
	id, staging, c := req.GetVolumeId(), req.GetStagingTargetPath(), req.GetVolumeCapability()
	if id == "" {
		return nil, statusf(codes.InvalidArgument, "%s: volume ID is required", rpc)
	}
	if err := checkPath(rpc, id, "staging target path", staging); err != nil {
		return nil, err
	}
	if err := checkCapabilityArg(rpc, id, c); err != nil {
		return nil, err
	}
	if err := checkVolumeID(rpc, id); err != nil {
		return nil, err
	}
	t, err := s.target(id, stageContext(req.GetVolumeContext(), req.GetPublishContext()))
	if err != nil {
		return nil, err
	}
	if t.HostNQN, err = attachmentHost(id, req.GetPublishContext()); err != nil {
		return nil, err
	}
	if t.Secret, err = s.attachmentSecret(id, req.GetPublishContext()); err != nil {
		return nil, err
	}
	release, err := s.acquire(id)
	if err != nil {
		return nil, err
	}
	defer release()

	logger := klog.FromContext(ctx).WithValues("volume", id)
	dev, err := s.connector.Connect(ctx, t)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			// The loop connector's backing file is gone: the disk was deleted.
			return nil, statusf(codes.NotFound, "volume %s does not exist on the RDS: %v", id, err)
		}
		return nil, fmt.Errorf("volume %s: connecting %s at %s port %d: %w", id, t.NQN, t.Address, t.Port, err)
	}
	logger.V(2).Info("connected", "device", dev, "nqn", t.NQN, "attachmentHostNQN", t.HostNQN != "", "authenticated", !t.Secret.IsZero())
	if c.GetBlock() != nil {
		// Nothing to mount: NodePublishVolume exposes the device itself.
		logger.Info("staged raw block volume", "device", dev)
		return &csi.NodeStageVolumeResponse{}, nil
	}
	if err := s.stageFilesystem(ctx, id, dev, staging, c); err != nil {
		return nil, err
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

// fsTypeOf is the filesystem a mount capability asks for.
func fsTypeOf(c *csi.VolumeCapability) string {
	if fs := c.GetMount().GetFsType(); fs != "" {
		return fs
	}
	return DefaultFsType
}

// mountOptions are the options a filesystem volume is staged with.
func mountOptions(fsType string, flags []string, readOnly bool) []string {
	var opts []string
	add := func(o string) {
		if o != "" && !slices.Contains(opts, o) {
			opts = append(opts, o)
		}
	}
	for _, f := range flags {
		add(f)
	}
	if readOnly {
		add("ro")
	}
	if fsType == "xfs" {
		// A clone or a restored snapshot carries its source's xfs UUID;
		// without nouuid the two cannot be mounted on one node.
		add("nouuid")
	}
	return opts
}

func (s *NodeServer) stageFilesystem(ctx context.Context, id, dev, staging string, c *csi.VolumeCapability) error {
	logger := klog.FromContext(ctx).WithValues("volume", id, "device", dev, "stagingPath", staging)
	fsType := fsTypeOf(c)
	readOnly := c.GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
	opts := mountOptions(fsType, c.GetMount().GetMountFlags(), readOnly)

	devNum, err := deviceNumber(dev)
	if err != nil {
		return fmt.Errorf("volume %s: %w", id, err)
	}
	mounted, err := mountAt(staging)
	if err != nil {
		return err
	}
	if mounted != nil {
		if mounted.dev() != devNum {
			return statusf(codes.AlreadyExists, "volume %s: staging path %s already has another device (%s, %s) mounted, not %s (%s); unmount it", id, staging, mounted.Source, mounted.dev(), dev, devNum)
		}
		if mounted.FsType != fsType {
			return statusf(codes.AlreadyExists, "volume %s is already staged at %s as %s, not %s", id, staging, mounted.FsType, fsType)
		}
		if mounted.readOnly() != readOnly {
			return statusf(codes.AlreadyExists, "volume %s is already staged at %s with read-only %t, not %t", id, staging, mounted.readOnly(), readOnly)
		}
		// Staged by a node plugin that kept no records: recorded now.
		if err := s.ensureRecord(ctx, id, staging, devNum); err != nil {
			return err
		}
		logger.V(2).Info("already staged")
		return nil
	}
	if err := checkUnmountedStaging("NodeStageVolume", id, staging); err != nil {
		return err
	}
	if err := os.MkdirAll(staging, 0o750); err != nil {
		return fmt.Errorf("volume %s: creating staging path: %w", id, err)
	}
	if err := s.records.write(id, staging, devNum); err != nil {
		return err
	}

	// SafeFormatAndMount formats whenever blkid exits 2, and blkid exits 2
	// also when it could not open or read the device. So the node decides
	// itself: format only a device that blkid finds no signature on AND
	// that reads back blank (verifyBlank); mount an existing filesystem
	// without ever handing it to the formatting path.
	existing, err := s.mounter.GetDiskFormat(dev)
	if err != nil {
		return fmt.Errorf("volume %s: probing %s for a filesystem: %w; a device that cannot be probed is never formatted", id, dev, err)
	}
	switch {
	case existing == "":
		if readOnly {
			return statusf(codes.FailedPrecondition, "volume %s has no filesystem, and a MULTI_NODE_READER_ONLY volume is never formatted; stage it read-write once first", id)
		}
		if err := verifyBlank(id, dev); err != nil {
			return err
		}
		logger.Info("formatting blank volume", "fsType", fsType)
		start := time.Now()
		if err := s.mounter.FormatAndMountSensitiveWithFormatOptions(dev, staging, fsType, opts, nil, mkfsOptions[fsType]); err != nil {
			return fmt.Errorf("volume %s: formatting %s as %s and mounting it at %s: %w", id, dev, fsType, staging, err)
		}
		logger.Info("formatted and staged", "fsType", fsType, "duration", time.Since(start))
	case existing != fsType:
		return statusf(codes.FailedPrecondition, "volume %s already holds %s, not the requested %s; existing data is never reformatted: request fsType %q for this volume, or move its data elsewhere", id, existing, fsType, existing)
	default:
		if err := s.mounter.Mount(dev, staging, fsType, opts); err != nil {
			return fmt.Errorf("volume %s: mounting %s (%s) at %s: %w", id, dev, fsType, staging, err)
		}
		if !readOnly {
			// A volume restored from a snapshot or cloned into a larger
			// size has a device larger than its filesystem, and no
			// NodeExpandVolume follows: grow it here. resize2fs and
			// xfs_growfs do nothing when it already fills the device.
			if _, err := s.resizer.Resize(dev, staging); err != nil {
				if uerr := s.mounter.Unmount(staging); uerr != nil {
					logger.Error(uerr, "unmounting after a failed resize")
				}
				return fmt.Errorf("volume %s: growing the %s filesystem on %s to the size of the volume: %w", id, fsType, dev, err)
			}
		}
		logger.Info("staged existing filesystem", "fsType", fsType)
	}
	return nil
}

func (s *NodeServer) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	const rpc = "NodeUnstageVolume"
	id, staging := req.GetVolumeId(), req.GetStagingTargetPath()
	release, err := s.beginPathRPC(rpc, id, "staging target path", staging)
	if err != nil {
		return nil, err
	}
	defer release()
	// What is checked is what is unmounted: the path as the kernel
	// resolves it (a ".." after a symbolic link included).
	staging = canonicalPath(staging)

	logger := klog.FromContext(ctx).WithValues("volume", id, "stagingPath", staging)
	nqn := s.d.nqn(id)
	mounted, err := mountAt(staging)
	if err != nil {
		return nil, err
	}
	if mounted != nil {
		// kubelet gives every volume its own staging path, but whatever
		// the caller, only what can be tied to this volume is unmounted.
		dev, err := s.checkOwnMount(ctx, rpc, id, "staging path", mounted)
		if err != nil {
			return nil, err
		}
		// Refuse before touching anything while the filesystem is still
		// published: unmounting the staging path would succeed and leave
		// the publishes on a volume that is about to be disconnected.
		users, err := deviceMounts(dev)
		if err != nil {
			return nil, err
		}
		var others []string
		for _, m := range users {
			if m.MountPoint != mounted.MountPoint {
				others = append(others, m.MountPoint)
			}
		}
		if len(others) > 0 {
			return nil, statusf(codes.FailedPrecondition, "volume %s is still published on this node at %v; unpublish it before unstaging", id, others)
		}
		if err := s.mounter.Unmount(staging); err != nil {
			return nil, fmt.Errorf("volume %s: unmounting staging path %s: %w", id, staging, err)
		}
		if still, err := mountAt(staging); err != nil {
			return nil, err
		} else if still != nil {
			return nil, fmt.Errorf("volume %s: %s is still mounted after umount (%s); check the node's mount table", id, staging, still.Source)
		}
		logger.Info("unmounted staging path")
	}
	if err := s.records.remove(ctx, id, staging); err != nil {
		return nil, err
	}
	if err := s.connector.Disconnect(ctx, nqn, s.inUse); err != nil {
		return nil, fmt.Errorf("volume %s: disconnecting %s: %w", id, nqn, err)
	}
	// The staging directory itself belongs to kubelet (it creates it);
	// only what the driver made goes away.
	logger.Info("unstaged")
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// ensureRecord records the mount of volume id at p from device dev unless
// its record says so already: for a mount made before the node plugin
// kept records, found again by an idempotent stage or publish.
func (s *NodeServer) ensureRecord(ctx context.Context, id, p string, dev devNumber) error {
	if rec := s.records.read(ctx, p); rec != nil && rec.Volume == id && rec.Device == dev.String() {
		return nil
	}
	return s.records.write(id, p, dev)
}

// inUse is the question Disconnect asks before it disconnects: a volume is
// in use on this node while its device appears in the mount table, either
// as a mounted filesystem (the staging mount and the publish bind mounts
// of it) or as a bind-mounted device node (a raw block publish). The mount
// table is the kernel's own record, so the answer is right after a restart
// of the node plugin and for mounts the plugin did not make.
func (s *NodeServer) inUse(ctx context.Context, nqn string) (bool, error) {
	dev, err := s.connector.DevicePath(ctx, nqn)
	if errors.Is(err, nvme.ErrNotConnected) || errors.Is(err, nvme.ErrNoDevice) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	num, err := deviceNumber(dev)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	users, err := deviceMounts(num)
	if err != nil {
		return false, err
	}
	if len(users) > 0 {
		klog.FromContext(ctx).Info("device still mounted; not disconnecting", "nqn", nqn, "device", dev, "mountPoint", users[0].MountPoint)
	}
	return len(users) > 0, nil
}

func (s *NodeServer) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	const rpc = "NodePublishVolume"
	id, target, staging, c := req.GetVolumeId(), req.GetTargetPath(), req.GetStagingTargetPath(), req.GetVolumeCapability()
	if id == "" {
		return nil, statusf(codes.InvalidArgument, "%s: volume ID is required", rpc)
	}
	if err := checkPath(rpc, id, "target path", target); err != nil {
		return nil, err
	}
	if err := checkCapabilityArg(rpc, id, c); err != nil {
		return nil, err
	}
	// STAGE_UNSTAGE_VOLUME is advertised, so the staging path is required.
	if err := checkPath(rpc, id, "staging target path", staging); err != nil {
		return nil, err
	}
	if err := checkVolumeID(rpc, id); err != nil {
		return nil, err
	}
	if _, err := s.target(id, req.GetVolumeContext()); err != nil {
		return nil, err
	}
	release, err := s.acquire(id)
	if err != nil {
		return nil, err
	}
	defer release()
	dev, num, err := s.device(ctx, id)
	if err != nil {
		return nil, err
	}
	if c.GetBlock() != nil {
		err = s.publishBlock(ctx, id, dev, num, target, c, req.GetReadonly())
	} else {
		err = s.publishFilesystem(ctx, id, num, staging, target, c, req.GetReadonly())
	}
	if err != nil {
		return nil, err
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

func bindOptions(readOnly bool) []string {
	if readOnly {
		return []string{"bind", "ro"}
	}
	return []string{"bind"}
}

// checkSingleWriter refuses a second publish of a SINGLE_NODE_SINGLE_WRITER
// (ReadWriteOncePod) volume: users lists the device's mounts, and any
// other than the staging path and the requested target is a publish for
// another pod.
func checkSingleWriter(id, target, staging string, c *csi.VolumeCapability, users []mountEntry) error {
	if c.GetAccessMode().GetMode() != csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER {
		return nil
	}
	target, staging = canonicalPath(target), canonicalPath(staging)
	for _, m := range users {
		if m.MountPoint != target && m.MountPoint != staging {
			return statusf(codes.FailedPrecondition, "volume %s is SINGLE_NODE_SINGLE_WRITER (ReadWriteOncePod) and already published at %s on this node; it cannot also be published at %s", id, m.MountPoint, target)
		}
	}
	return nil
}

func (s *NodeServer) publishFilesystem(ctx context.Context, id string, num devNumber, staging, target string, c *csi.VolumeCapability, readOnly bool) error {
	staged, err := mountAt(staging)
	if err != nil {
		return err
	}
	if staged == nil || staged.dev() != num {
		return statusf(codes.FailedPrecondition, "volume %s is not staged at %s; NodeStageVolume must succeed first", id, staging)
	}
	if staged.readOnly() && !readOnly {
		readOnly = true // a read-only stage (MULTI_NODE_READER_ONLY) cannot be published writable
	}
	existing, err := mountAt(target)
	if err != nil {
		return err
	}
	if existing != nil {
		if existing.dev() == num && existing.readOnly() == readOnly {
			return s.ensureRecord(ctx, id, target, num)
		}
		return statusf(codes.AlreadyExists, "volume %s: target path %s already has a different mount (%s, %s, read-only %t); requested: the volume, read-only %t", id, target, existing.Source, existing.dev(), existing.readOnly(), readOnly)
	}
	users, err := deviceMounts(num)
	if err != nil {
		return err
	}
	if err := checkSingleWriter(id, target, staging, c, users); err != nil {
		return err
	}
	if err := checkUnmountedTarget("NodePublishVolume", id, target); err != nil {
		return err
	}
	if err := os.MkdirAll(target, 0o750); err != nil {
		return fmt.Errorf("volume %s: creating target path: %w", id, err)
	}
	if err := s.records.write(id, target, num); err != nil {
		return err
	}
	if err := s.mounter.Mount(staging, target, "", bindOptions(readOnly)); err != nil {
		return fmt.Errorf("volume %s: bind-mounting %s at %s: %w", id, staging, target, err)
	}
	klog.FromContext(ctx).Info("published", "volume", id, "targetPath", target, "readOnly", readOnly)
	return nil
}

// publishBlock bind-mounts the volume's device node onto a file at target.
// A read-only publish is a read-only bind mount; the kernel does not stop
// writes through a device node on a read-only mount, so for raw block it is
// the container runtime that enforces it (kubelet grants the container the
// device read-only).
func (s *NodeServer) publishBlock(ctx context.Context, id, dev string, num devNumber, target string, c *csi.VolumeCapability, readOnly bool) error {
	existing, err := mountAt(target)
	if err != nil {
		return err
	}
	if existing != nil {
		got, err := deviceNumber(target)
		if err == nil && got == num && existing.readOnly() == readOnly {
			return s.ensureRecord(ctx, id, target, num)
		}
		return statusf(codes.AlreadyExists, "volume %s: target path %s already has a different mount (%s, read-only %t); requested: device %s, read-only %t", id, target, existing.Source, existing.readOnly(), dev, readOnly)
	}
	users, err := deviceMounts(num)
	if err != nil {
		return err
	}
	if err := checkSingleWriter(id, target, "", c, users); err != nil {
		return err
	}
	if err := checkUnmountedTarget("NodePublishVolume", id, target); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		return fmt.Errorf("volume %s: creating the target's directory: %w", id, err)
	}
	f, err := os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o640)
	if err != nil {
		return fmt.Errorf("volume %s: creating target file %s: %w", id, target, err)
	}
	f.Close()
	if err := s.records.write(id, target, num); err != nil {
		return err
	}
	if err := s.mounter.Mount(dev, target, "", bindOptions(readOnly)); err != nil {
		return fmt.Errorf("volume %s: bind-mounting device %s at %s: %w", id, dev, target, err)
	}
	klog.FromContext(ctx).Info("published raw block", "volume", id, "device", dev, "targetPath", target, "readOnly", readOnly)
	return nil
}

func (s *NodeServer) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	const rpc = "NodeUnpublishVolume"
	id, target := req.GetVolumeId(), req.GetTargetPath()
	release, err := s.beginPathRPC(rpc, id, "target path", target)
	if err != nil {
		return nil, err
	}
	defer release()
	// What is checked is what is unmounted and removed: the path as the
	// kernel resolves it (a ".." after a symbolic link included).
	target = canonicalPath(target)
	mounted, err := mountAt(target)
	if err != nil {
		return nil, err
	}
	if mounted != nil {
		// Only a mount that can be tied to this volume is unmounted
		// (also one whose device vanished, by the node's record).
		if _, err := s.checkOwnMount(ctx, rpc, id, "target path", mounted); err != nil {
			return nil, err
		}
	} else if err := checkUnmountedTarget(rpc, id, target); err != nil {
		// Nothing mounted: only what a publish leaves is removed.
		return nil, err
	}
	// Unmounts if mounted and removes the directory or file; a path that
	// does not exist is success.
	if err := mount.CleanupMountPoint(target, s.mounter, true); err != nil {
		return nil, fmt.Errorf("volume %s: unpublishing %s: %w", id, target, err)
	}
	if err := s.records.remove(ctx, id, target); err != nil {
		return nil, err
	}
	klog.FromContext(ctx).Info("unpublished", "volume", id, "targetPath", target)
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// checkVolumePath validates a given volume_path of NodeGetVolumeStats and
// NodeExpandVolume. A path that is not absolute cannot be where kubelet
// put the volume, so it is reported as the volume not being there.
func checkVolumePath(rpc, id, p string) error {
	if !filepath.IsAbs(p) {
		return statusf(codes.NotFound, "%s: volume %s is not at %q: not an absolute path", rpc, id, p)
	}
	return nil
}

func (s *NodeServer) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	const rpc = "NodeGetVolumeStats"
	id, p := req.GetVolumeId(), req.GetVolumePath()
	if id == "" {
		return nil, statusf(codes.InvalidArgument, "%s: volume ID is required", rpc)
	}
	if p == "" {
		return nil, statusf(codes.InvalidArgument, "%s: volume %s: volume path is required", rpc, id)
	}
	if err := checkVolumeID(rpc, id); err != nil {
		return nil, err
	}
	if err := checkVolumePath(rpc, id, p); err != nil {
		return nil, err
	}
	mounted, err := mountAt(p)
	if err != nil {
		return nil, err
	}
	if mounted == nil {
		if pathMissing(p) {
			return nil, statusf(codes.NotFound, "volume %s: volume path %s does not exist", id, p)
		}
		return nil, statusf(codes.NotFound, "volume %s is not mounted at %s", id, p)
	}
	_, num, err := s.device(ctx, id)
	if err != nil {
		if status.Code(err) == codes.FailedPrecondition {
			return nil, statusf(codes.NotFound, "volume %s is mounted at %s but not connected on this node; NodeGetVolumeHealth reports why", id, p)
		}
		return nil, err
	}
	if isBlockDevice(p) {
		got, err := deviceNumber(p)
		if err != nil || got != num {
			return nil, statusf(codes.NotFound, "volume %s is not the device published at %s", id, p)
		}
		size, err := blockDeviceSize(p)
		if err != nil {
			return nil, fmt.Errorf("volume %s: %w", id, err)
		}
		return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{{Unit: csi.VolumeUsage_BYTES, Total: size}}}, nil
	}
	if mounted.dev() != num {
		return nil, statusf(codes.NotFound, "volume %s is not what is mounted at %s (%s, %s)", id, p, mounted.Source, mounted.dev())
	}
	usage, err := filesystemUsage(p)
	if err != nil {
		return nil, fmt.Errorf("volume %s: %w", id, err)
	}
	return &csi.NodeGetVolumeStatsResponse{Usage: usage}, nil
}

func (s *NodeServer) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	const rpc = "NodeExpandVolume"
	id, p := req.GetVolumeId(), req.GetVolumePath()
	if id == "" {
		return nil, statusf(codes.InvalidArgument, "%s: volume ID is required", rpc)
	}
	if p == "" {
		return nil, statusf(codes.InvalidArgument, "%s: volume %s: volume path is required", rpc, id)
	}
	c := req.GetVolumeCapability()
	if c != nil {
		if err := checkCapabilityArg(rpc, id, c); err != nil {
			return nil, err
		}
	}
	rng, err := parseRange(id, req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	if err := checkVolumeID(rpc, id); err != nil {
		return nil, err
	}
	if err := checkVolumePath(rpc, id, p); err != nil {
		return nil, err
	}
	release, err := s.acquire(id)
	if err != nil {
		return nil, err
	}
	defer release()

	dev, num, err := s.device(ctx, id)
	if err != nil {
		if status.Code(err) == codes.FailedPrecondition {
			return nil, statusf(codes.NotFound, "volume %s is not staged on this node, so it cannot be expanded at %s", id, p)
		}
		return nil, err
	}
	block := c.GetBlock() != nil || isBlockDevice(p)
	var mounted *mountEntry
	if block {
		// A raw block volume's path is its published device node (or a
		// path with nothing mounted, such as its staging directory); a
		// mount or a device node of anything else is not this volume.
		if got, err := deviceNumber(p); err == nil && got != num {
			return nil, statusf(codes.NotFound, "volume %s is not the device at %s (%s); it is %s (%s)", id, p, got, dev, num)
		}
		if m, err := mountAt(p); err != nil {
			return nil, err
		} else if m != nil && mountDevice(m) != num {
			return nil, statusf(codes.NotFound, "volume %s is not what is mounted at %s (%s, %s)", id, p, m.Source, mountDevice(m))
		}
	} else {
		mounted, err = mountAt(p)
		if err != nil {
			return nil, err
		}
		if mounted == nil || mounted.dev() != num {
			return nil, statusf(codes.NotFound, "volume %s is not staged or published at %s", id, p)
		}
		if mounted.superReadOnly() {
			return nil, statusf(codes.FailedPrecondition, "volume %s: the filesystem at %s is read-only and cannot grow; restage it read-write", id, p)
		}
	}
	if err := s.connector.RefreshSize(ctx, s.d.nqn(id)); err != nil {
		return nil, fmt.Errorf("volume %s: making the kernel re-read the size of %s: %w", id, dev, err)
	}
	size, err := waitForSize(ctx, dev, rng.required)
	if err != nil {
		return nil, fmt.Errorf("volume %s: %w", id, err)
	}
	logger := klog.FromContext(ctx).WithValues("volume", id, "device", dev, "bytes", size)
	if block {
		logger.Info("raw block volume: the device has the new size")
		return &csi.NodeExpandVolumeResponse{CapacityBytes: size}, nil
	}
	// resize2fs grows ext4 through the device, xfs_growfs through any
	// mount point of the filesystem; both do nothing when it already fills
	// the device, so a repeated call is harmless.
	if _, err := s.resizer.Resize(dev, p); err != nil {
		return nil, fmt.Errorf("volume %s: growing the %s filesystem at %s: %w", id, mounted.FsType, p, err)
	}
	logger.Info("filesystem expanded", "volumePath", p)
	return &csi.NodeExpandVolumeResponse{CapacityBytes: size}, nil
}

// waitForSize returns the device's size once it is at least want bytes.
// An NVMe rescan updates the size asynchronously, so it polls, bounded by
// ctx and expandWait.
func waitForSize(ctx context.Context, dev string, want int64) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, expandWait)
	defer cancel()
	tick := time.NewTicker(nvme.DefaultPollInterval)
	defer tick.Stop()
	for {
		size, err := blockDeviceSize(dev)
		if err != nil {
			return 0, err
		}
		if size >= want {
			return size, nil
		}
		select {
		case <-ctx.Done():
			return 0, statusf(codes.FailedPrecondition, "device %s still has %d bytes, less than the %d requested; the volume has not grown on the RDS (check ControllerExpandVolume) or the kernel has not seen it yet", dev, size, want)
		case <-tick.C:
		}
	}
}
