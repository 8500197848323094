//go:build nvmevm

package nvme

// The TCP connector against the real kernel: the nvmet target (set up by
// rdssim's NvmetExporter over configfs) and the nvme-tcp initiator, in the
// VM of `make e2e-nvme` (e2e/nvme boots it with nvme_core.multipath Y and
// N). Outside that VM these tests skip.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

const vmPort = 4420

func requireVM(t *testing.T) {
	t.Helper()
	if os.Getenv("RDS_NVME_VM") != "1" {
		t.Skip("runs inside the NVMe/TCP VM only (make e2e-nvme)")
	}
}

// vmExport exports each NQN on a fresh sparse file of size bytes through
// the kernel's nvmet, and removes the exports when the test ends.
func vmExport(t *testing.T, size int64, allowHost string, nqns ...string) map[string]string {
	t.Helper()
	e, err := rdssim.NewNvmetExporter(rdssim.NvmetConfig{})
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	var want []rdssim.Export
	dir := t.TempDir()
	for i, nqn := range nqns {
		f := filepath.Join(dir, fmt.Sprintf("disk%d.img", i))
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(f, size); err != nil {
			t.Fatal(err)
		}
		files[nqn] = f
		want = append(want, rdssim.Export{NQN: nqn, Port: vmPort, File: f, Size: size, AllowHost: allowHost})
	}
	if err := e.Reconcile(want); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Reconcile(nil); err != nil {
			t.Errorf("removing the exports: %v", err)
		}
	})
	return files
}

func vmConnector(t *testing.T) *TCPConnector {
	t.Helper()
	c, err := NewTCPConnector(Config{
		NQNPrefix:       testPrefix,
		EtcNVMeDir:      t.TempDir(),
		CtrlLossTimeout: 30 * time.Second,
		ReconnectDelay:  time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func vmCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func multipath(t *testing.T) bool {
	v, err := readAttr("/sys/module/nvme_core/parameters/multipath")
	if err != nil {
		t.Fatal(err)
	}
	return v == "Y"
}

// controllersOf lists /sys/class/nvme controllers whose subsysnqn is nqn.
func controllersOf(t *testing.T, nqn string) []string {
	t.Helper()
	names, err := readDirNames("/sys/class/nvme")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range names {
		if got, err := readAttr(filepath.Join("/sys/class/nvme", n, "subsysnqn")); err == nil && got == nqn {
			out = append(out, n)
		}
	}
	return out
}

// waitNoControllers polls until nqn has no controller (deletion is
// asynchronous in the kernel), bounded by d.
func waitNoControllers(t *testing.T, nqn string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		got := controllersOf(t, nqn)
		if len(got) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still has controllers %v after %v", nqn, got, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// fabricsConnect connects nqn by hand as host, as an operator or another
// driver would, outside the connector. With the host's own host ID: Linux
// 6.12 refuses (EINVAL) a host NQN with another's host ID, which a connect
// without hostid= gets (the default host's), where 6.1 only warned.
func fabricsConnect(t *testing.T, nqn string, host HostIdentity) {
	t.Helper()
	f, err := os.OpenFile("/dev/nvme-fabrics", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	opts := fmt.Sprintf("transport=tcp,traddr=127.0.0.1,trsvcid=%d,nqn=%s,hostnqn=%s,hostid=%s", vmPort, nqn, host.NQN, host.ID)
	if _, err := f.Write([]byte(opts)); err != nil {
		t.Fatalf("connecting %s by hand: %v", nqn, err)
	}
}

func deleteAll(t *testing.T, nqn string) {
	for _, c := range controllersOf(t, nqn) {
		_ = os.WriteFile(filepath.Join("/sys/class/nvme", c, "delete_controller"), []byte("1"), 0)
	}
	waitNoControllers(t, nqn, time.Minute)
}

// Connect, find the device through sysfs in either multipath mode, do
// I/O through it, connect again (idempotent), and disconnect only this
// driver's subsystem: a foreign one connected in the same kernel stays.
func TestVMConnectDiscoverDisconnect(t *testing.T) {
	requireVM(t)
	nqnA := testPrefix + "vm-a"
	const foreign = "nqn.2014-08.org.example:foreign-disk"
	files := vmExport(t, 64<<20, "", nqnA, foreign)
	c := vmConnector(t)
	ctx := vmCtx(t, time.Minute)

	other, err := AttachmentHostIdentity("nqn.2014-08.org.example:another-initiator")
	if err != nil {
		t.Fatal(err)
	}
	fabricsConnect(t, foreign, other)
	t.Cleanup(func() { deleteAll(t, foreign) })

	dev, err := c.Connect(ctx, Target{Address: "127.0.0.1", Port: vmPort, NQN: nqnA})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteAll(t, nqnA) })
	name := filepath.Base(dev)
	st, err := c.sys.lookup(nqnA)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("multipath=%v device %s controllers %v namespaces %v", multipath(t), dev, controllerNames(st.controllers), st.namespaces)
	if multipath(t) {
		// The head lives in the subsystem directory; the controller only
		// has the hidden per-path namespace.
		if _, err := os.Stat(filepath.Join("/sys/class/nvme-subsystem", st.subsystems[0], name)); err != nil {
			t.Errorf("multipath: %s is not the subsystem's head: %v", name, err)
		}
	} else if _, err := os.Stat(filepath.Join("/sys/class/nvme", st.controllers[0].name, name)); err != nil {
		t.Errorf("no multipath: %s is not the controller's namespace: %v", name, err)
	}
	size, err := readAttr(filepath.Join("/sys/class/block", name, "size"))
	if err != nil || size != fmt.Sprint((64<<20)/512) {
		t.Errorf("size of %s = %q (%v), want %d sectors", name, size, err, (64<<20)/512)
	}

	// Data written through the initiator lands in the target's file.
	msg := []byte("written through nvme-tcp")
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(msg, 4096); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	back := make([]byte, len(msg))
	bf, err := os.Open(files[nqnA])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bf.ReadAt(back, 4096); err != nil || string(back) != string(msg) {
		t.Errorf("backing file has %q (%v), want %q", back, err, msg)
	}
	bf.Close()

	again, err := c.Connect(ctx, Target{Address: "127.0.0.1", Port: vmPort, NQN: nqnA})
	if err != nil || again != dev {
		t.Errorf("second Connect = %q, %v; want %q", again, err, dev)
	}
	if got := controllersOf(t, nqnA); len(got) != 1 {
		t.Errorf("controllers after two connects: %v, want one", got)
	}

	if err := c.Disconnect(ctx, foreign, notInUse); !errors.Is(err, ErrForeignNQN) {
		t.Errorf("Disconnect(foreign) = %v, want ErrForeignNQN", err)
	}
	if err := c.Disconnect(ctx, nqnA, notInUse); err != nil {
		t.Fatal(err)
	}
	waitNoControllers(t, nqnA, time.Minute)
	if _, err := c.DevicePath(ctx, nqnA); !errors.Is(err, ErrNotConnected) {
		t.Errorf("DevicePath after Disconnect = %v, want ErrNotConnected", err)
	}
	fc := controllersOf(t, foreign)
	if len(fc) != 1 {
		t.Fatalf("the foreign subsystem has controllers %v after our Disconnect", fc)
	}
	if state, _ := readAttr(filepath.Join("/sys/class/nvme", fc[0], "state")); state != stateLive {
		t.Errorf("the foreign controller is %q after our Disconnect", state)
	}
}

// A target that accepts TCP but never answers the NVMe/TCP handshake: the
// caller's deadline ends the wait (DeadlineExceeded), and once the kernel
// gives up on its own nothing is left connected.
func TestVMConnectTimeout(t *testing.T) {
	requireVM(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	port := l.Addr().(*net.TCPAddr).Port
	nqn := testPrefix + "vm-silent"
	c := vmConnector(t)
	_, err = c.Connect(vmCtx(t, 2*time.Second), Target{Address: "127.0.0.1", Port: port, NQN: nqn})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Connect = %v, want DeadlineExceeded", err)
	}
	select {
	case conn := <-accepted:
		held = append(held, conn)
	default:
		t.Error("the kernel never reached the silent target")
	}
	// The connector holds the NQN until the kernel's write returns.
	unlock, err := c.locks.lock(vmCtx(t, 2*time.Minute), nqn)
	if err != nil {
		t.Fatalf("the kernel's connect did not end: %v", err)
	}
	unlock()
	if got := controllersOf(t, nqn); len(got) != 0 {
		t.Errorf("a timed-out connect left controllers %v", got)
	}
}

// An NQN the target does not have, and one it has but not for this host:
// ErrSubsystemNotFound, and nothing left connected (not even the discovery
// controller used to find out).
func TestVMConnectUnknownNQN(t *testing.T) {
	requireVM(t)
	exported := testPrefix + "vm-exported"
	fenced := testPrefix + "vm-other-host"
	vmExport(t, 16<<20, "", exported)
	vmExport(t, 16<<20, "nqn.2014-08.org.example:some-other-node", fenced)
	c := vmConnector(t)
	for _, nqn := range []string{testPrefix + "vm-missing", fenced} {
		_, err := c.Connect(vmCtx(t, time.Minute), Target{Address: "127.0.0.1", Port: vmPort, NQN: nqn})
		if !errors.Is(err, ErrSubsystemNotFound) {
			t.Errorf("Connect(%s) = %v, want ErrSubsystemNotFound", nqn, err)
		}
		if got := controllersOf(t, nqn); len(got) != 0 {
			t.Errorf("%s has controllers %v after a refused connect", nqn, got)
		}
	}
	waitNoControllers(t, discoveryNQN, time.Minute)
}

// What storage fencing (changing nvme-tcp-server-allow-host-name) does on
// Linux nvmet, as the simulator applies it: a host that is not allowed
// cannot connect (ErrSubsystemNotFound); changing the allowed host leaves
// the old host's established controller live; taking the subsystem off
// the port and back drops every connection, and only the allowed host
// gets back in.
func TestVMAllowedHostChange(t *testing.T) {
	requireVM(t)
	nqn := testPrefix + "vm-fence"
	a, b := vmConnector(t), vmConnector(t)
	a.cfg.CtrlLossTimeout = 5 * time.Second // how long A keeps knocking
	idA, err := a.HostIdentity()
	if err != nil {
		t.Fatal(err)
	}
	idB, err := b.HostIdentity()
	if err != nil {
		t.Fatal(err)
	}
	e, err := rdssim.NewNvmetExporter(rdssim.NvmetConfig{})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "fence.img")
	if err := os.WriteFile(file, make([]byte, 16<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	export := func(host string) {
		t.Helper()
		if err := e.Reconcile([]rdssim.Export{{NQN: nqn, Port: vmPort, File: file, Size: 16 << 20, AllowHost: host}}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { deleteAll(t, nqn); _ = e.Reconcile(nil) })
	ctx := vmCtx(t, 2*time.Minute)

	export(idA.NQN)
	if _, err := b.Connect(ctx, Target{Address: "127.0.0.1", Port: vmPort, NQN: nqn}); !errors.Is(err, ErrSubsystemNotFound) {
		t.Fatalf("B connecting while only A is allowed = %v, want ErrSubsystemNotFound", err)
	}
	devA, err := a.Connect(ctx, Target{Address: "127.0.0.1", Port: vmPort, NQN: nqn})
	if err != nil {
		t.Fatal(err)
	}

	export(idB.NQN)
	ctrls := controllersOf(t, nqn)
	if len(ctrls) != 1 {
		t.Fatalf("controllers after the allowed host changed: %v", ctrls)
	}
	if state, _ := readAttr(filepath.Join("/sys/class/nvme", ctrls[0], "state")); state != stateLive {
		t.Errorf("A's controller is %q right after the change; nvmet checks hosts at connect only", state)
	}
	f, err := os.OpenFile(devA, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, werr := f.WriteAt(make([]byte, 4096), 0)
	if werr == nil {
		werr = f.Sync()
	}
	f.Close()
	if werr != nil {
		t.Errorf("A's write after the change failed (%v); nvmet was expected to let it through", werr)
	}

	// Dropping the connections: off the port and back.
	link := filepath.Join(rdssim.DefaultNvmetRoot, "ports", fmt.Sprint(vmPort), "subsystems", nqn)
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(rdssim.DefaultNvmetRoot, "subsystems", nqn), link); err != nil {
		t.Fatal(err)
	}
	// A's controller keeps trying, is refused, and goes when its
	// ctrl_loss_tmo (5 s here) runs out; it must never be live again.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ctrls := controllersOf(t, nqn)
		for _, c := range ctrls {
			if st, _ := readAttr(filepath.Join("/sys/class/nvme", c, "state")); st == stateLive {
				t.Fatalf("A reconnected after the port bounce although only B is allowed")
			}
		}
		if len(ctrls) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("A's controllers %v are still there after ctrl_loss_tmo", ctrls)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Only now can B connect from this kernel: nvmet hands B's controller
	// the cntlid A's had, and one host kernel refuses a duplicate cntlid
	// within a subsystem ("Duplicate cntlid"). Two real nodes do not
	// share a kernel, so there B gets in at once.
	fabricsConnect(t, nqn, idB)
	ctrls = controllersOf(t, nqn)
	if len(ctrls) != 1 {
		t.Fatalf("controllers after B connected: %v", ctrls)
	}
	if h, _ := readAttr(filepath.Join("/sys/class/nvme", ctrls[0], "hostnqn")); h != idB.NQN {
		t.Errorf("the controller is %s's, want B's", h)
	}
}

// A new attachment of a volume never shares the kernel's controller or
// multipath head with an earlier one: connected as host A (the UUID form),
// Connect as host B (another form) disconnects A's controller before it
// connects B's, each with the host ID derived from its own NQN; B again is
// idempotent. The export admits any host, so only the connector decides.
func TestVMConnectAsNewAttachment(t *testing.T) {
	requireVM(t)
	const (
		hostA = "nqn.2014-08.org.nvmexpress:uuid:3f2b8c1d-6e4a-4b5c-9d8e-7f6a5b4c3d2e"
		hostB = "nqn.2024-01.lan.example:attachment-b"
	)
	nqn := testPrefix + "vm-attachments"
	vmExport(t, 16<<20, "", nqn)
	c := vmConnector(t)
	ctx := vmCtx(t, 2*time.Minute)
	t.Cleanup(func() { deleteAll(t, nqn) })
	// hosts lists each controller of nqn as "nvmeX hostnqn hostid".
	hosts := func() []string {
		t.Helper()
		var out []string
		for _, ctrl := range controllersOf(t, nqn) {
			hn, _ := readAttr(filepath.Join("/sys/class/nvme", ctrl, "hostnqn"))
			hid, _ := readAttr(filepath.Join("/sys/class/nvme", ctrl, "hostid"))
			out = append(out, ctrl+" "+hn+" "+hid)
		}
		return out
	}
	idA, err := AttachmentHostIdentity(hostA)
	if err != nil {
		t.Fatal(err)
	}
	idB, err := AttachmentHostIdentity(hostB)
	if err != nil {
		t.Fatal(err)
	}

	if _, err := c.Connect(ctx, Target{Address: "127.0.0.1", Port: vmPort, NQN: nqn, HostNQN: hostA}); err != nil {
		t.Fatal(err)
	}
	got := hosts()
	if len(got) != 1 || !strings.HasSuffix(got[0], " "+idA.NQN+" "+idA.ID) {
		t.Fatalf("controllers after connecting as A: %q, want one as %s with host ID %s", got, idA.NQN, idA.ID)
	}

	devB, err := c.Connect(ctx, Target{Address: "127.0.0.1", Port: vmPort, NQN: nqn, HostNQN: hostB})
	if err != nil {
		t.Fatal(err)
	}
	got = hosts()
	if len(got) != 1 || !strings.HasSuffix(got[0], " "+idB.NQN+" "+idB.ID) {
		t.Fatalf("controllers after connecting as B: %q, want only B's (%s, host ID %s): A's must be gone", got, idB.NQN, idB.ID)
	}
	f, err := os.OpenFile(devB, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	msg := []byte("written by attachment B")
	if _, err := f.WriteAt(msg, 8192); err != nil {
		t.Errorf("writing through B's device %s: %v", devB, err)
	} else if err := f.Sync(); err != nil {
		t.Errorf("syncing B's device %s: %v", devB, err)
	}
	f.Close()

	again, err := c.Connect(ctx, Target{Address: "127.0.0.1", Port: vmPort, NQN: nqn, HostNQN: hostB})
	if err != nil || again != devB {
		t.Errorf("Connect as B again = %q, %v; want %q", again, err, devB)
	}
	if after := hosts(); len(after) != 1 || after[0] != got[0] {
		t.Errorf("controllers after connecting as B again: %q, want %q", after, got)
	}
}

// A node whose nvme-tcp module is not loaded gets an error that names the
// fix. The module is loaded again from the unpacked kernel package. Last
// of the tests: unloading needs every nvme-tcp controller gone.
func TestVMNoNvmeTCPModule(t *testing.T) {
	requireVM(t)
	ko := os.Getenv("RDS_NVME_VM_NVME_TCP_KO")
	if ko == "" {
		t.Fatal("RDS_NVME_VM_NVME_TCP_KO (the nvme-tcp.ko to load again) is not set")
	}
	if err := unix.DeleteModule("nvme_tcp", 0); err != nil {
		t.Fatalf("unloading nvme_tcp (is a controller still connected?): %v", err)
	}
	defer func() {
		f, err := os.Open(ko)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		// A compressed module (Debian's 6.12 packages them with xz) is
		// decompressed by the kernel itself (CONFIG_MODULE_DECOMPRESS).
		flags := 0
		if strings.HasSuffix(ko, ".xz") || strings.HasSuffix(ko, ".zst") || strings.HasSuffix(ko, ".gz") {
			flags = unix.MODULE_INIT_COMPRESSED_FILE
		}
		if err := unix.FinitModule(int(f.Fd()), "", flags); err != nil {
			t.Fatalf("loading %s again: %v", ko, err)
		}
	}()
	c := vmConnector(t)
	c.cfg.Runner = RunnerFunc(func(context.Context, string, ...string) ([]byte, error) {
		return nil, errors.New("modprobe must not run: /dev/nvme-fabrics is there")
	})
	_, err := c.Connect(vmCtx(t, time.Minute), Target{Address: "127.0.0.1", Port: vmPort, NQN: testPrefix + "vm-any"})
	if !errors.Is(err, ErrConnectFailed) || !strings.Contains(err.Error(), "modprobe nvme-tcp") {
		t.Errorf("Connect without nvme_tcp = %v, want ErrConnectFailed naming modprobe nvme-tcp", err)
	}
}

// BenchmarkVMWriteThroughput compares sequential (1 MiB) and 4 KiB random
// O_DIRECT write throughput to the same file through NVMe/TCP (nvmet on
// loopback, the kernel's initiator) and through a loop device, in the same
// VM, with fio. It reports MiB/s of each and their ratio (NVMe/TCP over
// loop); b.N is ignored (run it with -benchtime 1x).
func BenchmarkVMWriteThroughput(b *testing.B) {
	if os.Getenv("RDS_NVME_VM") != "1" {
		b.Skip("runs inside the NVMe/TCP VM only (make e2e-nvme)")
	}
	const size = 512 << 20
	nqn := testPrefix + "vm-bench"
	e, err := rdssim.NewNvmetExporter(rdssim.NvmetConfig{})
	if err != nil {
		b.Fatal(err)
	}
	file := filepath.Join(b.TempDir(), "bench.img")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		b.Fatal(err)
	}
	if err := os.Truncate(file, size); err != nil {
		b.Fatal(err)
	}
	if err := e.Reconcile([]rdssim.Export{{NQN: nqn, Port: vmPort, File: file, Size: size}}); err != nil {
		b.Fatal(err)
	}
	defer e.Reconcile(nil)
	c, err := NewTCPConnector(Config{NQNPrefix: testPrefix, EtcNVMeDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	nvmeDev, err := c.Connect(ctx, Target{Address: "127.0.0.1", Port: vmPort, NQN: nqn})
	if err != nil {
		b.Fatal(err)
	}
	// Fill the file once, so neither device pays for allocating it.
	fio(b, nvmeDev, "write", "1M", 16, false)
	results := map[string]float64{}
	for _, w := range []struct{ name, rw, bs string }{{"seq", "write", "1M"}, {"rand4k", "randwrite", "4k"}} {
		results["nvme-"+w.name] = fio(b, nvmeDev, w.rw, w.bs, 32, true)
	}
	if err := c.Disconnect(ctx, nqn, func(context.Context, string) (bool, error) { return false, nil }); err != nil {
		b.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", file).Output()
	if err != nil {
		b.Fatalf("losetup: %v", err)
	}
	loopDev := strings.TrimSpace(string(out))
	defer exec.Command("losetup", "--detach", loopDev).Run()
	for _, w := range []struct{ name, rw, bs string }{{"seq", "write", "1M"}, {"rand4k", "randwrite", "4k"}} {
		results["loop-"+w.name] = fio(b, loopDev, w.rw, w.bs, 32, true)
	}
	for _, w := range []string{"seq", "rand4k"} {
		b.ReportMetric(results["nvme-"+w], "nvme-"+w+"-MiB/s")
		b.ReportMetric(results["loop-"+w], "loop-"+w+"-MiB/s")
		b.ReportMetric(results["nvme-"+w]/results["loop-"+w], w+"-nvme/loop")
	}
}

// fio writes to dev and returns the write bandwidth in MiB/s: 15 s when
// timed, one pass over the device otherwise.
func fio(b *testing.B, dev, rw, bs string, depth int, timed bool) float64 {
	b.Helper()
	args := []string{"--name=w", "--filename=" + dev, "--rw=" + rw, "--bs=" + bs, "--direct=1",
		"--ioengine=libaio", fmt.Sprintf("--iodepth=%d", depth), "--output-format=json"}
	if timed {
		args = append(args, "--runtime=15", "--time_based")
	}
	out, err := exec.Command("fio", args...).Output()
	if err != nil {
		b.Fatalf("fio %v: %v", args, err)
	}
	var res struct {
		Jobs []struct {
			Write struct {
				BW float64 `json:"bw"` // KiB/s
			} `json:"write"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.Jobs) != 1 {
		b.Fatalf("fio output: %v", err)
	}
	return res.Jobs[0].Write.BW / 1024
}
