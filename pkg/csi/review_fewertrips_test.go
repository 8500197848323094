package csi

import (
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stypes "k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"

	"github.com/srvlab/rds-csi/pkg/fencing"
)

// Review of issue 24's fewer round trips: what the saved reads carried
// must be carried by what is left. Each case runs with storage fencing
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
				node.UID = k8stypes.UID("uid-" + n)
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
