package main

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/srvlab/rds-csi/pkg/rds"
	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// A copy whose /disk add reply could not be read, and whose clean-up then
// failed to remove the file, leaves the copy's file without a disk; every
// later `rdsctl copy` of the slot failed "file already exists". The file
// path is the slot's own, so rdsctl copy now takes the file for a copy's
// leftover as the driver's clones do: while the RDS's clock says it
// changed within the last two hours (a copy may still be writing it) it
// says the copy is pending and removes nothing; once quiet, it removes
// the file and copies. A file another disk uses is never removed.
func TestRdsctlCopyAfterAnUnreadableReplyAndAFailedCleanup(t *testing.T) {
	var ahead atomic.Int64 // how far the RDS's clock is moved on
	flags, client, srv := simWithKey(t, func(c *rdssim.Config) {
		c.Now = func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
	})
	ctx := context.Background()
	if code, _, errOut := rdsctlProcess(t, append(flags, "create", "pvc-src", "8M")...); code != 0 {
		t.Fatalf("create the source: exit %d, %s", code, errOut)
	}
	srv.GarbageNth(1, "copy-from")
	srv.FailNth(1, "/file remove", "failure: simulated failure")
	if code, out, _ := rdsctlProcess(t, append(flags, "copy", "pvc-copy", "pvc-src")...); code == 0 {
		t.Fatalf("the copy with an unreadable reply and a failed clean-up succeeded: %s", out)
	}
	srv.ClearFaults()
	file := rds.VolumeFilePath(rds.DefaultVolumePath, "pvc-copy")
	if _, err := client.GetDisk(ctx, "pvc-copy"); !errors.Is(err, rds.ErrNotFound) {
		t.Fatalf("after the failed copy: disk %v, want none", err)
	}
	if _, err := client.GetFile(ctx, file); err != nil {
		t.Fatalf("the failed clean-up left no file (%v): the fault injection did not reproduce the case", err)
	}

	code, out, errOut := rdsctlProcess(t, append(flags, "copy", "pvc-copy", "pvc-src")...)
	if code != 1 || !strings.Contains(errOut, "may be a copy still running") {
		t.Errorf("copy over the fresh leftover: exit %d, stdout %q, stderr %q; want it pending (a copy may still be writing it), nothing removed", code, out, errOut)
	}
	if _, err := client.GetFile(ctx, file); err != nil {
		t.Fatalf("the fresh leftover was removed: %v", err)
	}

	ahead.Store(int64(2*time.Hour + time.Minute))
	code, out, errOut = rdsctlProcess(t, append(flags, "copy", "pvc-copy", "pvc-src")...)
	if code != 0 || !strings.Contains(out, "pvc-copy") {
		t.Fatalf("copy once the leftover was quiet for over two hours: exit %d, stdout %q, stderr %q; want it removed and the copy made", code, out, errOut)
	}
	if d, err := client.GetDisk(ctx, "pvc-copy"); err != nil || d.FilePath != file {
		t.Errorf("copied: %+v %v", d, err)
	}

	// A file a disk uses is never taken for a leftover.
	if _, err := client.CreateDisk(ctx, rds.CreateDiskRequest{Slot: "other", FilePath: rds.VolumeFilePath(rds.DefaultVolumePath, "pvc-copy2"), Size: 8 * rds.MiB}); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = rdsctlProcess(t, append(flags, "copy", "pvc-copy2", "pvc-src")...)
	if code != 1 || !strings.Contains(errOut, "already exists") {
		t.Errorf("copy onto a file another disk uses: exit %d, stderr %q; want it refused", code, errOut)
	}
	if d, err := client.GetDisk(ctx, "other"); err != nil || d.FilePath != rds.VolumeFilePath(rds.DefaultVolumePath, "pvc-copy2") {
		t.Errorf("the disk using the file: %+v %v", d, err)
	}
}
