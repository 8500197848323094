package csi

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/srvlab/rds-csi/pkg/rds"
	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// TestSimDeleteSnapshotFinishesInterruptedDelete: a DeleteSnapshot whose
// /file remove failed after the disk was removed left the file; the retry,
// which finds no disk, finds the file by the snapshot ID and removes it.
func TestSimDeleteSnapshotFinishesInterruptedDelete(t *testing.T) {
	env := startSimEnv(t, simEnvConfig{})
	ctx := context.Background()
	vol, err := env.ctrl.CreateVolume(ctx, createReq(testPVC, 8*rds.MiB))
	if err != nil {
		t.Fatal(err)
	}
	snap, err := env.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: testSnapName, SourceVolumeId: vol.Volume.VolumeId})
	if err != nil {
		t.Fatal(err)
	}
	id := snap.Snapshot.SnapshotId
	d, ok := env.disk(id)
	if !ok {
		t.Fatalf("no disk for snapshot %s", id)
	}
	env.sim.FailNth(1, "/file remove", "failure: could not remove file")
	if _, err := env.ctrl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: id}); err == nil {
		t.Fatal("DeleteSnapshot succeeded although its /file remove failed")
	}
	if _, ok := env.disk(id); ok {
		t.Fatal("setup: the snapshot's disk is still there")
	}
	if !strings.Contains(env.routerOS(t, `/file print detail where name="`+strings.TrimPrefix(d.FilePath, "/")+`"`), "name=") {
		t.Fatal("setup: the snapshot's file is already gone")
	}
	if _, err := env.ctrl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: id}); err != nil {
		t.Fatalf("retried DeleteSnapshot: %v", err)
	}
	if out := env.routerOS(t, `/file print detail where name="`+strings.TrimPrefix(d.FilePath, "/")+`"`); strings.Contains(out, "name=") {
		t.Fatalf("the snapshot's file leaked:\n%s", out)
	}
	// The volume's own file is untouched.
	if out := env.routerOS(t, `/file print detail where name="storage-pool/kubernetes-volumes/`+testPVC+`.img"`); !strings.Contains(out, "name=") {
		t.Fatalf("the volume's file is gone:\n%s", out)
	}
}

// TestSimCloneAtSourceRequestSize: a volume requested at 3 GiB + 12 KiB
// has 3 GiB + 1 MiB; a clone and a restore requested at the same 3 GiB +
// 12 KiB are created at that size, not refused as smaller than the source.
func TestSimCloneAtSourceRequestSize(t *testing.T) {
	env := startSimEnv(t, simEnvConfig{})
	ctx := context.Background()
	const size = 3<<30 + 12<<10
	vol, err := env.ctrl.CreateVolume(ctx, createReq(testPVC, size))
	if err != nil {
		t.Fatal(err)
	}
	if vol.Volume.CapacityBytes != 3<<30+rds.MiB {
		t.Fatalf("source has %d bytes", vol.Volume.CapacityBytes)
	}
	clone := createReq("pvc-00000000-0000-4000-8000-00000000c10e", size)
	clone.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: vol.Volume.VolumeId}}}
	got, err := env.ctrl.CreateVolume(ctx, clone)
	if err != nil || got.Volume.CapacityBytes != 3<<30+rds.MiB {
		t.Fatalf("clone: %v, %v", got, err)
	}
	snap, err := env.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: testSnapName, SourceVolumeId: vol.Volume.VolumeId})
	if err != nil {
		t.Fatal(err)
	}
	restore := createReq("pvc-00000000-0000-4000-8000-0000000e5707", size)
	restore.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.Snapshot.SnapshotId}}}
	if got, err := env.ctrl.CreateVolume(ctx, restore); err != nil || got.Volume.CapacityBytes != 3<<30+rds.MiB {
		t.Fatalf("restore: %v, %v", got, err)
	}
}

// TestSimCreateVolumeReclaimsOrphanedFile: a backing file at the volume's
// path with no disk (an earlier create whose cleanup failed) does not
// block the volume for ever.
func TestSimCreateVolumeReclaimsOrphanedFile(t *testing.T) {
	env := startSimEnv(t, simEnvConfig{})
	ctx := context.Background()
	file := "/storage-pool/kubernetes-volumes/" + testPVC + ".img"
	env.routerOS(t, `/disk add type=file file-path="`+file+`" file-size=1G slot="`+testPVC+`"`)
	env.routerOS(t, `/disk remove [find slot="`+testPVC+`"]`)
	vol, err := env.ctrl.CreateVolume(ctx, createReq(testPVC, 8*rds.MiB))
	if err != nil {
		t.Fatalf("CreateVolume over an orphaned file: %v", err)
	}
	if d, ok := env.disk(testPVC); !ok || d.FilePath != file || vol.Volume.CapacityBytes != 8*rds.MiB || d.Size != 8*rds.MiB {
		t.Fatalf("disk %+v, volume %v", d, vol)
	}
}

// TestSimSnapshotReadyOnlyWhenCopied: a snapshot whose copy outlives the
// CreateSnapshot call is reported not ready, is not copied a second time
// by the repeated call, and is ready once the copy completed. The copy is
// held by the simulator's CopyGate until the checks are made, not timed by
// a copy rate: on a loaded machine (CI's two cores under -race) a second
// went by between the calls and the copy was done before the repeat.
func TestSimSnapshotReadyOnlyWhenCopied(t *testing.T) {
	gate := make(chan struct{})
	env := startSimEnv(t, simEnvConfig{Sim: func(c *rdssim.Config) { c.CopyGate = gate }})
	ctx := context.Background()
	vol, err := env.ctrl.CreateVolume(ctx, createReq(testPVC, 64*rds.MiB))
	if err != nil {
		t.Fatal(err)
	}
	req := &csi.CreateSnapshotRequest{Name: testSnapName, SourceVolumeId: vol.Volume.VolumeId}
	// The CO's deadline passes during the copy (the driver's answer, not
	// ready, arrives after it): once the copy's file is on the RDS, not
	// after a fixed time, which a loaded machine can spend before the
	// copy is even sent (the repeat below would then copy, and wait on
	// the gate for good).
	short, expire := rdssim.DeadlineOnCue(ctx)
	answered, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		defer expire()
		files := filepath.Join(env.sim.DataDir(), "kubernetes-volumes", "snapshots", "*.img")
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			select {
			case <-answered:
				return
			default:
			}
			if m, _ := filepath.Glob(files); len(m) > 0 {
				return
			}
		}
		t.Errorf("no snapshot copy began on the RDS within a minute (%s)", files)
	}()
	resp, err := env.ctrl.CreateSnapshot(short, req)
	close(answered)
	<-watched
	if code(err) != codes.DeadlineExceeded && (err != nil || resp.Snapshot.ReadyToUse) {
		t.Fatalf("CreateSnapshot past its deadline: %v, %v", resp, err)
	}
	// Until the first call has let go of the snapshot, a repeat is ABORTED
	// (the CO retries); then it answers without copying again.
	first, err := env.ctrl.CreateSnapshot(ctx, req)
	for code(err) == codes.Aborted {
		time.Sleep(5 * time.Millisecond)
		first, err = env.ctrl.CreateSnapshot(ctx, req)
	}
	if err != nil || first.Snapshot.ReadyToUse || first.Snapshot.SizeBytes != 64*rds.MiB {
		t.Fatalf("repeated while copying: %v, %v", first, err)
	}
	copies := 0
	for _, c := range env.sim.Commands() {
		if strings.Contains(c.Text, "copy-from") {
			copies++
		}
	}
	if copies != 1 {
		t.Fatalf("the snapshot was copied %d times", copies)
	}
	close(gate)
	deadline := time.Now().Add(time.Minute)
	for {
		if _, ok := env.disk(first.Snapshot.SnapshotId); ok || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	done, err := env.ctrl.CreateSnapshot(ctx, req)
	if err != nil || !done.Snapshot.ReadyToUse || !done.Snapshot.CreationTime.AsTime().Equal(first.Snapshot.CreationTime.AsTime()) {
		t.Fatalf("after the copy: %v, %v", done, err)
	}
}
