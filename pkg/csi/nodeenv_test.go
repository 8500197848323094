package csi

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/srvlab/rds-csi/pkg/nvme"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// nodeTools are the host tools the node path runs for real;
// hack/install-deps.sh installs them (make test runs it).
var nodeTools = []string{"losetup", "blkid", "mount", "umount", "mkfs.ext4", "resize2fs", "mkfs.xfs", "xfs_growfs"}

// requireNodeHost skips a test that needs real loop devices and mounts
// unless it runs as root, fails it when a tool is missing, and, whatever
// happens in the test, unmounts everything mounted below the test's
// temporary directories and detaches every loop device over a file there
// before they are removed.
func requireNodeHost(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("node service tests need root: they attach real loop devices, run mkfs and mount (run go test as root)")
	}
	for _, tool := range nodeTools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed: run hack/install-deps.sh (make test does)", tool)
		}
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Fatalf("no loop device support: %v", err)
	}
	// t.TempDir registers its removal now, so this cleanup runs before it.
	base := filepath.Dir(t.TempDir())
	t.Cleanup(func() { cleanupNodeHost(t, base) })
}

func cleanupNodeHost(t testing.TB, base string) {
	t.Helper()
	unmountBelow(t, base)
	detachLoops(t, func(backFile string) bool { return strings.HasPrefix(backFile, base) })
}

// unmountBelow unmounts every mount point below dir, topmost first.
func unmountBelow(t testing.TB, dir string) {
	t.Helper()
	mounts, err := readMounts()
	if err != nil {
		t.Errorf("cleanup: %v", err)
		return
	}
	prefix := strings.TrimSuffix(dir, string(filepath.Separator)) + string(filepath.Separator)
	for i := len(mounts) - 1; i >= 0; i-- {
		mp := mounts[i].MountPoint
		if !strings.HasPrefix(mp, prefix) {
			continue
		}
		if err := unix.Unmount(mp, 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			t.Errorf("cleanup: unmounting %s: %v; detaching it lazily", mp, err)
			_ = unix.Unmount(mp, unix.MNT_DETACH)
		}
	}
}

// detachLoops detaches every loop device whose backing file matches
// (also one whose file was deleted while attached).
func detachLoops(t testing.TB, match func(backFile string) bool) {
	t.Helper()
	out, err := exec.Command("losetup", "--list", "--json", "--output", "NAME,BACK-FILE").Output()
	if err != nil || len(bytes.TrimSpace(out)) == 0 {
		return
	}
	var list struct {
		LoopDevices []struct {
			Name     string `json:"name"`
			BackFile string `json:"back-file"`
		} `json:"loopdevices"`
	}
	if err := json.Unmarshal(out, &list); err != nil {
		t.Errorf("cleanup: %v", err)
		return
	}
	for _, d := range list.LoopDevices {
		if match(strings.TrimSuffix(d.BackFile, " (deleted)")) {
			if out, err := exec.Command("losetup", "--detach", d.Name).CombinedOutput(); err != nil {
				t.Errorf("cleanup: detaching %s (%s): %v: %s", d.Name, d.BackFile, err, out)
			}
		}
	}
}

func mountCapability(fsType string, mode csi.VolumeCapability_AccessMode_Mode, flags ...string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fsType, MountFlags: flags}},
	}
}

func blockCapability(mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
	}
}

// nodeVolume is one volume walked through the node service in a test.
type nodeVolume struct {
	env     *simEnv
	vol     *csi.Volume
	cap     *csi.VolumeCapability
	staging string
	target  string
}

// newNodeVolume creates a volume of size bytes with the controller and
// picks fresh staging and target paths for it (kubelet's layout: the
// staging directory exists, the target's parent exists).
func newNodeVolume(t testing.TB, env *simEnv, name string, size int64, c *csi.VolumeCapability) *nodeVolume {
	t.Helper()
	resp, err := env.ctrl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{
		Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{c},
	})
	if err != nil {
		t.Fatalf("CreateVolume %s: %v", name, err)
	}
	return newNodeVolumeFor(t, env, resp.Volume, c)
}

// newNodeVolumeFor is newNodeVolume for a volume created otherwise (from
// a snapshot, a clone).
func newNodeVolumeFor(t testing.TB, env *simEnv, vol *csi.Volume, c *csi.VolumeCapability) *nodeVolume {
	t.Helper()
	dir := t.TempDir()
	// Registered after TempDir, so it runs before the directory goes:
	// whatever the test did, nothing stays mounted there or attached.
	disk, _ := env.disk(vol.VolumeId)
	t.Cleanup(func() {
		unmountBelow(t, dir)
		detachLoops(t, func(f string) bool { return f == disk.BackingFile })
	})
	staging := filepath.Join(dir, "staging")
	if err := os.Mkdir(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	return &nodeVolume{env: env, vol: vol, cap: c, staging: staging, target: filepath.Join(dir, "pod", "mount")}
}

func (v *nodeVolume) id() string { return v.vol.VolumeId }

func (v *nodeVolume) stage(t testing.TB) error {
	t.Helper()
	_, err := v.env.node.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{
		VolumeId: v.id(), StagingTargetPath: v.staging, VolumeCapability: v.cap, VolumeContext: v.vol.VolumeContext,
	})
	return err
}

func (v *nodeVolume) publish(t testing.TB, readOnly bool) error {
	t.Helper()
	_, err := v.env.node.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{
		VolumeId: v.id(), StagingTargetPath: v.staging, TargetPath: v.target, VolumeCapability: v.cap,
		VolumeContext: v.vol.VolumeContext, Readonly: readOnly,
	})
	return err
}

func (v *nodeVolume) unpublish(t testing.TB) error {
	t.Helper()
	_, err := v.env.node.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: v.id(), TargetPath: v.target})
	return err
}

func (v *nodeVolume) unstage(t testing.TB) error {
	t.Helper()
	_, err := v.env.node.NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: v.id(), StagingTargetPath: v.staging})
	return err
}

func (v *nodeVolume) must(t testing.TB, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s %s: %v", what, v.id(), err)
	}
}

// stageAndPublish stages and publishes read-write, each twice: the second
// call of each must succeed as a no-op.
func (v *nodeVolume) stageAndPublish(t testing.TB) {
	t.Helper()
	for range 2 {
		v.must(t, "NodeStageVolume", v.stage(t))
	}
	for range 2 {
		v.must(t, "NodePublishVolume", v.publish(t, false))
	}
}

// teardown unpublishes and unstages, each twice.
func (v *nodeVolume) teardown(t testing.TB) {
	t.Helper()
	for range 2 {
		v.must(t, "NodeUnpublishVolume", v.unpublish(t))
	}
	for range 2 {
		v.must(t, "NodeUnstageVolume", v.unstage(t))
	}
}

// device is the loop device the volume is attached as, or "" when it is
// not attached.
func (v *nodeVolume) device(t testing.TB) string {
	t.Helper()
	dev, err := v.env.ns.connector.DevicePath(context.Background(), v.vol.VolumeContext[VolumeContextNQN])
	if errors.Is(err, nvme.ErrNotConnected) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return dev
}

// blkidType is what blkid finds on a device, read by the test itself.
func blkidType(t testing.TB, dev string) string {
	t.Helper()
	out, err := exec.Command("blkid", "-p", "-s", "TYPE", "-o", "value", dev).Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) && exit.ExitCode() == 2 {
			return ""
		}
		t.Fatalf("blkid %s: %v", dev, err)
	}
	return strings.TrimSpace(string(out))
}

func isMounted(t testing.TB, p string) bool {
	t.Helper()
	m, err := mountAt(p)
	if err != nil {
		t.Fatal(err)
	}
	return m != nil
}

const (
	sw   = csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	sswr = csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
	mnro = csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
)

// xfs refuses filesystems under 300 MB.
const nodeTestSize = 512 * rds.MiB

func randomBytes(t testing.TB, n int64) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func writeSynced(t testing.TB, path string, data []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func writeAt(t *testing.T, path string, off int64, data []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, off); err != nil {
		t.Fatal(err)
	}
}

func readAt(t *testing.T, path string, off int64, n int) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, off); err != nil {
		t.Fatal(err)
	}
	return buf
}

// nodeInfoServer is a node service named worker-1 on the RDS rds1, on
// connector c; no I/O happens until an RPC asks for it.
func nodeInfoServer(t *testing.T, c Connector) *NodeServer {
	t.Helper()
	opts := Options{Mode: ModeNode, DriverName: DefaultDriverName, Endpoint: "unix:///csi/csi.sock", NodeID: "worker-1",
		RDSName: "rds1", NVMePort: 4420, NQNPrefix: testNQNPrefix, MaxVolumesPerNode: 20}
	if err := opts.Validate(); err != nil {
		t.Fatal(err)
	}
	return NewNodeServer(NewDriver(opts, nil), c, "")
}

// recordingConnector records the targets NodeStageVolume connects; every
// volume's device is dev.
type recordingConnector struct {
	Connector
	dev     string
	mu      sync.Mutex
	targets []nvme.Target
}

func (r *recordingConnector) Connect(_ context.Context, t nvme.Target) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.targets = append(r.targets, t)
	return r.dev, nil
}

func (r *recordingConnector) connected() []nvme.Target {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]nvme.Target(nil), r.targets...)
}
