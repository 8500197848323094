package rds

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// Regression tests for issue 22, items 1-3: output shapes seen on RouterOS
// hardware that the parser could not read. Where a shape is quoted
// verbatim in the issue (from RDS2216 captures, and the peer driver's
// hardware fix, its commit a28f18e) the test says so.

// TestFlagColumnsFromLegend: flags stand in the legend's columns, blanks
// for flags not set; the letters set are read by position.
func TestFlagColumnsFromLegend(t *testing.T) {
	tests := []struct {
		name      string
		out       string
		wantFlags []string
		wantSlots []string
	}{
		{
			// Issue 22 item 1, RDS2216 capture: a RAID member `27 B r
			// type=raid ...` and a mounted array `26 BM  type=raid ...`
			// under a legend of B, M and r.
			name: "RDS2216 RAID member and mounted array",
			out: "Flags: B - BLOCK-DEVICE; M - MOUNTED; r - RAID-MEMBER\n" +
				"26 BM  type=raid slot=\"raid10\" mount-point=\"raid10\" size=15 363 002 253 312\n" +
				" \n" +
				"27 B r type=raid slot=\"raid1-b\" raid-master=\"raid10\" size=7 681 501 126 656\n",
			wantFlags: []string{"BM", "Br"},
			wantSlots: []string{"raid10", "raid1-b"},
		},
		{
			// Issue 22 item 1, RDS2216 capture: an exported file disk `31
			// Bt type=file ...` under a legend of B and t.
			name:      "RDS2216 exported file disk",
			out:       realDisk,
			wantFlags: []string{"Bt"},
			wantSlots: []string{"vm-storage-001"},
		},
		{
			// Issue 22 item 2: beside a mounted disk the legend is B, M,
			// t and every exported disk prints `B t`.
			name: "exported disks beside a mounted image",
			out: "Flags: B - BLOCK-DEVICE; M - MOUNTED; t - NVME-TCP-EXPORT\n" +
				" 0 BM  type=file slot=\"iso\" file-path=/storage-pool/iso/a.iso\n" +
				" \n" +
				" 1 B t type=file slot=\"pvc-1\" file-path=/storage-pool/k8s/pvc-1.img\n" +
				" \n" +
				" 2 B   type=file slot=\"pvc-2\" file-path=/storage-pool/k8s/pvc-2.img\n",
			wantFlags: []string{"BM", "Bt", "B"},
			wantSlots: []string{"iso", "pvc-1", "pvc-2"},
		},
		{
			// Entry numbers of one to three digits, right-aligned.
			name: "numbers of one to three digits",
			out: "Flags: B - BLOCK-DEVICE; M - MOUNTED; t - NVME-TCP-EXPORT\n" +
				"  7 B t type=file slot=\"a\"\n \n 42 BM  type=file slot=\"b\"\n \n113 B   type=file slot=\"c\"\n",
			wantFlags: []string{"Bt", "BM", "B"},
			wantSlots: []string{"a", "b", "c"},
		},
		{
			// ... and numbers not padded at all: the flags are then the
			// words before the first property, letters of the legend.
			name: "numbers not padded",
			out: "Flags: B - BLOCK-DEVICE; M - MOUNTED; t - NVME-TCP-EXPORT\n" +
				"7 B t type=file slot=\"a\"\n113 B   type=file slot=\"c\"\n",
			wantFlags: []string{"Bt", "B"},
			wantSlots: []string{"a", "c"},
		},
		{
			// RouterOS 7 legends group exclusive flags in one column
			// (`A - ACQUIRED, E - EMPTY, B - BLOCK-DEVICE;`) and run onto
			// more lines: a public capture of /disk print detail on a hAP
			// ax3 with a USB disk, ` 0  BM         type=hardware`.
			name: "grouped legend columns on two lines",
			out: "Flags: X - DISABLED; A - ACQUIRED, E - EMPTY, B - BLOCK-DEVICE;\n" +
				"M - MOUNTED, F - FORMATTING, S - SWAP-ENABLED;\n" +
				" 0  BM         type=hardware slot=\"usb1\" fs=ext4\n" +
				"               size=124 948 316 160 free=122 382 983 168\n",
			wantFlags: []string{"BM"},
			wantSlots: []string{"usb1"},
		},
		{
			// The same grouping on another menu, a comment after the flags
			// (a public capture of /interface print detail, RouterOS 7).
			name: "grouped columns and a comment",
			out: "Flags: D - DYNAMIC; X - DISABLED, R - RUNNING; S - SLAVE\n" +
				" 0  RS ;;; defconf\n" +
				"        slot=\"ether1\" type=\"ether\" mtu=1500\n" +
				" 1  R  slot=\"ether2\" type=\"ether\" mtu=1500\n",
			wantFlags: []string{"RS", "R"},
			wantSlots: []string{"ether1", "ether2"},
		},
		{
			// A legend that names flags no entry carries (assumed possible:
			// the hAP ax3 capture names X): blank columns for them.
			name: "legend naming unused flags",
			out: "Flags: X - DISABLED; B - BLOCK-DEVICE; M - MOUNTED; r - RAID-MEMBER; t - NVME-TCP-EXPORT; i - ISCSI-EXPORT\n" +
				" 0  B  t  type=file slot=\"a\"\n \n 1  BM    type=file slot=\"b\"\n \n 2  B r   type=raid slot=\"c\"\n",
			wantFlags: []string{"Bt", "BM", "Br"},
			wantSlots: []string{"a", "b", "c"},
		},
		{
			// A comment line before the first number line is the entry's,
			// not more of the legend.
			name: "comment line after the legend",
			out: "Flags: B - BLOCK-DEVICE; M - MOUNTED; t - NVME-TCP-EXPORT\n" +
				" ;;; made by hand\n" +
				" 0 B t type=file slot=\"a\"\n",
			wantFlags: []string{"Bt"},
			wantSlots: []string{"a"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			entries, err := ParsePrintDetail(tc.out)
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) != len(tc.wantFlags) {
				t.Fatalf("%d entries %+v, want %d", len(entries), entries, len(tc.wantFlags))
			}
			for i, e := range entries {
				if e.Flags != tc.wantFlags[i] || e.Values["slot"] != tc.wantSlots[i] {
					t.Errorf("entry %d: flags %q slot %q, want %q %q", i, e.Flags, e.Values["slot"], tc.wantFlags[i], tc.wantSlots[i])
				}
			}
		})
	}
}

// TestCommentAfterLegend: a `;;;` comment line between the legend and the
// first entry is that entry's comment, not more of the legend (which would
// lose the comment and the legend's columns).
func TestCommentAfterLegend(t *testing.T) {
	entries, err := ParsePrintDetail("Flags: B - BLOCK-DEVICE; M - MOUNTED; t - NVME-TCP-EXPORT\n ;;; made by hand\n 0 B t type=file slot=\"a\"\n")
	if err != nil || len(entries) != 1 || entries[0].Comment != "made by hand" || entries[0].Flags != "Bt" {
		t.Fatalf("%+v, %v", entries, err)
	}
}

// TestListingSkipsUnreadableEntry: one entry the parser cannot read never
// fails the listing of the others; it is skipped, counted and kept for the
// record. Reading that one entry alone still fails.
func TestListingSkipsUnreadableEntry(t *testing.T) {
	l, err := ParseListing(unreadableBeside)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Entries) != 1 || l.Entries[0].Values["slot"] != "pvc-1" || l.Entries[0].Flags != "Bt" {
		t.Fatalf("entries %+v", l.Entries)
	}
	if len(l.Skipped) != 1 || l.Skipped[0].Number != 1 || !errors.Is(l.Skipped[0].Err, ErrBadOutput) || !strings.Contains(l.Skipped[0].Text, "mystery") {
		t.Fatalf("skipped %+v", l.Skipped)
	}
	if !l.Skipped[0].mayUseFile("/storage-pool/k8s/pvc-2.img") || l.Skipped[0].mayUseFile("/storage-pool/k8s/pvc-1.img") {
		t.Errorf("mayUseFile does not see the broken path in %q", l.Skipped[0].Text)
	}
	if _, err := ParsePrintDetail(unreadableBeside); !errors.Is(err, ErrBadOutput) {
		t.Errorf("strict parse: %v", err)
	}
	// A disk entry without a slot is skipped the same way.
	dl := disksFromListing(Listing{Entries: []Entry{{Number: 3, Values: map[string]string{"type": "file"}}}})
	if len(dl.Disks) != 0 || len(dl.Skipped) != 1 || dl.Skipped[0].Number != 3 {
		t.Errorf("disk without slot: %+v", dl)
	}
}

// TestClientListsBesideUnreadableEntry: over SSH, ListDisks answers with
// the driver's disk and counts the entry it skipped; GetDisk of the
// unreadable one is an error, never "not found"; and a file an unreadable
// entry may use is never reclaimed as debris.
func TestClientListsBesideUnreadableEntry(t *testing.T) {
	env := startSim(t, 10*GiB)
	c := env.client(t, nil)
	ctx := context.Background()
	env.sim.InjectFault(rdssim.Fault{Kind: rdssim.FaultGarbage, Match: "where type=file", Output: unreadableBeside})
	disks, err := c.ListDisks(ctx)
	if err != nil || len(disks) != 1 || disks[0].Slot != "pvc-1" || !disks[0].Exported || disks[0].Port != 4420 {
		t.Fatalf("ListDisks = %+v, %v", disks, err)
	}
	if n := c.SkippedEntries(); n != 1 {
		t.Errorf("SkippedEntries = %d, want 1", n)
	}
	env.sim.InjectFault(rdssim.Fault{Kind: rdssim.FaultGarbage, Match: "where slot=", Output: unreadableBeside[:strings.Index(unreadableBeside, " 0 B t")] + unreadableBeside[strings.Index(unreadableBeside, " 1 Q?"):]})
	if _, err := c.GetDisk(ctx, "mystery"); !errors.Is(err, ErrBadOutput) || errors.Is(err, ErrNotFound) {
		t.Errorf("GetDisk of the unreadable entry: %v, want ErrBadOutput", err)
	}

	// Debris: a file at the path, no disk in the slot, and an unreadable
	// entry that may use the file: the file is not the driver's to remove.
	path := "/storage-pool/k8s/pvc-2.img"
	if _, err := c.CreateDisk(ctx, CreateDiskRequest{Slot: "pvc-2", FilePath: path, Size: GiB}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.exec(ctx, "/disk remove [find slot=%s]", "pvc-2"); err != nil {
		t.Fatal(err)
	}
	env.sim.InjectFault(rdssim.Fault{Kind: rdssim.FaultGarbage, Match: "where type=file", Output: unreadableBeside})
	if _, err := c.CreateDisk(ctx, CreateDiskRequest{Slot: "pvc-2", FilePath: path, Size: GiB, OwnsFilePath: true}); !errors.Is(err, ErrAlreadyExists) {
		t.Errorf("create over a file an unreadable entry may use: %v, want ErrAlreadyExists", err)
	}
	if !env.fileExists(t, path) {
		t.Error("the file was removed")
	}
}

// TestValueBrokenShortOfWidth: issue 22 item 3, the peer driver's hardware
// fix (its commit a28f18e): RouterOS broke an unquoted
// `file-path=/storage-pool/metal-csi/pvc-...-9120` and continued it with
// `-464c...img` on the next line, well short of the terminal width. The
// pieces join without a space, wherever the line ended.
func TestValueBrokenShortOfWidth(t *testing.T) {
	const want = "/storage-pool/metal-csi/pvc-ccdecfad-a8bf-572e-9120-464c4d99f12f.img"
	for _, out := range []string{
		// As the peer's commit message shows it: the rest indented under
		// the value.
		" 0 Bt type=file slot=\"pvc-ccdecfad-a8bf-572e-9120-464c4d99f12f\" nvme-tcp-export=yes nvme-tcp-server-port=4420\n" +
			"      file-path=/storage-pool/metal-csi/pvc-ccdecfad-a8bf-572e-9120\n" +
			"                -464c4d99f12f.img\n" +
			"      file-size=10.0GiB file-offset=0\n",
		// The rest at the property column, more properties after it.
		" 0 Bt type=file slot=\"pvc-ccdecfad-a8bf-572e-9120-464c4d99f12f\" nvme-tcp-export=yes nvme-tcp-server-port=4420\n" +
			"      file-path=/storage-pool/metal-csi/pvc-ccdecfad-a8bf-572e-9120\n" +
			"      -464c4d99f12f.img file-size=10.0GiB file-offset=0\n",
		// Broken after the hyphen instead, and in the middle of a word.
		" 0 Bt type=file slot=\"pvc-ccdecfad-a8bf-572e-9120-464c4d99f12f\" nvme-tcp-export=yes nvme-tcp-server-port=4420\n" +
			"      file-path=/storage-pool/metal-csi/pvc-ccdecfad-a8bf-\n      572e-9120-464c4d99f12f.img\n",
		" 0 Bt type=file slot=\"pvc-ccdecfad-a8bf-572e-9120-464c4d99f12f\" nvme-tcp-export=yes nvme-tcp-server-port=4420\n" +
			"      file-path=/storage-pool/met\n      al-csi/pvc-ccdecfad-a8bf-572e-9120-464c4d99f12f.img\n",
	} {
		disks, err := disksFromOutput(out)
		if err != nil || len(disks) != 1 || disks[0].FilePath != want {
			t.Errorf("%+v, %v; want file %s from\n%s", disks, err, want, out)
		}
	}
}

// TestValueBrokenAtAnyCharacter: every value of a listing broken at every
// character, on a line of any length, reads back the same. RouterOS's
// rule for where it breaks short of the width is not known; the parser
// must not depend on it.
func TestValueBrokenAtAnyCharacter(t *testing.T) {
	const head = "Flags: B - BLOCK-DEVICE; M - MOUNTED; t - NVME-TCP-EXPORT\n 0 B t "
	props := []string{
		"type=file", `slot="` + corpusVolume + `"`, "size=10 737 418 240",
		"nvme-tcp-export=yes", "nvme-tcp-server-port=4420",
		`nvme-tcp-server-nqn="nqn.2000-02.com.mikrotik:` + corpusVolume + `"`,
		"nvme-tcp-server-allow-host-name=\"\"",
		"file-path=/storage-pool/kubernetes-volumes/" + corpusVolume + ".img", "file-size=10.0GiB",
	}
	want := Disk{Slot: corpusVolume, Type: "file", FilePath: "/storage-pool/kubernetes-volumes/" + corpusVolume + ".img",
		Size: 10 * GiB, Exported: true, Port: 4420, NQN: "nqn.2000-02.com.mikrotik:" + corpusVolume, Flags: "Bt"}
	for i, p := range props {
		for cut := 1; cut < len(p); cut++ {
			lines := []string{head + strings.Join(props[:i], " ")}
			if i == 0 {
				lines[0] += p[:cut]
			} else {
				lines[0] += " " + p[:cut]
			}
			lines = append(lines, "       "+strings.Join(append([]string{p[cut:]}, props[i+1:]...), " "))
			out := strings.Join(lines, "\n") + "\n"
			got, err := disksFromOutput(out)
			if err != nil || len(got) != 1 || got[0] != want {
				t.Errorf("broken at %d of %q: %+v, %v\n%s", cut, p, got, err, out)
			}
		}
	}
}

// TestClientReadsValuesBrokenBeforeHyphen: against the simulator breaking
// long values before a '-' short of the width (rdssim ValueBreakHyphen, as
// the hardware broke a file-path) and at the width, under flag columns of
// a legend naming the flags in use or all of them, with a mounted image
// beside the driver's disks, every read returns the driver's IDs, paths
// and NQNs exactly, and a delete finds its file.
func TestClientReadsValuesBrokenBeforeHyphen(t *testing.T) {
	type variant struct {
		vb     rdssim.ValueBreak
		legend rdssim.Legend
	}
	for _, v := range []variant{{rdssim.ValueBreakWidth, rdssim.LegendUsed}, {rdssim.ValueBreakHyphen, rdssim.LegendUsed}, {rdssim.ValueBreakHyphen, rdssim.LegendAll}} {
		vb := v.vb
		t.Run(string(vb)+"/"+string(v.legend), func(t *testing.T) {
			env := startSimWith(t, 10*GiB, func(c *rdssim.Config) { c.ValueBreak, c.Legend = vb, v.legend })
			if err := env.sim.AddMountedImage("debian-iso", "/storage-pool/iso/debian-13.1.0-amd64-netinst.iso", MiB); err != nil {
				t.Fatal(err)
			}
			c := env.client(t, nil)
			ctx := context.Background()
			r := wrapReq()
			d, err := c.CreateDisk(ctx, r)
			if err != nil || d.FilePath != r.FilePath || d.NQN != r.Export.NQN {
				t.Fatalf("CreateDisk = %+v, %v", d, err)
			}
			if _, err := c.CopyDisk(ctx, CopyDiskRequest{Slot: wrapSnapshot, FilePath: wrapSnapFile, SourceSlot: wrapVolume}); err != nil {
				t.Fatal(err)
			}
			disks, err := c.ListDisks(ctx)
			if err != nil || len(disks) != 3 || c.SkippedEntries() != 0 {
				t.Fatalf("ListDisks = %+v, %v (skipped %d)", disks, err, c.SkippedEntries())
			}
			byslot := map[string]Disk{}
			for _, d := range disks {
				byslot[d.Slot] = d
			}
			if v := byslot[wrapVolume]; v.FilePath != r.FilePath || v.NQN != r.Export.NQN || v.Flags != "Bt" {
				t.Errorf("volume %+v", v)
			}
			if s := byslot[wrapSnapshot]; s.FilePath != wrapSnapFile {
				t.Errorf("snapshot %+v", s)
			}
			if img := byslot["debian-iso"]; img.Flags != "BM" || img.FilePath != "/storage-pool/iso/debian-13.1.0-amd64-netinst.iso" {
				t.Errorf("image %+v", img)
			}
			if out := lastPrint(env, "where type=file"); (vb == rdssim.ValueBreakHyphen) != brokenShortBeforeHyphen(out) {
				t.Errorf("%s: values broken before a '-' short of the width: %v\n%s", vb, brokenShortBeforeHyphen(out), out)
			}
			if err := c.DeleteDisk(ctx, wrapSnapshot, wrapSnapFile); err != nil {
				t.Fatal(err)
			}
			if err := c.DeleteDisk(ctx, wrapVolume, r.FilePath); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// brokenShortBeforeHyphen reports whether out has a line shorter than its
// longest that the next line continues with a '-'.
func brokenShortBeforeHyphen(out string) bool {
	lines := strings.Split(out, "\n")
	for i := 0; i+1 < len(lines); i++ {
		if strings.HasPrefix(strings.TrimLeft(lines[i+1], " "), "-") && len(lines[i]) < longestLine(out) {
			return true
		}
	}
	return false
}
