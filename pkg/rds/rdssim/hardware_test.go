package rdssim

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// TestHardwareListing: an unconditioned /disk print lists the pool, the
// file disks, the array and its drives, the drives under the r column;
// a failed drive carries f and raid-member-failed=yes and the array says
// it is degraded; a removed drive is gone from the listing; restore puts
// every drive back healthy.
func TestHardwareListing(t *testing.T) {
	ts := startSim(t, func(c *Config) { c.TerminalWidth = -1 })
	ts.mustRun(addCmd("pvc-1", "1G"))
	out := ts.run(`/disk print detail`)
	if !strings.HasPrefix(out, "Flags: B - BLOCK-DEVICE; M - MOUNTED; r - RAID-MEMBER; t - NVME-TCP-EXPORT\n") ||
		!strings.Contains(out, "\n 2 B    type=raid slot=\"raid1\"") || !strings.Contains(out, `raid-state="active" `) ||
		!strings.Contains(out, "\n 3 B r  type=hardware slot=\"nvme1\"") || !strings.Contains(out, "\n 8 B r  type=hardware slot=\"nvme6\"") {
		t.Fatalf("healthy listing:\n%s", out)
	}
	if err := ts.srv.FailDrive("nvme2"); err != nil {
		t.Fatal(err)
	}
	out = ts.run(`/disk print detail where raid-master="raid1"`)
	if !strings.HasPrefix(out, "Flags: B - BLOCK-DEVICE; f - RAID-MEMBER-FAILED; r - RAID-MEMBER\n") ||
		!strings.Contains(out, "\n 1 Bfr type=hardware slot=\"nvme2\"") || !strings.Contains(out, "raid-member-failed=yes") ||
		strings.Count(out, "type=hardware") != 6 {
		t.Fatalf("failed drive:\n%s", out)
	}
	if out := ts.run(`/disk print detail where slot="raid1"`); !strings.Contains(out, `raid-state="active, degraded"`) {
		t.Errorf("array after a failed drive:\n%s", out)
	}
	if err := ts.srv.RemoveDrive("nvme5"); err != nil {
		t.Fatal(err)
	}
	if out := ts.run(`/disk print detail where type=hardware`); strings.Contains(out, `"nvme5"`) || strings.Count(out, "type=hardware") != 5 {
		t.Errorf("removed drive still listed:\n%s", out)
	}
	if err := ts.srv.FailDrive("nvme9"); err == nil {
		t.Error("FailDrive of a slot that is no drive succeeded")
	}
	ts.srv.RestoreArray()
	if out := ts.run(`/disk print detail where raid-member-failed=yes`); out != "Flags: B - BLOCK-DEVICE; M - MOUNTED; t - NVME-TCP-EXPORT\n" {
		t.Errorf("after restore, failed drives:\n%s", out)
	}
	if out := ts.run(`/disk print detail where type=hardware`); strings.Count(out, "type=hardware") != 6 {
		t.Errorf("after restore:\n%s", out)
	}
}

// TestDiskStatsFollowWrites: /disk print stats detail counts the bytes a
// write newly allocates in a volume's sparse file as written, and nothing
// for a volume nobody wrote; a rewrite of allocated blocks counts one
// write; AddIO adds exact counts and sets the queue depth; drives print
// their S.M.A.R.T. values; the pool sums every volume.
func TestDiskStatsFollowWrites(t *testing.T) {
	ts := startSim(t, func(c *Config) { c.TerminalWidth = -1 })
	ts.mustRun(addCmd("pvc-1", "1G"))
	ts.mustRun(addCmd("pvc-2", "1G"))
	first := ts.run(`/disk print stats detail where type=file`)
	if strings.Count(first, "write-ops=0 write-bytes=0") != 2 || strings.Contains(first, "file-path") {
		t.Fatalf("fresh volumes:\n%s", first)
	}
	if err := ts.srv.WriteDisk("pvc-1", 1<<20, bytes.Repeat([]byte{7}, 64<<10)); err != nil {
		t.Fatal(err)
	}
	out := ts.run(`/disk print stats detail where slot="pvc-1"`)
	if !strings.Contains(out, "write-ops=16 write-bytes=65 536 ") {
		t.Errorf("after 64 KiB written to fresh blocks:\n%s", out)
	}
	if out := ts.run(`/disk print stats detail where slot="pvc-2"`); !strings.Contains(out, "write-ops=0 write-bytes=0 ") {
		t.Errorf("a volume nobody wrote:\n%s", out)
	}
	// A rewrite of the same blocks allocates nothing: one write seen.
	path, err := ts.srv.BackingFile("pvc-1")
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(path)
	if err := ts.srv.WriteDisk("pvc-1", 1<<20, []byte{8}); err != nil {
		t.Fatal(err)
	}
	// The same mtime granularity may hide a rewrite within one tick: move it.
	if err := os.Chtimes(path, fi.ModTime(), fi.ModTime().Add(1e9)); err != nil {
		t.Fatal(err)
	}
	if out := ts.run(`/disk print stats detail where slot="pvc-1"`); !strings.Contains(out, "write-ops=17 write-bytes=65 536 ") {
		t.Errorf("after a rewrite:\n%s", out)
	}
	if a := ts.srv.Control("io slot=pvc-2 read-ops=5 read-bytes=20480 in-flight=9"); a != "ok io pvc-2" {
		t.Fatal(a)
	}
	if out := ts.run(`/disk print stats detail where slot="pvc-2"`); !strings.Contains(out, "read-ops=5 read-bytes=20 480 write-ops=0 write-bytes=0 in-flight-ops=9 ") {
		t.Errorf("after io:\n%s", out)
	}
	if out := ts.run(`/disk print stats detail where slot="storage-pool"`); !strings.Contains(out, "read-ops=5 read-bytes=20 480 write-ops=17 write-bytes=65 536 in-flight-ops=9 ") {
		t.Errorf("pool:\n%s", out)
	}
	if a := ts.srv.Control("smart drive=nvme3 temperature=78 critical-warning=4"); a != "ok smart nvme3" {
		t.Fatal(a)
	}
	if out := ts.run(`/disk print stats detail where slot="nvme3"`); !strings.Contains(out, "temperature=78C percentage-used=2% critical-warning=4 unsafe-shutdowns=1") {
		t.Errorf("drive:\n%s", out)
	}
}

// TestMonitorTraffic: `/disk monitor-traffic <slot> once` prints the
// slot's counters and its rates since the previous monitor of it, in the
// hardware's `key: value` form; without once, or of no such slot, it is
// refused.
func TestMonitorTraffic(t *testing.T) {
	clock := &fakeClock{}
	ts := startSim(t, func(c *Config) { c.Now = clock.Now })
	ts.mustRun(addCmd("pvc-1", "1G"))
	first := ts.run(`/disk monitor-traffic "storage-pool" once`)
	if !strings.Contains(first, "                     slot: storage-pool\n") || !strings.Contains(first, "write-ops-per-second: 0\n") {
		t.Fatalf("first:\n%s", first)
	}
	if a := ts.srv.Control("io slot=pvc-1 write-ops=200 write-bytes=1600000 in-flight=3"); !strings.HasPrefix(a, "ok") {
		t.Fatal(a)
	}
	clock.Add(2e9)
	out := ts.run(`/disk monitor-traffic storage-pool once`)
	for _, want := range []string{"write-ops-per-second: 100\n", "write-rate: 6.4Mbps\n", "in-flight-ops: 3\n", "write-bytes: 1 600 000\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("want %q in:\n%s", want, out)
		}
	}
	if out := ts.run(`/disk monitor-traffic nvme1 once`); !strings.Contains(out, "temperature: ") {
		t.Errorf("drive:\n%s", out)
	}
	for _, bad := range []string{`/disk monitor-traffic storage-pool`, `/disk monitor-traffic "nope" once`} {
		if out, _ := ts.tryRun(bad); out == "" || strings.Contains(out, "slot:") {
			t.Errorf("%s: %q", bad, out)
		}
	}
}

// TestControlHardware: the fault control protocol's hardware requests,
// and what it refuses.
func TestControlHardware(t *testing.T) {
	ts := startSim(t, nil)
	ts.mustRun(addCmd("pvc-1", "1G"))
	for line, want := range map[string]string{
		"drive fail=nvme1":                      "ok failed nvme1",
		"drive remove=nvme2":                    "ok removed nvme2",
		"drive restore":                         "ok restored",
		"drive fail=sda":                        "error: no such drive",
		"drive explode=nvme1":                   "error: want drive",
		"smart drive=nvme1 temperature=70":      "ok smart nvme1",
		"smart drive=nvme1 temperature=hot":     "error: temperature=hot",
		"smart drive=nvme1 temperature=NaN":     "error: temperature=NaN",
		"smart drive=nvme1 percentage-used=nan": "error: percentage-used=nan",
		"smart drive=nvme1 colour=red":          "error: unknown key colour",
		"smart drive=nope":                      "error: want smart",
		"io slot=pvc-1 write-ops=3":             "ok io pvc-1",
		"io slot=pvc-9 write-ops=3":             "error: no file disk",
		"io slot=pvc-1 write-ops=-3":            "error: write-ops=-3",
		"io slot=pvc-1 write-ops=1 write-ops=2": "error: write-ops given twice",
		"status":                                "ok armed=0 held=0",
	} {
		if got := ts.srv.Control(line); !strings.HasPrefix(got, want) {
			t.Errorf("%q: %q, want %q...", line, got, want)
		}
	}
}

// TestDiskStatsOfARecreatedSlot: a disk removed and made again in the
// same slot starts its counters from 0.
func TestDiskStatsOfARecreatedSlot(t *testing.T) {
	ts := startSim(t, func(c *Config) { c.TerminalWidth = -1 })
	ts.mustRun(addCmd("pvc-1", "1G"))
	if err := ts.srv.WriteDisk("pvc-1", 0, bytes.Repeat([]byte{7}, 64<<10)); err != nil {
		t.Fatal(err)
	}
	if out := ts.run(`/disk print stats detail where slot="pvc-1"`); !strings.Contains(out, "write-ops=16 ") {
		t.Fatalf("written:\n%s", out)
	}
	ts.mustRun(`/disk remove [find slot="pvc-1"]`)
	ts.mustRun(`/file remove [find name="storage-pool/k8s/pvc-1.img"]`)
	ts.mustRun(addCmd("pvc-1", "1G"))
	if out := ts.run(`/disk print stats detail where slot="pvc-1"`); !strings.Contains(out, "read-ops=0 read-bytes=0 write-ops=0 write-bytes=0 ") {
		t.Errorf("made again:\n%s", out)
	}
	if err := ts.srv.WriteDisk("pvc-1", 0, bytes.Repeat([]byte{7}, 8192)); err != nil {
		t.Fatal(err)
	}
	if out := ts.run(`/disk print stats detail where slot="pvc-1"`); !strings.Contains(out, "write-ops=2 write-bytes=8 192 ") {
		t.Errorf("written again:\n%s", out)
	}
}
