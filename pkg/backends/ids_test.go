package backends

import (
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"testing"

	"github.com/srvlab/rds-csi/pkg/nvme"
	"github.com/srvlab/rds-csi/pkg/rds"
)

func TestAnIDWithoutABoxIsTheDefaultBoxs(t *testing.T) {
	for _, tc := range []struct{ id, box, slot string }{
		{"pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789", "", "pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789"},
		{"rack-b/pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789", "rack-b", "pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789"},
	} {
		box, slot := SplitID(tc.id)
		if box != tc.box || slot != tc.slot {
			t.Errorf("SplitID(%q) = %q, %q", tc.id, box, slot)
		}
		if got := JoinID(box, box == "", slot); got != tc.id {
			t.Errorf("JoinID = %q, want %q", got, tc.id)
		}
	}
}

func TestTheRouterNeverSendsAnotherBoxsIDToTheDefault(t *testing.T) {
	a := &recordingRDS{}
	b := &recordingRDS{}
	va := NewView(&Backend{Name: "rack-a", Default: true}, a)
	vb := NewView(&Backend{Name: "rack-b"}, b)
	r, err := NewRouter(va, vb)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	d, err := r.GetDisk(ctx, "rack-b/pvc-1")
	if err != nil || d.Slot != "rack-b/pvc-1" || b.last != "pvc-1" || a.last != "" {
		t.Fatalf("rack-b's volume: disk %+v, err %v, rack-b got %q, rack-a got %q", d, err, b.last, a.last)
	}
	if d, err := r.GetDisk(ctx, "pvc-2"); err != nil || d.Slot != "pvc-2" || a.last != "pvc-2" {
		t.Fatalf("the default's volume: %+v %v", d, err)
	}
	// Neither an unknown box nor the default box by name is the default.
	for _, id := range []string{"rack-z/pvc-3", "rack-a/pvc-3"} {
		a.last = ""
		if _, err := r.GetDisk(ctx, id); !errors.Is(err, ErrUnknownBox) || a.last != "" {
			t.Errorf("%s: err %v, default box got %q", id, err, a.last)
		}
	}
	// A view refuses an ID of another box, and names its box in errors.
	if _, err := vb.GetDisk(ctx, "pvc-4"); !errors.Is(err, rds.ErrInvalidArgument) {
		t.Errorf("rack-b's view took the default's ID: %v", err)
	}
	b.err = rds.ErrNotFound
	if _, err := r.GetDisk(ctx, "rack-b/pvc-5"); !errors.Is(err, rds.ErrNotFound) || !strings.Contains(err.Error(), "RDS rack-b") {
		t.Errorf("error %v does not name rack-b", err)
	}
	// A copy stays on its source's box.
	if _, err := vb.CopyDisk(ctx, rds.CopyDiskRequest{Slot: "rack-b/pvc-6", SourceSlot: "pvc-7"}); err == nil || !strings.Contains(err.Error(), "stays on its source's RDS") {
		t.Errorf("cross-box copy: %v", err)
	}
}

// DH-HMAC-CHAP per box: an authenticated export swap of a box's volume
// goes to that box alone, under the slot the box knows, and the secret
// it prints comes back; an unknown box's goes nowhere.
func TestAnAuthenticatedSwapGoesToItsVolumesBox(t *testing.T) {
	secret, err := nvme.NewDHCHAPSecret(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	a := &recordingRDS{}
	b := &recordingRDS{secret: secret}
	r, err := NewRouter(NewView(&Backend{Name: "rack-a", Default: true}, a), NewView(&Backend{Name: "rack-b"}, b))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	to := rds.ExportState{Open: true, Host: "nqn.2014-08.org.nvmexpress:uuid:5459cdc1-af07-497b-8b8e-7ed04e2b1d5a"}
	got, sec, err := r.SwapExportAuth(ctx, "rack-b/pvc-1", rds.ExportState{}, to, rds.ExportPassword{})
	if err != nil || got != to || !sec.Equal(secret) || b.last != "pvc-1" || a.last != "" {
		t.Fatalf("rack-b's volume: state %+v, secret from rack-b %t, err %v; rack-b got %q, rack-a got %q", got, sec.Equal(secret), err, b.last, a.last)
	}
	b.last = ""
	if _, _, err := r.SwapExportAuth(ctx, "pvc-2", rds.ExportState{}, to, rds.ExportPassword{}); err != nil || a.last != "pvc-2" || b.last != "" {
		t.Fatalf("the default box's volume: err %v; rack-a got %q, rack-b got %q", err, a.last, b.last)
	}
	a.last = ""
	if _, _, err := r.SwapExportAuth(ctx, "rack-z/pvc-3", rds.ExportState{}, to, rds.ExportPassword{}); !errors.Is(err, ErrUnknownBox) || a.last != "" || b.last != "" {
		t.Fatalf("an unknown box's volume: err %v; rack-a got %q, rack-b got %q", err, a.last, b.last)
	}
}

// recordingRDS remembers the last slot it was asked for.
type recordingRDS struct {
	RDS
	last   string
	err    error
	secret nvme.DHCHAPSecret
}

func (r *recordingRDS) SwapExportAuth(_ context.Context, slot string, _, to rds.ExportState, _ rds.ExportPassword) (rds.ExportState, nvme.DHCHAPSecret, error) {
	r.last = slot
	if r.err != nil {
		return rds.ExportState{}, nvme.DHCHAPSecret{}, r.err
	}
	return to, r.secret, nil
}

func (r *recordingRDS) GetDisk(_ context.Context, slot string) (*rds.Disk, error) {
	r.last = slot
	if r.err != nil {
		return nil, r.err
	}
	return &rds.Disk{Slot: slot}, nil
}

func TestTheRouterRoutesNoIDWithAnEmptyBoxName(t *testing.T) {
	a := &recordingRDS{}
	va := NewView(&Backend{Name: "rack-a", Default: true}, a)
	r, err := NewRouter(va, NewView(&Backend{Name: "rack-b"}, &recordingRDS{}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.GetDisk(context.Background(), "/pvc-1"); !errors.Is(err, ErrUnknownBox) || a.last != "" {
		t.Fatalf("/pvc-1: err %v, the default box got %q", err, a.last)
	}
	if _, err := va.GetDisk(context.Background(), "/pvc-1"); err == nil || a.last != "" {
		t.Fatalf("the default box's view took /pvc-1: err %v, got %q", err, a.last)
	}
}
