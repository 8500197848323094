package inventory

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/srvlab/rds-csi/pkg/rds"
)

const vp = "/storage-pool/kubernetes-volumes"

func TestBuildClassifies(t *testing.T) {
	disks := []rds.Disk{
		{Slot: "pvc-b", FilePath: vp + "/pvc-b.img", Size: 2, Exported: true, Port: 4420, NQN: "nqn.x:pvc-b", AllowHost: "nqn.host"},
		{Slot: "pvc-a", FilePath: vp + "/pvc-a.img", Size: 1},
		{Slot: "snap-1", FilePath: vp + "/snapshots/snap-1.src-pvc-a.t-1.img"},
		{Slot: "snap-2", FilePath: vp + "/snapshots/other.img"},        // file does not name the slot
		{Slot: "pvc-c", FilePath: "/storage-pool/elsewhere/pvc-c.img"}, // another volume path
		{Slot: "system", FilePath: "/storage-pool/system.img"},
	}
	inv := Build(disks, vp, time.Unix(0, 0))
	var got []string
	for _, d := range inv.Disks {
		got = append(got, d.Slot+":"+d.Kind)
	}
	if want := "pvc-a:volume pvc-b:volume snap-1:snapshot"; strings.Join(got, " ") != want {
		t.Errorf("disks = %v, want %s", got, want)
	}
	if inv.OtherDisks != 3 {
		t.Errorf("OtherDisks = %d, want 3", inv.OtherDisks)
	}
	if d, ok := inv.Find("pvc-b"); !ok || d.AllowHost != HostFingerprint("nqn.host") || strings.Contains(d.AllowHost, "nqn.host") || d.NQN != "nqn.x:pvc-b" || d.Port != 4420 {
		t.Errorf("Find(pvc-b) = %+v, %v", d, ok)
	}
}

type fakeLister struct {
	calls int
	err   error
	disks []rds.Disk
}

func (f *fakeLister) ListDisks(context.Context) ([]rds.Disk, error) {
	f.calls++
	return f.disks, f.err
}

func TestHandler(t *testing.T) {
	now := time.Date(2026, 11, 23, 8, 0, 0, 0, time.UTC)
	l := &fakeLister{disks: []rds.Disk{{Slot: "pvc-a", FilePath: vp + "/pvc-a.img", Size: 1 << 30}}}
	h := NewHandler(l, vp)
	h.now = func() time.Time { return now }
	srv := httptest.NewServer(h)
	defer srv.Close()
	ctx := context.Background()

	inv, err := Fetch(ctx, srv.Client(), srv.URL+Path)
	if err != nil {
		t.Fatal(err)
	}
	if d, ok := inv.Find("pvc-a"); !ok || d.SizeBytes != 1<<30 || d.Kind != KindVolume {
		t.Errorf("inventory = %+v", inv)
	}
	// Within the cache period, no second listing.
	now = now.Add(DefaultMaxAge - time.Second)
	if _, err := Fetch(ctx, srv.Client(), srv.URL); err != nil {
		t.Fatal(err)
	}
	if l.calls != 1 {
		t.Errorf("listings = %d within the cache period, want 1", l.calls)
	}
	now = now.Add(2 * time.Second)
	l.err = errors.New("ssh: connection refused")
	_, err = Fetch(ctx, srv.Client(), srv.URL)
	if err == nil || !strings.Contains(err.Error(), "502") || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("failed listing: err = %v, want a 502 naming the cause", err)
	}

	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete} {
		req, _ := http.NewRequest(m, srv.URL, nil)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("%s: status %d, want 405", m, resp.StatusCode)
		}
	}
	if l.calls != 2 {
		t.Errorf("listings = %d, want 2 (writes must not list)", l.calls)
	}
}

func TestFetchUnreachable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	srv.Close()
	_, err := Fetch(context.Background(), http.DefaultClient, srv.URL)
	if err == nil || !strings.Contains(err.Error(), "port-forward") {
		t.Errorf("err = %v, want the port-forward hint", err)
	}
}
