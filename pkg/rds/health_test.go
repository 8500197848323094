package rds

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func f64(v float64) *float64 { return &v }
func i64(v int64) *int64     { return &v }

// readHealthCorpus reads testdata/health: the monitor-traffic capture and
// the assumed listings of health.go (docs/routeros.md, "Health and load").
func readHealthCorpus(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "health", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mustListing(t *testing.T, out string) Listing {
	t.Helper()
	l, err := ParseListing(out)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestHealthRDS2216Capture reads the RDS2216 capture of issue 22 (nested
// RAID10 over two RAID1 arrays, one NVMe drive shown): the arrays and
// their members as the listing links them, the pool mounted at raid10.
// The capture is an excerpt: raid1-a's drives and one of raid1-b's are
// not in it, which is how a listing looks when drives dropped out of the
// array, so those arrays read as missing members.
func TestHealthRDS2216Capture(t *testing.T) {
	r := HealthFromListing(mustListing(t, readCorpus(t, "disk-raid-flag-columns.txt")), "raid10")
	want := []Array{
		{Slot: "raid1-a", RAIDType: "raid-1", Devices: 2},
		{Slot: "raid1-b", RAIDType: "raid-1", Devices: 2, Members: []string{"nvme12"}},
		{Slot: "raid10", RAIDType: "raid-0", Devices: 2, Members: []string{"raid1-a", "raid1-b"}},
	}
	if !reflect.DeepEqual(r.Arrays, want) {
		t.Fatalf("arrays %+v, want %+v", r.Arrays, want)
	}
	if r.Arrays[2].Degraded() || !r.Arrays[0].Degraded() || r.Arrays[1].Missing() != 1 {
		t.Errorf("degraded: raid10 %v, raid1-a %v; raid1-b missing %d", r.Arrays[2].Degraded(), r.Arrays[0].Degraded(), r.Arrays[1].Missing())
	}
	if len(r.Drives) != 1 || r.Drives[0].Slot != "nvme12" || r.Drives[0].Master != "raid1-b" || r.Drives[0].Failed ||
		r.Drives[0].Temperature != nil || r.Drives[0].CriticalWarning != nil {
		t.Errorf("drives %+v: want nvme12 in raid1-b, not failed, no S.M.A.R.T. values (none printed)", r.Drives)
	}
	if r.Pool == nil || r.Pool.Slot != "raid10" || r.Pool.Capacity != (Capacity{Total: 15363002253312, Free: 14000000000000}) {
		t.Errorf("pool %+v", r.Pool)
	}
	if len(r.Volumes) != 0 || len(r.Skipped) != 0 {
		t.Errorf("volumes %+v, skipped %+v", r.Volumes, r.Skipped)
	}
}

// TestHealthDegradedRAID6Assumed reads an assumed pair (the listing, with
// no counters or S.M.A.R.T. values as on hardware, and `print stats
// detail` with them under their reference names; wrapped at 80 columns, a
// key broken in the middle): the failed member by its flag and its
// property, the missing one, each drive's values, the pool, each volume's
// counters, and a volume printing fewer counters than another.
func TestHealthDegradedRAID6Assumed(t *testing.T) {
	r := HealthFromListing(mustListing(t, readHealthCorpus(t, "disk-health-raid6-degraded-assumed.txt")), "storage-pool")
	st := StatsFromListing(mustListing(t, readHealthCorpus(t, "disk-stats-assumed.txt")))
	if len(r.Skipped) != 0 || len(st.Skipped) != 0 {
		t.Fatalf("skipped %+v, %+v", r.Skipped, st.Skipped)
	}
	for _, v := range r.Volumes {
		if v.IO.Has != 0 {
			t.Errorf("volume %s: counters %+v from a listing that prints none", v.Slot, v.IO)
		}
	}
	r.ApplyStats(st)
	wantArray := Array{Slot: "raid1", RAIDType: "raid-6", Devices: 6, State: "active, degraded",
		Members: []string{"nvme1", "nvme2", "nvme3", "nvme4", "nvme5"}, Failed: []string{"nvme2"}}
	if len(r.Arrays) != 1 || !reflect.DeepEqual(r.Arrays[0], wantArray) || !r.Arrays[0].Degraded() || r.Arrays[0].Missing() != 1 {
		t.Fatalf("arrays %+v, want %+v (degraded, one missing)", r.Arrays, wantArray)
	}
	if len(r.Drives) != 5 {
		t.Fatalf("drives %+v", r.Drives)
	}
	want2 := Drive{Slot: "nvme2", Model: "SAMSUNG MZQL27T6HBLA-00A07", Serial: "S6CKNE0X000102", Master: "raid1", Failed: true,
		Smart: Smart{Temperature: f64(74), PercentageUsed: f64(97), CriticalWarning: i64(4), UnsafeShutdowns: i64(2)}}
	if !reflect.DeepEqual(r.Drives[1], want2) {
		t.Errorf("nvme2 %+v, want %+v", r.Drives[1], want2)
	}
	if d := r.Drives[0]; d.Failed || *d.Temperature != 41 || *d.CriticalWarning != 0 {
		t.Errorf("nvme1 %+v", d)
	}
	if d := r.Drives[3]; d.Slot != "nvme4" || !d.Smart.Empty() {
		t.Errorf("nvme4 printed no statistics: %+v", d)
	}
	if r.Pool == nil || r.Pool.Slot != "raid1" || r.Pool.Capacity != (Capacity{Total: 30726004506624, Free: 4000000000000}) {
		t.Errorf("pool %+v", r.Pool)
	}
	vol := "pvc-3f2c1a2b-5d4e-4f60-9120-464c8a7b9d0e"
	want := []VolumeIO{
		{Slot: "pvc-2", FilePath: "/storage-pool/kubernetes-volumes/pvc-2.img", IO: IOStats{
			Has: IOReadOps | IOReadBytes | IOWriteOps | IOWriteBytes | IOInFlight}},
		{Slot: vol, FilePath: "/storage-pool/kubernetes-volumes/" + vol + ".img", IO: IOStats{
			Has:     IOReadOps | IOReadBytes | IOWriteOps | IOWriteBytes | IOInFlight | IOActiveTime | IOWaitTime | IOErrors,
			ReadOps: 1204, ReadBytes: 4931584, WriteOps: 88512, WriteBytes: 362545152, InFlight: 7,
			ActiveTime: time.Minute + 3200*time.Millisecond, WaitTime: 2 * time.Second}},
	}
	if !reflect.DeepEqual(r.Volumes, want) {
		t.Errorf("volumes\n%+v\nwant\n%+v", r.Volumes, want)
	}
}

// TestStatsDuplicateSlot: a slot printed twice is neither entry.
func TestStatsDuplicateSlot(t *testing.T) {
	st := StatsFromListing(mustListing(t, " 0 slot=\"a\" read-ops=1\n 1 slot=\"a\" read-ops=2\n 2 slot=\"b\" read-ops=3\n"))
	if _, ok := st.Disks["a"]; ok || len(st.Disks) != 1 || len(st.Skipped) != 1 {
		t.Errorf("%+v", st)
	}
}

// TestHealthSkipsOnlyTheUnreadableEntry: a counter the parser cannot read
// skips that entry; a S.M.A.R.T. value or a raid-device-count it cannot
// read is dropped alone (counted as skipped) and its drive or array is
// still reported; a listing without the counters reports volumes with none.
func TestHealthSkipsOnlyTheUnreadableEntry(t *testing.T) {
	out := ` 0 type=file slot="a" read-ops=12x write-ops=1
 1 type=file slot="b" read-ops=3
 2 type=hardware slot="d1" temperature=hot
 3 type=hardware slot="d2" temperature=30
 4 type=raid slot="r" raid-device-count=many
 5 type=file slot="c" file-path=/p/c.img
`
	r := HealthFromListing(mustListing(t, out), "storage-pool")
	if len(r.Skipped) != 3 {
		t.Fatalf("skipped %+v, want a, d1 and r", r.Skipped)
	}
	for _, s := range r.Skipped {
		if !errors.Is(s.Err, ErrBadOutput) {
			t.Errorf("skipped %d: %v is not ErrBadOutput", s.Number, s.Err)
		}
	}
	want := []VolumeIO{{Slot: "b", IO: IOStats{Has: IOReadOps, ReadOps: 3}}, {Slot: "c", FilePath: "/p/c.img"}}
	if !reflect.DeepEqual(r.Volumes, want) || len(r.Drives) != 2 || r.Drives[0].Slot != "d1" || !r.Drives[0].Smart.Empty() ||
		r.Drives[1].Slot != "d2" || *r.Drives[1].Temperature != 30 || len(r.Arrays) != 1 || r.Arrays[0].Devices != 0 || r.Pool != nil {
		t.Errorf("volumes %+v drives %+v arrays %+v pool %+v", r.Volumes, r.Drives, r.Arrays, r.Pool)
	}
}

// TestMonitorTrafficCapture reads the public hardware capture of
// `/disk monitor-traffic storage-pool once` (the peer driver's): counters,
// rates in bits per second turned into bytes, and columns the client does
// not use (merges, discard, flush) ignored.
func TestMonitorTrafficCapture(t *testing.T) {
	s, err := ParseMonitorTraffic(readHealthCorpus(t, "monitor-traffic-pool.txt"))
	if err != nil {
		t.Fatal(err)
	}
	want := IOStats{
		Has: IOReadOps | IOWriteOps | IOReadBytes | IOWriteBytes | IOInFlight | IOActiveTime | IOWaitTime |
			IOReadOpsRate | IOWriteOpsRate | IOReadRate | IOWriteRate,
		ReadOps: 243401, ReadBytes: 33131503616, WriteOps: 17667231, WriteBytes: 515659673600,
		WriteOpsRate: 76, WriteRate: 12.8e6 / 8,
	}
	if !reflect.DeepEqual(s, want) {
		t.Errorf("got  %+v\nwant %+v", s, want)
	}
	// Fewer columns: what is printed, nothing else.
	s, err = ParseMonitorTraffic("  slot: raid1\n  in-flight-ops: 9\n")
	if err != nil || s != (IOStats{Has: IOInFlight, InFlight: 9}) {
		t.Errorf("two columns: %+v, %v", s, err)
	}
	for _, bad := range []string{"", "  slot: raid1\n", "failure: no such item\n", "  write-rate: 12.8Mbit\n"} {
		if _, err := ParseMonitorTraffic(bad); !errors.Is(err, ErrBadOutput) {
			t.Errorf("%q: %v, want ErrBadOutput", bad, err)
		}
	}
}

func TestParseRateAndDuration(t *testing.T) {
	for in, want := range map[string]float64{"0bps": 0, "12.8Mbps": 1.6e6, "1.5Gbps": 187.5e6, "500kbps": 62500, " 8 bps ": 1} {
		if got, err := ParseRate(in); err != nil || got != want {
			t.Errorf("ParseRate(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "bps", "12.8", "1e3bps", "-1bps", "12.8Mbit"} {
		if _, err := ParseRate(in); !errors.Is(err, ErrBadOutput) {
			t.Errorf("ParseRate(%q): %v, want ErrBadOutput", in, err)
		}
	}
	for in, want := range map[string]time.Duration{"0ms": 0, "10ms": 10 * time.Millisecond, "1s200ms": 1200 * time.Millisecond,
		"3d4h12m5s": 76*time.Hour + 12*time.Minute + 5*time.Second, "1w": 168 * time.Hour, "5": 5 * time.Second,
		"01:02:03": time.Hour + 2*time.Minute + 3*time.Second, "250us": 250 * time.Microsecond} {
		if got, err := ParseDuration(in); err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "ms", "1x", "1s-", "1:2", "-1s", "1:2:x"} {
		if _, err := ParseDuration(in); !errors.Is(err, ErrBadOutput) {
			t.Errorf("ParseDuration(%q): %v, want ErrBadOutput", in, err)
		}
	}
}

// TestHealthCountersRejoinedAcrossBreaks: a counter broken right after its
// first digit group at a line end is rejoined with its space (groupedKeys).
func TestHealthCountersRejoinedAcrossBreaks(t *testing.T) {
	out := " 0 type=file slot=\"a\" write-bytes=515\n      659 673 600 read-ops=1\n      204 write-ops=88 512\n"
	r := HealthFromListing(mustListing(t, out), "p")
	if len(r.Volumes) != 1 || r.Volumes[0].IO.WriteBytes != 515659673600 || r.Volumes[0].IO.ReadOps != 1204 || r.Volumes[0].IO.WriteOps != 88512 {
		t.Fatalf("%+v skipped %+v", r.Volumes, r.Skipped)
	}
	if !strings.Contains(readHealthCorpus(t, "monitor-traffic-pool.txt"), "515 659 673 600") {
		t.Fatal("the corpus prints write-bytes in digit groups")
	}
}

// TestParseDurationNeverOverflows: parts each in range whose sum is not,
// and an hh:mm:ss beyond the range, are refused, never negative.
func TestParseDurationNeverOverflows(t *testing.T) {
	for _, in := range []string{"1000000h1000000h1000000h", "1000000000:00:00", "100000w"} {
		if d, err := ParseDuration(in); err == nil {
			t.Errorf("ParseDuration(%q) = %v, want an error", in, d)
		}
	}
}

// A drive marked failed in its array stays in the report, and
// rds_csi_rds_drive_failed with it, when an assumed S.M.A.R.T. value
// beside the confirmed raid-member-failed=yes is one the parser cannot
// read: RDSCSIRDSDriveFailing's drive_failed arm and `kubectl rds check`'s
// "drive is marked failed" must not go silent for exactly the drive that
// is dying. Input: nvme12 with raid-member-failed=yes temperature="n/a".
func TestFailedDriveKeptWhenSmartUnreadable(t *testing.T) {
	l, err := ParseListing(`Flags: B - BLOCK-DEVICE; M - MOUNTED; r - RAID-MEMBER; f - RAID-MEMBER-FAILED
  7 B   type=raid slot="raid1-a" model="RAID1" size=7 681 501 126 656
        raid-master=none raid-type=raid-1 raid-device-count=2
113 B rf type=hardware slot="nvme12" model="SAMSUNG MZQL27T6HBLA-00A07"
        serial="S6CKNE0X000113" size=7 681 501 126 656 raid-master="raid1-a"
        raid-member-failed=yes temperature="n/a"
114 B r type=hardware slot="nvme13" model="SAMSUNG MZQL27T6HBLA-00A07"
        serial="S6CKNE0X000114" size=7 681 501 126 656 raid-master="raid1-a"
        raid-member-failed=no temperature=41C
`)
	if err != nil {
		t.Fatal(err)
	}
	r := HealthFromListing(l, "raid10")
	for _, d := range r.Drives {
		if d.Slot == "nvme12" {
			if !d.Failed {
				t.Errorf("nvme12 reported, but not failed: %+v", d)
			}
			return
		}
	}
	t.Errorf("nvme12 (raid-member-failed=yes) is not in the report's drives (%+v); skipped: %v", r.Drives, r.Skipped)
}

// An array with a failed member stays in the report when its
// raid-device-count is unreadable: skipping the whole array entry, before
// the pool check, would leave rds_csi_rds_array_degraded without a series
// (RDSCSIRDSArrayDegraded never fires) and drop the pool mounted on that
// array too (the pool capacity alerts and pool rates go silent). Input:
// raid10 with raid-device-count=2+1 (anything not an integer) and
// mount-point=raid10, a member raid1-a marked failed.
func TestArrayKeptWhenDeviceCountUnreadable(t *testing.T) {
	l, err := ParseListing(`Flags: B - BLOCK-DEVICE; M - MOUNTED; r - RAID-MEMBER; f - RAID-MEMBER-FAILED
 26 BM  type=raid slot="raid10" model="RAID10" size=15 363 002 253 312
        free=14 000 000 000 000 mount-point="raid10" raid-master=none
        raid-type=raid-0 raid-device-count=2+1
 27 B rf type=raid slot="raid1-a" model="RAID1" size=7 681 501 126 656
        raid-master="raid10" raid-type=raid-1 raid-device-count=2
        raid-member-failed=yes
`)
	if err != nil {
		t.Fatal(err)
	}
	r := HealthFromListing(l, "raid10")
	found := false
	for _, a := range r.Arrays {
		if a.Slot == "raid10" {
			found = true
			if !a.Degraded() {
				t.Errorf("raid10 (member raid1-a failed) is not degraded: %+v", a)
			}
		}
	}
	if !found {
		t.Errorf("raid10, whose member raid1-a is failed, is not in the report: arrays %+v, skipped %v", r.Arrays, r.Skipped)
	}
	if r.Pool == nil {
		t.Errorf("the pool (mounted on raid10, size= and free= readable) is not reported")
	}
}

// A slot the statistics print three times is taken from none of its
// lines, as StatsFromListing takes a slot printed twice from neither: an
// odd number of repeats does not bring the third line's counters back.
// Input: slot=pvc-a printed three times.
func TestStatsSlotPrintedThriceTakenFromNone(t *testing.T) {
	l, err := ParseListing(` 0 slot="pvc-a" read-ops=1 write-ops=1
 1 slot="pvc-a" read-ops=2 write-ops=2
 2 slot="pvc-a" read-ops=3 write-ops=3
`)
	if err != nil {
		t.Fatal(err)
	}
	r := StatsFromListing(l)
	if d, ok := r.Disks["pvc-a"]; ok {
		t.Errorf("pvc-a, printed three times, is taken with %+v", d.IO)
	}
}

// A rate printed in bytes per second with a capital B, `12.8MBps`, is not
// read as megabits per second, 8 times too low (ParseRate does not fold
// the unit's case): the pool's throughput would look plausible and be
// wrong. Input: write-rate 12.8MBps.
func TestRateInBytesNotReadAsBits(t *testing.T) {
	got, err := ParseRate("12.8MBps")
	if err == nil && got != 12.8e6 {
		t.Errorf("ParseRate(12.8MBps) = %v bytes/s with no error: megabytes read as megabits (want 1.28e7 or an error)", got)
	}
}
