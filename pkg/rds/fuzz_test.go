package rds

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParsePrintDetail: the parser never panics, and every disk it accepts
// has a slot and a non-negative size; a listing read entry by entry
// accounts for what the strict read does (it fails exactly when an entry
// was skipped). The hardware-shaped corpus in testdata/routeros seeds it,
// with the flag-column shapes of issue 22.
func FuzzParsePrintDetail(f *testing.F) {
	for _, s := range []string{realDisk, unnumbered, "", " 0 slot=\"a\" size=1 024", "Flags: X\n 0 X ;;; c\n a=b",
		"Flags: B - BLOCK-DEVICE; M - MOUNTED; r - RAID-MEMBER\n26 BM  type=raid slot=\"r\"\n \n27 B r type=raid slot=\"m\"\n",
		"Flags: B - BLOCK-DEVICE; M - MOUNTED; t - NVME-TCP-EXPORT\n  0 BM  slot=\"iso\"\n \n 12 B t slot=\"a\"\n \n113 B   slot=\"b\"\n",
		"Flags: X - DISABLED; A - ACQUIRED, E - EMPTY, B - BLOCK-DEVICE;\nM - MOUNTED, F - FORMATTING;\n 0  BM  type=hardware slot=\"usb1\"\n",
		unreadableBeside,
		" 0 Bt slot=\"a\" file-path=/p/pvc-ccdecfad-a8bf-572e-9120\n      -464c4d99f12f.img\n",
	} {
		f.Add(s)
	}
	names, err := filepath.Glob(filepath.Join(corpusDir(), "*.txt"))
	if err != nil || len(names) == 0 {
		f.Fatalf("corpus: %v, %d files", err, len(names))
	}
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
	f.Fuzz(func(t *testing.T, out string) {
		l, lerr := ParseListing(out)
		strict, serr := ParsePrintDetail(out)
		if (lerr == nil && len(l.Skipped) == 0) != (serr == nil) || (serr == nil && len(strict) != len(l.Entries)) {
			t.Fatalf("listing %+v, %v; strict %+v, %v from %q", l, lerr, strict, serr, out)
		}
		for _, s := range l.Skipped {
			if !errors.Is(s.Err, ErrBadOutput) {
				t.Fatalf("skipped entry %+v: not ErrBadOutput", s)
			}
		}
		for _, d := range disksFromListing(l).Disks {
			if d.Slot == "" || d.Size < 0 {
				t.Fatalf("accepted disk %+v from %q", d, out)
			}
		}
	})
}

// FuzzParseSize: accepted sizes are non-negative, and whole binary-unit
// values survive a format/parse round trip.
func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"53 687 091 200", "50.0GiB", "1.5TiB", "10G", "512", "100 KiB", "790 626 304", "15 363 002 253 312", "754.0MiB", "1024.0MiB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err != nil {
			return
		}
		if n < 0 {
			t.Fatalf("ParseSize(%q) = %d", s, n)
		}
		if r, err := RoundUpSize(n); err == nil {
			if back, err := ParseSize(FormatSize(r)); err != nil || back != r {
				t.Fatalf("round trip of %d: %d, %v", r, back, err)
			}
		}
	})
}

// FuzzValidateSlot: whatever passes validation is safe to quote into a
// command (no quote, escape, separator, bracket or whitespace).
func FuzzValidateSlot(f *testing.F) {
	for _, s := range hostile {
		f.Add(s)
	}
	f.Add("pvc-1")
	f.Add("pvc-ccdecfad-a8bf-572e-9120-464c4d99f12f")
	f.Add("/storage-pool/metal-csi/pvc-ccdecfad-a8bf-572e-9120 -464c4d99f12f.img")
	f.Fuzz(func(t *testing.T, s string) {
		if ValidateSlot(s) == nil && strings.ContainsAny(s, "\"\\$;[]{}'` \t\r\n/.") {
			t.Fatalf("ValidateSlot accepted %q", s)
		}
		if ValidateFilePath(s) == nil && strings.ContainsAny(s, "\"\\$;[]{}'` \t\r\n") {
			t.Fatalf("ValidateFilePath accepted %q", s)
		}
		if ValidateNQN(s) == nil && strings.ContainsAny(s, "\"\\$;[]{}'` \t\r\n") {
			t.Fatalf("ValidateNQN accepted %q", s)
		}
	})
}

// FuzzParseWrapped: any valid slot, with the file path and NQN the driver
// derives from it, wrapped at any width from 40 to 200 columns, and its
// file path broken once more at any character short of the width (as
// RouterOS broke one before a '-', issue 22 item 3), under the flag
// columns of a legend of B, M and t, parses back exactly.
func FuzzParseWrapped(f *testing.F) {
	f.Add(corpusVolume, uint8(40), uint8(0))
	f.Add(corpusSnapshot, uint8(0), uint8(20))
	f.Add(corpusHashed, uint8(255), uint8(7))
	f.Add("a", uint8(7), uint8(1))
	f.Add("pvc-ccdecfad-a8bf-572e-9120-464c4d99f12f", uint8(80), uint8(59))
	f.Fuzz(func(t *testing.T, slot string, w, cut uint8) {
		if ValidateSlot(slot) != nil {
			return
		}
		width := 40 + int(w)%161
		file := "/storage-pool/kubernetes-volumes/" + slot + ".img"
		nqn := "nqn.2000-02.com.mikrotik:" + slot
		// The path's first piece, then the rest on a line of its own.
		at := 1 + int(cut)%(len(file)-1)
		logical := "Flags: B - BLOCK-DEVICE; M - MOUNTED; t - NVME-TCP-EXPORT\n" +
			" 0 B t type=file slot=\"" + slot + "\" model=\"" + file + "\" size=10 737 418 240 nvme-tcp-export=yes\n" +
			"       nvme-tcp-server-port=4420 nvme-tcp-server-nqn=\"" + nqn + "\" file-path=" + file[:at] + "\n" +
			"       " + file[at:] + " file-size=10.0GiB\n"
		want := Disk{Slot: slot, Type: "file", FilePath: file, Size: 10 * GiB, Exported: true, Port: 4420, NQN: nqn, Flags: "Bt"}
		out := wordWrap(logical, width, 7)
		got, err := disksFromOutput(out)
		if err != nil || len(got) != 1 || got[0] != want {
			t.Fatalf("width %d: %+v, %v\n%s", width, got, err, out)
		}
	})
}
