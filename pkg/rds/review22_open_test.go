//go:build review22

package rds

import "testing"

// An open hole of issue 22 found by the outside review; it fails on the
// parser as it is, so it builds only with the tag:
//
//	go test -tags review22 -run TestReview22 ./pkg/rds

// HOLE: a continuation line that starts with a digit group and is
// indented less than the entry's property column is taken for a new
// entry. Entry numbers with three digits (or a row that prints every
// legend column blank-padded) push the property column right; the
// hardware captures only show continuations aligned to it, which is not
// confirmed for 3-digit numbers. Input: `100 Bt type=file ... size=10 737 418`
// then `      240 file-path=/p/b.img` (indent 6 < property column 8).
// Consequence: entry 100 is ACCEPTED (not skipped) with size "10 737 418"
// (10 737 418 bytes instead of 10 GiB) and no file-path; the rest becomes
// a skipped entry "240". ListDisks then reports the driver's own disk with
// a wrong size and an empty FilePath (a CreateVolume retry compares the
// size and refuses; ListVolumes reports the wrong capacity). Broken one
// digit earlier (`size=10 737 41` / `8 240`) the size is malformed and
// the own disk drops out of ListDisks altogether (ListVolumes,
// ListSnapshots and ReconcileExports do not see it). A reading that
// cannot tell must skip the entry, never accept half of it.
// Severity: wrong size / missing path of own disk (no data loss: the
// skipped fragment still holds the path for mayUseFile).
func TestReview22DigitContinuationBelowPropertyColumn(t *testing.T) {
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
