package csi

import (
	"strings"
	"testing"
	"time"

	"github.com/srvlab/rds-csi/pkg/rds"
)

func TestVolumeIDFromName(t *testing.T) {
	tests := []struct {
		name, want string
	}{
		{"pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789", "pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789"},
		// Not the sidecar's form: hashed.
		{"pvc-0A1B2C3D-4E5F-6789-ABCD-EF0123456789", "vol-" + hashHex("pvc-0A1B2C3D-4E5F-6789-ABCD-EF0123456789")},
		{"my volume", "vol-" + hashHex("my volume")},
		{"pvc-1", "vol-" + hashHex("pvc-1")},
		{strings.Repeat("x", 128), "vol-" + hashHex(strings.Repeat("x", 128))},
	}
	for _, tc := range tests {
		got := VolumeIDFromName(tc.name)
		if got != tc.want {
			t.Errorf("VolumeIDFromName(%q) = %q, want %q", tc.name, got, tc.want)
		}
		if !isVolumeID(got) || isSnapshotID(got) {
			t.Errorf("VolumeIDFromName(%q) = %q is not recognized as a volume ID only", tc.name, got)
		}
		if err := rds.ValidateSlot(got); err != nil {
			t.Errorf("volume ID %q is not a valid slot: %v", got, err)
		}
		if VolumeIDFromName(tc.name) != got {
			t.Errorf("VolumeIDFromName(%q) is not deterministic", tc.name)
		}
	}
	if VolumeIDFromName("a") == VolumeIDFromName("b") {
		t.Error("different names give one volume ID")
	}
}

func TestSnapshotIDFromName(t *testing.T) {
	tests := []struct {
		name, want string
	}{
		{"snapshot-0a1b2c3d-4e5f-6789-abcd-ef0123456789", "snap-0a1b2c3d-4e5f-6789-abcd-ef0123456789"},
		{"snapshot-x", "snap-" + hashHex("snapshot-x")},
		{"pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789", "snap-" + hashHex("pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789")},
	}
	for _, tc := range tests {
		got := SnapshotIDFromName(tc.name)
		if got != tc.want {
			t.Errorf("SnapshotIDFromName(%q) = %q, want %q", tc.name, got, tc.want)
		}
		if !isSnapshotID(got) || isVolumeID(got) {
			t.Errorf("SnapshotIDFromName(%q) = %q is not recognized as a snapshot ID only", tc.name, got)
		}
	}
}

func TestIsVolumeID(t *testing.T) {
	for id, want := range map[string]bool{
		"pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789":     true,
		"vol-0123456789abcdef0123456789abcdef":         true,
		"vol-0123456789abcdef0123456789abcde":          false, // 31 hex
		"vol-0123456789ABCDEF0123456789ABCDEF":         false,
		"snap-0123456789abcdef0123456789abcdef":        false,
		"pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789.img": false,
		"fake-vol-id": false,
		"":            false,
		"../vol-0123456789abcdef0123456789abcdef":       false,
		"pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789\"; x": false,
	} {
		if got := isVolumeID(id); got != want {
			t.Errorf("isVolumeID(%q) = %v, want %v", id, got, want)
		}
	}
}

func TestSnapshotFileName(t *testing.T) {
	d := NewDriver(testOptions(), nil)
	created := time.Date(2026, 3, 1, 12, 30, 0, 123456789, time.UTC)
	for _, m := range []snapshotMeta{
		{SnapshotID: "snap-0a1b2c3d-4e5f-6789-abcd-ef0123456789", SourceVolumeID: "pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789", CreatedAt: created},
		{SnapshotID: "snap-0123456789abcdef0123456789abcdef", SourceVolumeID: "vol-0123456789abcdef0123456789abcdef", CreatedAt: time.Unix(0, 1).UTC()},
	} {
		p := d.snapshotFilePath(m)
		if err := rds.ValidateFilePath(p); err != nil {
			t.Fatalf("snapshot file path %q is not valid on RouterOS: %v", p, err)
		}
		if !strings.HasPrefix(p, testVolumePath+"/snapshots/") {
			t.Errorf("snapshot file %q is not under %s/snapshots/", p, testVolumePath)
		}
		got, err := d.parseSnapshotDisk(&rds.Disk{Slot: m.SnapshotID, FilePath: p})
		if err != nil {
			t.Fatalf("parse %q: %v", p, err)
		}
		if got != m {
			t.Errorf("parse(%q) = %+v, want %+v", p, got, m)
		}
	}
	// The longest possible path still fits RouterOS' limit at the longest
	// volume path Options accept.
	long := testOptions()
	long.VolumePath = "/" + strings.Repeat("a", maxVolumePathLength-1)
	p := NewDriver(long, nil).snapshotFilePath(snapshotMeta{
		SnapshotID: "snap-0a1b2c3d-4e5f-6789-abcd-ef0123456789", SourceVolumeID: "pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789",
		CreatedAt: time.Unix(0, 1<<62).UTC()})
	if err := rds.ValidateFilePath(p); err != nil {
		t.Errorf("longest snapshot path (%d characters) is invalid: %v", len(p), err)
	}
}

func TestParseSnapshotDiskRejects(t *testing.T) {
	d := NewDriver(testOptions(), nil)
	const snap = "snap-0123456789abcdef0123456789abcdef"
	const vol = "vol-0123456789abcdef0123456789abcdef"
	dir := testVolumePath + "/snapshots/"
	for _, disk := range []rds.Disk{
		{Slot: snap, FilePath: testVolumePath + "/" + snap + ".src-" + vol + ".t-1.img"},              // not in snapshots/
		{Slot: snap, FilePath: "/other/snapshots/" + snap + ".src-" + vol + ".t-1.img"},               // other volume path
		{Slot: snap, FilePath: dir + snap + ".img"},                                                   // no metadata
		{Slot: snap, FilePath: dir + snap + ".src-" + vol + ".img"},                                   // no time
		{Slot: snap, FilePath: dir + snap + ".src-" + vol + ".t-0.img"},                               // zero time
		{Slot: snap, FilePath: dir + snap + ".src-" + vol + ".t-01.img"},                              // non-canonical time
		{Slot: snap, FilePath: dir + snap + ".src-" + vol + ".t-x.img"},                               // bad time
		{Slot: snap, FilePath: dir + snap + ".src-fake.t-1.img"},                                      // bad source
		{Slot: snap, FilePath: dir + "snap-ffffffffffffffffffffffffffffffff.src-" + vol + ".t-1.img"}, // other slot
		{Slot: snap, FilePath: dir + snap + ".src-" + vol + ".t-1.raw"},                               // suffix
	} {
		if m, err := d.parseSnapshotDisk(&disk); err == nil {
			t.Errorf("parseSnapshotDisk(%s) = %+v, want an error", disk.FilePath, m)
		}
	}
}
