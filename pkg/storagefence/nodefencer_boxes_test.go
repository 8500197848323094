package storagefence

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/srvlab/rds-csi/pkg/backends"
	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/informers"
	"github.com/srvlab/rds-csi/pkg/nvme"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// boxRDS is one box's exports, in memory; gate, when set, holds every
// call until it is closed (a box that hangs).
type boxRDS struct {
	backends.RDS
	mu    sync.Mutex
	disks map[string]rds.Disk
	gate  chan struct{}
}

func (b *boxRDS) wait(ctx context.Context) error {
	if b.gate == nil {
		return nil
	}
	select {
	case <-b.gate:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (b *boxRDS) GetDisk(ctx context.Context, slot string) (*rds.Disk, error) {
	if err := b.wait(ctx); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	d, ok := b.disks[slot]
	if !ok {
		return nil, rds.ErrNotFound
	}
	return &d, nil
}

func (b *boxRDS) SwapExport(ctx context.Context, slot string, from, to rds.ExportState) (rds.ExportState, error) {
	if err := b.wait(ctx); err != nil {
		return rds.ExportState{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	d := b.disks[slot]
	if rds.StateOf(&d) != from {
		return rds.StateOf(&d), rds.ErrExportChanged
	}
	d.Exported, d.AllowHost = to.Open, to.Host
	b.disks[slot] = d
	return to, nil
}

func (b *boxRDS) SwapExportAuth(ctx context.Context, slot string, from, to rds.ExportState, _ rds.ExportPassword) (rds.ExportState, nvme.DHCHAPSecret, error) {
	s, err := b.SwapExport(ctx, slot, from, to)
	return s, nvme.DHCHAPSecret{}, err
}

func (b *boxRDS) Retombstone(ctx context.Context, slot string, to rds.ExportState) (rds.ExportState, error) {
	if err := b.wait(ctx); err != nil {
		return rds.ExportState{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	d := b.disks[slot]
	d.Exported, d.AllowHost, d.AllowHostUnknown = to.Open, to.Host, false
	b.disks[slot] = d
	return to, nil
}

// A node's volumes on two boxes are fenced side by side: while the box of
// one hangs, the other's is cut off and released, and the node's fence
// (and so its taint) still waits for the hung one.
func TestAHungBoxHoldsOnlyItsOwnVolumesFence(t *testing.T) {
	key := []byte("a test attachment key of 32 bytes or more")
	held := func(handle string) string {
		c := claims.Claim{At: t0, NodeUID: "uid-1", Nonce: "n-" + strings.ReplaceAll(handle, "/", "-")}
		b, err := json.Marshal(map[string]claims.Claim{"node-a": c})
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	client := fake.NewClientset(
		pv("pv-a", "pvc-a", corev1.ReadWriteOnce, held("pvc-a")),
		pv("pv-b", "rack-b/pvc-b", corev1.ReadWriteOnce, held("rack-b/pvc-b")))
	// node-a is gone: both claims are stale.
	openTo := func(handle string) rds.Disk {
		c := claims.Claim{At: t0, NodeUID: "uid-1", Nonce: "n-" + strings.ReplaceAll(handle, "/", "-")}
		_, slot := backends.SplitID(handle)
		return rds.Disk{Slot: slot, Exported: true, AllowHost: HostNQN(key, handle, "node-a", c)}
	}
	a := &boxRDS{disks: map[string]rds.Disk{"pvc-a": openTo("pvc-a")}, gate: make(chan struct{})}
	b := &boxRDS{disks: map[string]rds.Disk{"pvc-b": openTo("rack-b/pvc-b")}}
	router, err := backends.NewRouter(backends.NewView(&backends.Backend{Name: "rack-a", Default: true}, a), backends.NewView(&backends.Backend{Name: "rack-b"}, b))
	if err != nil {
		t.Fatal(err)
	}
	live := fencing.NewLiveness(fencing.LivenessConfig{Client: client})
	f, err := New(Config{StorageFencing: true, AttachmentKey: key, RDS: router, Store: claims.NewStore(client, driver, true),
		Index: informers.NewAttachmentIndex(), Nodes: live, IsVolumeID: func(string) bool { return true }, IsVolumeDisk: func(*rds.Disk) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	nf := NewNodeFencer(NodeFencerConfig{Fence: f, Nodes: live, Policy: fencing.DefaultConfig(),
		Group: func(h string) string { box, _ := backends.SplitID(h); return box }})
	done := make(chan error, 1)
	go func() {
		done <- nf.NodeStale(context.Background(), fencing.StaleHolder{Node: "node-a", Reason: fencing.FenceNodeDeleted, Volumes: []fencing.VolumeRef{
			{PV: "pv-a", Handle: "pvc-a"}, {PV: "pv-b", Handle: "rack-b/pvc-b"}}})
	}()
	// rack-b's volume is cut off and released while rack-a hangs.
	err = wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		_, kept := apiClaims(t, client, "pv-b")["node-a"]
		return !kept, nil
	})
	if err != nil {
		t.Fatalf("rack-b's volume was not fenced while rack-a hung: %v", err)
	}
	if d, _ := b.GetDisk(context.Background(), "pvc-b"); d.Exported && d.AllowHost == openTo("rack-b/pvc-b").AllowHost {
		t.Error("rack-b's export still lets node-a's attachment in")
	}
	select {
	case err := <-done:
		t.Fatalf("the node's fence ended (%v) with rack-a's volume not cut off", err)
	default:
	}
	if _, kept := apiClaims(t, client, "pv-a")["node-a"]; !kept {
		t.Fatal("rack-a's claim went before its export was cut")
	}
	close(a.gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, kept := apiClaims(t, client, "pv-a")["node-a"]; kept {
		t.Error("rack-a's claim stays after its box answered")
	}
}
