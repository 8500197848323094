package rdssim

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"time"
)

// Each file disk's I/O counters (issue 27), printed by `/disk print stats
// detail` and `/disk monitor-traffic <slot> once`.
//
// The simulator does not see the I/O itself: nvmet (the VM tier) reads and
// writes the backing files in the kernel. What it sees is the files: at
// every statistics print or monitor it samples each backing file, and
//   - the bytes newly allocated in the sparse file (st_blocks grown) count
//     as written, one write per 4 KiB page newly allocated;
//   - a file modified (mtime moved) without new allocation counts one write
//     (a rewrite of allocated blocks: at least one happened).
// These are lower bounds: reads and the size of rewrites are not seen. A
// volume written with fio shows writes; one nobody touched shows none.
// Counting starts at the end of the command that created the disk (a
// copy's data is not counted), or at the first command after the
// simulator started.
// Tests add exact counts and set the queue depth with AddIO (fault control:
// `io slot=... write-ops=...`). Counters start at 0 when the simulator
// starts counting a disk (a restart resets them, as a reboot resets
// RouterOS').

// DiskIO is an addition to a file disk's counters (AddIO).
type DiskIO struct {
	ReadOps, WriteOps, ReadBytes, WriteBytes, Errors int64
	// InFlight, when not nil, sets the queue depth (in-flight-ops) until
	// the next AddIO that sets it.
	InFlight *int64
}

// ioState is one file disk's counters; under stateMu.
type ioState struct {
	readOps, writeOps, readBytes, writeBytes, errors int64
	inFlight                                         int64
	active, wait                                     time.Duration
	// What the last sample of the backing file saw.
	allocated int64
	mtime     time.Time
	sampled   bool
}

// ioPage is the page a newly allocated range counts as one write of.
const ioPage = 4096

// diskIO is slot's counters, made on first use; under stateMu.
func (s *Server) diskIO(slot string) *ioState {
	if s.io == nil {
		s.io = map[string]*ioState{}
	}
	st := s.io[slot]
	if st == nil {
		st = &ioState{}
		s.io[slot] = st
	}
	return st
}

// AddIO adds to a file disk's counters (and sets its queue depth).
func (s *Server) AddIO(slot string, add DiskIO) error {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	if s.diskBySlot(slot) == nil {
		return fmt.Errorf("no file disk in slot %q", slot)
	}
	st := s.diskIO(slot)
	st.readOps += add.ReadOps
	st.writeOps += add.WriteOps
	st.readBytes += add.ReadBytes
	st.writeBytes += add.WriteBytes
	st.errors += add.Errors
	if add.InFlight != nil {
		st.inFlight = *add.InFlight
	}
	// Time busy: a millisecond per operation, queueing for the queue.
	st.active += time.Duration(add.ReadOps+add.WriteOps) * time.Millisecond
	st.wait += time.Duration(st.inFlight*(add.ReadOps+add.WriteOps)) * time.Millisecond
	return nil
}

// controlIO applies `io slot=<slot> key=<n> ...` (ControlHardware).
func (s *Server) controlIO(kv map[string]string) error {
	var add DiskIO
	slot := kv["slot"]
	if slot == "" {
		return errors.New("io needs slot=<slot>")
	}
	for k, text := range kv {
		if k == "slot" {
			continue
		}
		n, err := strconv.ParseInt(text, 10, 64)
		if err != nil || n < 0 || n > math.MaxInt64/4 {
			return fmt.Errorf("%s=%s: want a count from 0", k, text)
		}
		switch k {
		case "read-ops":
			add.ReadOps = n
		case "write-ops":
			add.WriteOps = n
		case "read-bytes":
			add.ReadBytes = n
		case "write-bytes":
			add.WriteBytes = n
		case "io-errors":
			add.Errors = n
		case "in-flight":
			add.InFlight = &n
		default:
			return fmt.Errorf("unknown key %s: want read-ops, write-ops, read-bytes, write-bytes, io-errors or in-flight", k)
		}
	}
	return s.AddIO(slot, add)
}

// trackNewDisks starts counting the I/O of every disk not counted yet
// (created by the command that just ran, or there when the simulator
// started): what its file holds now is its baseline. Under stateMu.
func (s *Server) trackNewDisks() {
	if len(s.io) > len(s.disks) {
		// A removed disk's counters go with it: a new disk in its slot
		// starts from 0, as a new RouterOS disk would.
		live := make(map[string]bool, len(s.disks))
		for _, d := range s.disks {
			live[d.Slot] = true
		}
		for slot := range s.io {
			if !live[slot] {
				delete(s.io, slot)
				delete(s.monitors, slot)
			}
		}
	}
	for _, d := range s.disks {
		if st := s.diskIO(d.Slot); !st.sampled {
			s.sample(d, st, false)
		}
	}
}

// sampleIO looks at every backing file and counts what changed since the
// last look (see the top of this file); under stateMu. A file that cannot
// be read is left for the next sample.
func (s *Server) sampleIO() {
	for _, d := range s.disks {
		s.sample(d, s.diskIO(d.Slot), true)
	}
}

// sample looks at d's backing file; count adds what changed since the
// last look to st.
func (s *Server) sample(d *disk, st *ioState, count bool) {
	rel, err := s.relPath(d.FilePath)
	if err != nil {
		return
	}
	fi, err := os.Stat(s.hostPath(rel))
	if err != nil {
		return
	}
	alloc, mtime := allocatedBytes(fi), fi.ModTime()
	switch {
	case !count || !st.sampled:
	case alloc > st.allocated:
		grown := alloc - st.allocated
		st.writeBytes += grown
		st.writeOps += (grown + ioPage - 1) / ioPage
		st.active += time.Duration(grown/ioPage) * 10 * time.Microsecond
	case !mtime.Equal(st.mtime):
		st.writeOps++
	}
	st.allocated, st.mtime, st.sampled = alloc, mtime, true
}

// ioProps are a file disk's counters as `print stats detail` prints them.
func ioProps(st *ioState) []prop {
	count := func(k string, n int64) prop { return prop{key: k, raw: fmt.Sprint(n), text: spacedNumber(n)} }
	return []prop{
		count("read-ops", st.readOps),
		count("read-bytes", st.readBytes),
		count("write-ops", st.writeOps),
		count("write-bytes", st.writeBytes),
		bareProp("in-flight-ops", strconv.FormatInt(st.inFlight, 10)),
		bareProp("active-time", routerOSDurationMs(st.active)),
		bareProp("wait-time", routerOSDurationMs(st.wait)),
		bareProp("io-errors", strconv.FormatInt(st.errors, 10)),
	}
}

// routerOSDurationMs prints d as RouterOS prints short times: "0ms",
// "1s200ms", "1m3s200ms".
func routerOSDurationMs(d time.Duration) string {
	ms := d.Milliseconds()
	if ms%1000 == 0 {
		if ms == 0 {
			return "0ms"
		}
		return routerOSDuration(d)
	}
	if ms < 1000 {
		return strconv.FormatInt(ms, 10) + "ms"
	}
	return routerOSDuration(d) + strconv.FormatInt(ms%1000, 10) + "ms"
}

// statsItems are the items of `/disk print stats detail`: each item of the
// listing with its slot (and, hidden, the properties a where tests), and
// its statistics: a file disk's counters, a drive's S.M.A.R.T. values,
// the pool's and the array's counters summed over the file disks. Under
// stateMu.
func (s *Server) statsItems(items []item, disks []*disk) []item {
	s.sampleIO()
	var total ioState
	for _, d := range s.disks {
		st := s.diskIO(d.Slot)
		total.readOps += st.readOps
		total.writeOps += st.writeOps
		total.readBytes += st.readBytes
		total.writeBytes += st.writeBytes
		total.errors += st.errors
		total.inFlight += st.inFlight
		total.active += st.active
		total.wait += st.wait
	}
	out := make([]item, 0, len(items))
	for i, it := range items {
		st := item{flags: it.flags}
		var slot, typ string
		for _, p := range it.props {
			switch p.key {
			case "slot":
				slot = p.raw
				st.props = append(st.props, p)
			case "type":
				typ = p.raw
				st.props = append(st.props, hidden(p, true))
			default:
				st.props = append(st.props, hidden(p, true))
			}
		}
		switch {
		case i < len(disks) && disks[i] != nil:
			st.props = append(st.props, ioProps(s.diskIO(disks[i].Slot))...)
		case typ == "hardware":
			st.props = append(st.props, smartProps(s.hw.smart[slot])...)
		default: // the pool and the array carry every volume's I/O
			st.props = append(st.props, ioProps(&total)...)
		}
		out = append(out, st)
	}
	return out
}

// monitorState is what the last `monitor-traffic` of a slot saw, for its
// rates; under stateMu.
type monitorState struct {
	at                                       time.Time
	readOps, writeOps, readBytes, writeBytes int64
}

// diskMonitorTraffic answers `/disk monitor-traffic <slot> once`: the
// slot's counters (the pool and the array: every volume's), and rates
// since the previous monitor of that slot (0 the first time).
func (s *Server) diskMonitorTraffic(cmd *command) (string, error) {
	if len(cmd.args) != 2 || cmd.args[0].key != "" || cmd.args[0].val.find != nil || cmd.args[1].key != "" || cmd.args[1].val.text != "once" || cmd.args[1].val.quoted {
		// Without once RouterOS keeps printing; the simulator answers only once.
		return "", expectedEnd(cmd.end)
	}
	slot := cmd.args[0].val.text
	var st []prop
	if d := s.diskBySlot(slot); d != nil {
		// One volume: its file alone is looked at.
		io := s.diskIO(d.Slot)
		s.sample(d, io, true)
		st = append([]prop{strProp("slot", slot)}, ioProps(io)...)
	} else {
		items, disks, err := s.diskItems()
		if err != nil {
			return "", err
		}
		items = append(items, s.hardwareItems()...)
		for _, it := range s.statsItems(items, disks) {
			for _, p := range it.props {
				if p.key == "slot" && p.raw == slot {
					st = it.props
				}
			}
		}
	}
	if st == nil {
		return "", failure("no such item")
	}
	values := map[string]prop{}
	for _, p := range st {
		values[p.key] = p
	}
	n := func(k string) int64 { v, _ := strconv.ParseInt(values[k].raw, 10, 64); return v }
	now := s.now()
	if s.monitors == nil {
		s.monitors = map[string]monitorState{}
	}
	last, seen := s.monitors[slot]
	cur := monitorState{at: now, readOps: n("read-ops"), writeOps: n("write-ops"), readBytes: n("read-bytes"), writeBytes: n("write-bytes")}
	s.monitors[slot] = cur
	rate := func(a, b int64) float64 {
		secs := now.Sub(last.at).Seconds()
		if !seen || secs <= 0 || a < b {
			return 0
		}
		return float64(a-b) / secs
	}
	lines := [][2]string{{"slot", slot}}
	add := func(k string) {
		if p, ok := values[k]; ok {
			lines = append(lines, [2]string{k, p.text})
		}
	}
	add("read-ops")
	lines = append(lines, [2]string{"read-ops-per-second", strconv.FormatInt(int64(math.Round(rate(cur.readOps, last.readOps))), 10)})
	add("read-bytes")
	lines = append(lines, [2]string{"read-rate", bitRate(rate(cur.readBytes, last.readBytes))})
	add("write-ops")
	lines = append(lines, [2]string{"write-ops-per-second", strconv.FormatInt(int64(math.Round(rate(cur.writeOps, last.writeOps))), 10)})
	add("write-bytes")
	lines = append(lines, [2]string{"write-rate", bitRate(rate(cur.writeBytes, last.writeBytes))})
	add("in-flight-ops")
	add("active-time")
	add("wait-time")
	for _, k := range []string{"temperature", "percentage-used", "critical-warning", "unsafe-shutdowns"} {
		add(k)
	}
	return formatResource(lines), nil
}

// bitRate prints bytes per second as RouterOS prints a rate: bits per
// second with a decimal unit and one decimal ("0bps", "12.8Mbps").
func bitRate(bytesPerSec float64) string {
	bits := bytesPerSec * 8
	for _, u := range []struct {
		unit string
		n    float64
	}{{"Gbps", 1e9}, {"Mbps", 1e6}, {"kbps", 1e3}} {
		if bits >= u.n {
			return strconv.FormatFloat(bits/u.n, 'f', 1, 64) + u.unit
		}
	}
	return strconv.FormatFloat(math.Round(bits), 'f', 0, 64) + "bps"
}

// diskPrintKeys are the properties /disk print where accepts: the file
// disks', the pool's and the hardware's.
var diskPrintKeys = func() map[string]bool {
	keys := map[string]bool{}
	for k := range diskKeys {
		keys[k] = true
	}
	for k := range hardwareKeys {
		keys[k] = true
	}
	return keys
}()

// takeStats removes a `stats` argument from a print (before its where)
// and reports whether there was one.
func takeStats(cmd *command) bool {
	for i, a := range cmd.args {
		if a.key == "" && !a.val.quoted && a.val.find == nil && a.val.text == "where" {
			return false
		}
		if a.key == "" && !a.val.quoted && a.val.find == nil && a.val.text == "stats" {
			cmd.args = append(cmd.args[:i:i], cmd.args[i+1:]...)
			return true
		}
	}
	return false
}
