package rdssim

import (
	"strings"
	"testing"
	"time"
)

// TestCopyTakesTime: with CopyRate, /disk add copy-from returns after
// size/CopyRate; meanwhile other commands run, the copy's disk is not
// listed and its file cannot be removed; then the disk is there.
func TestCopyTakesTime(t *testing.T) {
	ts := startSim(t, func(c *Config) { c.CopyRate = 32 * mib }) // 64 MiB: 2 s
	ts.mustRun(addCmd("pvc-1", "64M"))
	sess, err := ts.client.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	var out strings.Builder
	sess.Stdout = &out
	if err := sess.Start(copyCmd("snap-1", "pvc-1", "")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(ts.srv.Commands()) < 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := ts.run(`/disk print detail where slot="snap-1"`); got != diskLegendLine {
		t.Errorf("the copy's disk while copying:\n%s", got)
	}
	if got := ts.run(`/file remove [find name="storage-pool/k8s/snap-1.img"]`); got != "failure: file is in use by a copy in progress\n" {
		t.Errorf("removing a copy's file while copying: %q", got)
	}
	if err := sess.Wait(); err != nil || out.String() != "" {
		t.Fatalf("copy: %v, %q", err, out.String())
	}
	if d := ts.srv.Disks(); len(d) != 2 || d[1].Slot != "snap-1" || d[1].Size != 64*mib {
		t.Fatalf("after the copy: %+v", d)
	}
}
