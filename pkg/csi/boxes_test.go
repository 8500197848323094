package csi

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/srvlab/rds-csi/pkg/backends"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// Three boxes: rds1 (the default, the --rds-* flags of testOptions), and
// rack-b and rack-c of a --rds-config, each with its own fake RDS.
type boxesEnv struct {
	s       *ControllerServer
	a, b, c *fakeRDS
	down    map[string]error // a box's Health
}

const (
	keyA = "topology." + DefaultDriverName + "/rds"
	keyB = "topology." + DefaultDriverName + "/rds.rack-b"
	keyC = "topology." + DefaultDriverName + "/rds.rack-c"
)

func newBoxesEnv(t *testing.T, sizes ...int64) *boxesEnv {
	t.Helper()
	for len(sizes) < 3 {
		sizes = append(sizes, 100*rds.GiB)
	}
	e := &boxesEnv{a: newFakeRDS(sizes[0]), b: newFakeRDS(sizes[1]), c: newFakeRDS(sizes[2]), down: map[string]error{}}
	opts := testOptions()
	def := opts.DefaultBackend()
	rackB := def
	rackB.Default, rackB.Name, rackB.Address, rackB.NVMeAddress, rackB.VolumePath = false, "rack-b", "10.0.1.5", "10.0.3.5", "/storage-pool/b-volumes"
	rackC := def
	rackC.Default, rackC.Name, rackC.Address, rackC.NVMeAddress, rackC.NVMePort = false, "rack-c", "10.0.2.5", "10.0.2.5", 4421
	health := func(name string) func() error { return func() error { return e.down[name] } }
	d, err := NewDriverBoxes(opts, []Box{
		{Backend: def, RDS: e.a, Health: health("rds1")},
		{Backend: rackB, RDS: e.b, Health: health("rack-b")},
		{Backend: rackC, RDS: e.c, Health: health("rack-c")},
	})
	if err != nil {
		t.Fatal(err)
	}
	e.s = NewControllerServer(d, nil)
	e.s.now = func() time.Time { return testClock }
	return e
}

func boxCreateReq(name string, params map[string]string, topo *csi.TopologyRequirement) *csi.CreateVolumeRequest {
	return &csi.CreateVolumeRequest{
		Name: name, Parameters: params, AccessibilityRequirements: topo,
		CapacityRange:      &csi.CapacityRange{RequiredBytes: rds.GiB},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")},
	}
}

func seg(kv ...string) *csi.Topology {
	m := map[string]string{}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return &csi.Topology{Segments: m}
}

func TestAStorageClassPinsTheBoxItsVolumesGoTo(t *testing.T) {
	e := newBoxesEnv(t)
	resp, err := e.s.CreateVolume(context.Background(), boxCreateReq(testPVC, map[string]string{ParameterRDS: "rack-b"}, nil))
	if err != nil {
		t.Fatal(err)
	}
	v := resp.GetVolume()
	if v.GetVolumeId() != "rack-b/"+testPVC {
		t.Fatalf("volume ID %q, want rack-b/%s: the ID names its box", v.GetVolumeId(), testPVC)
	}
	d, ok := e.b.disk(testPVC)
	if !ok || d.FilePath != "/storage-pool/b-volumes/"+testPVC+".img" || d.NQN != testNQNPrefix+testPVC {
		t.Fatalf("rack-b's disk: %+v (found %v)", d, ok)
	}
	if _, ok := e.a.disk(testPVC); ok {
		t.Fatal("the default box has the disk too")
	}
	if got := v.GetVolumeContext(); got[VolumeContextNVMeAddress] != "10.0.3.5" || got[VolumeContextNQN] != testNQNPrefix+testPVC {
		t.Errorf("volume context %v: want rack-b's NVMe/TCP target", got)
	}
	if topo := v.GetAccessibleTopology(); len(topo) != 1 || len(topo[0].GetSegments()) != 1 || topo[0].GetSegments()[keyB] != "true" {
		t.Errorf("accessible topology %v, want %s=true alone", topo, keyB)
	}
	// Everything after goes to rack-b by the ID alone.
	if _, err := e.s.ControllerGetVolume(context.Background(), &csi.ControllerGetVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.ControllerExpandVolume(context.Background(), &csi.ControllerExpandVolumeRequest{VolumeId: v.GetVolumeId(), CapacityRange: &csi.CapacityRange{RequiredBytes: 2 * rds.GiB}}); err != nil {
		t.Fatal(err)
	}
	if d, _ := e.b.disk(testPVC); d.Size != 2*rds.GiB {
		t.Errorf("expanded on rack-b: %d bytes", d.Size)
	}
	if _, err := e.s.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.b.disk(testPVC); ok || e.b.fileExists("/storage-pool/b-volumes/"+testPVC+".img") {
		t.Error("deleted: rack-b still has the disk or its file")
	}
	// The default box's volumes keep IDs without a box, as before.
	resp, err = e.s.CreateVolume(context.Background(), boxCreateReq(testPVC2, map[string]string{ParameterRDS: testRDSName}, nil))
	if err != nil || resp.GetVolume().GetVolumeId() != testPVC2 {
		t.Fatalf("the default box's volume: %v %v", resp.GetVolume().GetVolumeId(), err)
	}
	if topo := resp.GetVolume().GetAccessibleTopology(); topo[0].GetSegments()[keyA] != testRDSName || len(topo[0].GetSegments()) != 1 {
		t.Errorf("the default box's volume requires %v, want %s=%s alone, as before there were several", topo, keyA, testRDSName)
	}
	// A pin of a box that does not exist is the StorageClass's error.
	_, err = e.s.CreateVolume(context.Background(), boxCreateReq("pvc-3a1b2c3d-4e5f-6789-abcd-ef0123456789", map[string]string{ParameterRDS: "rack-z"}, nil))
	if code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `RDS "rack-z"`) {
		t.Errorf("unknown pin: %v", err)
	}
}

func TestAVolumeGoesWhereItsTopologyAllows(t *testing.T) {
	e := newBoxesEnv(t)
	// The selected node reaches rack-a and rack-c; requisite also names rack-b.
	topo := &csi.TopologyRequirement{
		Requisite: []*csi.Topology{seg(keyA, testRDSName, keyC, "true"), seg(keyB, "true")},
		Preferred: []*csi.Topology{seg(keyC, "true"), seg(keyB, "true")},
	}
	resp, err := e.s.CreateVolume(context.Background(), boxCreateReq(testPVC, nil, topo))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetVolume().GetVolumeId(); got != "rack-c/"+testPVC {
		t.Fatalf("placed as %q, want on rack-c (the first preferred segment's box)", got)
	}
	// Requisite naming no box of this driver: RESOURCE_EXHAUSTED, nothing made.
	_, err = e.s.CreateVolume(context.Background(), boxCreateReq(testPVC2, nil, &csi.TopologyRequirement{Requisite: []*csi.Topology{seg("topology.kubernetes.io/zone", "z1")}}))
	if code(err) != codes.ResourceExhausted {
		t.Fatalf("unreachable topology: %v", err)
	}
	for _, f := range []*fakeRDS{e.a, e.b, e.c} {
		if f.callCount("CreateDisk") > 1 {
			t.Error("a disk was made for the unreachable request")
		}
	}
	// Pin and topology together: the pin must be reachable.
	_, err = e.s.CreateVolume(context.Background(), boxCreateReq(testPVC2, map[string]string{ParameterRDS: "rack-b"}, &csi.TopologyRequirement{Requisite: []*csi.Topology{seg(keyC, "true")}}))
	if code(err) != codes.ResourceExhausted {
		t.Fatalf("pinned box outside the topology: %v", err)
	}
}

func TestAFullBoxIsPassedOver(t *testing.T) {
	e := newBoxesEnv(t, 100*rds.GiB, 512*rds.MiB, 100*rds.GiB)
	// rack-b cannot take 1 GiB; among the others the one with more room.
	e.a.putDisk(rds.Disk{Slot: "pvc-9a1b2c3d-4e5f-6789-abcd-ef0123456789", FilePath: testVolumePath + "/x.img", Size: 10 * rds.GiB})
	e.a.files[testVolumePath+"/x.img"] = 10 * rds.GiB
	topo := &csi.TopologyRequirement{
		Requisite: []*csi.Topology{seg(keyA, testRDSName, keyB, "true", keyC, "true")},
		Preferred: []*csi.Topology{seg(keyA, testRDSName, keyB, "true", keyC, "true")},
	}
	resp, err := e.s.CreateVolume(context.Background(), boxCreateReq(testPVC, nil, topo))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetVolume().GetVolumeId(); got != "rack-c/"+testPVC {
		t.Fatalf("placed as %q, want on rack-c: rack-b is full, rds1 has less room", got)
	}
	// Retried after the free space changed, the same volume comes back.
	e.c.poolSize = 2 * rds.GiB
	again, err := e.s.CreateVolume(context.Background(), boxCreateReq(testPVC, nil, topo))
	if err != nil || again.GetVolume().GetVolumeId() != "rack-c/"+testPVC {
		t.Fatalf("retry: %v %v, want the volume made on rack-c", again.GetVolume().GetVolumeId(), err)
	}
	// Only rack-b allowed, and it is full: RESOURCE_EXHAUSTED naming it.
	_, err = e.s.CreateVolume(context.Background(), boxCreateReq(testPVC2, map[string]string{ParameterRDS: "rack-b"}, nil))
	if code(err) != codes.ResourceExhausted {
		t.Fatalf("full pinned box: %v", err)
	}
}

func TestADownBoxIsPassedOverWithoutBeingAsked(t *testing.T) {
	e := newBoxesEnv(t)
	e.down["rack-b"] = errors.New("probe timed out")
	topo := &csi.TopologyRequirement{Requisite: []*csi.Topology{seg(keyB, "true"), seg(keyC, "true")}, Preferred: []*csi.Topology{seg(keyB, "true"), seg(keyC, "true")}}
	resp, err := e.s.CreateVolume(context.Background(), boxCreateReq(testPVC, nil, topo))
	if err != nil || resp.GetVolume().GetVolumeId() != "rack-c/"+testPVC {
		t.Fatalf("with rack-b down: %v %v, want rack-c", resp.GetVolume().GetVolumeId(), err)
	}
	if n := e.b.callCount("GetDisk") + e.b.callCount("Capacity"); n != 0 {
		t.Errorf("rack-b, down, was asked %d times", n)
	}
	cap, err := e.s.GetCapacity(context.Background(), &csi.GetCapacityRequest{AccessibleTopology: seg(keyB, "true", keyC, "true")})
	if err != nil || cap.GetAvailableCapacity() != 100*rds.GiB-rds.GiB {
		t.Errorf("capacity with rack-b down: %v %v, want rack-c's alone", cap.GetAvailableCapacity(), err)
	}
	// Pinned to the down box: UNAVAILABLE, naming it.
	_, err = e.s.CreateVolume(context.Background(), boxCreateReq(testPVC2, map[string]string{ParameterRDS: "rack-b"}, nil))
	if code(err) != codes.Unavailable || !strings.Contains(err.Error(), "rack-b") {
		t.Fatalf("pinned to a down box: %v", err)
	}
}

func TestCapacityIsPerBoxAndSegment(t *testing.T) {
	e := newBoxesEnv(t, 10*rds.GiB, 20*rds.GiB, 40*rds.GiB)
	for _, tc := range []struct {
		name      string
		topo      *csi.Topology
		params    map[string]string
		available int64
		largest   int64
	}{
		{"every box", nil, nil, 70 * rds.GiB, 40 * rds.GiB},
		{"a node reaching rds1 and rack-b", seg(keyA, testRDSName, keyB, "true"), nil, 30 * rds.GiB, 20 * rds.GiB},
		{"rds1 by its own key", seg(keyA+".rds1", "true"), nil, 10 * rds.GiB, 10 * rds.GiB},
		{"pinned within the segment", seg(keyA, testRDSName, keyB, "true"), map[string]string{ParameterRDS: "rds1"}, 10 * rds.GiB, 10 * rds.GiB},
		{"pinned outside the segment", seg(keyB, "true"), map[string]string{ParameterRDS: "rack-c"}, 0, 0},
		{"another driver's segment", seg("topology.kubernetes.io/zone", "z1"), nil, 0, 0},
	} {
		resp, err := e.s.GetCapacity(context.Background(), &csi.GetCapacityRequest{AccessibleTopology: tc.topo, Parameters: tc.params})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if resp.GetAvailableCapacity() != tc.available || resp.GetMaximumVolumeSize().GetValue() != tc.largest {
			t.Errorf("%s: available %d, largest %d; want %d, %d", tc.name, resp.GetAvailableCapacity(), resp.GetMaximumVolumeSize().GetValue(), tc.available, tc.largest)
		}
	}
}

func TestACopyStaysOnItsSourcesBox(t *testing.T) {
	e := newBoxesEnv(t)
	ctx := context.Background()
	src, err := e.s.CreateVolume(ctx, boxCreateReq(testPVC, map[string]string{ParameterRDS: "rack-b"}, nil))
	if err != nil {
		t.Fatal(err)
	}
	snap, err := e.s.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: testSnapName, SourceVolumeId: src.GetVolume().GetVolumeId()})
	if err != nil {
		t.Fatal(err)
	}
	sn := snap.GetSnapshot()
	if !strings.HasPrefix(sn.GetSnapshotId(), "rack-b/snap-") || sn.GetSourceVolumeId() != "rack-b/"+testPVC {
		t.Fatalf("snapshot %s of %s: want both on rack-b", sn.GetSnapshotId(), sn.GetSourceVolumeId())
	}
	_, slot := backends.SplitID(sn.GetSnapshotId())
	if d, ok := e.b.disk(slot); !ok || !strings.HasPrefix(d.FilePath, "/storage-pool/b-volumes/snapshots/"+slot+".src-"+testPVC+".") {
		t.Fatalf("rack-b's snapshot disk %+v (%v)", d, ok)
	}
	if got, err := e.s.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SourceVolumeId: src.GetVolume().GetVolumeId()}); err != nil || len(got.GetEntries()) != 1 {
		t.Fatalf("listing rack-b's volume's snapshots: %v %v", got, err)
	}
	source := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: sn.GetSnapshotId()}}}
	// Restored without a pin: on rack-b, the snapshot's box.
	req := boxCreateReq(testPVC2, nil, nil)
	req.VolumeContentSource = source
	restored, err := e.s.CreateVolume(ctx, req)
	if err != nil || restored.GetVolume().GetVolumeId() != "rack-b/"+testPVC2 {
		t.Fatalf("restore: %v %v", restored.GetVolume().GetVolumeId(), err)
	}
	// Into a class pinning another box: refused, nothing copied.
	req = boxCreateReq("pvc-4a1b2c3d-4e5f-6789-abcd-ef0123456789", map[string]string{ParameterRDS: "rack-c"}, nil)
	req.VolumeContentSource = source
	_, err = e.s.CreateVolume(ctx, req)
	if code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "copying across RDS is refused") {
		t.Fatalf("cross-box restore: %v", err)
	}
	if e.c.callCount("CopyDisk")+e.c.callCount("CreateDisk") != 0 {
		t.Error("rack-c was asked to copy")
	}
	// A clone whose topology reaches only another box: refused too.
	req = boxCreateReq("pvc-5a1b2c3d-4e5f-6789-abcd-ef0123456789", nil, &csi.TopologyRequirement{Requisite: []*csi.Topology{seg(keyC, "true")}})
	req.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src.GetVolume().GetVolumeId()}}}
	if _, err = e.s.CreateVolume(ctx, req); code(err) != codes.ResourceExhausted {
		t.Fatalf("clone outside its box's topology: %v", err)
	}
	// A snapshot class cannot pin a box.
	_, err = e.s.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snapshot-6a1b2c3d-4e5f-6789-abcd-ef0123456789", SourceVolumeId: src.GetVolume().GetVolumeId(), Parameters: map[string]string{ParameterRDS: "rack-c"}})
	if code(err) != codes.InvalidArgument {
		t.Fatalf("snapshot class with a pin: %v", err)
	}
}

func TestAnIDOfABoxNotConfiguredIsNeverAnothersVolume(t *testing.T) {
	e := newBoxesEnv(t)
	ctx := context.Background()
	// rds1 (the default) holds a disk in the same slot.
	if _, err := e.s.CreateVolume(ctx, boxCreateReq(testPVC, nil, &csi.TopologyRequirement{Requisite: []*csi.Topology{seg(keyA, testRDSName)}})); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"rack-z/" + testPVC, testRDSName + "/" + testPVC} {
		if _, err := e.s.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); code(err) != codes.FailedPrecondition {
			t.Errorf("DeleteVolume(%s): %v, want FAILED_PRECONDITION (never nothing-to-delete, never the default's)", id, err)
		}
		if _, err := e.s.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: id}); code(err) != codes.FailedPrecondition {
			t.Errorf("ControllerGetVolume(%s): %v", id, err)
		}
	}
	if _, ok := e.a.disk(testPVC); !ok {
		t.Fatal("the default box's volume of that slot is gone")
	}
}

func TestANodeReportsTheBoxesItReachesInItsTopology(t *testing.T) {
	opts := testOptions()
	opts.Mode, opts.NodeID = ModeNode, "rack-b-7"
	def := opts.DefaultBackend()
	d, err := NewDriverBoxes(opts, []Box{{Backend: def}, {Backend: backends.Backend{Name: "rack-b", Nodes: []string{"rack-b-*"}}}, {Backend: backends.Backend{Name: "rack-c", Nodes: []string{"rack-c-*"}}}})
	if err != nil {
		t.Fatal(err)
	}
	ns := NewNodeServer(d, nil, "")
	resp, err := ns.NodeGetInfo(context.Background(), &csi.NodeGetInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	got := resp.GetAccessibleTopology().GetSegments()
	want := map[string]string{keyA: testRDSName, keyA + ".rds1": "true", keyB: "true"}
	if len(got) != len(want) {
		t.Fatalf("segments %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("segments %v, want %v", got, want)
		}
	}
}

// An ID that starts with the separator names no box: it is not the
// default box's volume of that slot under a second name (whose claims,
// kept by ID, would not see the first name's, letting two nodes write it).
func TestAnIDWithAnEmptyBoxNameIsNoVolume(t *testing.T) {
	e := newBoxesEnv(t)
	ctx := context.Background()
	if _, err := e.s.CreateVolume(ctx, boxCreateReq(testPVC, nil, &csi.TopologyRequirement{Requisite: []*csi.Topology{seg(keyA, testRDSName)}})); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{backends.IDSeparator + testPVC, backends.IDSeparator + "snap-" + testPVC[4:]} {
		if isVolumeID(id) || isSnapshotID(id) {
			t.Errorf("%q is taken for an ID", id)
		}
	}
	// No volume of this driver's: nothing to delete (as any ID it cannot
	// have made).
	if _, err := e.s.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: backends.IDSeparator + testPVC}); err != nil {
		t.Errorf("DeleteVolume(/%s): %v", testPVC, err)
	}
	if _, ok := e.a.disk(testPVC); !ok {
		t.Fatal("the default box's volume was deleted by an ID with an empty box name")
	}
}

// A CreateVolume retried after an attempt whose answer was lost goes back
// to the box that attempt was sent to: while that box cannot answer (down,
// or its look-up fails) the retry waits (UNAVAILABLE), and when it
// answers that the disk is not there yet (the command may still land) the
// volume is made there again, never on another box, which would leave
// the first box's disk behind and one slot on two boxes.
func TestARetriedCreateStaysOnTheBoxAnEarlierAttemptWasSentTo(t *testing.T) {
	topo := &csi.TopologyRequirement{
		Requisite: []*csi.Topology{seg(keyB, "true"), seg(keyC, "true")},
		Preferred: []*csi.Topology{seg(keyB, "true"), seg(keyC, "true")},
	}
	for _, tc := range []struct {
		name   string
		before func(e *boxesEnv)
		want   codes.Code
	}{
		{"rack-b down", func(e *boxesEnv) { e.down["rack-b"] = errors.New("probe timed out") }, codes.Unavailable},
		{"rack-b's look-up fails", func(e *boxesEnv) {
			e.b.failNext("GetDisk", rds.ErrTransient)
		}, codes.Unavailable},
		{"rack-b answers it has no such disk yet", func(*boxesEnv) {}, codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newBoxesEnv(t)
			ctx := context.Background()
			// The first attempt goes to rack-b (preferred); its answer is lost.
			e.b.failNext("CreateDisk", rds.ErrTransient)
			if _, err := e.s.CreateVolume(ctx, boxCreateReq(testPVC, nil, topo)); code(err) != codes.Unavailable {
				t.Fatalf("first attempt: %v", err)
			}
			tc.before(e)
			// The retry prefers rack-c (external-provisioner rotates the
			// preferred segments of an immediately bound claim).
			retry := &csi.TopologyRequirement{Requisite: topo.Requisite, Preferred: []*csi.Topology{seg(keyC, "true"), seg(keyB, "true")}}
			resp, err := e.s.CreateVolume(ctx, boxCreateReq(testPVC, nil, retry))
			if code(err) != tc.want {
				t.Fatalf("retry: %v %v, want %s", resp.GetVolume().GetVolumeId(), err, tc.want)
			}
			if err == nil && resp.GetVolume().GetVolumeId() != "rack-b/"+testPVC {
				t.Fatalf("retry made %s, want it on rack-b", resp.GetVolume().GetVolumeId())
			}
			if n := e.c.callCount("CreateDisk"); n != 0 {
				t.Fatalf("rack-c was asked to create the volume %d times", n)
			}
		})
	}
}

// A node connects to a volume whose context names no NVMe/TCP target (a
// PV written by hand, a driver run without ControllerPublish) at its own
// box's target, never at the default box's, which exports its own
// volume of the same slot under the same NQN.
func TestANodeConnectsToItsVolumesBoxWhenTheContextNamesNoTarget(t *testing.T) {
	opts := testOptions()
	opts.Mode, opts.NodeID = ModeNode, "rack-b-7"
	def := opts.DefaultBackend()
	d, err := NewDriverBoxes(opts, []Box{{Backend: def},
		{Backend: backends.Backend{Name: "rack-b", Address: "10.0.1.5", NVMeAddress: "10.0.3.5", NVMePort: 4421}}})
	if err != nil {
		t.Fatal(err)
	}
	ns := NewNodeServer(d, nil, "")
	tgt, err := ns.target("rack-b/"+testPVC, nil)
	if err != nil || tgt.Address != "10.0.3.5" || tgt.Port != 4421 {
		t.Fatalf("rack-b's volume: target %+v, err %v; want 10.0.3.5:4421", tgt, err)
	}
	if tgt, err := ns.target(testPVC, nil); err != nil || tgt.Address != opts.NVMeAddress || tgt.Port != opts.NVMePort {
		t.Fatalf("the default box's volume: target %+v, err %v", tgt, err)
	}
	if _, err := ns.target("rack-z/"+testPVC, nil); code(err) != codes.FailedPrecondition {
		t.Fatalf("an unknown box's volume: %v", err)
	}
}

// A snapshot ID of a box missing from the configuration is
// FAILED_PRECONDITION in ListSnapshots too, never an empty list: that
// would tell the CO the snapshot does not exist while its disk is on a
// box only missing from the list for now.
func TestListingASnapshotOfABoxNotConfiguredIsNotAnEmptyList(t *testing.T) {
	e := newBoxesEnv(t)
	id := "rack-z/snap-0a1b2c3d-4e5f-6789-abcd-ef0123456789"
	resp, err := e.s.ListSnapshots(context.Background(), &csi.ListSnapshotsRequest{SnapshotId: id})
	if code(err) != codes.FailedPrecondition {
		t.Fatalf("ListSnapshots(%s): %v %v, want FAILED_PRECONDITION", id, resp, err)
	}
}
