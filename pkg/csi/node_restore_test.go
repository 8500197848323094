package csi

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
)

// TestNodeStageGrowsAFilesystemRestoredIntoALargerVolume: a volume
// restored from a snapshot into a larger size (or cloned into one) comes
// with its source's filesystem, smaller than the new device, and no
// NodeExpandVolume follows (Kubernetes' storage suite: "should provision
// correct filesystem size when restoring snapshot to larger size pvc").
// NodeStageVolume grows the filesystem to the device, and the data stays.
func TestNodeStageGrowsAFilesystemRestoredIntoALargerVolume(t *testing.T) {
	requireNodeHost(t)
	env := startSimEnv(t, simEnvConfig{LoopNode: true})
	for i, fsType := range SupportedFsTypes {
		t.Run(fsType, func(t *testing.T) {
			if fsType == "ext4" && !haveCapability(t, unix.CAP_SYS_RESOURCE) {
				t.Skip("the kernel grows a mounted ext4 only for CAP_SYS_RESOURCE (EXT4_IOC_RESIZE_FS), which this process lacks; the node plugin's pod is privileged")
			}
			src := newNodeVolume(t, env, fmt.Sprintf("restore-src-%d", i), nodeTestSize, mountCapability(fsType, sw))
			src.stageAndPublish(t)
			data := randomBytes(t, 1<<20)
			writeSynced(t, filepath.Join(src.target, "data"), data)
			srcSize := fsTotal(t, src.target)
			src.teardown(t)

			snap, err := env.ctrl.CreateSnapshot(context.Background(), &csi.CreateSnapshotRequest{
				Name: fmt.Sprintf("restore-snap-%d", i), SourceVolumeId: src.id()})
			if err != nil {
				t.Fatalf("CreateSnapshot: %v", err)
			}
			const grown = 2 * nodeTestSize
			resp, err := env.ctrl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{
				Name: fmt.Sprintf("restore-dst-%d", i), CapacityRange: &csi.CapacityRange{RequiredBytes: grown},
				VolumeCapabilities: []*csi.VolumeCapability{src.cap},
				VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
					Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.Snapshot.SnapshotId}}},
			})
			if err != nil {
				t.Fatalf("CreateVolume from the snapshot: %v", err)
			}
			dst := newNodeVolumeFor(t, env, resp.Volume, src.cap)
			dst.stageAndPublish(t)
			got := fsTotal(t, dst.target)
			// The filesystem's own metadata takes a few percent.
			if got <= srcSize || got < resp.Volume.CapacityBytes*9/10 {
				t.Errorf("%s restored into %d bytes: the filesystem has %d bytes, its source %d", fsType, resp.Volume.CapacityBytes, got, srcSize)
			}
			if b, err := os.ReadFile(filepath.Join(dst.target, "data")); err != nil || !bytes.Equal(b, data) {
				t.Errorf("the restored data does not match the source's: %v", err)
			}
			dst.teardown(t)
		})
	}
}
