package rds

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

func TestNewExportPassword(t *testing.T) {
	for _, tc := range []struct {
		v  string
		ok bool
	}{
		{"abcdefghij0123456789", true},
		{strings.Repeat("A", 16), true},
		{strings.Repeat("z", 64), true},
		{strings.Repeat("z", 15), false},
		{strings.Repeat("z", 65), false},
		{"abcdefghij012345678\"", false},
		{"abcdefghij 0123456789", false},
		{"abcdefghij0123456789]", false},
		{"abcdefghij0123456789$x", false},
		{"", false},
	} {
		p, err := NewExportPassword(tc.v)
		if (err == nil) != tc.ok {
			t.Errorf("NewExportPassword(%q) = %v, want ok %v", tc.v, err, tc.ok)
		}
		if err != nil && tc.v != "" && strings.Contains(err.Error(), tc.v) {
			t.Errorf("the error shows the value: %v", err)
		}
		// Also in an unexported field, which fmt prints by reflection
		// without calling String.
		h := struct {
			slot string
			pw   ExportPassword
		}{"s", p}
		if out := fmt.Sprintf("%v %s %+v %#v %v %+v %#v", p, p, struct{ P ExportPassword }{p}, p, h, h, h); tc.ok && strings.Contains(out, tc.v) {
			t.Errorf("a printed password shows its value: %s", out)
		}
	}
}

// The password goes in the same compare-and-swap as the allowed host; the
// secret comes back; the password appears in no log line, no command
// record and no error, also when RouterOS quotes the command back in a
// refusal; a password set but no secret read back is an error naming the
// slot.
func TestSwapExportAuthHidesThePassword(t *testing.T) {
	env := startSim(t, 10*GiB)
	var (
		mu      sync.Mutex
		records []string
		logs    bytes.Buffer
	)
	c := env.client(t, func(cfg *Config) {
		cfg.Observer = func(r CommandRecord) {
			mu.Lock()
			defer mu.Unlock()
			records = append(records, fmt.Sprintf("%s|%s|%v", r.Command, r.Output, r.Err))
		}
	})
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&syncWriter{mu: &mu, w: &logs}), textlogger.Verbosity(10)))
	ctx := klog.NewContext(context.Background(), logger)
	r := req("pvc-1", GiB)
	r.Export.Closed = true
	if _, err := c.CreateDisk(ctx, r); err != nil {
		t.Fatal(err)
	}
	hostA := "nqn.2014-08.org.nvmexpress:uuid:3f2b8c1d-6e4a-4b5c-9d8e-7f6a5b4c3d2e"
	hostB := "nqn.2014-08.org.nvmexpress:uuid:4a1b2c3d-6e4a-4b5c-9d8e-7f6a5b4c3d2f"
	pws := []string{"PwOne0123456789abcdefXYZ", "PwTwo0123456789abcdefXYZ", "PwThree0123456789abcdefX"}
	pw := func(i int) ExportPassword {
		p, err := NewExportPassword(pws[i])
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	closed := ExportState{}
	openA, openB := ExportState{Open: true, Host: hostA}, ExportState{Open: true, Host: hostB}

	after, secret, err := c.SwapExportAuth(ctx, "pvc-1", closed, openA, pw(0))
	if err != nil || after != openA || secret.IsZero() {
		t.Fatalf("open to A with a password: %v, secret zero %v, %v", after, secret.IsZero(), err)
	}
	d, err := c.GetDisk(ctx, "pvc-1")
	if err != nil || !d.Secret.Equal(secret) {
		t.Fatalf("the secret returned is not the one printed: %v", err)
	}

	// A refusal that quotes the command back, password included.
	env.sim.InjectFault(rdssim.Fault{Kind: rdssim.FaultFail, Match: "nvme-tcp-server-password", Output: "failure: cannot set nvme-tcp-server-password=" + pws[1]})
	_, _, err = c.SwapExportAuth(ctx, "pvc-1", openA, openB, pw(1))
	if !errors.Is(err, ErrCommandFailed) {
		t.Fatalf("a refused swap: %v, want ErrCommandFailed", err)
	}
	if strings.Contains(err.Error(), pws[1]) || !strings.Contains(err.Error(), hiddenValue) {
		t.Fatalf("the error shows the password, or does not say it was hidden: %v", err)
	}

	// The password cleared: no secret; the disk printed so, taken for the
	// read back of a swap that sets one.
	if after, secret, err = c.SwapExportAuth(ctx, "pvc-1", openA, openB, ExportPassword{}); err != nil || after != openB || !secret.IsZero() {
		t.Fatalf("the password cleared: %v, secret zero %v, %v", after, secret.IsZero(), err)
	}
	noSecret, err := c.exec(ctx, "/disk print detail where slot=%s", "pvc-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err = c.SwapExportAuth(ctx, "pvc-1", openB, openA, ExportPassword{}); err != nil {
		t.Fatal(err)
	}
	env.sim.InjectFault(rdssim.Fault{Kind: rdssim.FaultGarbage, Match: "print detail where slot=", Output: noSecret})
	_, _, err = c.SwapExportAuth(ctx, "pvc-1", openA, openB, pw(2))
	if err == nil || !strings.Contains(err.Error(), `"pvc-1"`) || strings.Contains(err.Error(), pws[2]) {
		t.Fatalf("a password set and no secret read back: %v, want an error naming the slot and not the password", err)
	}

	mu.Lock()
	defer mu.Unlock()
	all := strings.Join(records, "\n") + "\n" + logs.String()
	if !strings.Contains(all, "nvme-tcp-server-password=") {
		t.Fatalf("the capture holds no password command at all, so it proves nothing:\n%s", all)
	}
	for _, p := range pws {
		if strings.Contains(all, p) {
			t.Fatalf("a command record or log line shows a password:\n%s", all)
		}
	}
}
