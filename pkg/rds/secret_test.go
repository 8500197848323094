package rds

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/srvlab/rds-csi/pkg/nvme"
	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// A disk whose export has a password is read with its secret (assumed
// RouterOS output, played by the simulator); a Disk printed with %+v never
// shows it; an unknown form is unreadable, not "none".
func TestDiskReadsTheExportSecret(t *testing.T) {
	env := startSim(t, 10*GiB)
	c := env.client(t, nil)
	ctx := context.Background()
	if _, err := c.CreateDisk(ctx, req("pvc-1", GiB)); err != nil {
		t.Fatal(err)
	}
	d, err := c.GetDisk(ctx, "pvc-1")
	if err != nil || !d.Secret.IsZero() || d.SecretUnreadable {
		t.Fatalf("without a password: %+v, %v", d, err)
	}
	if _, err := c.exec(ctx, `/disk set [find slot=%s] nvme-tcp-server-allow-host-name=%s nvme-tcp-server-password=%s`,
		"pvc-1", "nqn.2014-08.org.nvmexpress:uuid:3f2b8c1d-6e4a-4b5c-9d8e-7f6a5b4c3d2e", "pw-1"); err != nil {
		t.Fatal(err)
	}
	d, err = c.GetDisk(ctx, "pvc-1")
	if err != nil || d.Secret.IsZero() || d.SecretUnreadable {
		t.Fatalf("with a password: %+v, %v", d, err)
	}
	if _, err := nvme.ParseDHCHAPSecret(d.Secret.Reveal()); err != nil {
		t.Fatalf("the secret read back is not one a kernel takes: %v", err)
	}
	if out := fmt.Sprintf("%+v %v", *d, d); strings.Contains(out, d.Secret.Reveal()[10:30]) {
		t.Fatalf("a printed Disk shows the secret: %s", out)
	}

	e, err := diskFromEntry(Entry{Values: map[string]string{"slot": "x", "nvme-tcp-export": "yes", "nvme-tcp-server-secret": "DHHC-9:whatever:"}})
	if err != nil || !e.SecretUnreadable || !e.Secret.IsZero() {
		t.Fatalf("an unknown secret form: %+v, %v", e, err)
	}
}

// The command observer (rdsctl --show-commands' transcript, the driver's
// metrics) never sees an export's secret: a print of a disk with a
// password shows nvme-tcp-server-secret as <hidden>, wrapped or not, while
// the client itself still reads it.
func TestObserverNeverSeesTheSecret(t *testing.T) {
	for _, width := range []int{-1, 0} {
		env := startSimWith(t, 10*GiB, func(c *rdssim.Config) { c.TerminalWidth = width })
		var (
			mu      sync.Mutex
			records []string
		)
		c := env.client(t, func(cfg *Config) {
			cfg.Observer = func(r CommandRecord) {
				mu.Lock()
				defer mu.Unlock()
				records = append(records, r.Command+"\n"+r.Output)
			}
		})
		ctx := context.Background()
		r := req("pvc-1", GiB)
		r.Export.Closed = true
		if _, err := c.CreateDisk(ctx, r); err != nil {
			t.Fatal(err)
		}
		pw, err := NewExportPassword("PwOne0123456789abcdefXYZ")
		if err != nil {
			t.Fatal(err)
		}
		host := "nqn.2014-08.org.nvmexpress:uuid:3f2b8c1d-6e4a-4b5c-9d8e-7f6a5b4c3d2e"
		_, secret, err := c.SwapExportAuth(ctx, "pvc-1", ExportState{}, ExportState{Open: true, Host: host}, pw)
		if err != nil || secret.IsZero() {
			t.Fatalf("width %d: SwapExportAuth: %v (secret zero %v)", width, err, secret.IsZero())
		}
		d, err := c.GetDisk(ctx, "pvc-1")
		if err != nil || !d.Secret.Equal(secret) {
			t.Fatalf("width %d: GetDisk no longer reads the secret: %v", width, err)
		}
		if _, err := c.ListDisks(ctx); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		all := strings.Join(records, "\n")
		mu.Unlock()
		if !strings.Contains(all, "nvme-tcp-server-secret") {
			t.Fatalf("width %d: no print of the secret's property was observed, so this proves nothing:\n%s", width, all)
		}
		// The key part of DHHC-1:hh:<key>: in pieces, since RouterOS may
		// wrap it anywhere.
		key := strings.Split(secret.Reveal(), ":")[2]
		for i := 0; i+12 <= len(key); i += 12 {
			if strings.Contains(strings.Join(strings.Fields(all), ""), key[i:i+12]) {
				t.Fatalf("width %d: the observer saw the secret:\n%s", width, all)
			}
		}
	}
}
