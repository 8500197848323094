package rds

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
)

// The RDS's own health and load (issue 27), three commands per poll
// whatever the number of volumes:
//
//   - `/disk print detail` (no condition) lists every disk: the RAID
//     arrays (type=raid), the drives under them (type=hardware, with
//     raid-master and raid-member-failed), and the pool (the disk mounted
//     at the pool's mount point: size=, free=). Health reads it.
//   - `/disk print stats detail` lists every disk's statistics: the I/O
//     counters RouterOS' /disk reference lists (and, for a drive, its
//     S.M.A.R.T. values). DiskStats reads it.
//   - `/disk monitor-traffic <pool> once`: the pool's rates. PoolTraffic.
//
// What is confirmed and what is assumed (docs/routeros.md, "Health and
// load"): the listing's shape and raid-member-failed= (RDS2216 captures,
// which also show that plain print detail carries no counters and no
// S.M.A.R.T. values); monitor-traffic's `key: value` output (a public
// hardware capture, the peer driver's). Assumed: `print stats detail` and
// the names of its values. Every value is optional: what RouterOS does not
// print is absent here (never 0). A S.M.A.R.T. value or an array's
// raid-device-count the parser cannot read is dropped alone (counted as
// skipped), so that the entry's confirmed values, such as a drive's
// raid-member-failed flag, still count; any other value it cannot read
// skips its entry, never the poll.

// IOField names one I/O value of IOStats.
type IOField uint16

// The I/O values RouterOS may print for a disk.
const (
	IOReadOps      IOField = 1 << iota // read-ops: reads completed, cumulative
	IOWriteOps                         // write-ops
	IOReadBytes                        // read-bytes
	IOWriteBytes                       // write-bytes
	IOInFlight                         // in-flight-ops: the queue depth now
	IOActiveTime                       // active-time: time busy, cumulative
	IOWaitTime                         // wait-time: time requests waited, cumulative
	IOErrors                           // io-errors
	IOReadOpsRate                      // read-ops-per-second
	IOWriteOpsRate                     // write-ops-per-second
	IOReadRate                         // read-rate, bytes per second
	IOWriteRate                        // write-rate, bytes per second
)

// IOStats are a disk's I/O counters and rates as RouterOS printed them;
// Has says which were printed.
type IOStats struct {
	Has                       IOField
	ReadOps, WriteOps         int64
	ReadBytes, WriteBytes     int64
	InFlight                  int64
	ActiveTime, WaitTime      time.Duration
	Errors                    int64
	ReadOpsRate, WriteOpsRate float64 // per second
	ReadRate, WriteRate       float64 // bytes per second
}

// ioKeys maps RouterOS' property names to the values they fill: a count,
// a duration or a rate, each read by its parser into its field of IOStats.
var ioKeys = []struct {
	key   string
	field IOField
	read  func(s *IOStats, text string) error
}{
	{"read-ops", IOReadOps, countInto(func(s *IOStats) *int64 { return &s.ReadOps })},
	{"write-ops", IOWriteOps, countInto(func(s *IOStats) *int64 { return &s.WriteOps })},
	{"read-bytes", IOReadBytes, countInto(func(s *IOStats) *int64 { return &s.ReadBytes })},
	{"write-bytes", IOWriteBytes, countInto(func(s *IOStats) *int64 { return &s.WriteBytes })},
	{"in-flight-ops", IOInFlight, countInto(func(s *IOStats) *int64 { return &s.InFlight })},
	{"active-time", IOActiveTime, durationInto(func(s *IOStats) *time.Duration { return &s.ActiveTime })},
	{"wait-time", IOWaitTime, durationInto(func(s *IOStats) *time.Duration { return &s.WaitTime })},
	{"io-errors", IOErrors, countInto(func(s *IOStats) *int64 { return &s.Errors })},
	{"read-ops-per-second", IOReadOpsRate, perSecondInto(func(s *IOStats) *float64 { return &s.ReadOpsRate })},
	{"write-ops-per-second", IOWriteOpsRate, perSecondInto(func(s *IOStats) *float64 { return &s.WriteOpsRate })},
	{"read-rate", IOReadRate, rateInto(func(s *IOStats) *float64 { return &s.ReadRate })},
	{"write-rate", IOWriteRate, rateInto(func(s *IOStats) *float64 { return &s.WriteRate })},
}

func countInto(field func(*IOStats) *int64) func(*IOStats, string) error {
	return func(s *IOStats, text string) (err error) { *field(s), err = parseCount(text); return err }
}

func durationInto(field func(*IOStats) *time.Duration) func(*IOStats, string) error {
	return func(s *IOStats, text string) (err error) { *field(s), err = ParseDuration(text); return err }
}

func rateInto(field func(*IOStats) *float64) func(*IOStats, string) error {
	return func(s *IOStats, text string) (err error) { *field(s), err = ParseRate(text); return err }
}

// perSecondInto reads a count per second (`76`).
func perSecondInto(field func(*IOStats) *float64) func(*IOStats, string) error {
	return func(s *IOStats, text string) error {
		n, err := parseCount(text)
		*field(s) = float64(n)
		return err
	}
}

// ioFromValues reads the I/O values among a disk's properties; a value it
// cannot read is ErrBadOutput naming it.
func ioFromValues(v map[string]string) (IOStats, error) {
	var s IOStats
	for _, k := range ioKeys {
		text, ok := v[k.key]
		if !ok {
			continue
		}
		if err := k.read(&s, text); err != nil {
			return IOStats{}, fmt.Errorf("%s: %w", k.key, err)
		}
		s.Has |= k.field
	}
	return s, nil
}

// parseCount reads a counter: digits, in groups of three after the first
// when RouterOS spaces them (`243 401`), nothing else.
func parseCount(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if t == "" || strings.Trim(t, "0123456789 ") != "" {
		return 0, fmt.Errorf("%w: count %q is not a number", ErrBadOutput, truncate(s))
	}
	return ParseSize(t)
}

// ParseRate reads a rate RouterOS prints with a decimal unit and returns
// bytes per second. The unit's b is case-sensitive: bps is bits per second
// (`0bps`, `12.8Mbps`, `1.5Gbps`, `500kbps`, what the public captures
// show), Bps bytes per second (`12.8MBps`, assumed). The prefix (k, M, G,
// T) is read in either case, since no capture prints a milli rate.
func ParseRate(s string) (float64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	unit := strings.TrimSpace(t[i:])
	bits := 8.0
	rest, ok := strings.CutSuffix(unit, "bps")
	if !ok {
		rest, ok = strings.CutSuffix(unit, "Bps")
		bits = 1
	}
	mult, known := map[string]float64{"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[strings.ToLower(rest)]
	n, err := strconv.ParseFloat(t[:i], 64)
	if !ok || !known || !isDecimal(t[:i]) || err != nil || math.IsNaN(n) || math.IsInf(n*mult, 0) {
		return 0, fmt.Errorf("%w: rate %q is not a number with bps, kbps, Mbps, Gbps, Tbps or their Bps (bytes)", ErrBadOutput, truncate(s))
	}
	return n * mult / bits, nil
}

// maxDuration bounds what ParseDuration accepts (about 146 years), so
// that no sum of its parts overflows.
const maxDuration = time.Duration(math.MaxInt64 / 2)

// ParseDuration reads a RouterOS duration: units from weeks to
// microseconds run together (`0ms`, `1s200ms`, `3d4h12m5s`), or a bare
// number of seconds; `hh:mm:ss` as RouterOS prints some times.
func ParseDuration(s string) (time.Duration, error) {
	t := strings.TrimSpace(s)
	bad := fmt.Errorf("%w: duration %q is not like 1s200ms or 01:02:03", ErrBadOutput, truncate(s))
	if t == "" {
		return 0, bad
	}
	if h, rest, ok := strings.Cut(t, ":"); ok {
		m, sec, ok := strings.Cut(rest, ":")
		if !ok {
			return 0, bad
		}
		var total time.Duration
		for _, p := range []struct {
			text string
			unit time.Duration
		}{{h, time.Hour}, {m, time.Minute}, {sec, time.Second}} {
			// Digits and a point only: ParseFloat alone also takes
			// "NaN", "Inf", exponents and hex, and NaN passes every
			// bound below (it compares false).
			f, err := strconv.ParseFloat(p.text, 64)
			if !isDecimal(p.text) || err != nil || f < 0 || f*float64(p.unit) > float64(maxDuration-total) {
				return 0, bad
			}
			total += time.Duration(f * float64(p.unit))
		}
		return total, nil
	}
	units := map[string]time.Duration{"w": 7 * 24 * time.Hour, "d": 24 * time.Hour, "h": time.Hour, "m": time.Minute,
		"s": time.Second, "ms": time.Millisecond, "us": time.Microsecond}
	var total time.Duration
	for t != "" {
		i := 0
		for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
			i++
		}
		j := i
		for j < len(t) && t[j] >= 'a' && t[j] <= 'z' {
			j++
		}
		f, err := strconv.ParseFloat(t[:i], 64)
		unit, ok := units[t[i:j]]
		if t[i:j] == "" && j == len(t) {
			unit, ok = time.Second, true // a bare number of seconds
		}
		if err != nil || !ok || f < 0 || f*float64(unit) > float64(maxDuration-total) {
			return 0, bad
		}
		total += time.Duration(f * float64(unit))
		t = t[j:]
	}
	return total, nil
}

// isDecimal: digits with at most one point, as RouterOS prints a number.
func isDecimal(s string) bool {
	return s != "" && strings.Trim(s, "0123456789.") == "" && strings.Count(s, ".") <= 1
}

// Array is a RAID array (type=raid) and its members as the listing shows
// them.
type Array struct {
	Slot     string
	RAIDType string // raid-type (raid-1, raid-6, ...)
	// Devices is raid-device-count, the members the array is built for;
	// 0 when not printed.
	Devices int
	Members []string // slots whose raid-master is this array, sorted
	Failed  []string // members printed failed (raid-member-failed=yes or flag f)
	// State is the array's state= or raid-state= as printed, "" when
	// neither is (assumed names; docs/routeros.md).
	State string
}

// Missing is how many members the array is built for and the listing does
// not show (a drive pulled or dead drops out of /disk).
func (a Array) Missing() int { return max(a.Devices-len(a.Members), 0) }

// Degraded: a member failed or missing, or a state that says so.
func (a Array) Degraded() bool {
	s := strings.ToLower(a.State)
	return len(a.Failed) > 0 || a.Missing() > 0 ||
		strings.Contains(s, "degraded") || strings.Contains(s, "fail") || strings.Contains(s, "inactive")
}

// Smart is a drive's S.M.A.R.T. values, each nil when RouterOS did not
// print it.
type Smart struct {
	Temperature     *float64 // degrees Celsius
	PercentageUsed  *float64 // the NVMe endurance estimate, 0-255 %
	CriticalWarning *int64   // the NVMe critical warning byte; 0 is none
	UnsafeShutdowns *int64
}

// Drive is a physical disk (type=hardware): its array membership and its
// S.M.A.R.T. values.
type Drive struct {
	Slot, Model, Serial string
	Master              string // raid-master; "" for none
	Failed              bool   // raid-member-failed=yes or flag f
	Smart
}

// smartKeys are the names a drive's S.M.A.R.T. values are read from, the
// plain name first (assumed; docs/routeros.md).
var (
	temperatureKeys     = []string{"temperature", "smart-temperature"}
	percentageUsedKeys  = []string{"percentage-used", "smart-percentage-used"}
	criticalWarningKeys = []string{"critical-warning", "smart-critical-warning"}
	unsafeShutdownKeys  = []string{"unsafe-shutdowns", "smart-unsafe-shutdowns"}
)

// VolumeIO is a file disk's I/O.
type VolumeIO struct {
	Slot     string
	FilePath string
	IO       IOStats
}

// Pool is the disk mounted at the pool's mount point.
type Pool struct {
	Slot     string
	Capacity Capacity
}

// HealthReport is one `/disk print detail`, read for health and load.
type HealthReport struct {
	Arrays  []Array    // by slot
	Drives  []Drive    // by slot
	Pool    *Pool      // nil: no disk is mounted at the pool
	Volumes []VolumeIO // file disks, by slot
	// Skipped are the entries, or single values of entries otherwise
	// reported, that could not be read (logged and counted by the caller).
	Skipped []SkippedEntry
}

// Health lists every disk once (`/disk print detail`) and reads the arrays,
// drives, the pool mounted at pool and every file disk's I/O from it.
func (c *Client) Health(ctx context.Context, pool string) (HealthReport, error) {
	if err := ValidatePoolName(pool); err != nil {
		return HealthReport{}, err
	}
	l, err := c.printListing(ctx, "/disk print detail")
	if err != nil {
		return HealthReport{}, err
	}
	r := HealthFromListing(l, pool)
	if n := len(r.Skipped); n > 0 {
		c.skipped.Add(int64(n))
	}
	return r, nil
}

// HealthFromListing reads a `/disk print detail` listing of every disk.
func HealthFromListing(l Listing, pool string) HealthReport {
	r := HealthReport{Skipped: append([]SkippedEntry(nil), l.Skipped...)}
	skip := func(e Entry, err error) {
		r.Skipped = append(r.Skipped, SkippedEntry{Number: e.Number, Text: entryText(e), Err: err})
	}
	arrays := map[string]*Array{}
	var members []Entry
	for _, e := range l.Entries {
		v := e.Values
		slot := v["slot"]
		if slot == "" {
			skip(e, fmt.Errorf("%w: disk entry %d has no slot", ErrBadOutput, e.Number))
			continue
		}
		if m := v["raid-master"]; m != "" && m != "none" {
			members = append(members, e)
		}
		switch {
		case v["type"] == "raid":
			a := &Array{Slot: slot, RAIDType: v["raid-type"], State: firstOf(v, "raid-state", "state")}
			if n, ok := v["raid-device-count"]; ok {
				// Unreadable, it is dropped alone: the array stays reported
				// (its failed members, the pool on it) with Devices unknown.
				if d, err := strconv.Atoi(strings.TrimSpace(n)); err != nil || d < 0 {
					skip(e, fmt.Errorf("%w: array %q raid-device-count %q (dropped, the array kept)", ErrBadOutput, slot, truncate(n)))
				} else {
					a.Devices = d
				}
			}
			arrays[slot] = a
		case v["type"] == "hardware":
			d, errs := driveFromEntry(e)
			for _, err := range errs {
				skip(e, err)
			}
			r.Drives = append(r.Drives, d)
		case v["type"] == "file":
			io, err := ioFromValues(v)
			if err != nil {
				skip(e, fmt.Errorf("disk %q: %w", slot, err))
				continue
			}
			r.Volumes = append(r.Volumes, VolumeIO{Slot: slot, FilePath: v["file-path"], IO: io})
		}
		if v["mount-point"] == pool && r.Pool == nil {
			c, err := capacityFromEntries(pool, []Entry{e})
			if err != nil {
				skip(e, err)
				continue
			}
			r.Pool = &Pool{Slot: slot, Capacity: c}
		}
	}
	for _, e := range members {
		a := arrays[e.Values["raid-master"]]
		if a == nil {
			continue // its array is an entry the parser skipped, or not listed
		}
		slot := e.Values["slot"]
		a.Members = append(a.Members, slot)
		if memberFailed(e) {
			a.Failed = append(a.Failed, slot)
		}
	}
	for _, a := range arrays {
		sort.Strings(a.Members)
		sort.Strings(a.Failed)
		r.Arrays = append(r.Arrays, *a)
	}
	sort.Slice(r.Arrays, func(i, j int) bool { return r.Arrays[i].Slot < r.Arrays[j].Slot })
	sort.Slice(r.Drives, func(i, j int) bool { return r.Drives[i].Slot < r.Drives[j].Slot })
	sort.Slice(r.Volumes, func(i, j int) bool { return r.Volumes[i].Slot < r.Volumes[j].Slot })
	return r
}

// memberFailed: raid-member-failed=yes, or the f (RAID-MEMBER-FAILED) flag.
func memberFailed(e Entry) bool {
	return e.Values["raid-member-failed"] == "yes" || strings.ContainsRune(e.Flags, 'f')
}

// driveFromEntry reads a drive; the S.M.A.R.T. values it cannot read are
// left out (nil) and returned as errors, the drive kept.
func driveFromEntry(e Entry) (Drive, []error) {
	v := e.Values
	d := Drive{Slot: v["slot"], Model: v["model"], Serial: v["serial"], Failed: memberFailed(e)}
	if m := v["raid-master"]; m != "none" {
		d.Master = m
	}
	var errs []error
	d.Smart, errs = smartFromValues(v)
	for i, err := range errs {
		errs[i] = fmt.Errorf("drive %q %w (dropped, the drive kept)", d.Slot, err)
	}
	return d, errs
}

// smartFromValues reads the S.M.A.R.T. values among a disk's properties;
// one it cannot read is nil, with an error naming it.
func smartFromValues(v map[string]string) (Smart, []error) {
	var (
		s    Smart
		errs []error
	)
	read := func(keys []string, parse func(string) (float64, error)) *float64 {
		text, ok := firstPresent(v, keys...)
		if !ok {
			return nil
		}
		f, err := parse(text)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", keys[0], err))
			return nil
		}
		return &f
	}
	s.Temperature = read(temperatureKeys, parseNumberWithUnit("C", "°C"))
	s.PercentageUsed = read(percentageUsedKeys, parseNumberWithUnit("%"))
	if f := read(criticalWarningKeys, parseFlagsNumber); f != nil {
		n := int64(*f)
		s.CriticalWarning = &n
	}
	if f := read(unsafeShutdownKeys, func(t string) (float64, error) { n, err := parseCount(t); return float64(n), err }); f != nil {
		n := int64(*f)
		s.UnsafeShutdowns = &n
	}
	return s, errs
}

// Empty: no value was printed.
func (s Smart) Empty() bool {
	return s.Temperature == nil && s.PercentageUsed == nil && s.CriticalWarning == nil && s.UnsafeShutdowns == nil
}

// parseNumberWithUnit reads a number followed by one of units or none
// (`45C`, `45`, `3%`).
func parseNumberWithUnit(units ...string) func(string) (float64, error) {
	return func(s string) (float64, error) {
		t := strings.TrimSpace(s)
		for _, u := range units {
			t = strings.TrimSpace(strings.TrimSuffix(t, u))
		}
		f, err := strconv.ParseFloat(t, 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return 0, fmt.Errorf("%w: %q is not a number", ErrBadOutput, truncate(s))
		}
		return f, nil
	}
}

// parseFlagsNumber reads the NVMe critical-warning byte, decimal or hex
// (`0`, `0x04`).
func parseFlagsNumber(s string) (float64, error) {
	n, err := strconv.ParseUint(strings.TrimSpace(s), 0, 8)
	if err != nil {
		return 0, fmt.Errorf("%w: critical warning %q is not a byte", ErrBadOutput, truncate(s))
	}
	return float64(n), nil
}

func firstPresent(v map[string]string, keys ...string) (string, bool) {
	for _, k := range keys {
		if t, ok := v[k]; ok {
			return t, true
		}
	}
	return "", false
}

func firstOf(v map[string]string, keys ...string) string {
	t, _ := firstPresent(v, keys...)
	return t
}

// DiskStats is one disk's line of `/disk print stats detail`.
type DiskStats struct {
	IO    IOStats
	Smart Smart
}

// StatsReport is `/disk print stats detail` read by slot.
type StatsReport struct {
	Disks   map[string]DiskStats
	Skipped []SkippedEntry
}

// DiskStats lists every disk's statistics once (`/disk print stats
// detail`): the I/O counters of every volume in one command.
func (c *Client) DiskStats(ctx context.Context) (StatsReport, error) {
	l, err := c.printListing(ctx, "/disk print stats detail")
	if err != nil {
		return StatsReport{}, err
	}
	r := StatsFromListing(l)
	if n := len(r.Skipped); n > 0 {
		c.skipped.Add(int64(n))
	}
	return r, nil
}

// StatsFromListing reads a `/disk print stats detail` listing. A slot
// printed more than once is taken from none of its lines. A S.M.A.R.T.
// value it cannot read is dropped alone (counted in Skipped).
func StatsFromListing(l Listing) StatsReport {
	r := StatsReport{Disks: map[string]DiskStats{}, Skipped: append([]SkippedEntry(nil), l.Skipped...)}
	skip := func(e Entry, slot string, err error) {
		r.Skipped = append(r.Skipped, SkippedEntry{Number: e.Number, Text: entryText(e), Err: fmt.Errorf("disk %q: %w", slot, err)})
	}
	repeated := map[string]bool{} // slots printed more than once so far
	for _, e := range l.Entries {
		slot := e.Values["slot"]
		if slot == "" {
			skip(e, slot, fmt.Errorf("%w: statistics entry %d has no slot", ErrBadOutput, e.Number))
			continue
		}
		if _, dup := r.Disks[slot]; dup || repeated[slot] {
			repeated[slot] = true
			delete(r.Disks, slot) // none of its lines is taken for the truth
			skip(e, slot, fmt.Errorf("%w: statistics of slot %q printed more than once", ErrBadOutput, slot))
			continue
		}
		io, err := ioFromValues(e.Values)
		if err != nil {
			skip(e, slot, err)
			repeated[slot] = true // a later line of the slot is not taken either
			continue
		}
		smart, errs := smartFromValues(e.Values)
		for _, err := range errs {
			skip(e, slot, fmt.Errorf("%w (dropped, the entry kept)", err))
		}
		r.Disks[slot] = DiskStats{IO: io, Smart: smart}
	}
	return r
}

// ApplyStats fills in what the statistics print and the listing did not:
// each volume's I/O and each drive's S.M.A.R.T. values. A value the
// listing printed itself is kept.
func (r *HealthReport) ApplyStats(st StatsReport) {
	for i := range r.Volumes {
		if s, ok := st.Disks[r.Volumes[i].Slot]; ok && r.Volumes[i].IO.Has == 0 {
			r.Volumes[i].IO = s.IO
		}
	}
	for i := range r.Drives {
		if s, ok := st.Disks[r.Drives[i].Slot]; ok && r.Drives[i].Smart.Empty() {
			r.Drives[i].Smart = s.Smart
		}
	}
}

// PoolTraffic runs `/disk monitor-traffic <slot> once` and reads its
// `key: value` lines (the pool's rates and counters).
func (c *Client) PoolTraffic(ctx context.Context, slot string) (IOStats, error) {
	if err := ValidatePoolName(slot); err != nil {
		return IOStats{}, err
	}
	out, err := c.exec(ctx, "/disk monitor-traffic %s once", slot)
	if err != nil {
		return IOStats{}, err
	}
	return ParseMonitorTraffic(out)
}

// ParseMonitorTraffic reads `/disk monitor-traffic ... once` output: right-
// aligned `key: value` lines, as /system resource print.
func ParseMonitorTraffic(out string) (IOStats, error) {
	v, err := ParseResource(out)
	if err != nil {
		return IOStats{}, err
	}
	s, err := ioFromValues(v)
	if err != nil {
		return IOStats{}, err
	}
	if s.Has == 0 {
		return IOStats{}, fmt.Errorf("%w: monitor-traffic printed no I/O value", ErrBadOutput)
	}
	return s, nil
}
