package rds

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/srvlab/rds-csi/pkg/nvme"
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
