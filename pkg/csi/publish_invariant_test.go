package csi

import (
	"context"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/informers"
)

// TestPublishInvariantTwoReplicas drives thousands of interleaved
// publishes, unpublishes, VolumeAttachment changes and node failures
// through two controller replicas that share one API server, from several
// goroutines at once, and checks after every step what the API server
// holds: a single-node volume is never claimed by two healthy nodes, a
// multi-writer volume by three. The replicas' indexes lag the API by
// design; the conditional claim updates must make that harmless.
func TestPublishInvariantTwoReplicas(t *testing.T) {
	const (
		workers      = 4
		stepsPerWork = 600
		singleVols   = 6
		multiVols    = 2
	)
	nodes := []string{"n0", "n1", "n2", "n3", "n4"}
	var objs []runtime.Object
	for _, n := range nodes {
		objs = append(objs, testNode(n))
	}
	client := newFakeAPI(objs...)
	sharedRDS := newFakeRDS(1 << 40)
	a := newPublishEnv(t, client, sharedRDS, fencing.DefaultConfig())
	b := newPublishEnv(t, client, sharedRDS, fencing.DefaultConfig())
	replicas := []*publishEnv{a, b}

	type vol struct {
		id, pv string
		multi  bool
	}
	var vols []vol
	for i := 0; i < singleVols+multiVols; i++ {
		name := fmt.Sprintf("pvc-0a1b2c3d-0000-4000-8000-%012d", 100+i)
		multi := i >= singleVols
		mode := corev1.ReadWriteOnce
		if multi {
			mode = corev1.ReadWriteMany
		}
		id := a.newVolume(client, name, mode, multi)
		waitFor(t, "replica b to know "+id, func() bool { return b.index.Volume(id) != nil })
		vols = append(vols, vol{id: id, pv: name, multi: multi})
	}

	// Failed nodes stay failed (a deleted or out-of-service node never
	// becomes healthy again under the same name here), so "healthy" only
	// shrinks and the checker's reads need no snapshot isolation.
	var failures atomic.Int32
	var ok, refused, aborted atomic.Int64
	check := func() error {
		ctx := context.Background()
		healthy := map[string]bool{}
		nl, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, n := range nl.Items {
			healthy[n.Name] = true
			for _, taint := range n.Spec.Taints {
				if taint.Key == informers.OutOfServiceTaint {
					healthy[n.Name] = false
				}
			}
		}
		for _, v := range vols {
			held := 0
			for n := range claimsOf(t, client, v.pv) {
				if healthy[n] {
					held++
				}
			}
			limit := 1
			if v.multi {
				limit = 2
			}
			if held > limit {
				return fmt.Errorf("volume %s is claimed by %d healthy nodes: %v", v.id, held, claimsOf(t, client, v.pv))
			}
		}
		return nil
	}

	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(seed int64) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed))
			ctx := context.Background()
			for step := 0; step < stepsPerWork; step++ {
				v := vols[rng.Intn(len(vols))]
				node := nodes[rng.Intn(len(nodes))]
				r := replicas[rng.Intn(len(replicas))]
				c := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
				if v.multi {
					c = blockCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
				}
				switch op := rng.Intn(100); {
				case op < 45:
					_, err := r.publish(v.id, node, c)
					switch code(err) {
					case codes.OK:
						ok.Add(1)
					case codes.FailedPrecondition:
						refused.Add(1)
					case codes.Aborted, codes.NotFound:
						aborted.Add(1) // a stale index or a failed node: retried by the CO
					default:
						errs <- fmt.Errorf("publish %s to %s: %v", v.id, node, err)
						return
					}
				case op < 80:
					if err := r.unpublish(v.id, node); err != nil && code(err) != codes.Aborted {
						errs <- fmt.Errorf("unpublish %s from %s: %v", v.id, node, err)
						return
					}
				case op < 90:
					va := testVA(v.pv, node, publishNow)
					_, err := client.StorageV1().VolumeAttachments().Create(ctx, va, metav1.CreateOptions{})
					if apierrors.IsAlreadyExists(err) {
						err = client.StorageV1().VolumeAttachments().Delete(ctx, va.Name, metav1.DeleteOptions{})
					}
					if err != nil && !apierrors.IsNotFound(err) {
						errs <- err
						return
					}
				case op < 92 && failures.Load() < 3:
					// A node fails for good: deleted or tainted out of service.
					failures.Add(1)
					if rng.Intn(2) == 0 {
						err := client.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{})
						if err != nil && !apierrors.IsNotFound(err) {
							errs <- err
							return
						}
					} else if n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); err == nil {
						n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: informers.OutOfServiceTaint, Effect: corev1.TaintEffectNoExecute})
						if _, err := client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
							errs <- err
							return
						}
					}
				}
				if err := check(); err != nil {
					errs <- fmt.Errorf("step %d of worker %d: %w", step, seed, err)
					return
				}
			}
		}(int64(w + 1))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("publishes: %d succeeded, %d refused, %d aborted/not found; %d node failures",
		ok.Load(), refused.Load(), aborted.Load(), failures.Load())
	// The run must have exercised both outcomes, or it proved nothing.
	if ok.Load() == 0 || refused.Load() == 0 {
		t.Fatalf("degenerate run: %d successes, %d refusals", ok.Load(), refused.Load())
	}
}

// TestRestartGivesIdenticalDecisions: a controller started on an API
// that already holds attachments, claims and failed nodes reaches, once
// synced, exactly the decisions the replica that built that state reaches.
// There is no rebuild step to get wrong: the new index is the informers'.
func TestRestartGivesIdenticalDecisions(t *testing.T) {
	client := newFakeAPI(testNode("n0"), testNode("n1"), testNode("n2"), testNode("n3"))
	sharedRDS := newFakeRDS(1 << 40)
	first := newFixedPublishEnv(t, client, sharedRDS, fencing.DefaultConfig())
	ctx := context.Background()
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	rwx := blockCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)

	var ids []string
	for i := 0; i < 6; i++ {
		name := fmt.Sprintf("pvc-0a1b2c3d-0000-4000-8000-%012d", 200+i)
		mode, block := corev1.ReadWriteOnce, false
		if i >= 4 {
			mode, block = corev1.ReadWriteMany, true
		}
		ids = append(ids, first.newVolume(client, name, mode, block))
	}
	mustPublish := func(id, node string, c *csi.VolumeCapability) {
		t.Helper()
		if _, err := first.publish(id, node, c); err != nil {
			t.Fatalf("publish %s to %s: %v", id, node, err)
		}
	}
	mustPublish(ids[0], "n0", rwo)
	mustPublish(ids[1], "n1", rwo)
	mustPublish(ids[2], "n2", rwo)
	mustPublish(ids[4], "n0", rwx)
	first.waitClaims(ids[4], "n0")
	mustPublish(ids[4], "n1", rwx)
	// A VolumeAttachment without a claim (attached before claims existed),
	// one being detached, and a node that failed.
	for _, va := range []struct {
		pv, node string
		deleting bool
	}{{"pvc-0a1b2c3d-0000-4000-8000-000000000203", "n3", false}, {"pvc-0a1b2c3d-0000-4000-8000-000000000202", "n2", true}} {
		obj := testVA(va.pv, va.node, publishNow.Add(-time.Hour))
		if va.deleting {
			del := metav1.NewTime(publishNow.Add(-10 * time.Second))
			obj.DeletionTimestamp = &del
			obj.Finalizers = []string{"external-attacher/rds-csi-srvlab-io"}
		}
		if _, err := client.StorageV1().VolumeAttachments().Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := client.CoreV1().Nodes().Delete(ctx, "n1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first replica to see every change", func() bool {
		return !first.index.Node("n1").Exists && len(first.index.Volume(ids[3]).Attachments) == 1 &&
			len(first.index.Volume(ids[2]).Attachments) == 1 && !first.index.Volume(ids[1]).HasClaim("n1") &&
			!first.index.Volume(ids[4]).HasClaim("n1") // the Fencer released every claim of the deleted node
	})

	decide := func(e *publishEnv) []string {
		var out []string
		for _, id := range ids {
			v := e.index.Volume(id)
			mode := fencing.SingleNode
			if v.Block {
				mode = fencing.MultiNodeMultiWriter
			}
			for _, n := range []string{"n0", "n1", "n2", "n3"} {
				d := fencing.Decide(fencing.Request{VolumeID: id, Node: n, Mode: mode}, v.Holders(), e.index.Node, publishNow, fencing.DefaultConfig())
				out = append(out, fmt.Sprintf("%s@%s: %s %s fence=%v", id, n, d.Verdict, d.Blocking, d.Fence))
			}
		}
		return out
	}
	before := decide(first)
	first.close()
	second := newFixedPublishEnv(t, client, sharedRDS, fencing.DefaultConfig())
	after := decide(second) // no waiting: synced means indexed
	refusals := 0
	for i := range before {
		if before[i] != after[i] {
			t.Errorf("decision changed across the restart:\n before %s\n after  %s", before[i], after[i])
		}
		if strings.Contains(before[i], " refuse ") {
			refusals++
		}
	}
	if refusals == 0 {
		t.Fatal("degenerate state: nothing was refused")
	}
}
