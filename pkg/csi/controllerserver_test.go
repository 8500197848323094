package csi

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/srvlab/rds-csi/pkg/rds"
)

func mustCreate(t *testing.T, s *ControllerServer, req *csi.CreateVolumeRequest) *csi.Volume {
	t.Helper()
	resp, err := s.CreateVolume(context.Background(), req)
	if err != nil {
		t.Fatalf("CreateVolume(%s): %v", req.Name, err)
	}
	return resp.Volume
}

func mustSnapshot(t *testing.T, s *ControllerServer, name, source string) *csi.Snapshot {
	t.Helper()
	resp, err := s.CreateSnapshot(context.Background(), &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: source})
	if err != nil {
		t.Fatalf("CreateSnapshot(%s of %s): %v", name, source, err)
	}
	return resp.Snapshot
}

func expectCode(t *testing.T, what string, err error, want codes.Code, msgParts ...string) {
	t.Helper()
	if got := code(err); got != want {
		t.Fatalf("%s: code %v (%v), want %v", what, got, err, want)
	}
	for _, p := range msgParts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("%s: message %q does not mention %q", what, err.Error(), p)
		}
	}
}

func TestControllerCapabilities(t *testing.T) {
	s, _ := newTestController(t)
	resp, err := s.ControllerGetCapabilities(context.Background(), &csi.ControllerGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var got []csi.ControllerServiceCapability_RPC_Type
	for _, c := range resp.Capabilities {
		got = append(got, c.GetRpc().GetType())
	}
	for _, want := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME, csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES, csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
		csi.ControllerServiceCapability_RPC_CLONE_VOLUME, csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
		csi.ControllerServiceCapability_RPC_GET_CAPACITY, csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
	} {
		if !slices.Contains(got, want) {
			t.Errorf("capability %v not advertised", want)
		}
	}
	// Fencing is not implemented: the driver must not claim to publish.
	for _, never := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
		csi.ControllerServiceCapability_RPC_PUBLISH_READONLY,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES,
	} {
		if slices.Contains(got, never) {
			t.Errorf("capability %v advertised before fencing exists", never)
		}
	}
	_, err = s.ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{VolumeId: testPVC, NodeId: "n1"})
	expectCode(t, "ControllerPublishVolume", err, codes.Unimplemented)
}

func TestCheckCapability(t *testing.T) {
	m := csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
	tests := []struct {
		name    string
		cap     *csi.VolumeCapability
		wantErr string // "" means supported
	}{
		{"mount SNW", mountCap(snw, ""), ""},
		{"mount SNW ext4", mountCap(snw, "ext4"), ""},
		{"mount SNW xfs", mountCap(snw, "xfs"), ""},
		{"mount SNSW", mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER, ""), ""},
		{"mount SNMW", mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER, ""), ""},
		{"mount MNRO", mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY, ""), ""},
		{"block MNMW", blockCap(m), ""},
		{"block SNW", blockCap(snw), ""},
		{"mount MNMW", mountCap(m, "ext4"), "raw block volumes only"},
		{"mount btrfs", mountCap(snw, "btrfs"), `filesystem "btrfs" is not supported`},
		{"SNRO", mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY, ""), "not offered"},
		{"MNSW", blockCap(csi.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER), "not offered"},
		{"no access mode", &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}}, "no access mode"},
		{"no access type", &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: snw}}, "neither block nor mount"},
		{"nil", nil, "empty"},
	}
	for _, tc := range tests {
		err := checkCapability(tc.cap)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%s: unexpected error %v", tc.name, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.wantErr)
		}
	}
}

func TestCheckParameters(t *testing.T) {
	if err := checkParameters(map[string]string{
		"csi.storage.k8s.io/pvc/name": "data", "csi.storage.k8s.io/pvc/namespace": "default", "csi.storage.k8s.io/pv/name": testPVC,
	}); err != nil {
		t.Errorf("provisioner metadata rejected: %v", err)
	}
	if err := checkParameters(nil); err != nil {
		t.Errorf("no parameters rejected: %v", err)
	}
	err := checkParameters(map[string]string{"fstype": "ext4", "pool": "x", "csi.storage.k8s.io/pvc/name": "a"})
	if err == nil {
		t.Fatal("unknown parameters accepted")
	}
	for _, want := range []string{`"fstype"`, `"pool"`, "csi.storage.k8s.io/"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}

func TestCreateSize(t *testing.T) {
	const mib = rds.MiB
	tests := []struct {
		name       string
		rng        sizeRange
		sourceSize int64
		want       int64
		wantCode   codes.Code
	}{
		{"exact MiB", sizeRange{required: 5 * mib}, 0, 5 * mib, codes.OK},
		{"rounded up", sizeRange{required: 5*mib + 1}, 0, 6 * mib, codes.OK},
		{"rounded within limit", sizeRange{required: 5*mib + 1, limit: 6 * mib}, 0, 6 * mib, codes.OK},
		{"required equals limit", sizeRange{required: 7 * mib, limit: 7 * mib}, 0, 7 * mib, codes.OK},
		{"rounding would pass the limit", sizeRange{required: 5*mib + 1, limit: 5*mib + 100}, 0, 0, codes.OutOfRange},
		{"default", sizeRange{}, 0, DefaultVolumeSize, codes.OK},
		{"default capped by limit", sizeRange{limit: 10 * mib}, 0, 10 * mib, codes.OK},
		{"limit below a MiB", sizeRange{limit: 1000}, 0, 0, codes.OutOfRange},
		{"source size by default", sizeRange{}, 3 * mib, 3 * mib, codes.OK},
		{"larger than source", sizeRange{required: 9 * mib}, 3 * mib, 9 * mib, codes.OK},
		{"smaller than source", sizeRange{required: 2 * mib}, 3 * mib, 0, codes.OutOfRange},
		{"smaller than source after rounding", sizeRange{required: 2*mib + 1}, 3*mib + 1, 0, codes.OutOfRange},
		// A source made for 3 GiB + 12 KiB has 3 GiB + 1 MiB; a clone or
		// restore asking for 3 GiB + 12 KiB again gets the same size.
		{"same request as the source's", sizeRange{required: 3<<30 + 12<<10}, 3<<30 + mib, 3<<30 + mib, codes.OK},
		{"same request, limit at the rounded size", sizeRange{required: 3<<30 + 12<<10, limit: 3<<30 + mib}, 3<<30 + mib, 3<<30 + mib, codes.OK},
		{"source above limit", sizeRange{limit: 2 * mib}, 3 * mib, 0, codes.OutOfRange},
	}
	for _, tc := range tests {
		got, err := createSize("v", tc.rng, tc.sourceSize)
		if code(err) != tc.wantCode {
			t.Errorf("%s: code %v (%v), want %v", tc.name, code(err), err, tc.wantCode)
			continue
		}
		if err == nil && got != tc.want {
			t.Errorf("%s: size %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestCreateVolume(t *testing.T) {
	s, f := newTestController(t)
	req := createReq(testPVC, 10*rds.GiB+1)
	req.Parameters = map[string]string{"csi.storage.k8s.io/pvc/name": "data"}
	vol := mustCreate(t, s, req)

	if vol.VolumeId != testPVC {
		t.Errorf("volume ID %q, want the PV name %q", vol.VolumeId, testPVC)
	}
	if want := 10*rds.GiB + rds.MiB; vol.CapacityBytes != want {
		t.Errorf("capacity %d, want %d (rounded up to a whole MiB, never down)", vol.CapacityBytes, want)
	}
	wantCtx := map[string]string{"nvmeAddress": "10.0.0.5", "nvmePort": "4420", "nqn": testNQNPrefix + testPVC}
	for k, v := range wantCtx {
		if vol.VolumeContext[k] != v {
			t.Errorf("volume_context[%s] = %q, want %q", k, vol.VolumeContext[k], v)
		}
	}
	if len(vol.AccessibleTopology) != 1 || vol.AccessibleTopology[0].Segments["topology."+DefaultDriverName+"/rds"] != testRDSName {
		t.Errorf("accessible topology %v, want the RDS %q", vol.AccessibleTopology, testRDSName)
	}
	d, ok := f.disk(testPVC)
	if !ok {
		t.Fatal("no disk on the RDS")
	}
	if want := testVolumePath + "/" + testPVC + ".img"; d.FilePath != want || !d.Exported || d.Port != 4420 || d.NQN != testNQNPrefix+testPVC {
		t.Errorf("disk %+v, want file %s exported on 4420 as %s", d, want, testNQNPrefix+testPVC)
	}

	// Same name, same request: the same volume, nothing new.
	creates := f.calls["CreateDisk"]
	again := mustCreate(t, s, req)
	if again.VolumeId != vol.VolumeId || again.CapacityBytes != vol.CapacityBytes {
		t.Errorf("repeated CreateVolume returned %v, want %v", again, vol)
	}
	if f.calls["CreateDisk"] != creates {
		t.Error("repeated CreateVolume created a disk again")
	}
	// A range the existing volume satisfies is the same volume too.
	mustCreate(t, s, createReq(testPVC, rds.GiB))
	// A size it does not satisfy is a conflict.
	_, err := s.CreateVolume(context.Background(), createReq(testPVC, 20*rds.GiB))
	expectCode(t, "CreateVolume with another size", err, codes.AlreadyExists, testPVC)
	limited := createReq(testPVC, rds.GiB)
	limited.CapacityRange.LimitBytes = 2 * rds.GiB
	_, err = s.CreateVolume(context.Background(), limited)
	expectCode(t, "CreateVolume with a limit below the existing size", err, codes.AlreadyExists)
}

func TestCreateVolumeValidation(t *testing.T) {
	mnmw := csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
	tests := []struct {
		name   string
		modify func(*csi.CreateVolumeRequest)
		want   codes.Code
		msg    string
	}{
		{"no name", func(r *csi.CreateVolumeRequest) { r.Name = "" }, codes.InvalidArgument, "name is required"},
		{"no capabilities", func(r *csi.CreateVolumeRequest) { r.VolumeCapabilities = nil }, codes.InvalidArgument, "capabilities are required"},
		{"filesystem multi-node writer", func(r *csi.CreateVolumeRequest) {
			r.VolumeCapabilities = []*csi.VolumeCapability{mountCap(mnmw, "ext4")}
		}, codes.InvalidArgument, "volumeMode: Block"},
		{"block and filesystem, filesystem multi-writer", func(r *csi.CreateVolumeRequest) {
			r.VolumeCapabilities = []*csi.VolumeCapability{blockCap(mnmw), mountCap(mnmw, "")}
		}, codes.InvalidArgument, "not cluster filesystems"},
		{"unknown filesystem", func(r *csi.CreateVolumeRequest) {
			r.VolumeCapabilities = []*csi.VolumeCapability{mountCap(snw, "zfs")}
		}, codes.InvalidArgument, "zfs"},
		{"unknown parameter", func(r *csi.CreateVolumeRequest) { r.Parameters = map[string]string{"replicas": "3"} }, codes.InvalidArgument, `"replicas"`},
		{"mutable parameters", func(r *csi.CreateVolumeRequest) { r.MutableParameters = map[string]string{"iops": "1"} }, codes.InvalidArgument, "VolumeAttributesClass"},
		{"negative size", func(r *csi.CreateVolumeRequest) { r.CapacityRange.RequiredBytes = -1 }, codes.InvalidArgument, "negative"},
		{"required above limit", func(r *csi.CreateVolumeRequest) { r.CapacityRange.LimitBytes = 1 }, codes.InvalidArgument, "exceeds limit_bytes"},
		{"limit not reachable in whole MiB", func(r *csi.CreateVolumeRequest) {
			r.CapacityRange = &csi.CapacityRange{RequiredBytes: rds.MiB + 1, LimitBytes: rds.MiB + 1}
		}, codes.OutOfRange, "whole MiB"},
		{"other RDS required", func(r *csi.CreateVolumeRequest) {
			r.AccessibilityRequirements = &csi.TopologyRequirement{Requisite: []*csi.Topology{{Segments: map[string]string{"topology." + DefaultDriverName + "/rds": "rds2"}}}}
		}, codes.ResourceExhausted, testRDSName},
		{"unknown snapshot source", func(r *csi.CreateVolumeRequest) {
			r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: "non-existing-snapshot-id"}}}
		}, codes.NotFound, "non-existing-snapshot-id"},
		{"missing snapshot source", func(r *csi.CreateVolumeRequest) {
			r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: SnapshotIDFromName("gone")}}}
		}, codes.NotFound, "does not exist"},
		{"snapshot source without ID", func(r *csi.CreateVolumeRequest) {
			r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{}}}
		}, codes.InvalidArgument, "no snapshot ID"},
		{"missing volume source", func(r *csi.CreateVolumeRequest) {
			r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: testPVC2}}}
		}, codes.NotFound, testPVC2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, f := newTestController(t)
			req := createReq(testPVC, rds.GiB)
			tc.modify(req)
			_, err := s.CreateVolume(context.Background(), req)
			expectCode(t, tc.name, err, tc.want, tc.msg)
			if len(f.disks) != 0 || len(f.files) != 0 {
				t.Errorf("a refused CreateVolume left %v on the RDS", f.disks)
			}
		})
	}
}

func TestCreateVolumeTopology(t *testing.T) {
	s, _ := newTestController(t)
	key := "topology." + DefaultDriverName + "/rds"
	req := createReq(testPVC, rds.GiB)
	req.AccessibilityRequirements = &csi.TopologyRequirement{
		Requisite: []*csi.Topology{{Segments: map[string]string{key: "rds2"}}, {Segments: map[string]string{key: testRDSName}}},
		Preferred: []*csi.Topology{{Segments: map[string]string{key: "rds2"}}},
	}
	mustCreate(t, s, req)
}

func TestCreateVolumeNoSpaceLeavesNothing(t *testing.T) {
	s, f := newTestController(t)
	_, err := s.CreateVolume(context.Background(), createReq(testPVC, 200*rds.GiB))
	expectCode(t, "CreateVolume larger than the pool", err, codes.ResourceExhausted, testPVC, "free space")
	if len(f.disks) != 0 || len(f.files) != 0 {
		t.Errorf("RESOURCE_EXHAUSTED left %v %v behind", f.disks, f.files)
	}
}

func TestCreateVolumeRDSErrors(t *testing.T) {
	tests := []struct {
		method string
		err    error
		want   codes.Code
	}{
		{"GetDisk", fmt.Errorf("%w: dial: connection refused", rds.ErrTransient), codes.Unavailable},
		{"GetDisk", rds.ErrHostKey, codes.Unavailable},
		{"CreateDisk", fmt.Errorf("%w: garbage", rds.ErrBadOutput), codes.Internal},
		{"CreateDisk", fmt.Errorf("%w: exists", rds.ErrAlreadyExists), codes.AlreadyExists},
		{"CreateDisk", context.DeadlineExceeded, codes.DeadlineExceeded},
	}
	for _, tc := range tests {
		s, f := newTestController(t)
		f.failNext(tc.method, tc.err)
		_, err := s.CreateVolume(context.Background(), createReq(testPVC, rds.GiB))
		expectCode(t, tc.method+": "+tc.err.Error(), err, tc.want, testPVC)
	}
}

func TestCreateVolumeForeignDiskInSlot(t *testing.T) {
	s, f := newTestController(t)
	f.putDisk(rds.Disk{Slot: testPVC, FilePath: "/storage-pool/other/" + testPVC + ".img", Size: rds.GiB, Exported: true})
	_, err := s.CreateVolume(context.Background(), createReq(testPVC, rds.GiB))
	expectCode(t, "CreateVolume over a foreign disk", err, codes.AlreadyExists, "/storage-pool/other/")
}

func TestConcurrentOperationIsAborted(t *testing.T) {
	s, f := newTestController(t)
	h := f.holdNext("GetDisk")
	done := make(chan error)
	go func() {
		_, err := s.CreateVolume(context.Background(), createReq(testPVC, rds.GiB))
		done <- err
	}()
	<-h.entered // the first CreateVolume holds the volume
	_, err := s.CreateVolume(context.Background(), createReq(testPVC, rds.GiB))
	expectCode(t, "second CreateVolume", err, codes.Aborted, testPVC)
	_, err = s.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: testPVC})
	expectCode(t, "DeleteVolume during CreateVolume", err, codes.Aborted)
	// Another volume is not blocked.
	mustCreate(t, s, createReq(testPVC2, rds.GiB))
	close(h.release)
	if err := <-done; err != nil {
		t.Fatalf("first CreateVolume: %v", err)
	}
	if s.inflight.Len() != 0 {
		t.Errorf("%d keys still in flight", s.inflight.Len())
	}
	mustCreate(t, s, createReq(testPVC, rds.GiB))
}

func TestCreateVolumeFromSources(t *testing.T) {
	s, f := newTestController(t)
	src := mustCreate(t, s, createReq(testPVC, 2*rds.GiB))
	snap := mustSnapshot(t, s, testSnapName, src.VolumeId)

	fromSnap := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.SnapshotId}}}
	fromVol := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src.VolumeId}}}
	tests := []struct {
		name     string
		source   *csi.VolumeContentSource
		required int64
		wantSize int64
		want     codes.Code
	}{
		{"restore, same size", fromSnap, 2 * rds.GiB, 2 * rds.GiB, codes.OK},
		{"restore, larger", fromSnap, 5 * rds.GiB, 5 * rds.GiB, codes.OK},
		{"restore, size unset", fromSnap, 0, 2 * rds.GiB, codes.OK},
		{"restore, smaller", fromSnap, rds.GiB, 0, codes.OutOfRange},
		{"clone, same size", fromVol, 2 * rds.GiB, 2 * rds.GiB, codes.OK},
		{"clone, larger", fromVol, 3*rds.GiB + 1, 3*rds.GiB + rds.MiB, codes.OK},
		{"clone, smaller", fromVol, rds.MiB, 0, codes.OutOfRange},
	}
	for i, tc := range tests {
		req := createReq(fmt.Sprintf("copy-%d", i), tc.required)
		req.VolumeContentSource = tc.source
		resp, err := s.CreateVolume(context.Background(), req)
		if code(err) != tc.want {
			t.Errorf("%s: code %v (%v), want %v", tc.name, code(err), err, tc.want)
			continue
		}
		if err != nil {
			if _, ok := f.disk(VolumeIDFromName(req.Name)); ok {
				t.Errorf("%s: a refused copy left a disk", tc.name)
			}
			continue
		}
		v := resp.Volume
		if v.CapacityBytes != tc.wantSize {
			t.Errorf("%s: size %d, want %d", tc.name, v.CapacityBytes, tc.wantSize)
		}
		if v.ContentSource == nil {
			t.Errorf("%s: response has no content source", tc.name)
		}
		d, _ := f.disk(v.VolumeId)
		if !d.Exported || d.NQN != testNQNPrefix+v.VolumeId {
			t.Errorf("%s: copy is not exported as a volume: %+v", tc.name, d)
		}
	}

	// A retried restore succeeds even after its snapshot is gone: the
	// volume exists, the source is not needed again.
	if _, err := s.DeleteSnapshot(context.Background(), &csi.DeleteSnapshotRequest{SnapshotId: snap.SnapshotId}); err != nil {
		t.Fatal(err)
	}
	req := createReq("copy-0", 2*rds.GiB)
	req.VolumeContentSource = fromSnap
	if _, err := s.CreateVolume(context.Background(), req); err != nil {
		t.Errorf("retried restore after the snapshot was deleted: %v", err)
	}
}

func TestDeleteVolume(t *testing.T) {
	s, f := newTestController(t)
	vol := mustCreate(t, s, createReq(testPVC, rds.GiB))
	snap := mustSnapshot(t, s, testSnapName, vol.VolumeId)
	snapDisk, _ := f.disk(snap.SnapshotId)

	for i := 0; i < 3; i++ { // idempotent
		if _, err := s.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: vol.VolumeId}); err != nil {
			t.Fatalf("DeleteVolume #%d: %v", i+1, err)
		}
	}
	if _, ok := f.disk(vol.VolumeId); ok || f.fileExists(testVolumePath+"/"+testPVC+".img") {
		t.Error("the volume's disk or backing file is still there")
	}
	if d, ok := f.disk(snap.SnapshotId); !ok || !f.fileExists(snapDisk.FilePath) || d != snapDisk {
		t.Error("deleting the volume touched its snapshot")
	}
	// A backing file left by an interrupted delete goes on retry.
	f.putDisk(rds.Disk{Slot: testPVC2, FilePath: testVolumePath + "/" + testPVC2 + ".img", Size: rds.MiB})
	delete(f.disks, testPVC2)
	if _, err := s.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: testPVC2}); err != nil {
		t.Fatal(err)
	}
	if f.fileExists(testVolumePath + "/" + testPVC2 + ".img") {
		t.Error("leftover backing file not removed")
	}
}

func TestDeleteVolumeIDs(t *testing.T) {
	s, f := newTestController(t)
	_, err := s.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{})
	expectCode(t, "no ID", err, codes.InvalidArgument)
	for _, id := range []string{"fake-vol-id", "UPPER", "../../etc", "snap-0123456789abcdef0123456789abcdef"} {
		if _, err := s.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Errorf("DeleteVolume(%q): %v, want success (it never existed)", id, err)
		}
	}
	if f.calls["DeleteDisk"] != 0 {
		t.Error("an ID this driver cannot have made reached the RDS")
	}
	// A disk in our slot with a foreign file is left alone, loudly.
	f.putDisk(rds.Disk{Slot: testPVC, FilePath: "/storage-pool/old/" + testPVC + ".img", Size: rds.GiB})
	_, err = s.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: testPVC})
	expectCode(t, "foreign disk", err, codes.FailedPrecondition, "/storage-pool/old/")
	if _, ok := f.disk(testPVC); !ok {
		t.Error("a foreign disk was deleted")
	}
}

func TestControllerExpandVolume(t *testing.T) {
	s, f := newTestController(t)
	vol := mustCreate(t, s, createReq(testPVC, rds.GiB))
	expand := func(id string, required, limit int64, c *csi.VolumeCapability) (*csi.ControllerExpandVolumeResponse, error) {
		return s.ControllerExpandVolume(context.Background(), &csi.ControllerExpandVolumeRequest{
			VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: required, LimitBytes: limit}, VolumeCapability: c})
	}
	resp, err := expand(vol.VolumeId, 2*rds.GiB+1, 0, mountCap(snw, "ext4"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.CapacityBytes != 2*rds.GiB+rds.MiB || !resp.NodeExpansionRequired {
		t.Errorf("filesystem expand: %v, want %d bytes and node expansion", resp, 2*rds.GiB+rds.MiB)
	}
	if d, _ := f.disk(vol.VolumeId); d.Size != 2*rds.GiB+rds.MiB {
		t.Errorf("disk has %d bytes", d.Size)
	}
	resp, err = expand(vol.VolumeId, 3*rds.GiB, 0, blockCap(snw))
	if err != nil {
		t.Fatal(err)
	}
	if resp.NodeExpansionRequired {
		t.Error("a raw block volume needs no node expansion")
	}
	resp, err = expand(vol.VolumeId, 3*rds.GiB, 0, nil)
	if err != nil || resp.CapacityBytes != 3*rds.GiB || !resp.NodeExpansionRequired {
		t.Errorf("repeated expand without capability: %v %v", resp, err)
	}
	// Already larger: success, no shrink.
	if resp, err := expand(vol.VolumeId, rds.GiB, 0, nil); err != nil || resp.CapacityBytes != 3*rds.GiB {
		t.Errorf("expand to a smaller size: %v %v", resp, err)
	}

	_, err = expand(vol.VolumeId, rds.GiB, 2*rds.GiB, nil)
	expectCode(t, "limit below current size", err, codes.OutOfRange, "never shrink")
	_, err = expand(vol.VolumeId, 4*rds.GiB+1, 4*rds.GiB+2, nil)
	expectCode(t, "limit not reachable in whole MiB", err, codes.OutOfRange)
	_, err = expand(vol.VolumeId, 1000*rds.GiB, 0, nil)
	expectCode(t, "larger than the pool", err, codes.ResourceExhausted, "free space")
	_, err = expand(testPVC2, 4*rds.GiB, 0, nil)
	expectCode(t, "missing volume", err, codes.NotFound)
	_, err = expand("fake-vol-id", 4*rds.GiB, 0, nil)
	expectCode(t, "not our ID", err, codes.NotFound)
	_, err = expand("", 4*rds.GiB, 0, nil)
	expectCode(t, "no ID", err, codes.InvalidArgument)
	_, err = s.ControllerExpandVolume(context.Background(), &csi.ControllerExpandVolumeRequest{VolumeId: vol.VolumeId})
	expectCode(t, "no range", err, codes.InvalidArgument)
	_, err = expand(vol.VolumeId, 4*rds.GiB, 0, mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER, ""))
	expectCode(t, "bad capability", err, codes.InvalidArgument)
}

// seedVolumes creates n volumes, a snapshot and a foreign disk.
func seedVolumes(t *testing.T, s *ControllerServer, f *fakeRDS, n int) []string {
	t.Helper()
	var ids []string
	for i := 0; i < n; i++ {
		ids = append(ids, mustCreate(t, s, createReq(fmt.Sprintf("vol-%d", i), rds.MiB)).VolumeId)
	}
	mustSnapshot(t, s, testSnapName, ids[0])
	f.putDisk(rds.Disk{Slot: "foreign", FilePath: "/storage-pool/foreign.img", Size: rds.MiB})
	f.putDisk(rds.Disk{Slot: testPVC, FilePath: "/storage-pool/elsewhere/" + testPVC + ".img", Size: rds.MiB})
	slices.Sort(ids)
	return ids
}

func TestListVolumesPagination(t *testing.T) {
	s, f := newTestController(t)
	ids := seedVolumes(t, s, f, 5)

	all, err := s.ListVolumes(context.Background(), &csi.ListVolumesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range all.Entries {
		got = append(got, e.Volume.VolumeId)
		if e.Volume.VolumeContext["nqn"] != testNQNPrefix+e.Volume.VolumeId || e.Volume.CapacityBytes != rds.MiB {
			t.Errorf("entry %v lacks context or size", e.Volume)
		}
	}
	if !slices.Equal(got, ids) || all.NextToken != "" {
		t.Fatalf("ListVolumes = %v (next %q), want exactly the volumes %v (no snapshots or foreign disks)", got, all.NextToken, ids)
	}

	for _, max := range []int32{1, 2, 3, 5, 6} {
		var paged []string
		token := ""
		for pages := 0; ; pages++ {
			resp, err := s.ListVolumes(context.Background(), &csi.ListVolumesRequest{MaxEntries: max, StartingToken: token})
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Entries) > int(max) {
				t.Fatalf("max_entries %d: page has %d entries", max, len(resp.Entries))
			}
			for _, e := range resp.Entries {
				paged = append(paged, e.Volume.VolumeId)
			}
			if token = resp.NextToken; token == "" {
				break
			}
			if pages > len(ids) {
				t.Fatal("pagination does not end")
			}
		}
		if !slices.Equal(paged, ids) {
			t.Errorf("max_entries %d: paged %v, want %v", max, paged, ids)
		}
	}

	// A token stays valid when the volume it names is deleted meanwhile.
	first, _ := s.ListVolumes(context.Background(), &csi.ListVolumesRequest{MaxEntries: 2})
	if _, err := s.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: first.NextToken}); err != nil {
		t.Fatal(err)
	}
	rest, err := s.ListVolumes(context.Background(), &csi.ListVolumesRequest{StartingToken: first.NextToken})
	if err != nil {
		t.Fatal(err)
	}
	if len(rest.Entries) != len(ids)-3 {
		t.Errorf("after deleting the token's volume: %d entries, want %d", len(rest.Entries), len(ids)-3)
	}

	_, err = s.ListVolumes(context.Background(), &csi.ListVolumesRequest{StartingToken: "invalid-token"})
	expectCode(t, "bad token", err, codes.Aborted)
	_, err = s.ListVolumes(context.Background(), &csi.ListVolumesRequest{MaxEntries: -1})
	expectCode(t, "negative max_entries", err, codes.InvalidArgument)
	f.failNext("ListDisks", fmt.Errorf("%w: connection lost", rds.ErrTransient))
	_, err = s.ListVolumes(context.Background(), &csi.ListVolumesRequest{})
	expectCode(t, "RDS down", err, codes.Unavailable)
}

func TestControllerGetVolumeAndHealth(t *testing.T) {
	s, f := newTestController(t)
	ctx := context.Background()
	healthy := mustCreate(t, s, createReq("healthy", rds.GiB)).VolumeId
	unexported := mustCreate(t, s, createReq("unexported", rds.GiB)).VolumeId
	mismatched := mustCreate(t, s, createReq("mismatched", rds.GiB)).VolumeId
	diskGone := mustCreate(t, s, createReq("disk-gone", rds.GiB)).VolumeId
	fileGone := mustCreate(t, s, createReq("file-gone", rds.GiB)).VolumeId
	f.mu.Lock()
	d := f.disks[unexported]
	d.Exported = false
	f.disks[unexported] = d
	d = f.disks[mismatched]
	d.NQN = "nqn.2000-02.com.mikrotik:other"
	f.disks[mismatched] = d
	delete(f.disks, diskGone)
	delete(f.files, f.disks[fileGone].FilePath)
	f.mu.Unlock()

	got, err := s.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: healthy})
	if err != nil || got.Volume.VolumeId != healthy || got.Status == nil {
		t.Fatalf("ControllerGetVolume: %v %v", got, err)
	}
	_, err = s.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: diskGone})
	expectCode(t, "ControllerGetVolume of a volume without disk", err, codes.NotFound)

	tests := []struct {
		id     string
		status csi.VolumeHealthErrorType
		reason string
	}{
		{healthy, 0, ""},
		{unexported, csi.VolumeHealthErrorType_INACCESSIBLE, HealthNotExported},
		{mismatched, csi.VolumeHealthErrorType_INACCESSIBLE, HealthExportMismatch},
		{diskGone, csi.VolumeHealthErrorType_INACCESSIBLE, HealthDiskMissing},
		{fileGone, csi.VolumeHealthErrorType_DATA_LOSS, HealthBackingFileMissing},
	}
	for _, tc := range tests {
		resp, err := s.ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{VolumeId: tc.id})
		if err != nil {
			t.Fatalf("health of %s: %v", tc.id, err)
		}
		h := resp.VolumeHealth
		if h.VolumeId != tc.id {
			t.Errorf("health of %s names %s", tc.id, h.VolumeId)
		}
		if tc.reason == "" {
			if len(h.HealthStatuses) != 0 {
				t.Errorf("healthy volume reported %v", h.HealthStatuses)
			}
			continue
		}
		if len(h.HealthStatuses) != 1 || h.HealthStatuses[0].Status != tc.status || h.HealthStatuses[0].Reason != tc.reason ||
			!strings.Contains(h.HealthStatuses[0].Message, tc.id) {
			t.Errorf("health of %s = %v, want %v %s naming the volume", tc.id, h.HealthStatuses, tc.status, tc.reason)
		}
	}
	_, err = s.ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{VolumeId: testPVC})
	expectCode(t, "health of a volume that never existed", err, codes.NotFound)
	_, err = s.ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{})
	expectCode(t, "health without ID", err, codes.InvalidArgument)

	list, err := s.ControllerListVolumeHealth(ctx, &csi.ControllerListVolumeHealthRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var abnormal []string
	for _, h := range list.Entries {
		abnormal = append(abnormal, h.VolumeId)
	}
	want := []string{mismatched, unexported}
	slices.Sort(want)
	if !slices.Equal(abnormal, want) {
		t.Errorf("ControllerListVolumeHealth = %v, want the export problems %v", abnormal, want)
	}
	page1, err := s.ControllerListVolumeHealth(ctx, &csi.ControllerListVolumeHealthRequest{MaxEntries: 1})
	if err != nil || len(page1.Entries) != 1 || page1.NextToken != want[1] {
		t.Errorf("first page: %v %v", page1, err)
	}
}

func TestValidateVolumeCapabilities(t *testing.T) {
	s, _ := newTestController(t)
	ctx := context.Background()
	vol := mustCreate(t, s, createReq(testPVC, rds.GiB))
	resp, err := s.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{
		VolumeId: vol.VolumeId, VolumeCapabilities: []*csi.VolumeCapability{mountCap(snw, "xfs"), blockCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)},
		VolumeContext: vol.VolumeContext,
	})
	if err != nil || resp.Confirmed == nil || len(resp.Confirmed.VolumeCapabilities) != 2 {
		t.Fatalf("supported capabilities not confirmed: %v %v", resp, err)
	}
	resp, err = s.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{
		VolumeId: vol.VolumeId, VolumeCapabilities: []*csi.VolumeCapability{mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER, "")},
	})
	if err != nil || resp.Confirmed != nil || !strings.Contains(resp.Message, "raw block") {
		t.Errorf("filesystem multi-writer: %v %v, want unconfirmed with the reason", resp, err)
	}
	resp, err = s.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{
		VolumeId: vol.VolumeId, VolumeCapabilities: []*csi.VolumeCapability{mountCap(snw, "")}, Parameters: map[string]string{"bogus": "1"},
	})
	if err != nil || resp.Confirmed != nil || !strings.Contains(resp.Message, "bogus") {
		t.Errorf("unknown parameter: %v %v, want unconfirmed", resp, err)
	}
	_, err = s.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: testPVC2, VolumeCapabilities: []*csi.VolumeCapability{mountCap(snw, "")}})
	expectCode(t, "missing volume", err, codes.NotFound)
	_, err = s.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: vol.VolumeId})
	expectCode(t, "no capabilities", err, codes.InvalidArgument)
	_, err = s.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{})
	expectCode(t, "no ID", err, codes.InvalidArgument)
}

func TestGetCapacity(t *testing.T) {
	s, f := newTestController(t)
	ctx := context.Background()
	mustCreate(t, s, createReq(testPVC, 10*rds.GiB))
	resp, err := s.GetCapacity(ctx, &csi.GetCapacityRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if resp.AvailableCapacity != 90*rds.GiB || resp.MaximumVolumeSize.GetValue() != 90*rds.GiB {
		t.Errorf("GetCapacity = %v, want 90 GiB free", resp)
	}
	key := "topology." + DefaultDriverName + "/rds"
	for name, req := range map[string]*csi.GetCapacityRequest{
		"other RDS":          {AccessibleTopology: &csi.Topology{Segments: map[string]string{key: "rds2"}}},
		"unsupported access": {VolumeCapabilities: []*csi.VolumeCapability{mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER, "")}},
	} {
		resp, err := s.GetCapacity(ctx, req)
		if err != nil || resp.AvailableCapacity != 0 {
			t.Errorf("%s: %v %v, want 0", name, resp, err)
		}
	}
	_, err = s.GetCapacity(ctx, &csi.GetCapacityRequest{Parameters: map[string]string{"tier": "fast"}})
	expectCode(t, "unknown parameter", err, codes.InvalidArgument, "tier")
	f.failNext("Capacity", fmt.Errorf("%w: timeout", rds.ErrTransient))
	_, err = s.GetCapacity(ctx, &csi.GetCapacityRequest{})
	expectCode(t, "RDS down", err, codes.Unavailable, "storage-pool")
}

func TestSnapshots(t *testing.T) {
	s, f := newTestController(t)
	ctx := context.Background()
	vol := mustCreate(t, s, createReq(testPVC, 3*rds.GiB))
	snap := mustSnapshot(t, s, testSnapName, vol.VolumeId)
	if snap.SnapshotId != "snap-2a1b2c3d-4e5f-6789-abcd-ef0123456789" || snap.SourceVolumeId != testPVC ||
		!snap.CreationTime.AsTime().Equal(testClock) || snap.SizeBytes != 3*rds.GiB || !snap.ReadyToUse {
		t.Errorf("snapshot %v, want ID from the name, source %s, time %v, 3 GiB, ready", snap, testPVC, testClock)
	}
	d, _ := f.disk(snap.SnapshotId)
	if d.Exported {
		t.Error("a snapshot is exported")
	}
	if want := fmt.Sprintf("%s/snapshots/%s.src-%s.t-%d.img", testVolumePath, snap.SnapshotId, testPVC, testClock.UnixNano()); d.FilePath != want {
		t.Errorf("snapshot file %s, want %s", d.FilePath, want)
	}

	// Idempotent, and the metadata comes from the RDS, not from memory: a
	// new controller (a restart) a day later sees the same snapshot.
	restarted := NewControllerServer(NewDriver(testOptions(), f), nil)
	restarted.now = func() time.Time { return testClock.Add(24 * time.Hour) }
	again := mustSnapshot(t, restarted, testSnapName, vol.VolumeId)
	if again.SnapshotId != snap.SnapshotId || !again.CreationTime.AsTime().Equal(testClock) || again.SourceVolumeId != testPVC {
		t.Errorf("repeated CreateSnapshot after restart = %v, want %v", again, snap)
	}
	got, err := restarted.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: snap.SnapshotId})
	if err != nil || !got.Snapshot.CreationTime.AsTime().Equal(testClock) || got.Snapshot.SourceVolumeId != testPVC {
		t.Errorf("GetSnapshot after restart = %v %v", got, err)
	}

	other := mustCreate(t, s, createReq(testPVC2, rds.GiB))
	_, err = s.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: testSnapName, SourceVolumeId: other.VolumeId})
	expectCode(t, "same name, other source", err, codes.AlreadyExists, testPVC, testPVC2)
	_, err = s.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: "fake-vol-id"})
	expectCode(t, "source not ours", err, codes.NotFound)
	_, err = s.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: VolumeIDFromName("gone")})
	expectCode(t, "source missing", err, codes.NotFound)
	_, err = s.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{SourceVolumeId: testPVC})
	expectCode(t, "no name", err, codes.InvalidArgument)
	_, err = s.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "s"})
	expectCode(t, "no source", err, codes.InvalidArgument)
	_, err = s.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: testPVC, Parameters: map[string]string{"retain": "1"}})
	expectCode(t, "unknown parameter", err, codes.InvalidArgument, "retain")
	f.poolSize = f.used() + rds.GiB
	_, err = s.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "big", SourceVolumeId: testPVC})
	expectCode(t, "no space", err, codes.ResourceExhausted, "free space")
	if _, ok := f.disk(SnapshotIDFromName("big")); ok {
		t.Error("a snapshot without space left a disk")
	}

	// Delete: idempotent, and the source volume is untouched.
	for i := 0; i < 2; i++ {
		if _, err := s.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snap.SnapshotId}); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := f.disk(snap.SnapshotId); ok || f.fileExists(d.FilePath) {
		t.Error("snapshot disk or file still there")
	}
	if _, ok := f.disk(vol.VolumeId); !ok {
		t.Error("deleting a snapshot removed its source")
	}
	for _, id := range []string{"reallyfakesnapshotid", testPVC} {
		if _, err := s.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: id}); err != nil {
			t.Errorf("DeleteSnapshot(%q): %v, want success", id, err)
		}
	}
	_, err = s.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{})
	expectCode(t, "DeleteSnapshot without ID", err, codes.InvalidArgument)
	_, err = s.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: snap.SnapshotId})
	expectCode(t, "GetSnapshot of a deleted snapshot", err, codes.NotFound)
}

func TestListSnapshots(t *testing.T) {
	s, f := newTestController(t)
	ctx := context.Background()
	a := mustCreate(t, s, createReq("a", rds.MiB)).VolumeId
	b := mustCreate(t, s, createReq("b", rds.MiB)).VolumeId
	var all, ofA []string
	for i := 0; i < 5; i++ {
		src := a
		if i%2 == 1 {
			src = b
		}
		sn := mustSnapshot(t, s, fmt.Sprintf("snap-%d", i), src)
		all = append(all, sn.SnapshotId)
		if src == a {
			ofA = append(ofA, sn.SnapshotId)
		}
	}
	// Not snapshots: a snap-like slot with a volume-style file, a foreign disk.
	f.putDisk(rds.Disk{Slot: SnapshotIDFromName("fake"), FilePath: testVolumePath + "/x.img", Size: rds.MiB})
	f.putDisk(rds.Disk{Slot: "backup", FilePath: testVolumePath + "/snapshots/backup.img", Size: rds.MiB})
	slices.Sort(all)
	slices.Sort(ofA)

	list := func(req *csi.ListSnapshotsRequest) []string {
		t.Helper()
		var ids []string
		for {
			resp, err := s.ListSnapshots(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if req.MaxEntries > 0 && len(resp.Entries) > int(req.MaxEntries) {
				t.Fatalf("page of %d entries, max %d", len(resp.Entries), req.MaxEntries)
			}
			for _, e := range resp.Entries {
				if e.Snapshot.SourceVolumeId == "" || e.Snapshot.CreationTime == nil {
					t.Errorf("entry without source or time: %v", e.Snapshot)
				}
				ids = append(ids, e.Snapshot.SnapshotId)
			}
			if resp.NextToken == "" {
				return ids
			}
			req.StartingToken = resp.NextToken
		}
	}
	if got := list(&csi.ListSnapshotsRequest{}); !slices.Equal(got, all) {
		t.Errorf("all snapshots: %v, want %v", got, all)
	}
	if got := list(&csi.ListSnapshotsRequest{MaxEntries: 2}); !slices.Equal(got, all) {
		t.Errorf("paged by 2: %v, want %v", got, all)
	}
	if got := list(&csi.ListSnapshotsRequest{SourceVolumeId: a, MaxEntries: 1}); !slices.Equal(got, ofA) {
		t.Errorf("snapshots of %s: %v, want %v", a, got, ofA)
	}
	if got := list(&csi.ListSnapshotsRequest{SnapshotId: all[2]}); !slices.Equal(got, all[2:3]) {
		t.Errorf("by ID: %v, want %v", got, all[2:3])
	}
	for name, req := range map[string]*csi.ListSnapshotsRequest{
		"unknown ID":         {SnapshotId: "none-exist-id"},
		"missing ID":         {SnapshotId: SnapshotIDFromName("nope")},
		"not a snapshot":     {SnapshotId: SnapshotIDFromName("fake")},
		"ID of other source": {SnapshotId: ofA[0], SourceVolumeId: b},
		"unknown source":     {SourceVolumeId: testPVC},
	} {
		if got := list(req); len(got) != 0 {
			t.Errorf("%s: %v, want nothing", name, got)
		}
	}
	_, err := s.ListSnapshots(ctx, &csi.ListSnapshotsRequest{StartingToken: "bad"})
	expectCode(t, "bad token", err, codes.Aborted)
	_, err = s.ListSnapshots(ctx, &csi.ListSnapshotsRequest{MaxEntries: -2})
	expectCode(t, "negative max", err, codes.InvalidArgument)
}

func TestInFlight(t *testing.T) {
	f := NewInFlight()
	r1, ok := f.TryAcquire("volume/a")
	if !ok {
		t.Fatal("first acquire refused")
	}
	if _, ok := f.TryAcquire("volume/a"); ok {
		t.Error("busy key acquired twice")
	}
	if _, ok := f.TryAcquire("volume/b", "volume/a"); ok {
		t.Error("set with a busy key acquired")
	}
	if f.Len() != 1 {
		t.Errorf("a refused acquire marked keys: %d busy", f.Len())
	}
	r2, ok := f.TryAcquire("snapshot/a")
	if !ok {
		t.Error("a snapshot key collides with a volume key")
	}
	r1()
	r1() // releasing twice is harmless
	r2()
	if f.Len() != 0 {
		t.Errorf("%d keys busy after release", f.Len())
	}
	// Many goroutines try one key at once, none releasing before all have
	// tried: exactly one wins.
	var wg sync.WaitGroup
	start := make(chan struct{})
	won := make(chan func(), 50)
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if release, ok := f.TryAcquire("k"); ok {
				won <- release
			}
		}()
	}
	close(start)
	wg.Wait()
	close(won)
	if len(won) != 1 {
		t.Fatalf("%d of 50 concurrent acquires of one key won, want exactly 1", len(won))
	}
	(<-won)()
	if f.Len() != 0 {
		t.Errorf("%d keys busy after the winner released", f.Len())
	}
}

func TestTopologyValidation(t *testing.T) {
	o := testOptions()
	o.RDSName = ""
	o.RDSAddress = "fd00::5"
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "--rds-name is required") {
		t.Errorf("an IPv6 RDS address without --rds-name: %v", err)
	}
	o.RDSName = "rds-a"
	if err := o.Validate(); err != nil {
		t.Errorf("--rds-name with an IPv6 address: %v", err)
	}
	o = testOptions()
	o.RDSName = ""
	o.RDSAddress = "rds.example"
	if err := o.Validate(); err != nil || o.RDSName != "rds.example" {
		t.Errorf("RDS name defaults to the address: %q %v", o.RDSName, err)
	}
	o.VolumePath = "/storage-pool/" + strings.Repeat("v", 200)
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "--rds-volume-path") {
		t.Errorf("over-long volume path accepted: %v", err)
	}
}
