package backends

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/srvlab/rds-csi/pkg/rds"
	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

func TestABoxIsDownOnlyWhenItFailedToAnswer(t *testing.T) {
	h := NewHealth("rack-b")
	if h.Err() != nil {
		t.Fatal("a box nobody tried is down")
	}
	for _, tc := range []struct {
		name string
		err  error
		down bool
	}{
		{"a refusal is an answer", rds.ErrNoSpace, false},
		{"a timeout", fmt.Errorf("probe: %w", context.DeadlineExceeded), true},
		// Cancelled by its caller (another box answered first, the RPC
		// ended): the box may be fine; it stays as it was.
		{"cancelled by its caller", fmt.Errorf("%w: command timed out after it was sent: %w", rds.ErrOutcomeUnknown, context.Canceled), true},
		{"an answer again", nil, false},
		{"cancelled while up", fmt.Errorf("%w: %w", rds.ErrTransient, context.Canceled), false},
		{"a lost connection", fmt.Errorf("%w: connection reset", rds.ErrTransient), true},
		{"garbage", rds.ErrBadOutput, true},
		{"a wrong host key", rds.ErrHostKey, true},
	} {
		h.Observe(tc.err)
		if down := h.Err() != nil; down != tc.down {
			t.Errorf("%s: down %v, want %v", tc.name, down, tc.down)
		}
	}
	h.Observe(fmt.Errorf("%w: refused", rds.ErrTransient))
	if err := h.Err(); err == nil || !errors.Is(err, rds.ErrTransient) || !strings.Contains(err.Error(), "RDS rack-b unreachable") {
		t.Errorf("the error %v names neither the box nor its cause", err)
	}
}

// A box that refuses the driver's SSH key (a key rotated on one side
// only, the user removed) answers no command: it is down, so that
// placement and capacity pass it over and its room is not advertised.
func TestABoxThatRefusesTheSSHKeyIsDown(t *testing.T) {
	dir := t.TempDir()
	authorized, err := rdssim.WriteClientKey(filepath.Join(dir, "authorized"), "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rdssim.WriteClientKey(filepath.Join(dir, "other"), ""); err != nil {
		t.Fatal(err)
	}
	sim, err := rdssim.New(rdssim.Config{DataDir: filepath.Join(dir, "pool"), AuthorizedKeys: []ssh.PublicKey{authorized}})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	addr, err := sim.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	kh := filepath.Join(dir, "known_hosts")
	if err := sim.WriteKnownHosts(kh); err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	c, err := rds.NewClient(rds.Config{Address: host, Port: p, User: "admin", KeyFile: filepath.Join(dir, "other"), KnownHostsFile: kh})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Probe(context.Background())
	if err == nil {
		t.Fatal("the probe with a key the box refuses succeeded")
	}
	h := NewHealth("rack-b")
	h.Observe(err)
	if h.Err() == nil {
		t.Errorf("the box refusing the key (%v) is up", err)
	}
}
