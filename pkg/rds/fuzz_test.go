package rds

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParsePrintDetail: the parser never panics, and every disk it accepts
// has a slot and a non-negative size. The hardware-shaped corpus in
// testdata/routeros seeds it.
func FuzzParsePrintDetail(f *testing.F) {
	for _, s := range []string{realDisk, unnumbered, "", " 0 slot=\"a\" size=1 024", "Flags: X\n 0 X ;;; c\n a=b"} {
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
		disks, err := disksFromOutput(out)
		if err != nil {
			return
		}
		for _, d := range disks {
			if d.Slot == "" || d.Size < 0 {
				t.Fatalf("accepted disk %+v from %q", d, out)
			}
		}
	})
}

// FuzzParseSize: accepted sizes are non-negative, and whole binary-unit
// values survive a format/parse round trip.
func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"53 687 091 200", "50.0GiB", "1.5TiB", "10G", "512", "100 KiB"} {
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
// derives from it, wrapped at any width from 40 to 200 columns, parses
// back exactly.
func FuzzParseWrapped(f *testing.F) {
	f.Add(corpusVolume, uint8(40))
	f.Add(corpusSnapshot, uint8(0))
	f.Add(corpusHashed, uint8(255))
	f.Add("a", uint8(7))
	f.Fuzz(func(t *testing.T, slot string, w uint8) {
		if ValidateSlot(slot) != nil {
			return
		}
		width := 40 + int(w)%161
		file := "/storage-pool/kubernetes-volumes/" + slot + ".img"
		nqn := "nqn.2000-02.com.mikrotik:" + slot
		logical := "Flags: B - BLOCK-DEVICE; M - MOUNTED; t - NVME-TCP-EXPORT\n" +
			" 0 Bt type=file slot=\"" + slot + "\" model=\"" + file + "\" size=10 737 418 240 nvme-tcp-export=yes\n" +
			"      nvme-tcp-server-port=4420 nvme-tcp-server-nqn=\"" + nqn + "\" file-path=" + file + " file-size=10.0GiB\n"
		want := Disk{Slot: slot, Type: "file", FilePath: file, Size: 10 * GiB, Exported: true, Port: 4420, NQN: nqn, Flags: "Bt"}
		out := wordWrap(logical, width, 6)
		got, err := disksFromOutput(out)
		if err != nil || len(got) != 1 || got[0] != want {
			t.Fatalf("width %d: %+v, %v\n%s", width, got, err, out)
		}
	})
}
