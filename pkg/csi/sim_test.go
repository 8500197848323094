package csi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/srvlab/rds-csi/pkg/rds"
	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// repeat is how often the simulator tests send each idempotent call.
const repeat = 3

// imgFiles lists the disk image files in the simulator's pool.
func imgFiles(t *testing.T, dataDir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dataDir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".img") {
			out = append(out, strings.TrimPrefix(p, dataDir))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestSimVolumeLifecycle(t *testing.T) {
	created := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	env := startSimEnv(t, simEnvConfig{Now: func() time.Time { return created }})
	ctx := context.Background()
	pool, _ := env.sim.Free()

	var vol *csi.Volume
	for i := 0; i < repeat; i++ {
		resp, err := env.ctrl.CreateVolume(ctx, createReq(testPVC, 64*rds.MiB+1))
		if err != nil {
			t.Fatalf("CreateVolume #%d: %v", i+1, err)
		}
		vol = resp.Volume
	}
	d, ok := env.disk(testPVC)
	if !ok {
		t.Fatal("no disk on the simulator")
	}
	if d.Size != 65*rds.MiB || vol.CapacityBytes != 65*rds.MiB {
		t.Errorf("disk %d bytes, reported %d, want 65 MiB (64 MiB + 1 byte rounded up)", d.Size, vol.CapacityBytes)
	}
	if d.FilePath != "/storage-pool/kubernetes-volumes/"+testPVC+".img" || !d.NVMeTCPExport || d.NVMeTCPPort != 4420 || d.NVMeTCPNQN != testNQNPrefix+testPVC {
		t.Errorf("disk %+v is not exported as the volume_context says", d)
	}
	if len(env.sim.Disks()) != 1 {
		t.Errorf("repeated CreateVolume made %d disks", len(env.sim.Disks()))
	}

	// Data written before the snapshot must be in it; data written after
	// must not.
	before := bytes.Repeat([]byte("before-snapshot!"), 64)
	after := bytes.Repeat([]byte("AFTER"), 200)
	writeAt(t, d.BackingFile, 0, before)
	writeAt(t, d.BackingFile, 40*rds.MiB, before)
	var snap *csi.Snapshot
	for i := 0; i < repeat; i++ {
		resp, err := env.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: testSnapName, SourceVolumeId: vol.VolumeId})
		if err != nil {
			t.Fatalf("CreateSnapshot #%d: %v", i+1, err)
		}
		snap = resp.Snapshot
	}
	if !snap.CreationTime.AsTime().Equal(created) || snap.SourceVolumeId != testPVC || snap.SizeBytes != 65*rds.MiB {
		t.Errorf("snapshot %v", snap)
	}
	sd, _ := env.disk(snap.SnapshotId)
	if sd.NVMeTCPExport {
		t.Error("snapshot disk is exported")
	}
	writeAt(t, d.BackingFile, 0, after)

	for i := 0; i < repeat; i++ {
		resp, err := env.ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{
			VolumeId: vol.VolumeId, CapacityRange: &csi.CapacityRange{RequiredBytes: 128 * rds.MiB},
			VolumeCapability: mountCap(snw, "ext4")})
		if err != nil || resp.CapacityBytes != 128*rds.MiB || !resp.NodeExpansionRequired {
			t.Fatalf("ControllerExpandVolume #%d: %v %v", i+1, resp, err)
		}
	}
	if d, _ := env.disk(testPVC); d.Size != 128*rds.MiB {
		t.Errorf("disk has %d bytes after expansion", d.Size)
	}

	// Deleting the source leaves the snapshot intact.
	for i := 0; i < repeat; i++ {
		if _, err := env.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: vol.VolumeId}); err != nil {
			t.Fatalf("DeleteVolume #%d: %v", i+1, err)
		}
	}
	if _, err := os.Stat(d.BackingFile); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("backing file of the deleted volume: %v", err)
	}
	list, err := env.ctrl.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SourceVolumeId: testPVC})
	if err != nil || len(list.Entries) != 1 || list.Entries[0].Snapshot.SnapshotId != snap.SnapshotId {
		t.Fatalf("snapshots of the deleted volume: %v %v", list, err)
	}

	// Restore, larger than the snapshot; then clone the restored volume.
	restoreReq := createReq(testPVC2, 100*rds.MiB)
	restoreReq.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.SnapshotId}}}
	var restored *csi.Volume
	for i := 0; i < repeat; i++ {
		resp, err := env.ctrl.CreateVolume(ctx, restoreReq)
		if err != nil {
			t.Fatalf("restore #%d: %v", i+1, err)
		}
		restored = resp.Volume
	}
	cloneReq := createReq("clone-of-restored", 0)
	cloneReq.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: restored.VolumeId}}}
	cloneResp, err := env.ctrl.CreateVolume(ctx, cloneReq)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []*csi.Volume{restored, cloneResp.Volume} {
		vd, ok := env.disk(v.VolumeId)
		if !ok || vd.Size != 100*rds.MiB || v.CapacityBytes != 100*rds.MiB || !vd.NVMeTCPExport || vd.NVMeTCPNQN != testNQNPrefix+v.VolumeId {
			t.Errorf("copy %s: %+v, reported %d bytes", v.VolumeId, vd, v.CapacityBytes)
			continue
		}
		if got := readAt(t, vd.BackingFile, 0, len(before)); !bytes.Equal(got, before) {
			t.Errorf("copy %s: data at 0 is %q..., want the snapshot's", v.VolumeId, got[:16])
		}
		if got := readAt(t, vd.BackingFile, 40*rds.MiB, len(before)); !bytes.Equal(got, before) {
			t.Errorf("copy %s: data at 40 MiB differs from the snapshot", v.VolumeId)
		}
	}

	// Delete everything: nothing is left in the pool.
	for _, id := range []string{restored.VolumeId, cloneResp.Volume.VolumeId} {
		if _, err := env.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < repeat; i++ {
		if _, err := env.ctrl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snap.SnapshotId}); err != nil {
			t.Fatalf("DeleteSnapshot #%d: %v", i+1, err)
		}
	}
	if n := len(env.sim.Disks()); n != 0 {
		t.Errorf("%d disks left", n)
	}
	if files := imgFiles(t, env.sim.DataDir()); len(files) != 0 {
		t.Errorf("files left in the pool: %v", files)
	}
	if free, _ := env.sim.Free(); free != pool {
		t.Errorf("pool free %d after deleting everything, want %d", free, pool)
	}
}

func TestSimSnapshotMetadataSurvivesRestart(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "pool")
	created := time.Date(2025, 12, 24, 18, 0, 0, 42, time.UTC)
	env := startSimEnv(t, simEnvConfig{DataDir: dataDir, Now: func() time.Time { return created }})
	ctx := context.Background()
	vol, err := env.ctrl.CreateVolume(ctx, createReq(testPVC, 8*rds.MiB))
	if err != nil {
		t.Fatal(err)
	}
	snap, err := env.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: testSnapName, SourceVolumeId: vol.Volume.VolumeId})
	if err != nil {
		t.Fatal(err)
	}
	env.stop()

	// A new driver process against a restarted RDS, with another clock.
	env = startSimEnv(t, simEnvConfig{DataDir: dataDir, Now: func() time.Time { return created.Add(time.Hour) }})
	list, err := env.ctrl.ListSnapshots(ctx, &csi.ListSnapshotsRequest{})
	if err != nil || len(list.Entries) != 1 {
		t.Fatalf("ListSnapshots after restart: %v %v", list, err)
	}
	got := list.Entries[0].Snapshot
	if got.SnapshotId != snap.Snapshot.SnapshotId || got.SourceVolumeId != testPVC || !got.CreationTime.AsTime().Equal(created) || got.SizeBytes != 8*rds.MiB {
		t.Errorf("after restart: %v, want %v", got, snap.Snapshot)
	}
	again, err := env.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: testSnapName, SourceVolumeId: testPVC})
	if err != nil || !again.Snapshot.CreationTime.AsTime().Equal(created) {
		t.Errorf("repeated CreateSnapshot after restart: %v %v", again, err)
	}
	vols, err := env.ctrl.ListVolumes(ctx, &csi.ListVolumesRequest{})
	if err != nil || len(vols.Entries) != 1 || vols.Entries[0].Volume.VolumeId != testPVC {
		t.Errorf("ListVolumes after restart: %v %v (must list the volume and not the snapshot)", vols, err)
	}
}

func TestSimNoSpaceLeavesNothing(t *testing.T) {
	env := startSimEnv(t, simEnvConfig{PoolSize: 1536 * rds.MiB})
	ctx := context.Background()
	_, err := env.ctrl.CreateVolume(ctx, createReq("too-big", 2*rds.GiB))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("CreateVolume larger than the pool: %v, want RESOURCE_EXHAUSTED", err)
	}
	if n := len(env.sim.Disks()); n != 0 {
		t.Errorf("%d disks left behind", n)
	}
	vol, err := env.ctrl.CreateVolume(ctx, createReq(testPVC, 512*rds.MiB))
	if err != nil {
		t.Fatal(err)
	}
	snap, err := env.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: testSnapName, SourceVolumeId: vol.Volume.VolumeId})
	if err != nil {
		t.Fatal(err)
	}
	// 512 MiB are free: the copy fits, growing it to 600 MiB does not. The
	// half-made copy must go.
	req := createReq(testPVC2, 600*rds.MiB)
	req.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.Snapshot.SnapshotId}}}
	_, err = env.ctrl.CreateVolume(ctx, req)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), testPVC2) {
		t.Fatalf("restore without room to grow: %v, want RESOURCE_EXHAUSTED naming the volume", err)
	}
	if _, ok := env.disk(testPVC2); ok {
		t.Error("the failed restore left its disk")
	}
	if files := imgFiles(t, env.sim.DataDir()); len(files) != 2 {
		t.Errorf("files in the pool: %v, want the volume and the snapshot only", files)
	}
	_, err = env.ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: testPVC, CapacityRange: &csi.CapacityRange{RequiredBytes: 2 * rds.GiB}})
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("expanding beyond the pool: %v", err)
	}
	capResp, err := env.ctrl.GetCapacity(ctx, &csi.GetCapacityRequest{})
	if err != nil || capResp.AvailableCapacity != 512*rds.MiB {
		t.Errorf("GetCapacity: %v %v, want 512 MiB", capResp, err)
	}
}

func TestSimTransportFailuresAreRetried(t *testing.T) {
	env := startSimEnv(t, simEnvConfig{})
	ctx := context.Background()
	// The disk is made, the reply is lost: the retry must find it.
	env.sim.DropAfterExecNth(1, "/disk add")
	if _, err := env.ctrl.CreateVolume(ctx, createReq(testPVC, 16*rds.MiB)); err != nil {
		t.Fatalf("CreateVolume with a lost reply: %v", err)
	}
	env.sim.DropBeforeExecNth(1, "/disk remove")
	env.sim.DropAfterExecNth(1, "/file remove")
	if _, err := env.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: testPVC}); err != nil {
		t.Fatalf("DeleteVolume with dropped connections: %v", err)
	}
	if n := len(env.sim.Disks()); n != 0 || len(imgFiles(t, env.sim.DataDir())) != 0 {
		t.Errorf("%d disks, files %v left", n, imgFiles(t, env.sim.DataDir()))
	}
	// A refusal is not retried, and it is reported with the RDS's words.
	env.sim.FailNth(1, "/disk add", "failure: simulated controller fault")
	_, err := env.ctrl.CreateVolume(ctx, createReq(testPVC, 16*rds.MiB))
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "simulated controller fault") {
		t.Errorf("refused create: %v", err)
	}
}

func TestSimVolumeHealth(t *testing.T) {
	env := startSimEnv(t, simEnvConfig{})
	ctx := context.Background()
	for _, name := range []string{"a", "b"} {
		if _, err := env.ctrl.CreateVolume(ctx, createReq(name, 8*rds.MiB)); err != nil {
			t.Fatal(err)
		}
	}
	a, b := VolumeIDFromName("a"), VolumeIDFromName("b")
	health := func(id string) []*csi.VolumeHealth_VolumeHealthEntry {
		resp, err := env.ctrl.ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{VolumeId: id})
		if err != nil {
			t.Fatalf("health of %s: %v", id, err)
		}
		return resp.VolumeHealth.HealthStatuses
	}
	if h := health(a); len(h) != 0 {
		t.Errorf("healthy volume: %v", h)
	}
	env.routerOS(t, fmt.Sprintf(`/disk set [find slot="%s"] nvme-tcp-export=no`, a))
	if h := health(a); len(h) != 1 || h[0].Reason != HealthNotExported {
		t.Errorf("unexported volume: %v", h)
	}
	env.routerOS(t, fmt.Sprintf(`/disk remove [find slot="%s"]`, b))
	if h := health(b); len(h) != 1 || h[0].Reason != HealthDiskMissing || h[0].Status != csi.VolumeHealthErrorType_INACCESSIBLE {
		t.Errorf("volume whose disk was removed: %v", h)
	}
	list, err := env.ctrl.ControllerListVolumeHealth(ctx, &csi.ControllerListVolumeHealthRequest{})
	if err != nil || len(list.Entries) != 1 || list.Entries[0].VolumeId != a {
		t.Errorf("ControllerListVolumeHealth: %v %v", list, err)
	}
	// DeleteVolume still cleans up the file the removed disk left.
	if _, err := env.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: b}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.ctrl.ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{VolumeId: b}); status.Code(err) != codes.NotFound {
		t.Errorf("health of a deleted volume: %v, want NOT_FOUND", err)
	}
}

func TestSimProbe(t *testing.T) {
	env := startSimEnv(t, simEnvConfig{})
	resp, err := env.ident.Probe(context.Background(), &csi.ProbeRequest{})
	if err != nil || !resp.GetReady().GetValue() {
		t.Errorf("Probe with the RDS answering: %v %v", resp, err)
	}
}

// createConcurrently sends n CreateVolume calls at once and returns the
// errors.
func createConcurrently(env *simEnv, names []string, size int64) []error {
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, errs[i] = env.ctrl.CreateVolume(context.Background(), createReq(name, size))
		}()
	}
	close(start)
	wg.Wait()
	return errs
}

func TestSimConcurrentCreateVolume(t *testing.T) {
	for _, n := range []int{10, 50} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			env := startSimEnv(t, simEnvConfig{PoolSize: rds.TiB})
			names := make([]string, n)
			for i := range names {
				names[i] = fmt.Sprintf("pvc-%08x-0000-4000-8000-000000000000", i)
			}
			// BenchmarkSimConcurrentCreateVolume times this; the test
			// checks only the outcome.
			for i, err := range createConcurrently(env, names, rds.GiB) {
				if err != nil {
					t.Errorf("CreateVolume %s: %v", names[i], err)
				}
			}
			list, err := env.ctrl.ListVolumes(context.Background(), &csi.ListVolumesRequest{})
			if err != nil || len(list.Entries) != n {
				t.Errorf("ListVolumes after %d creates: %d entries, %v", n, len(list.GetEntries()), err)
			}
		})
	}
	t.Run("same name", func(t *testing.T) {
		env := startSimEnv(t, simEnvConfig{})
		names := make([]string, 10)
		for i := range names {
			names[i] = testPVC
		}
		ok := 0
		for _, err := range createConcurrently(env, names, rds.GiB) {
			switch status.Code(err) {
			case codes.OK:
				ok++
			case codes.Aborted:
			default:
				t.Errorf("concurrent CreateVolume of one name: %v, want OK or ABORTED", err)
			}
		}
		if ok == 0 || len(env.sim.Disks()) != 1 {
			t.Errorf("%d succeeded, %d disks; want at least one success and exactly one disk", ok, len(env.sim.Disks()))
		}
	})
}

// On RouterOS that hides a closed export's properties (a closed disk
// prints no nvme-tcp-server-allow-host-name, as the RDS2216 did for disks
// with nvme-tcp-export=no; unknown for file disks, docs/routeros.md),
// rds.Client resolves the hidden allowed host only from its own memory of
// what it set and "". Every close writes a fresh random tombstone, so a
// controller that did not write it (the other replica, or this one after
// a restart) reads the closed export as closed to "" (AllowHostUnknown):
// a swap from that state matches nothing and the read-back cannot confirm
// it, so without more every publish would be ABORTED after syncRounds
// rounds, on every retry, and the volume could never be attached again
// (the reconcile sees a closed export for an unclaimed volume and does
// nothing). syncExport first gives such an export a fresh tombstone it
// knows (rds.Client.Retombstone, conditioned on the export being off
// alone, which lets no one in). Here: a volume created (closed to its
// tombstone) by one rds.Client, published by a controller on a new
// rds.Client (a restarted controller).
func TestSimRestartedControllerPublishesAVolumeWithAHiddenTombstone(t *testing.T) {
	withFencing := func(o *Options) {
		o.StorageFencing = StorageFencingAllowHost
		o.AttachmentKey = []byte("a test attachment key of 32 bytes or more")
	}
	env := startSimEnv(t, simEnvConfig{Publish: true, Opts: withFencing,
		Sim: func(c *rdssim.Config) { c.ClosedExportProps = rdssim.ClosedExportHidden }})
	ctx := context.Background()
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	vol, err := env.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-2f000000-0000-4000-8000-000000000002",
		VolumeCapabilities: []*csi.VolumeCapability{rwo}})
	if err != nil {
		t.Fatal(err)
	}
	id := vol.Volume.VolumeId
	// Attached and detached once by the first controller: closed to a
	// tombstone only its rds.Client knows.
	if _, err := env.ctrl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: testNodeID, VolumeCapability: rwo}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.ctrl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: testNodeID}); err != nil {
		t.Fatal(err)
	}
	if d, ok := env.disk(id); !ok || d.NVMeTCPExport || d.AllowHostName == "" {
		t.Fatalf("volume %s: %+v; want a closed export with a tombstone", id, d)
	}

	// The restarted controller: a new rds.Client on the same RDS.
	dir := t.TempDir()
	knownHosts := filepath.Join(dir, "known_hosts")
	if err := env.sim.WriteKnownHosts(knownHosts); err != nil {
		t.Fatal(err)
	}
	host, portText, err := net.SplitHostPort(env.sim.Addr())
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(portText)
	client, err := rds.NewClient(rds.Config{Address: host, Port: port, User: "admin", Signer: env.signer, KnownHostsFile: knownHosts, LoginOptions: "ct"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	opts := allowHostOptions()
	opts.NVMePort, opts.NQNPrefix, opts.RDSPool, opts.VolumePath = 4420, testNQNPrefix, rdssim.DefaultPoolName, "/storage-pool/kubernetes-volumes"
	cs := NewControllerServer(NewDriver(opts, client), nil)
	ctrl := enablePublish(t, cs, testNodeID).(*provisioningController)
	if _, err := ctrl.client.CoreV1().PersistentVolumes().Create(ctx, testPV(id, id, corev1.ReadWriteOnce, false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the index to know "+id, func() bool { return ctrl.index.Volume(id).Indexed() })
	_, err = ctrl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: testNodeID, VolumeCapability: rwo})
	if err != nil {
		t.Errorf("a restarted controller's publish of a volume closed by another rds.Client (its tombstone hidden in print): %v (code %s); it fails the same way on every retry", err, status.Code(err))
	}
}
