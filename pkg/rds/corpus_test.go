package rds

import (
	"os"
	"strings"
	"testing"
)

// The corpus in testdata/routeros is RouterOS output shaped like what ROSE
// hardware printed: lines broken at the terminal width (about 80 columns)
// in the middle of keys and of bare, quoted and digit-group values, the
// rest on the next indented line; a Flags legend on two lines; CRLF. It is
// written by hand from those observations (not produced by the simulator),
// so the parser and the simulator do not share a mistake. Every file is a
// parser test here and a seed of FuzzParsePrintDetail.

func TestCorpusDisks(t *testing.T) {
	tests := []struct {
		file string
		want []Disk
	}{
		{"disk-volume-and-snapshot-wrapped-crlf.txt", []Disk{
			{Slot: corpusVolume, Type: "file", FilePath: "/storage-pool/kubernetes-volumes/" + corpusVolume + ".img", Size: 10 * GiB,
				Exported: true, Port: 4420, NQN: "nqn.2000-02.com.mikrotik:" + corpusVolume, Flags: "Bt"},
			{Slot: corpusSnapshot, Type: "file", FilePath: corpusSnapFile, Size: 10 * GiB, Port: 4420, Flags: "B"},
		}},
		{"disk-hashed-id-keys-split.txt", []Disk{
			{Slot: corpusHashed, Type: "file", FilePath: "/storage-pool/k8s/" + corpusHashed + ".img", Size: TiB,
				Exported: true, Port: 4420, NQN: "nqn.2000-02.com.mikrotik:" + corpusHashed, Flags: "Bt"},
		}},
		{"disk-size-split-at-space.txt", []Disk{
			{Slot: "pvc-2", Type: "file", FilePath: "/storage-pool/k8s/pvc-2.img", Size: 10 * GiB, Flags: "B", AllowHostUnknown: true},
		}},
		{"disk-size-split-mid-group-91-columns.txt", []Disk{
			{Slot: "pvc-1", Type: "file", FilePath: "/storage-pool/k8s/pvc-1.img", Size: 53687091200,
				Exported: true, Port: 4420, NQN: "nqn.2000-02.com.mikrotik:pvc-1", Flags: "Bt"},
		}},
		{"disk-no-match-legend-only.txt", nil},
		// Issue 22 items 1, 2 and 5: flag columns under a legend of B, M
		// and t (a mounted image beside the driver's disks: `B t`, and a
		// closed disk printing `B  ` and no port, NQN or allowed host: its
		// host is unknown, not "any host").
		{"disk-mounted-image-beside-exported.txt", []Disk{
			{Slot: "debian-13-iso", Type: "file", FilePath: "/storage-pool/iso/debian-13.1.0-amd64-netinst.iso", Size: 790626304, Flags: "BM", AllowHostUnknown: true},
			{Slot: corpusClosed, Type: "file", FilePath: "/storage-pool/kubernetes-volumes/" + corpusClosed + ".img", Size: GiB, Flags: "B", AllowHostUnknown: true},
			{Slot: corpusVolume, Type: "file", FilePath: "/storage-pool/kubernetes-volumes/" + corpusVolume + ".img", Size: 10 * GiB,
				Exported: true, Port: 4420, NQN: "nqn.2000-02.com.mikrotik:" + corpusVolume, Flags: "Bt"},
		}},
		// Issue 22 item 1: the RDS2216 shapes `27 B r type=raid` and `26
		// BM  type=raid`, numbers of one to three digits, separator lines
		// holding one space.
		{"disk-raid-flag-columns.txt", []Disk{
			{Slot: "nvme12", Type: "hardware", Size: 7681501126656, Flags: "Br", AllowHostUnknown: true},
			{Slot: "raid1-a", Type: "raid", Size: 7681501126656, Flags: "Br", AllowHostUnknown: true},
			{Slot: "raid1-b", Type: "raid", Size: 7681501126656, Flags: "Br", AllowHostUnknown: true},
			{Slot: "raid10", Type: "raid", Size: 15363002253312, Flags: "BM", AllowHostUnknown: true},
		}},
		// Issue 22 item 3: the peer driver's hardware fix (commit
		// a28f18e), a file-path broken short of the width before a '-'.
		{"disk-file-path-broken-short.txt", []Disk{
			{Slot: "pvc-ccdecfad-a8bf-572e-9120-464c4d99f12f", Type: "file", FilePath: "/storage-pool/metal-csi/pvc-ccdecfad-a8bf-572e-9120-464c4d99f12f.img",
				Size: 10 * GiB, Exported: true, Port: 4420, NQN: "nqn.2000-02.com.mikrotik:pvc-ccdecfad-a8bf-572e-9120-464c4d99f12f", Flags: "Bt"},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			got, err := disksFromOutput(readCorpus(t, tc.file))
			if err != nil {
				t.Fatal(err)
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

func TestCorpusOtherPrints(t *testing.T) {
	c, err := capacityFromOutput("storage-pool", readCorpus(t, "pool-free-split.txt"))
	if err != nil || c.Total != 7681501126656 || c.Free != 7000000000000 {
		t.Errorf("pool: %+v, %v", c, err)
	}
	entries, err := ParsePrintDetail(readCorpus(t, "pool-free-split.txt"))
	if err != nil || entries[0].Values["model"] != "" || entries[0].Values["mount-read-only"] != "no" || entries[0].Values["mount-point"] != "storage-pool" {
		t.Errorf("pool entry: %+v, %v", entries, err)
	}

	files := []struct {
		file string
		want []map[string]string
	}{
		{"file-snapshot-wrapped.txt", []map[string]string{{
			"name": strings.TrimPrefix(corpusSnapFile, "/"), "type": ".img file", "size": "10.0GiB", "last-modified": "2026-11-22 10:00:01",
		}}},
		{"file-type-and-time-split.txt", []map[string]string{
			{"name": "storage-pool/k8s/pvc-1.img", "type": ".img file", "size": "10.0GiB", "last-modified": "2026-11-22 10:00:01"},
			{"name": "storage-pool/k8s/pvc-22.img", "type": ".img file", "size": "20.0GiB", "last-modified": "2026-11-22 10:00:02"},
		}},
	}
	for _, tc := range files {
		entries, err := ParsePrintDetail(readCorpus(t, tc.file))
		if err != nil {
			t.Fatalf("%s: %v", tc.file, err)
		}
		if len(entries) != len(tc.want) {
			t.Fatalf("%s: %d entries %+v", tc.file, len(entries), entries)
		}
		for i, want := range tc.want {
			for k, v := range want {
				if got := entries[i].Values[k]; got != v {
					t.Errorf("%s entry %d: %s=%q, want %q", tc.file, i, k, got, v)
				}
			}
			if len(entries[i].Values) != len(want) {
				t.Errorf("%s entry %d: extra properties %v", tc.file, i, entries[i].Values)
			}
		}
	}
}

// TestCorpusIsUsed keeps the corpus and the tables above in step: a file
// added to testdata/routeros must get expectations.
func TestCorpusIsUsed(t *testing.T) {
	names, err := os.ReadDir(corpusDir())
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("corpus_test.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if strings.Count(string(src), `"`+n.Name()+`"`) == 0 {
			t.Errorf("%s has no expectations in corpus_test.go", n.Name())
		}
	}
}

// TestParseValueBrokenAtAnyColumn: the same listing, wrapped at every
// width from 40 to 200 columns, parses to the same disks.
func TestParseValueBrokenAtAnyColumn(t *testing.T) {
	logical := "Flags: X - DISABLED; B - BLOCK-DEVICE; M - MOUNTED; t - NVME-TCP-EXPORT; i - ISCSI-EXPORT\n" +
		" 0 Bt type=file slot=\"" + corpusVolume + "\" slot-default=\"\" parent=\"\" fs=- model=\"/storage-pool/kubernetes-volumes/" + corpusVolume + ".img\"\n" +
		"       size=10 737 418 240 mount-filesystem=no mount-read-only=no compress=no sector-size=512\n" +
		"       nvme-tcp-export=yes nvme-tcp-server-port=4420 nvme-tcp-server-nqn=\"nqn.2000-02.com.mikrotik:" + corpusVolume + "\" nvme-tcp-server-allow-host-name=\"\"\n" +
		"       file-path=/storage-pool/kubernetes-volumes/" + corpusVolume + ".img file-size=10.0GiB file-offset=0\n" +
		"\n" +
		" 1 B  type=file slot=\"" + corpusSnapshot + "\" model=\"" + corpusSnapFile + "\" size=1 099 511 627 776 nvme-tcp-export=no\n" +
		"       file-path=" + corpusSnapFile + " file-size=1024.0GiB\n"
	want := []Disk{
		{Slot: corpusVolume, Type: "file", FilePath: "/storage-pool/kubernetes-volumes/" + corpusVolume + ".img", Size: 10 * GiB,
			Exported: true, Port: 4420, NQN: "nqn.2000-02.com.mikrotik:" + corpusVolume, Flags: "Bt"},
		{Slot: corpusSnapshot, Type: "file", FilePath: corpusSnapFile, Size: TiB, Flags: "B", AllowHostUnknown: true},
	}
	for width := 40; width <= 200; width++ {
		out := wordWrap(logical, width, 7)
		got, err := disksFromOutput(out)
		if err != nil {
			t.Errorf("width %d: %v\n%s", width, err, out)
			continue
		}
		if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
			t.Errorf("width %d:\n got %+v\nwant %+v\n%s", width, got, want, out)
		}
	}
}
