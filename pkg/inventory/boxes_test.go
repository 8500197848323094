package inventory

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/srvlab/rds-csi/pkg/rds"
)

type listerFunc func(context.Context) ([]rds.Disk, error)

func (f listerFunc) ListDisks(ctx context.Context) ([]rds.Disk, error) { return f(ctx) }

// With several boxes every box is listed, each disk under its ID and its
// box's name; a box that does not answer is named with its error, its
// disks simply not listed; only when no box answers does the request fail.
func TestTheInventoryListsEveryBoxAndNamesOneThatDidNotAnswer(t *testing.T) {
	a := listerFunc(func(context.Context) ([]rds.Disk, error) {
		return []rds.Disk{{Slot: "pvc-1", FilePath: "/p/k8s/pvc-1.img", Size: 1 << 30}, {Slot: "raid1"}}, nil
	})
	b := listerFunc(func(context.Context) ([]rds.Disk, error) {
		return []rds.Disk{{Slot: "rds-b/pvc-2", FilePath: "/q/k8s/pvc-2.img", Size: 2 << 30, Exported: true, AllowHost: "nqn.x"}}, nil
	})
	down := listerFunc(func(context.Context) ([]rds.Disk, error) { return nil, errors.New("RDS rds-c: connection refused") })
	get := func(h *Handler) (*Inventory, int) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, Path, nil))
		if rec.Code != http.StatusOK {
			return nil, rec.Code
		}
		var inv Inventory
		if err := json.Unmarshal(rec.Body.Bytes(), &inv); err != nil {
			t.Fatal(err)
		}
		return &inv, rec.Code
	}
	inv, code := get(NewBoxesHandler([]Source{{Name: "rds-a", Default: true, VolumePath: "/p/k8s", Lister: a},
		{Name: "rds-b", VolumePath: "/q/k8s", Lister: b}, {Name: "rds-c", VolumePath: "/r", Lister: down}}))
	if inv == nil {
		t.Fatalf("status %d", code)
	}
	if len(inv.Disks) != 2 || inv.Disks[0].Slot != "pvc-1" || inv.Disks[0].RDS != "rds-a" || inv.Disks[1].Slot != "rds-b/pvc-2" || inv.Disks[1].RDS != "rds-b" ||
		inv.Disks[1].AllowHost != HostFingerprint("nqn.x") || inv.OtherDisks != 1 || inv.VolumePath != "/p/k8s" {
		t.Errorf("inventory %+v", inv)
	}
	if c, ok := inv.BoxOf("rds-c/pvc-3"); !ok || c.Error != "RDS rds-c: connection refused" {
		t.Errorf("rds-c: %+v %v", c, ok)
	}
	if d, ok := inv.BoxOf("pvc-1"); !ok || d.Name != "rds-a" || d.Disks != 1 {
		t.Errorf("the default box: %+v %v", d, ok)
	}
	if _, code := get(NewBoxesHandler([]Source{{Name: "rds-c", Default: true, Lister: down}})); code != http.StatusBadGateway {
		t.Errorf("no box answers: status %d, want 502", code)
	}
}
