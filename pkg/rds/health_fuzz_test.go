package rds

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// healthSeeds are the hardware captures and the assumed listings.
func healthSeeds(f *testing.F) {
	for _, dir := range []string{corpusDir(), filepath.Join("testdata", "health")} {
		names, err := filepath.Glob(filepath.Join(dir, "*.txt"))
		if err != nil || len(names) == 0 {
			f.Fatalf("%s: %v, %d files", dir, err, len(names))
		}
		for _, n := range names {
			b, err := os.ReadFile(n)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(string(b))
		}
	}
	f.Add(" 0 type=file slot=\"a\" read-ops=1 204 in-flight-ops=3 active-time=1s200ms read-rate=12.8Mbps\n")
	f.Add(" 0 Bfr type=hardware slot=\"d\" raid-master=\"r\" temperature=74C critical-warning=0x04\n 1 type=raid slot=\"r\" raid-device-count=2\n")
}

// FuzzHealthListing: reading a listing for health (and the same text as
// statistics, applied to it) never panics; every
// array's failed members are among its members, counts are never
// negative, every volume and drive has a slot, every skipped entry is
// ErrBadOutput, and no entry is both reported and skipped.
func FuzzHealthListing(f *testing.F) {
	healthSeeds(f)
	f.Fuzz(func(t *testing.T, out string) {
		l, err := ParseListing(out)
		if err != nil {
			return
		}
		r := HealthFromListing(l, "storage-pool")
		st := StatsFromListing(l)
		r.ApplyStats(st)
		for _, s := range st.Skipped {
			if !errors.Is(s.Err, ErrBadOutput) {
				t.Fatalf("skipped statistics %+v is not ErrBadOutput", s)
			}
		}
		for _, a := range r.Arrays {
			for _, m := range a.Failed {
				if !slices.Contains(a.Members, m) {
					t.Fatalf("array %+v: failed member %q is not a member", a, m)
				}
			}
			if a.Devices < 0 || a.Missing() < 0 {
				t.Fatalf("array %+v", a)
			}
		}
		for _, v := range r.Volumes {
			io := v.IO
			if v.Slot == "" || io.ReadOps < 0 || io.WriteOps < 0 || io.ReadBytes < 0 || io.WriteBytes < 0 || io.InFlight < 0 ||
				io.ActiveTime < 0 || io.WaitTime < 0 || !countable(io.ReadRate) || !countable(io.WriteRate) ||
				!countable(io.ReadOpsRate) || !countable(io.WriteOpsRate) {
				t.Fatalf("volume %+v from %q", v, out)
			}
		}
		for _, d := range r.Drives {
			if d.Slot == "" || (d.CriticalWarning != nil && (*d.CriticalWarning < 0 || *d.CriticalWarning > 255)) {
				t.Fatalf("drive %+v", d)
			}
		}
		for _, s := range r.Skipped {
			if !errors.Is(s.Err, ErrBadOutput) {
				t.Fatalf("skipped %+v is not ErrBadOutput", s)
			}
		}
		if r.Pool != nil && (r.Pool.Capacity.Total < 0 || r.Pool.Capacity.Free < 0) {
			t.Fatalf("pool %+v", r.Pool)
		}
	})
}

// FuzzParseMonitorTraffic: never panics; what it accepts has at least one
// value and no negative one; a refusal is ErrBadOutput.
func FuzzParseMonitorTraffic(f *testing.F) {
	healthSeeds(f)
	f.Add("  in-flight-ops: 9\n  wait-time: 01:02:03\n")
	f.Fuzz(func(t *testing.T, out string) {
		s, err := ParseMonitorTraffic(out)
		if err != nil {
			if !errors.Is(err, ErrBadOutput) {
				t.Fatalf("%q: %v is not ErrBadOutput", out, err)
			}
			return
		}
		if s.Has == 0 || s.InFlight < 0 || s.ReadOps < 0 || s.WriteBytes < 0 || s.ActiveTime < 0 || s.WaitTime < 0 || !countable(s.ReadRate) || !countable(s.WriteRate) {
			t.Fatalf("%q: %+v", out, s)
		}
	})
}

// countable: a rate a metric can carry, never NaN, infinite or negative.
func countable(f float64) bool { return f >= 0 && !math.IsInf(f, 0) }

// FuzzParseDuration: never panics, never negative; nor a rate NaN,
// infinite or negative.
func FuzzParseDuration(f *testing.F) {
	for _, s := range []string{"0ms", "1s200ms", "3d4h12m5s", "01:02:03", "5", "1w", "250us", "99999999999w", "00:00:NaN", "NaNbps", "+Infbps"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if d, err := ParseDuration(s); err == nil && d < 0 {
			t.Fatalf("ParseDuration(%q) = %v", s, d)
		}
		if r, err := ParseRate(s); err == nil && !countable(r) {
			t.Fatalf("ParseRate(%q) = %v", s, r)
		}
	})
}
