package rds

import (
	"errors"
	"testing"
)

func TestParseDisks(t *testing.T) {
	tests := []struct {
		name string
		out  string
		want []Disk
	}{
		{"empty output is no disks", "", nil},
		{"only whitespace", "\r\n  \n", nil},
		{"hardware output", realDisk, []Disk{{
			Slot: "vm-storage-001", Type: "file", FilePath: "/raid10/vm-storage-001.img", Size: 1 << 40,
			Exported: true, Port: 4420, NQN: "nqn.2026-09.com.mikrotik:rds2216.vm-storage-001", Flags: "Bt",
		}}},
		{"unnumbered", unnumbered, []Disk{{
			Slot: "pvc-test-123", Type: "file", FilePath: "/storage-pool/test.img", Size: 53687091200,
			Exported: true, Port: 4420, NQN: "nqn.2000-02.com.mikrotik:pvc-test-123",
		}}},
		{"two entries, crlf, comment, sorted by slot", "Flags: B - BLOCK-DEVICE\r\n 0 B  ;;; made by rds-csi\r\n      type=file slot=\"zz\" file-path=/p/zz.img size=1 048 576\r\n\r\n 1 B type=file slot=\"aa\" file-path=/p/aa.img file-size=2.0MiB nvme-tcp-export=no\r\n",
			[]Disk{
				{Slot: "aa", Type: "file", FilePath: "/p/aa.img", Size: 2 << 20, Flags: "B", AllowHostUnknown: true},
				{Slot: "zz", Type: "file", FilePath: "/p/zz.img", Size: 1 << 20, Flags: "B", AllowHostUnknown: true},
			}},
		{"comment line before the number line", " ;;; hello\n 4 B type=file slot=\"c\" file-path=/p/c.img size=512\n",
			[]Disk{{Slot: "c", Type: "file", FilePath: "/p/c.img", Size: 512, Flags: "B", AllowHostUnknown: true}}},
		{"quoted value with escapes and spaces", ` 0 type=file slot="q" model="a \"b\" c" file-path=/p/q.img size=0`,
			[]Disk{{Slot: "q", Type: "file", FilePath: "/p/q.img", AllowHostUnknown: true}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := disksFromOutput(tc.out)
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %d disks %+v, want %d", len(got), got, len(tc.want))
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("disk %d:\n got %+v\nwant %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

func TestParseRejectsGarbage(t *testing.T) {
	for _, out := range []string{
		"\x00\x01\x02garbage",
		"hello world",
		` 0 type=file slot="unterminated`,
		` 0 B`,
		` 0 type=file slot="x" size=12 34`, // 34 is not a thousands group
		` 0 Type!=x`,
		`=value`,
		` 0 type=file size=lots`,
	} {
		if _, err := disksFromOutput(out); !errors.Is(err, ErrBadOutput) {
			t.Errorf("%q: got %v, want ErrBadOutput", out, err)
		}
	}
}

func TestParseCapacity(t *testing.T) {
	out := " 0 BM type=partition slot=\"storage-pool\" mount-point=\"storage-pool\" fs=btrfs\n     size=7 681 501 126 656 free=7 000 000 000 000\n"
	c, err := capacityFromOutput("storage-pool", out)
	if err != nil {
		t.Fatal(err)
	}
	if c.Total != 7681501126656 || c.Free != 7000000000000 {
		t.Errorf("got %+v", c)
	}
	if _, err := capacityFromOutput("storage-pool", ""); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing pool: got %v, want ErrNotFound", err)
	}
	if _, err := capacityFromOutput("p", ` 0 slot="p" size=10`); !errors.Is(err, ErrBadOutput) {
		t.Errorf("missing free=: got %v, want ErrBadOutput", err)
	}
}

func TestParseResource(t *testing.T) {
	out := "                   uptime: 3d4h12m\n                  version: 7.20.4 (stable)\n               board-name: RDS2216\n"
	got, err := ParseResource(out)
	if err != nil {
		t.Fatal(err)
	}
	if got["version"] != "7.20.4 (stable)" || got["board-name"] != "RDS2216" || got["uptime"] != "3d4h12m" {
		t.Errorf("got %v", got)
	}
	for _, bad := range []string{"", "garbage without colon", "Bad Key: x"} {
		if _, err := ParseResource(bad); !errors.Is(err, ErrBadOutput) {
			t.Errorf("%q: got %v, want ErrBadOutput", bad, err)
		}
	}
}

func TestClassifyOutput(t *testing.T) {
	tests := []struct {
		out    string
		want   error
		silent bool // the output of add/set/remove (else of a print)
	}{
		{"", nil, false},
		{" 0 type=file slot=\"a\"", nil, false},
		{"failure: not enough space\n", ErrNoSpace, false},
		{"failure: no such item", ErrNotFound, false},
		{"no such item", ErrNotFound, false},
		{"failure: disk with such slot already exists", ErrAlreadyExists, false},
		{"failure: file already exists", ErrAlreadyExists, false},
		{"failure: could not create file", ErrCommandFailed, false},
		{"syntax error (line 1 column 7)", ErrInvalidArgument, false},
		{"bad command name dsk (line 1 column 2)", ErrInvalidArgument, false},
		{"expected end of command (line 1 column 40)", ErrInvalidArgument, false},
		{"invalid value for argument file-size", ErrInvalidArgument, false},
		{"input does not match any value of type", ErrInvalidArgument, false},
		// After add/set/remove, which print nothing when they succeed, any
		// text is a refusal: RouterOS does not always say "failure:".
		{"\r\n", nil, true},
		{"invalid parameter", ErrInvalidArgument, true},
		{"disk is in use", ErrCommandFailed, true},
		{"failure: disk is in use\r\n", ErrCommandFailed, true},
		{"not enough space", ErrNoSpace, true},
		{"file already exists", ErrAlreadyExists, true},
		{"could not remove file: permission denied", ErrCommandFailed, true},
	}
	for _, tc := range tests {
		classify := classifyOutput
		if tc.silent {
			classify = classifySilent
		}
		err := classify("/cmd", tc.out)
		if tc.want == nil {
			if err != nil {
				t.Errorf("%q: unexpected %v", tc.out, err)
			}
			continue
		}
		if !errors.Is(err, tc.want) {
			t.Errorf("%q: got %v, want %v", tc.out, err, tc.want)
		}
		if errors.Is(err, ErrTransient) {
			t.Errorf("%q: a RouterOS refusal must never be transient", tc.out)
		}
	}
}

// Entry numbers are right-aligned to one column, and a digit line
// indented to or past it continues a value: a continuation line that
// starts with a digit group and is indented less than the entry's
// property column never leaves half an entry accepted. Entry numbers with
// three digits (or a row that prints every legend column blank-padded)
// push the property column right; the hardware captures only show
// continuations aligned to it, which is not confirmed for 3-digit
// numbers. Input: `100 Bt type=file ... size=10 737 418` then
// `      240 file-path=/p/b.img` (indent 6 < property column 8). Read as a
// new entry, it would leave entry 100 accepted (not skipped) with size
// "10 737 418" (10 737 418 bytes instead of 10 GiB) and no file-path, the
// rest a skipped entry "240": ListDisks would report the driver's own
// disk with a wrong size and an empty FilePath (a CreateVolume retry
// compares the size and refuses; ListVolumes reports the wrong capacity).
// Broken one digit earlier (`size=10 737 41` / `8 240`) the size would be
// malformed and the own disk drop out of ListDisks altogether
// (ListVolumes, ListSnapshots and the export reconcile would not see it).
// A reading that cannot tell skips the entry, never accepts half of it
// (the skipped fragment still holds the path for mayUseFile).
func TestDigitLineBelowThePropertyColumnNeverHalfReadsAnEntry(t *testing.T) {
	out := "Flags: B - BLOCK-DEVICE; t - NVME-TCP-EXPORT\n" +
		"  9 Bt type=file slot=\"pvc-a\" size=10 737 41\n" +
		"        8 240 file-path=/storage-pool/k8s/pvc-a.img\n" +
		"100 Bt type=file slot=\"pvc-b\" size=10 737 418\n" +
		"      240 file-path=/storage-pool/k8s/pvc-b.img\n"
	l, err := ParseListing(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range l.Entries {
		if e.Values["slot"] != "pvc-b" {
			continue
		}
		if e.Values["size"] != "10 737 418 240" || e.Values["file-path"] != "/storage-pool/k8s/pvc-b.img" {
			t.Errorf("entry %d accepted with size=%q file-path=%q; want the whole entry read, or the entry skipped",
				e.Number, e.Values["size"], e.Values["file-path"])
		}
	}
	dl := disksFromListing(l)
	for _, d := range dl.Disks {
		if d.Slot == "pvc-b" && (d.Size != 10737418240 || d.FilePath == "") {
			t.Errorf("ListDisks would report own disk pvc-b with size %d, file-path %q", d.Size, d.FilePath)
		}
	}
}
