package rds

import "testing"

func TestFileKind(t *testing.T) {
	vp := DefaultVolumePath
	for _, tc := range []struct {
		slot, file, want string
	}{
		{"pvc-1", vp + "/pvc-1.img", FileVolume},
		{"snap-1", vp + "/snapshots/snap-1.src-pvc-1.t-1767323045000000006.img", FileSnapshot},
		{"snap-1", vp + "/snapshots/snap-10.src-pvc-1.t-1.img", ""}, // another slot's file
		{"snap-1", vp + "/snapshots/deeper/snap-1.x.img", ""},
		{"pvc-1", vp + "/pvc-2.img", ""},
		{"pvc-1", "/storage-pool/k8s/pvc-1.img", ""},
		{"system", "/storage-pool/system.img", ""},
	} {
		if got := FileKind(vp, Disk{Slot: tc.slot, FilePath: tc.file}); got != tc.want {
			t.Errorf("FileKind(%s, %s) = %q, want %q", tc.slot, tc.file, got, tc.want)
		}
	}
}
