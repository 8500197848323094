package csi

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/fencing"
)

// Issue 24: what one ControllerPublishVolume costs in round trips, counted
// on the fakes so that a saving cannot silently regress. API calls are
// counted by verb and resource on the shared API server; RouterOS
// commands as rds.Client sends them: GetDisk is one `print`, SwapExport a
// `set` and the `print` that reads it back.
type roundTrips struct {
	api map[string]int // "get nodes", "patch persistentvolumes", ...
	ros int            // RouterOS commands
}

func (r roundTrips) String() string {
	keys := slices.Sorted(maps.Keys(r.api))
	parts := make([]string, 0, len(keys)+1)
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, r.api[k]))
	}
	return strings.Join(append(parts, fmt.Sprintf("routeros=%d", r.ros)), " ")
}

// countPublish runs one ControllerPublishVolume of id on node (its
// VolumeAttachment already there) and counts what it sent.
func countPublish(t *testing.T, e *publishEnv, shared *fake.Clientset, id, node string) (roundTrips, *csi.ControllerPublishVolumeResponse) {
	t.Helper()
	e.ensureVA(id, node)
	// As the attacher calls: after its VolumeAttachment was created, which
	// the index has seen by then.
	waitFor(t, "the index to show the VolumeAttachment", func() bool { return indexShowsAttachment(e, id, node) })
	shared.ClearActions()
	e.rds.mu.Lock()
	clear(e.rds.calls)
	e.rds.mu.Unlock()
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	resp, err := e.cs.ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: node, VolumeCapability: rwo})
	if err != nil {
		t.Fatalf("publish of %s to %s: %v", id, node, err)
	}
	r := roundTrips{api: map[string]int{}}
	for _, a := range shared.Actions() {
		switch a.GetVerb() {
		case "list", "watch":
			continue // the informers'
		}
		r.api[a.GetVerb()+" "+a.GetResource().Resource]++
	}
	e.rds.mu.Lock()
	r.ros = e.rds.calls["GetDisk"] + 2*e.rds.calls["SwapExport"]
	e.rds.mu.Unlock()
	return r, resp
}

// TestPublishRoundTrips: the round trips of a first publish and of
// repeated ones, with and without storage fencing, and with this
// replica's PV watch behind its own last write (a repeat right after the
// first: answered from the write's own answer, not with a conflict, a
// wait and a second write).
func TestPublishRoundTrips(t *testing.T) {
	type want struct {
		first, repeat map[string]int
		firstROS      int
		repeatROS     int
	}
	for _, tc := range []struct {
		name string
		opts Options
		want want
	}{
		{
			name: "fencing off",
			opts: testOptions(),
			want: want{
				// The VolumeAttachment before the commit, the commit, the
				// Node and the VolumeAttachment after it. The requester's
				// UID comes from the index, confirmed by the read after.
				first:  map[string]int{"get volumeattachments": 2, "patch persistentvolumes": 1, "get nodes": 1},
				repeat: map[string]int{"get volumeattachments": 2, "patch persistentvolumes": 1, "get nodes": 1},
			},
		},
		{
			name: "allow-host",
			opts: allowHostOptions(),
			want: want{
				// And the export: read it, then the live claims; open it
				// (a set and its read-back, which the next round takes as
				// its export read), then the live claims again.
				first:     map[string]int{"get volumeattachments": 2, "patch persistentvolumes": 1, "get nodes": 1, "get persistentvolumes": 2},
				firstROS:  3,
				repeat:    map[string]int{"get volumeattachments": 2, "patch persistentvolumes": 1, "get nodes": 1, "get persistentvolumes": 1},
				repeatROS: 1,
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, lag, shared := newLaggingPublishEnv(t, tc.opts)
			const pv = "pvc-24000000-0000-4000-8000-000000000001"
			id := e.newVolume(shared, pv, corev1.ReadWriteOnce, false)

			check := func(what string, got roundTrips, api map[string]int, ros int) {
				t.Helper()
				if !maps.Equal(got.api, api) || got.ros != ros {
					t.Errorf("%s: %v; want %v", what, got, roundTrips{api: api, ros: ros})
				}
			}
			got, first := countPublish(t, e, shared, id, "node-a")
			check("first publish", got, tc.want.first, tc.want.firstROS)
			e.waitClaims(id, "node-a")
			waitFor(t, "the index to see the first publish's write", func() bool {
				return e.index.Volume(id).ResourceVersion == pvVersion(t, shared, pv)
			})

			got, again := countPublish(t, e, shared, id, "node-a")
			check("repeated publish, index up to date", got, tc.want.repeat, tc.want.repeatROS)

			// The PV watch is behind by this replica's own last write.
			lag.pause("persistentvolumes")
			for i := range 3 {
				got, more := countPublish(t, e, shared, id, "node-a")
				check(fmt.Sprintf("repeated publish %d, index behind this replica's own write", i+1), got, tc.want.repeat, tc.want.repeatROS)
				if !maps.Equal(more.PublishContext, first.PublishContext) {
					t.Errorf("repeat %d answered %v, the first %v", i+1, more.PublishContext, first.PublishContext)
				}
			}
			lag.resume("persistentvolumes")
			if !maps.Equal(again.PublishContext, first.PublishContext) {
				t.Errorf("repeat answered %v, the first %v", again.PublishContext, first.PublishContext)
			}
			if c := claimsOf(t, shared, pv)["node-a"]; c.Gen != 5 {
				t.Errorf("node-a's claim %+v after 5 publishes, want gen 5 (every success is a write)", c)
			}
		})
	}
}

func pvVersion(t *testing.T, client *fake.Clientset, name string) string {
	t.Helper()
	pv, err := client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("persistentvolumes"), "", name)
	if err != nil {
		t.Fatal(err)
	}
	return pv.(*corev1.PersistentVolume).ResourceVersion
}

// The requester's UID comes from the index; a replica whose Node watch is
// behind on a re-created node neither replaces the live attachment of the
// new incarnation (its claim names another UID than the index shows: read
// live, it is this node's) nor answers for the old one (the read after
// the commit shows another UID: ABORTED, nothing answered).
func TestPublishRequesterUIDFromALaggingIndex(t *testing.T) {
	node := testNode("node-a")
	node.UID = "uid-1"
	shared := newFakeAPI(node)
	rdsFake := newFakeRDS(1 << 40)
	a := newPublishEnvWith(t, shared, rdsFake, fencing.DefaultConfig(), allowHostOptions(), withoutNodeFencer)
	lag := newLaggingClient(t, shared)
	b := newPublishEnvWith(t, lag.Clientset, rdsFake, fencing.DefaultConfig(), allowHostOptions(), withoutNodeFencer)
	b.client = shared
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	const pv = "pvc-24000000-0000-4000-8000-000000000002"
	id := a.newVolume(shared, pv, corev1.ReadWriteOnce, false)
	b.waitIndexed(id)
	waitFor(t, "b to know node-a", func() bool { return b.index.Node("node-a").UID == "uid-1" })
	publish := func(e *publishEnv) (*csi.ControllerPublishVolumeResponse, error) {
		e.ensureVA(id, "node-a")
		return e.cs.ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-a", VolumeCapability: rwo})
	}

	// node-a is re-created; replica b's Node watch does not see it.
	lag.pause("nodes")
	ctx := context.Background()
	if err := shared.CoreV1().Nodes().Delete(ctx, "node-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := shared.CoreV1().Nodes().Create(ctx, nodeWithUID("node-a", "uid-2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a to see node-a's new incarnation", func() bool { return a.index.Node("node-a").UID == "uid-2" })
	first, err := publish(a)
	if err != nil {
		t.Fatal(err)
	}
	host := hostOn(t, a, shared, id, pv, "node-a")
	b.waitClaims(id, "node-a")
	waitFor(t, "b to see the claim of uid-2", func() bool { return claimOn(b.index.Volume(id).Claims, "node-a").NodeUID == "uid-2" })

	// b's index says uid-1, the claim uid-2: b reads node-a live and
	// answers for the attachment as it is, without cutting it.
	drops := a.drops(id)
	again, err := publish(b)
	if err != nil {
		t.Fatalf("repeated publish on the replica whose Node watch is behind: %v", err)
	}
	if again.PublishContext[PublishContextHostNQN] != first.PublishContext[PublishContextHostNQN] {
		t.Fatalf("answered host NQN %q, the attachment's is %q", again.PublishContext[PublishContextHostNQN], first.PublishContext[PublishContextHostNQN])
	}
	if c := claimsOf(t, shared, pv)["node-a"]; c.NodeUID != "uid-2" || hostOn(t, a, shared, id, pv, "node-a") != host {
		t.Fatalf("the live attachment was replaced: claim %+v", c)
	}
	wantExport(t, a, id, true, host)
	if a.drops(id) != drops {
		t.Fatalf("the export dropped node-a's connection (%d drops, was %d)", a.drops(id), drops)
	}

	// b catches up; then node-a is re-created once more behind its back:
	// its index and the claim say uid-2, the API server uid-3. The read
	// after the commit tells: nothing is answered, the claim (made by an
	// answered publish) stays for its detach.
	lag.resume("nodes")
	waitFor(t, "b to see uid-2", func() bool { return b.index.Node("node-a").UID == "uid-2" })
	lag.pause("nodes")
	if err := shared.CoreV1().Nodes().Delete(ctx, "node-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := shared.CoreV1().Nodes().Create(ctx, nodeWithUID("node-a", "uid-3"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := publish(b); code(err) != codes.Aborted {
		t.Fatalf("publish for a node re-created behind the replica's back: %v, want Aborted", err)
	}
	if c := claimsOf(t, shared, pv)["node-a"]; c.NodeUID != "uid-2" {
		t.Fatalf("claim %+v, want uid-2's kept", c)
	}
	wantExport(t, a, id, true, host)

	// Once b sees uid-3, the publish is a new attachment of the new
	// incarnation, the old one cut off first.
	lag.resume("nodes")
	waitFor(t, "b to see uid-3", func() bool { return b.index.Node("node-a").UID == "uid-3" })
	third, err := publish(b)
	if err != nil {
		t.Fatal(err)
	}
	if c := claimsOf(t, shared, pv)["node-a"]; c.NodeUID != "uid-3" || third.PublishContext[PublishContextHostNQN] == first.PublishContext[PublishContextHostNQN] {
		t.Fatalf("claim %+v, host NQN %q: want a new attachment of uid-3", c, third.PublishContext[PublishContextHostNQN])
	}
	wantExport(t, a, id, true, hostOn(t, a, shared, id, pv, "node-a"))
	if a.drops(id) == drops {
		t.Fatal("the old incarnation's attachment was not cut off")
	}
}

// A VolumeAttachment the index has not seen yet (the attacher's own
// informer was quicker) is read live: the publish succeeds on the first
// call rather than being refused for an attachment that exists.
func TestPublishReadsAnAttachmentTheIndexHasNotSeen(t *testing.T) {
	for name, opts := range map[string]Options{"fencing off": testOptions(), "allow-host": allowHostOptions()} {
		t.Run(name, func(t *testing.T) {
			e, lag, shared := newLaggingPublishEnv(t, opts)
			id := e.newVolume(shared, "pvc-24000000-0000-4000-8000-000000000011", corev1.ReadWriteOnce, false)
			lag.pause("volumeattachments")
			e.ensureVA(id, "node-a")
			shared.ClearActions()
			rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
			if _, err := e.cs.ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-a", VolumeCapability: rwo}); err != nil {
				t.Fatalf("publish on a VolumeAttachment the index has not seen: %v", err)
			}
			gets := 0
			for _, a := range shared.Actions() {
				if a.GetVerb() == "get" && a.GetResource().Resource == "volumeattachments" {
					gets++
				}
			}
			if gets != 2 {
				t.Fatalf("%d VolumeAttachment reads; want 2 (before the commit and after)", gets)
			}
		})
	}
}

// A paused replica: its index still shows the VolumeAttachment that was
// detached meanwhile. The live read before the commit refuses it: no
// claim is written at all, so none can be left when taking it back fails
// (nothing else would ever release it). Taking the attachment from the
// index and withdrawing after the commit leaves the claim in four ways.
func TestPausedReplicaWritesNoClaim(t *testing.T) {
	for name, opts := range map[string]Options{"fencing off": testOptions(), "allow-host": allowHostOptions()} {
		t.Run(name, func(t *testing.T) {
			e, lag, shared := newLaggingPublishEnv(t, opts)
			const pv = "pvc-24000000-0000-4000-8000-000000000012"
			id := e.newVolume(shared, pv, corev1.ReadWriteOnce, false)
			e.ensureVA(id, "node-a")
			waitFor(t, "the index to show the VolumeAttachment", func() bool { return indexShowsAttachment(e, id, "node-a") })
			lag.pause("volumeattachments")
			name := claims.VolumeAttachmentName(id, DefaultDriverName, "node-a")
			if err := shared.StorageV1().VolumeAttachments().Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			shared.ClearActions()
			rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
			_, err := e.cs.ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-a", VolumeCapability: rwo})
			mustCode(t, "publish on a detached VolumeAttachment the index still shows", err, codes.Aborted)
			for _, a := range shared.Actions() {
				if a.GetVerb() == "patch" && a.GetResource().Resource == "persistentvolumes" {
					t.Fatalf("a claim was written (a PATCH of PV %s) for a VolumeAttachment already gone", pv)
				}
			}
			if c := claimsOf(t, shared, pv); len(c) != 0 {
				t.Fatalf("claims %v left by a publish whose VolumeAttachment was detached", c)
			}
			if opts.AllowHostFencing() {
				wantClosed(t, e, id)
			}
		})
	}
}

// indexShowsAttachment: e's index shows a VolumeAttachment of id on
// node that is not being deleted.
func indexShowsAttachment(e *publishEnv, id, node string) bool {
	a, ok := e.index.Volume(id).AttachmentOn(node)
	return ok && a.DetachingSince.IsZero()
}

// newLaggingPublishEnv: one replica whose watches can be held back
// (lagging client) over a shared fake API server that knows node-a.
func newLaggingPublishEnv(t *testing.T, opts Options) (*publishEnv, *laggingClient, *fake.Clientset) {
	t.Helper()
	node := testNode("node-a")
	node.UID = types.UID("uid-node-a")
	shared := newFakeAPI(node)
	lag := newLaggingClient(t, shared)
	e := newPublishEnvWith(t, lag.Clientset, nil, fencing.DefaultConfig(), opts)
	e.client = shared
	waitFor(t, "the index to know node-a", func() bool { return e.index.Node("node-a").UID == "uid-node-a" })
	return e, lag, shared
}

// fewerTripsModes: the publish saves reads (round trips) where what they
// carried is carried by what is left. Each case runs with storage fencing
// off (the claim write and the reads after it are all there is) and on.
func fewerTripsModes() []struct {
	name string
	opts Options
} {
	return []struct {
		name string
		opts Options
	}{{"fencing off", testOptions()}, {"allow-host", allowHostOptions()}}
}

// The requester's UID comes from the index, with no Node GET before the
// commit. A Node deleted and re-created exactly between the decision and
// the claim write (the write itself deletes it, on the API server) must
// not be answered as the node the claim names: the read after the commit
// catches it, the claim this call made is withdrawn, the export stays
// shut. Once the index knows the new incarnation the publish goes
// through for it.
func TestPublishNodeRecreatedBetweenIndexReadAndCommit(t *testing.T) {
	for _, mode := range fewerTripsModes() {
		t.Run(mode.name, func(t *testing.T) {
			node := testNode(nodeA)
			node.UID = "uid-1"
			shared := newFakeAPI(node)
			var once sync.Once
			shared.PrependReactor("patch", "persistentvolumes", func(k8stesting.Action) (bool, runtime.Object, error) {
				once.Do(func() {
					nodes := corev1.SchemeGroupVersion.WithResource("nodes")
					if err := shared.Tracker().Delete(nodes, "", nodeA); err != nil {
						t.Error(err)
					}
					if err := shared.Tracker().Create(nodes, nodeWithUID(nodeA, "uid-2"), ""); err != nil {
						t.Error(err)
					}
				})
				return false, nil, nil // the write itself goes on
			})
			e := newPublishEnvWith(t, shared, newFakeRDS(1<<40), fencing.DefaultConfig(), mode.opts, withoutNodeFencer)
			rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
			const pv = "pvc-24000000-0000-4000-8000-0000000000a1"
			id := e.newVolume(shared, pv, corev1.ReadWriteOnce, false)
			waitFor(t, "the index to know node-a", func() bool { return e.index.Node(nodeA).UID == "uid-1" })

			_, err := e.publish(id, nodeA, rwo)
			mustCode(t, "publish while node-a is re-created under the claim write", err, codes.Aborted)
			if c, ok := claimsOf(t, shared, pv)[nodeA]; ok {
				t.Fatalf("a claim of node-a outlived the publish that was not answered: %+v", c)
			}
			if mode.opts.AllowHostFencing() && e.disk(id).Exported {
				t.Fatalf("the export was opened for a publish that was not answered: %+v", e.disk(id))
			}

			waitFor(t, "the index to know node-a's new incarnation", func() bool { return e.index.Node(nodeA).UID == "uid-2" })
			if _, err := e.publish(id, nodeA, rwo); err != nil {
				t.Fatalf("publish for the new incarnation: %v", err)
			}
			if c := claimsOf(t, shared, pv)[nodeA]; c.NodeUID != "uid-2" {
				t.Fatalf("claim %+v, want one of uid-2", c)
			}
		})
	}
}

// Claims.Fresher gives a replica its own last write while its PV watch is
// behind; another replica may have written since. Here replica b, whose
// PV and VolumeAttachment watches are stuck, publishes node-a; through
// replica a node-a is then unpublished and node-b published. b's Fresher
// still shows node-a's claim, its index shows node-a's VolumeAttachment:
// a repeated publish of node-a on b looks like an attachment already held.
// It must not be answered (the claim write conditional on b's own write's
// resourceVersion conflicts), and node-b's claim and export stay.
func TestPublishFresherBehindAnotherReplicasWrite(t *testing.T) {
	for _, mode := range fewerTripsModes() {
		t.Run(mode.name, func(t *testing.T) {
			var objs []runtime.Object
			for _, n := range []string{nodeA, nodeB} {
				node := testNode(n)
				node.UID = types.UID("uid-" + n)
				objs = append(objs, node)
			}
			shared := newFakeAPI(objs...)
			rdsFake := newFakeRDS(1 << 40)
			a := newPublishEnvWith(t, shared, rdsFake, fencing.DefaultConfig(), mode.opts, withoutNodeFencer)
			lag := newLaggingClient(t, shared)
			b := newPublishEnvWith(t, lag.Clientset, rdsFake, fencing.DefaultConfig(), mode.opts, withoutNodeFencer)
			b.client = shared
			b.cs.pub.CatchUp = time.Nanosecond // b's PV watch is held shut: no use waiting for it
			rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
			const pv = "pvc-24000000-0000-4000-8000-0000000000a2"
			id := a.newVolume(shared, pv, corev1.ReadWriteOnce, false)
			b.waitIndexed(id)

			lag.pause("persistentvolumes")
			lag.pause("volumeattachments")
			if _, err := b.publish(id, nodeA, rwo); err != nil {
				t.Fatal(err)
			}
			if v := b.fence.Fresher(b.index.Volume(id)); !v.HasClaim(nodeA) {
				t.Fatal("b's own write is not what Fresher shows: the case under test does not arise")
			}
			a.waitClaims(id, nodeA)
			if err := a.unpublish(id, nodeA); err != nil {
				t.Fatal(err)
			}
			a.waitClaims(id)
			if _, err := a.publish(id, nodeB, rwo); err != nil {
				t.Fatal(err)
			}
			holder := claimsOf(t, shared, pv)[nodeB]

			resp, err := b.publish(id, nodeA, rwo)
			if err == nil {
				t.Fatalf("replica b told node-a it may write (%v) while the API server holds %v", resp.GetPublishContext(), keys(claimsOf(t, shared, pv)))
			}
			if c := claimsOf(t, shared, pv); len(c) != 1 || c[nodeB].Nonce != holder.Nonce || c[nodeB].NodeUID != holder.NodeUID {
				t.Fatalf("claims %v, want node-b's alone and unchanged", c)
			}
			if mode.opts.AllowHostFencing() {
				wantExport(t, a, id, true, hostOn(t, a, shared, id, pv, nodeB))
			}
			lag.resume("persistentvolumes")
			lag.resume("volumeattachments")
		})
	}
}

// An open's next round takes the export from the swap's read-back
// instead of reading it again. Here the read-back is stale by the time
// that round reads the claims: replica a opened the export to node-a and
// read it back; before a reads the claims again, node-a is unpublished
// and node-b published through replica b, which moves the export on.
// a's round decides on the stale read-back and the live claims (node-b
// alone): node-a is not told it may write, node-b's export stays and is
// not dropped.
func TestPublishOpenReadBackStaleBeforeTheClaimsRead(t *testing.T) {
	shared := newFakeAPI(testNode(nodeA), testNode(nodeB))
	rdsFake := newFakeRDS(1 << 40)
	ac := newLaggingClient(t, shared) // no stream held: only its PV reads are gated
	a := newPublishEnvWith(t, ac.Clientset, rdsFake, fencing.DefaultConfig(), allowHostOptions())
	a.client = shared
	b := newPublishEnvWith(t, shared, rdsFake, fencing.DefaultConfig(), allowHostOptions())
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	const pv = "pvc-24000000-0000-4000-8000-0000000000a3"
	id := a.newVolume(shared, pv, corev1.ReadWriteOnce, false)
	b.waitIndexed(id)

	// a's first read of the claims once the export is open: the round
	// after its open, which takes the export from the read-back.
	opened, resume := make(chan struct{}), make(chan struct{})
	var gate sync.Once
	ac.PrependReactor("get", "persistentvolumes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if d, ok := rdsFake.disk(id); ok && d.Exported {
			gate.Do(func() { close(opened); <-resume })
		}
		return false, nil, nil
	})
	answered := make(chan error, 1)
	go func() { _, err := a.publish(id, nodeA, rwo); answered <- err }()
	select {
	case <-opened:
	case err := <-answered:
		t.Fatalf("publish answered (%v) without reading the claims after its open landed", err)
	}
	hostA := hostOn(t, a, shared, id, pv, nodeA)
	wantExport(t, a, id, true, hostA)

	a.dropAutoVA(id, nodeA)
	b.waitClaims(id, nodeA)
	if err := b.unpublish(id, nodeA); err != nil {
		t.Fatal(err)
	}
	b.waitClaims(id)
	if _, err := b.publish(id, nodeB, rwo); err != nil {
		t.Fatal(err)
	}
	hostB := b.hostOf(id, nodeB)
	wantExport(t, b, id, true, hostB)
	drops := b.drops(id)

	close(resume)
	if err := <-answered; err == nil {
		t.Fatal("node-a was told it may write after its unpublish and node-b's publish")
	}
	wantExport(t, b, id, true, hostB)
	if b.drops(id) != drops {
		t.Fatalf("node-b's connection was dropped (%d drops, was %d)", b.drops(id), drops)
	}
	if c := claimsOf(t, shared, pv); len(c) != 1 || !has(c, nodeB) {
		t.Fatalf("claims %v, want node-b's alone", keys(c))
	}
}
