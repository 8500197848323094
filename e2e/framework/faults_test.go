package framework

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

func TestLateFaultRequest(t *testing.T) {
	for _, tc := range []struct {
		match string
		delay time.Duration
		count int
		want  string
	}{
		{`nvme-tcp-export=no] nvme-tcp-export=yes`, 6 * time.Second, 1, `late match="nvme-tcp-export=no] nvme-tcp-export=yes" delay=6s`},
		{`allow-host-name="x"`, 0, -1, `late match="allow-host-name=\"x\"" count=all`},
		{"/disk set", 0, 4, `late match="/disk set" count=4`},
	} {
		got := LateFault(tc.match, tc.delay, tc.count)
		if got != tc.want {
			t.Errorf("LateFault(%q, %s, %d) = %s, want %s", tc.match, tc.delay, tc.count, got, tc.want)
		}
		req, err := rdssim.ParseFaultRequest(got)
		if err != nil || req.Fault.Match != tc.match || req.Fault.Delay != tc.delay {
			t.Errorf("%s parses as %+v, %v", got, req, err)
		}
	}
}

// FaultControl against a simulator's control socket: an answer after
// "ok", an error for a refused request.
func TestFaultControl(t *testing.T) {
	_, pub, err := rdssim.NewTestKeys()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := rdssim.New(rdssim.Config{DataDir: t.TempDir(), AuthorizedKeys: []ssh.PublicKey{pub}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	dir, err := os.MkdirTemp(socketBase(), "rdscsi-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "f.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go srv.ServeFaultControl(l)
	defer l.Close()
	ctx := context.Background()
	if got, err := FaultControl(ctx, sock, LateFault("/disk set", 0, 2)); err != nil || !strings.HasPrefix(got, "armed late") {
		t.Errorf("arm: %q, %v", got, err)
	}
	if armed, held, err := FaultStatus(ctx, sock); err != nil || armed != 1 || held != 0 {
		t.Errorf("status: armed %d held %d, %v", armed, held, err)
	}
	if _, err := FaultControl(ctx, sock, "late delay=forever"); err == nil || !strings.Contains(err.Error(), "error: delay=forever") {
		t.Errorf("a bad request: %v", err)
	}
}
