package rds

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// An entry of the listing the driver cannot read is logged with its text
// for the operator, but never with a secret in it: a disk with an export
// password prints its nvme-tcp-server-secret (what the allowed host
// presents to connect), RouterOS may wrap it over two lines, and the
// reconcile lists every disk every minute.
func TestSkippedEntryLogHidesTheSecret(t *testing.T) {
	const (
		keyHead = "q0VtZ2hGbWxrU3Zq"
		keyTail = "VGhpcyBpcyBub3QgYSByZWFsIGtleQ=="
	)
	listing := "Flags: B - BLOCK-DEVICE; M - MOUNTED; t - NVME-TCP-EXPORT\n" +
		" 0 B t type=file slot=\"pvc-1\" file-path=/storage-pool/k8s/pvc-1.img\n" +
		"       size=1 073 741 824 nvme-tcp-export=yes nvme-tcp-server-port=4420\n" +
		"       nvme-tcp-server-nqn=\"nqn.2000-02.com.mikrotik:pvc-1\"\n" +
		" \n" +
		" 1 Bt type=file slot=\"pvc-2\" size=lots nvme-tcp-export=yes\n" +
		"       nvme-tcp-server-secret=\"DHHC-1:00:" + keyHead + "\n" +
		"       " + keyTail + ":\" file-path=/storage-pool/k8s/pvc-2.img\n"
	env := startSim(t, 10*GiB)
	c := env.client(t, nil)
	var (
		mu   sync.Mutex
		logs bytes.Buffer
	)
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&syncWriter{mu: &mu, w: &logs}), textlogger.Verbosity(10)))
	ctx := klog.NewContext(context.Background(), logger)
	env.sim.InjectFault(rdssim.Fault{Kind: rdssim.FaultGarbage, Match: "where type=file", Output: listing})
	disks, err := c.ListDisks(ctx)
	if err != nil || len(disks) != 1 {
		t.Fatalf("ListDisks = %+v, %v", disks, err)
	}
	mu.Lock()
	defer mu.Unlock()
	out := logs.String()
	if !strings.Contains(out, "skipped a /disk entry") || !strings.Contains(out, "pvc-2") {
		t.Fatalf("no warning naming the skipped entry, so this proves nothing:\n%s", out)
	}
	if !strings.Contains(out, "lots") || !strings.Contains(out, "nvme-tcp-server-secret="+`\"`+hiddenValue) {
		t.Fatalf("the warning no longer shows what it could not read, or hides the secret some other way than <hidden>:\n%s", out)
	}
	for _, part := range []string{keyHead, keyTail[:16]} {
		if strings.Contains(out, part) {
			t.Fatalf("the warning shows the secret (%q):\n%s", part, out)
		}
	}
}

// Raw lines (an entry the parser could not even split into properties)
// that hold a secret, wrapped or not, are withheld whole; other text is
// logged as it was.
func TestLoggableText(t *testing.T) {
	for _, tc := range []struct {
		text     string
		withheld bool
	}{
		{" 1 Q? type=file slot=\"x\" size=lots\n", false},
		{" 1 Q? nvme-tcp-server-secret=\"DHHC-1:00:abc\n       def:\"\n", true},
		{" 1 Q? nvme-tcp-server-sec\n       ret=\"DH\n       HC-1:00:abc:\"\n", true},
		{" 1 Q? nvme-tcp-server-password=hunter2hunter2hunter2\n", true},
		{"1 Bt nvme-tcp-server-secret=\"<hidden>\" size=\"lots\"", false},
	} {
		got := loggableText(tc.text)
		if withheld := got != truncateTo(tc.text, 300); withheld != tc.withheld {
			t.Errorf("loggableText(%q) = %q, want withheld %v", tc.text, got, tc.withheld)
		}
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

// A copy of a disk without a password sends no nvme-tcp-server-password:
// whether RouterOS takes that property on `add` is assumed, and a RouterOS
// that refuses it must not fail every snapshot and clone of a cluster that
// never set a password. A copy of one with a password still clears it
// (TestCopyDiskClearsThePassword).
func TestCopyDiskWithoutPasswordSendsNone(t *testing.T) {
	env := startSimWith(t, 10*GiB, func(c *rdssim.Config) { c.CopyFromProperties = rdssim.CopyFromInherit })
	c := env.client(t, nil)
	ctx := context.Background()
	if _, err := c.CreateDisk(ctx, req("pvc-src", 64*MiB)); err != nil {
		t.Fatal(err)
	}
	env.sim.InjectFault(rdssim.Fault{Kind: rdssim.FaultFail, Match: "nvme-tcp-server-password", Output: "expected end of command (line 1 column 200)"})
	if _, err := c.CopyDisk(ctx, CopyDiskRequest{Slot: "snap-1", FilePath: "/storage-pool/k8s/snap-1.img", SourceSlot: "pvc-src"}); err != nil {
		t.Fatalf("a copy of a disk without a password on a RouterOS that does not take the property on add: %v", err)
	}
}
