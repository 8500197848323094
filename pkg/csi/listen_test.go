package csi

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
)

// Listen replaces a stale socket (nobody answers: a driver that died
// without unlinking it) and refuses one that answers: a second start must
// never take a live driver off its socket.
func TestListenReplacesOnlyAStaleSocket(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, "stale.sock")
	l, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close() // the path stays, nobody listens: what a killed driver leaves
	lis, err := Listen("unix://" + stale)
	if err != nil {
		t.Fatalf("a stale socket was not replaced: %v", err)
	}
	defer lis.Close()

	// lis is live now: a second Listen on it is refused and leaves it.
	if _, err := Listen("unix://" + stale); err == nil || !strings.Contains(err.Error(), "another process serves on "+stale) {
		t.Fatalf("a second Listen on a live socket: %v, want it refused", err)
	}
	c, err := net.Dial("unix", stale)
	if err != nil {
		t.Fatalf("the live socket is gone after a refused Listen: %v", err)
	}
	c.Close()
}
