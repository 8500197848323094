package csi

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/srvlab/rds-csi/pkg/rds"
	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// TestSimCloneAndRestoreAfterACopyLeftItsFile: a clone whose copy reply
// could not be read, and a restore whose grow after the copy failed, each
// with a clean-up that then failed to remove the file, leave the new
// volume's file without a disk. Their retries answered ALREADY_EXISTS for
// ever. Now a retry answers UNAVAILABLE (retried: the file may be a copy
// still running) while the RDS's clock says the file changed within the
// last two hours, and once it has been quiet longer, the file is removed
// and the volume made; a file another disk uses stays.
func TestSimCloneAndRestoreAfterACopyLeftItsFile(t *testing.T) {
	var ahead atomic.Int64 // how far the RDS's clock is moved on
	env := startSimEnv(t, simEnvConfig{Sim: func(c *rdssim.Config) {
		c.Now = func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
	}})
	ctx := context.Background()
	vol, err := env.ctrl.CreateVolume(ctx, createReq(testPVC, 8*rds.MiB))
	if err != nil {
		t.Fatal(err)
	}
	snap, err := env.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: testSnapName, SourceVolumeId: vol.Volume.VolumeId})
	if err != nil {
		t.Fatal(err)
	}
	clone := createReq("pvc-00000000-0000-4000-8000-00000000c10e", 8*rds.MiB)
	clone.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: vol.Volume.VolumeId}}}
	restore := createReq("pvc-00000000-0000-4000-8000-0000000e5707", 16*rds.MiB)
	restore.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.Snapshot.SnapshotId}}}

	for _, c := range []struct {
		name  string
		req   *csi.CreateVolumeRequest
		fault func()
	}{
		{"clone whose copy reply was unreadable", clone, func() { env.sim.GarbageNth(1, "copy-from") }},
		{"restore whose grow failed", restore, func() { env.sim.FailNth(1, "/disk set", "failure: simulated failure") }},
	} {
		id := VolumeIDFromName(c.req.Name)
		file := "storage-pool/kubernetes-volumes/" + id + ".img"
		fileThere := func() bool {
			return strings.Contains(env.routerOS(t, `/file print detail where name="`+file+`"`), "name=")
		}
		ahead.Store(0)
		c.fault()
		env.sim.FailNth(1, "/file remove", "failure: could not remove file")
		if _, err := env.ctrl.CreateVolume(ctx, c.req); err == nil {
			t.Fatalf("%s: CreateVolume succeeded through the fault", c.name)
		}
		if _, ok := env.disk(id); ok || !fileThere() {
			t.Fatalf("%s: setup: want the volume's file without a disk (disk %t, file %t)", c.name, ok, fileThere())
		}
		_, err := env.ctrl.CreateVolume(ctx, c.req)
		if status.Code(err) != codes.Unavailable {
			t.Errorf("%s: retry over the fresh file: %v; want UNAVAILABLE (a copy may still be writing it)", c.name, err)
		}
		if !fileThere() {
			t.Fatalf("%s: the fresh file was removed", c.name)
		}
		ahead.Store(int64(2*time.Hour + time.Minute))
		got, err := env.ctrl.CreateVolume(ctx, c.req)
		if err != nil {
			t.Fatalf("%s: retry once the file was quiet for over two hours: %v", c.name, err)
		}
		if d, ok := env.disk(id); !ok || got.Volume.VolumeId != id || d.FilePath != "/"+file {
			t.Errorf("%s: made %+v, disk %+v", c.name, got.Volume, d)
		}
	}
}
