package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/srvlab/rds-csi/pkg/nvme"
)

// fakeConnector "connects" an NQN by handing out a file standing in for
// its block device, and records what the data path asked of it.
type fakeConnector struct {
	dev          string
	refuse       error
	connects     []nvme.Target
	disconnected []string
}

func (f *fakeConnector) Connect(_ context.Context, t nvme.Target) (string, error) {
	f.connects = append(f.connects, t)
	if f.refuse != nil {
		return "", f.refuse
	}
	return f.dev, nil
}

func (f *fakeConnector) Disconnect(ctx context.Context, nqn string, inUse nvme.InUseFunc) error {
	if used, err := inUse(ctx, nqn); err != nil || used {
		return errors.New("in use")
	}
	f.disconnected = append(f.disconnected, nqn)
	return nil
}

// The data path connects as this run's host NQN, writes and reads the
// device, and disconnects after each, also when the I/O fails; a refused
// connect names the target.
func TestNVMeDataPath(t *testing.T) {
	dev := filepath.Join(t.TempDir(), "nvme0n1")
	if err := os.WriteFile(dev, make([]byte, 8<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	fc := &fakeConnector{dev: dev}
	p := &nvmeDataPath{c: fc, address: "192.0.2.10", port: 4420}
	ctx := context.Background()
	const nqn, host = "nqn.2000-02.com.mikrotik:rdsctl-selftest-x", "nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-4d3b-a3f5-ef19b5a7633b"
	pattern := []byte("written over NVMe/TCP")
	if err := p.write(ctx, nqn, host, nvme.DHCHAPSecret{}, 4<<20, pattern); err != nil {
		t.Fatal(err)
	}
	got, err := p.read(ctx, nqn, host, nvme.DHCHAPSecret{}, 4<<20, len(pattern))
	if err != nil || !bytes.Equal(got, pattern) {
		t.Fatalf("read %q, %v", got, err)
	}
	if _, err := p.read(ctx, nqn, host, nvme.DHCHAPSecret{}, 8<<20, 16); err == nil {
		t.Error("a read past the device's end succeeded")
	}
	if len(fc.connects) != 3 || len(fc.disconnected) != 3 {
		t.Errorf("connects %d, disconnects %d, want 3 each", len(fc.connects), len(fc.disconnected))
	}
	for _, c := range fc.connects {
		if c != (nvme.Target{Address: "192.0.2.10", Port: 4420, NQN: nqn, HostNQN: host}) {
			t.Errorf("connected %+v", c)
		}
	}
	fc.refuse = errors.New("connect refused")
	if err := p.write(ctx, nqn, host, nvme.DHCHAPSecret{}, 0, pattern); err == nil || !strings.Contains(err.Error(), nqn) || !strings.Contains(err.Error(), "connect refused") {
		t.Errorf("a refused connect: %v", err)
	}
}
