//go:build linux

package nvme

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const mib = 1 << 20

// requireLoop skips unless real loop devices can be used, and detaches every
// loop device over a file in dir when the test ends, whatever happened.
func requireLoop(t *testing.T, dir string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("loop device tests need root (losetup attaches real /dev/loopN devices)")
	}
	if _, err := exec.LookPath("losetup"); err != nil {
		t.Skip("loop device tests need losetup (util-linux) in PATH")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("loop device tests need /dev/loop-control: %v", err)
	}
	t.Cleanup(func() {
		out, err := exec.Command("losetup", "--list", "--json", "--output", "NAME,BACK-FILE").Output()
		if err != nil || len(bytes.TrimSpace(out)) == 0 {
			return
		}
		var list losetupList
		if err := json.Unmarshal(out, &list); err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		for _, d := range list.LoopDevices {
			if strings.HasPrefix(d.BackFile, dir+string(filepath.Separator)) {
				if out, err := exec.Command("losetup", "--detach", d.Name).CombinedOutput(); err != nil {
					t.Errorf("cleanup: detaching %s: %v: %s", d.Name, err, out)
				}
			}
		}
	})
}

// newBackingFile creates a sparse file of size bytes in dir.
func newBackingFile(t *testing.T, dir, name string, size int64) string {
	t.Helper()
	path := filepath.Join(dir, name)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return path
}

func newLoopConnector(t *testing.T, vols loopVolumes) *LoopConnector {
	t.Helper()
	l, err := NewLoopConnector(LoopConfig{NQNPrefix: testPrefix, Resolve: vols.resolve})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// deviceSize is what the kernel says the block device holds: lseek to the
// end of a block device returns its size.
func deviceSize(t *testing.T, dev string) int64 {
	t.Helper()
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestLoopConnectorLifecycle(t *testing.T) {
	dir := t.TempDir()
	requireLoop(t, dir)
	file := newBackingFile(t, dir, "vol-a.img", 16*mib)
	// Data put into the volume "on the RDS" must be visible on the node.
	seed := []byte("written on the RDS side")
	if err := writeAt(file, seed, 3*mib); err != nil {
		t.Fatal(err)
	}
	vols := loopVolumes{nqnA: file}
	l := newLoopConnector(t, vols)
	ctx := testCtx(t)

	dev, err := l.Connect(ctx, Target{Address: "10.0.0.5", NQN: nqnA})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(dev, "/dev/loop") {
		t.Fatalf("Connect = %q, want a /dev/loopN", dev)
	}
	if fi, err := os.Stat(dev); err != nil || fi.Mode()&os.ModeDevice == 0 {
		t.Fatalf("%s is not a device: %v", dev, err)
	}
	if got := deviceSize(t, dev); got != 16*mib {
		t.Errorf("device size %d, want %d", got, 16*mib)
	}

	// Through the device to the file and back.
	got := make([]byte, len(seed))
	if err := readAt(dev, got, 3*mib); err != nil || !bytes.Equal(got, seed) {
		t.Fatalf("read %q through %s (%v), want %q", got, dev, err, seed)
	}
	payload := []byte("written through the block device")
	if err := writeAt(dev, payload, 5*mib); err != nil {
		t.Fatal(err)
	}
	got = make([]byte, len(payload))
	if err := readAt(file, got, 5*mib); err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("backing file has %q (%v), want %q", got, err, payload)
	}

	// Idempotent, also for a fresh instance (a restarted node plugin), and
	// an attachment's host NQN changes nothing: a loop device has no host.
	if again, err := l.Connect(ctx, Target{NQN: nqnA, HostNQN: attachA}); err != nil || again != dev {
		t.Fatalf("second Connect = %q, %v; want %q", again, err, dev)
	}
	l2 := newLoopConnector(t, vols)
	if p, err := l2.DevicePath(ctx, nqnA); err != nil || p != dev {
		t.Fatalf("new instance DevicePath = %q, %v; want %q", p, err, dev)
	}
	if again, err := l2.Connect(ctx, Target{NQN: nqnA}); err != nil || again != dev {
		t.Fatalf("new instance Connect = %q, %v; want %q", again, err, dev)
	}
	if ok, err := l2.IsConnected(ctx, nqnA); err != nil || !ok {
		t.Fatalf("IsConnected = %v, %v", ok, err)
	}

	// In use: stays attached.
	busy := func(context.Context, string) (bool, error) { return true, nil }
	if err := l2.Disconnect(ctx, nqnA, busy); !errors.Is(err, ErrInUse) {
		t.Fatalf("Disconnect while in use = %v, want ErrInUse", err)
	}
	if p, err := l.DevicePath(ctx, nqnA); err != nil || p != dev {
		t.Fatalf("after refused Disconnect: DevicePath = %q, %v", p, err)
	}

	if err := l2.Disconnect(ctx, nqnA, notInUse); err != nil {
		t.Fatal(err)
	}
	if ok, err := l.IsConnected(ctx, nqnA); err != nil || ok {
		t.Fatalf("after Disconnect: IsConnected = %v, %v", ok, err)
	}
	if _, err := l.DevicePath(ctx, nqnA); !errors.Is(err, ErrNotConnected) {
		t.Fatalf("after Disconnect: DevicePath err = %v, want ErrNotConnected", err)
	}
	if err := l.Disconnect(ctx, nqnA, notInUse); err != nil {
		t.Fatalf("Disconnect of a detached volume = %v, want success", err)
	}
}

func TestLoopConnectorRefreshSize(t *testing.T) {
	dir := t.TempDir()
	requireLoop(t, dir)
	file := newBackingFile(t, dir, "vol-a.img", 16*mib)
	l := newLoopConnector(t, loopVolumes{nqnA: file})
	ctx := testCtx(t)
	dev, err := l.Connect(ctx, Target{NQN: nqnA})
	if err != nil {
		t.Fatal(err)
	}
	// The RDS grows the file (/disk set file-size=...).
	if err := os.Truncate(file, 48*mib); err != nil {
		t.Fatal(err)
	}
	if err := l.RefreshSize(ctx, nqnA); err != nil {
		t.Fatal(err)
	}
	if got := deviceSize(t, dev); got != 48*mib {
		t.Fatalf("after RefreshSize the device holds %d bytes, want %d", got, 48*mib)
	}
}

func TestLoopConnectorDeletedBackingFile(t *testing.T) {
	// The volume was deleted on the RDS while still attached here: Disconnect
	// must still find and detach the loop device.
	dir := t.TempDir()
	requireLoop(t, dir)
	file := newBackingFile(t, dir, "vol-a.img", 8*mib)
	l := newLoopConnector(t, loopVolumes{nqnA: file})
	ctx := testCtx(t)
	if _, err := l.Connect(ctx, Target{NQN: nqnA}); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if err := l.Disconnect(ctx, nqnA, notInUse); err != nil {
		t.Fatal(err)
	}
	devs, err := l.attached(ctx, file, true)
	if err != nil || len(devs) != 0 {
		t.Fatalf("still attached: %v, %v", devs, err)
	}
}

func TestLoopConnectorSeparateVolumes(t *testing.T) {
	dir := t.TempDir()
	requireLoop(t, dir)
	vols := loopVolumes{
		nqnA: newBackingFile(t, dir, "vol-a.img", 8*mib),
		nqnB: newBackingFile(t, dir, "vol-b.img", 8*mib),
	}
	l := newLoopConnector(t, vols)
	ctx := testCtx(t)
	devA, err := l.Connect(ctx, Target{NQN: nqnA})
	if err != nil {
		t.Fatal(err)
	}
	devB, err := l.Connect(ctx, Target{NQN: nqnB})
	if err != nil {
		t.Fatal(err)
	}
	if devA == devB {
		t.Fatalf("two volumes share %s", devA)
	}
	if err := l.Disconnect(ctx, nqnA, notInUse); err != nil {
		t.Fatal(err)
	}
	if p, err := l.DevicePath(ctx, nqnB); err != nil || p != devB {
		t.Fatalf("disconnecting A disturbed B: %q, %v", p, err)
	}
}

func writeAt(path string, b []byte, off int64) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(b, off); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func readAt(path string, b []byte, off int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.ReadAt(b, off)
	return err
}
