package rdssim

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// The simulated hardware under the pool (issue 27): one RAID-6 array,
// ArraySlot, of six NVMe drives (Drives), each with S.M.A.R.T. values.
// They are listed by an unconditioned `/disk print detail` (and by a
// `where` that matches them) after the pool and the file disks, as the
// RDS2216 listed its arrays and drives: type=raid, type=hardware with
// raid-master and raid-member-failed, the f and r flags. Their S.M.A.R.T.
// values print in `/disk print stats detail` (diskio.go), where the client
// assumes RouterOS prints them (docs/routeros.md, "Health and load").
//
// The state is in memory and starts healthy: a restarted simulator is a
// repaired array. Tests and the fault control protocol (ControlHardware)
// fail or remove a drive, restore the array and set a drive's values.

// ArraySlot is the simulated array's slot.
const ArraySlot = "raid1"

// Drives are the simulated array's members, in slot order.
var Drives = []string{"nvme1", "nvme2", "nvme3", "nvme4", "nvme5", "nvme6"}

// DriveSmart is a drive's S.M.A.R.T. values as the simulator prints them.
type DriveSmart struct {
	Temperature     float64 // degrees Celsius
	PercentageUsed  float64 // percent
	CriticalWarning uint8   // the NVMe critical warning byte
	UnsafeShutdowns int64
}

func defaultSmart(i int) DriveSmart {
	return DriveSmart{Temperature: float64(38 + i%4), PercentageUsed: 2, UnsafeShutdowns: 1}
}

// hardwareState is the array's state; under stateMu.
type hardwareState struct {
	failed  map[string]bool
	removed map[string]bool
	smart   map[string]DriveSmart
}

func (h *hardwareState) init() {
	if h.smart != nil {
		return
	}
	h.failed, h.removed, h.smart = map[string]bool{}, map[string]bool{}, map[string]DriveSmart{}
	for i, d := range Drives {
		h.smart[d] = defaultSmart(i)
	}
}

// errNoDrive: a slot that is not one of Drives.
var errNoDrive = errors.New("no such drive")

func checkDrive(slot string) error {
	if !slices.Contains(Drives, slot) {
		return fmt.Errorf("%w %q: want one of %s", errNoDrive, slot, strings.Join(Drives, ", "))
	}
	return nil
}

// FailDrive marks a drive failed in the array (raid-member-failed=yes,
// flag f): the array is degraded.
func (s *Server) FailDrive(slot string) error {
	return s.changeDrive(slot, func(h *hardwareState) { h.failed[slot] = true })
}

// RemoveDrive takes a drive out of the listing, as a dead or pulled drive
// drops out of /disk: the array shows one member fewer than it is built
// for.
func (s *Server) RemoveDrive(slot string) error {
	return s.changeDrive(slot, func(h *hardwareState) { h.removed[slot] = true })
}

// changeDrive applies change to the hardware state of a drive in slot.
func (s *Server) changeDrive(slot string, change func(*hardwareState)) error {
	if err := checkDrive(slot); err != nil {
		return err
	}
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	s.hw.init()
	change(&s.hw)
	return nil
}

// RestoreArray puts every drive back, healthy, with its first values.
func (s *Server) RestoreArray() {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	s.hw = hardwareState{}
	s.hw.init()
}

// SetDriveSmart sets a drive's S.M.A.R.T. values.
func (s *Server) SetDriveSmart(slot string, v DriveSmart) error {
	return s.changeDrive(slot, func(h *hardwareState) { h.smart[slot] = v })
}

// DriveSmartOf returns a drive's S.M.A.R.T. values.
func (s *Server) DriveSmartOf(slot string) (DriveSmart, error) {
	if err := checkDrive(slot); err != nil {
		return DriveSmart{}, err
	}
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	s.hw.init()
	return s.hw.smart[slot], nil
}

// hardwareFlags are the /disk flag columns of a listing that shows the
// array: diskFlags with RAID-MEMBER-FAILED and RAID-MEMBER before t, in
// the order of MikroTik's /disk reference.
var hardwareFlags = []flagColumn{{'B', "BLOCK-DEVICE"}, {'M', "MOUNTED"}, {'f', "RAID-MEMBER-FAILED"}, {'r', "RAID-MEMBER"}, {'t', "NVME-TCP-EXPORT"}}

// hardwareKeys are the properties of the array and drives that /disk
// where accepts beside diskKeys.
var hardwareKeys = propKeys((&Server{}).arrayItem(), driveItem("", DriveSmart{}, false))

// hardwareItems are the array and its drives as /disk print detail lists
// them; under stateMu.
func (s *Server) hardwareItems() []item {
	s.hw.init()
	items := []item{s.arrayItem()}
	for _, d := range Drives {
		if !s.hw.removed[d] {
			items = append(items, driveItem(d, s.hw.smart[d], s.hw.failed[d]))
		}
	}
	return items
}

// arrayItem is the array: RAID-6 over Drives. raid-state is the assumed
// name of its state (docs/routeros.md).
func (s *Server) arrayItem() item {
	state := "active"
	if s.hw.smart != nil {
		for _, d := range Drives {
			if s.hw.failed[d] || s.hw.removed[d] {
				state = "active, degraded"
			}
		}
	}
	size := int64(len(Drives)-2) * driveSize
	return item{flags: "B", props: append([]prop{
		bareProp("type", "raid"),
		strProp("slot", ArraySlot),
		strProp("slot-default", ""),
		strProp("parent", ""),
		bareProp("fs", "-"),
		strProp("model", "RAID6"),
		{key: "size", raw: fmt.Sprint(size), text: spacedNumber(size)},
		bareProp("raid-master", "none"),
		bareProp("raid-type", "raid-6"),
		bareProp("raid-device-count", strconv.Itoa(len(Drives))),
		strProp("raid-state", state),
	}, unsharedProps()...)}
}

// unsharedProps are the export and sharing properties of a disk that is
// exported and shared nowhere, as the RDS2216 printed its arrays and
// drives.
func unsharedProps() []prop {
	return []prop{
		bareProp("nvme-tcp-export", "no"),
		bareProp("iscsi-export", "no"),
		bareProp("nfs-sharing", "no"),
		bareProp("smb-sharing", "no"),
		bareProp("media-sharing", "no"),
		bareProp("media-interface", "none"),
		bareProp("swap", "no"),
	}
}

// driveSize is each simulated drive's size (the RDS2216's 7.68 TB NVMe).
const driveSize = 7681501126656

func driveItem(slot string, _ DriveSmart, failed bool) item {
	flags := "Br"
	if failed {
		flags = "Bfr"
	}
	return item{flags: flags, props: append([]prop{
		bareProp("type", "hardware"),
		strProp("slot", slot),
		strProp("slot-default", slot),
		strProp("parent", "pcie1"),
		bareProp("fs", "-"),
		strProp("model", "SAMSUNG MZQL27T6HBLA-00A07"),
		strProp("serial", "RDSSIM"+strings.TrimPrefix(slot, "nvme")),
		{key: "size", raw: fmt.Sprint(driveSize), text: spacedNumber(driveSize)},
		strProp("raid-master", ArraySlot),
		bareProp("raid-member-failed", yesNo(failed)),
	}, unsharedProps()...)}
}

// smartProps are a drive's values as `print stats detail` prints them.
func smartProps(v DriveSmart) []prop {
	return []prop{
		bareProp("temperature", strconv.FormatFloat(v.Temperature, 'f', -1, 64)+"C"),
		rawProp("percentage-used", strconv.FormatFloat(v.PercentageUsed, 'f', -1, 64)+"%"),
		bareProp("critical-warning", strconv.Itoa(int(v.CriticalWarning))),
		rawProp("unsafe-shutdowns", spacedNumber(v.UnsafeShutdowns)),
	}
}

// ControlHardware applies a hardware request of the fault control
// protocol and returns its answer line ("ok ..." or "error: ..."):
//
//	drive fail=<slot>        mark a drive failed (the array degrades)
//	drive remove=<slot>      take a drive out of the listing
//	drive restore            every drive back, healthy
//	smart drive=<slot> [temperature=<C>] [percentage-used=<%>] [critical-warning=<0-255>] [unsafe-shutdowns=<n>]
//	io slot=<slot> [read-ops=<n>] [write-ops=<n>] [read-bytes=<n>] [write-bytes=<n>] [in-flight=<n>] [io-errors=<n>]
//
// io adds to a file disk's counters and sets its queue depth (diskio.go).
// handled is false for a line that is none of these.
func (s *Server) ControlHardware(line string) (answer string, handled bool) {
	words, err := splitFaultWords(line)
	if err != nil || len(words) == 0 || words[0].key != "" {
		return "", false
	}
	kv := map[string]string{}
	var bare []string
	for _, w := range words[1:] {
		if w.key == "" {
			bare = append(bare, w.value)
			continue
		}
		if _, dup := kv[w.key]; dup {
			return "error: " + w.key + " given twice", true
		}
		kv[w.key] = w.value
	}
	fail := func(err error) (string, bool) { return "error: " + err.Error(), true }
	switch words[0].value {
	case "drive":
		switch {
		case len(bare) == 1 && bare[0] == "restore" && len(kv) == 0:
			s.RestoreArray()
			return "ok restored", true
		case len(bare) == 0 && len(kv) == 1 && kv["fail"] != "":
			if err := s.FailDrive(kv["fail"]); err != nil {
				return fail(err)
			}
			return "ok failed " + kv["fail"], true
		case len(bare) == 0 && len(kv) == 1 && kv["remove"] != "":
			if err := s.RemoveDrive(kv["remove"]); err != nil {
				return fail(err)
			}
			return "ok removed " + kv["remove"], true
		}
		return "error: want drive fail=<slot>, drive remove=<slot> or drive restore", true
	case "smart":
		slot := kv["drive"]
		v, err := s.DriveSmartOf(slot)
		if err != nil || len(bare) > 0 {
			return fail(fmt.Errorf("want smart drive=<slot> [temperature=<C>] ...: %v", err))
		}
		for k, text := range kv {
			if k == "drive" {
				continue
			}
			f, perr := strconv.ParseFloat(text, 64)
			// NaN compares false with every bound: refused first.
			perr = cmpErr(perr, f)
			bad := perr != nil || f < 0 || math.IsInf(f, 0)
			switch k {
			case "temperature":
				bad = perr != nil || f < -50 || f > 200
				v.Temperature = f
			case "percentage-used":
				bad = bad || f > 255
				v.PercentageUsed = f
			case "critical-warning":
				bad = bad || f > 255 || f != math.Trunc(f)
				v.CriticalWarning = uint8(f)
			case "unsafe-shutdowns":
				bad = bad || f > 1e15 || f != math.Trunc(f)
				v.UnsafeShutdowns = int64(f)
			default:
				return "error: unknown key " + k + ": want temperature, percentage-used, critical-warning or unsafe-shutdowns", true
			}
			if bad {
				return "error: " + k + "=" + text + " is out of range", true
			}
		}
		if err := s.SetDriveSmart(slot, v); err != nil {
			return fail(err)
		}
		return "ok smart " + slot, true
	case "io":
		if len(bare) > 0 {
			return "error: want io slot=<slot> key=<n> ...", true
		}
		if err := s.controlIO(kv); err != nil {
			return fail(err)
		}
		return "ok io " + kv["slot"], true
	}
	return "", false
}

// cmpErr is err, or an error for a NaN (which no range check catches).
func cmpErr(err error, f float64) error {
	if err == nil && math.IsNaN(f) {
		return strconv.ErrSyntax
	}
	return err
}
