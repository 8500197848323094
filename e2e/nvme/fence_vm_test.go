//go:build nvmevm

package nvme

// Inside the VM (RDS_NVME_VM=1): storage fencing against the real kernel
// target and initiator. bin/rds-sim exports a disk through nvmet; the rds
// client (over SSH, as the controller runs it) moves the export from host
// A to host B; A and B are two host NQNs of this one kernel, each with
// the driver's NVMe/TCP connector, and each writes sequence-tagged blocks
// (e2e/nvme/blocktag). The history of answers and the final image, read
// from the backing file on the target side, are checked.
//
// One kernel, two hosts: in one host kernel, controllers of the same
// subsystem NQN share one NVMe subsystem. While A's controller still
// exists (it reconnects until its ctrl_loss_tmo), B's controller would
// join A's: nvmet may hand B the cntlid A had, which the kernel refuses
// ("Duplicate cntlid", see TestVMAllowedHostChange in pkg/nvme), and the
// export turned off and on again is a new nvmet namespace with a new
// UUID, which (by the kernel's source) it refuses next to A's ("IDs don't
// match for shared namespace"). Two real nodes share none of this. So
// A's connector gets a short ctrl_loss_tmo (5 s, reconnect every 1 s): A
// keeps knocking after the export is on again for B (each knock refused:
// the fence is tested, not skipped), and B connects once A's controller
// is gone. B's first write is therefore later than on two machines; A
// writes throughout, before and after it.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/srvlab/rds-csi/e2e/nvme/blocktag"
	"github.com/srvlab/rds-csi/pkg/nvme"
	"github.com/srvlab/rds-csi/pkg/rds"
	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

const (
	fenceNQNPrefix = "nqn.2000-02.com.mikrotik:pvc-"
	fencePort      = 4420
	slotsPerHost   = 256 // 1 MiB of 4 KiB blocks each
	fenceDiskSize  = 4 << 20
	hostA, hostB   = 1, 2
)

// fenceSim is one rds-sim process with its nvmet backend and an rds
// client logged in to it over SSH.
type fenceSim struct {
	client  *rds.Client
	dataDir string
	clock   *answerClock
}

// startFenceSim starts bin/rds-sim with --allow-host-change=mode.
func startFenceSim(t *testing.T, mode string) *fenceSim {
	t.Helper()
	sim := startSimProcess(t, t.TempDir(), "--pool-size", "1T", "--allow-host-change="+mode)
	clock := &answerClock{}
	c, err := rds.NewClient(rds.Config{Address: sim.host, Port: sim.port, User: "admin", KeyFile: sim.key, KnownHostsFile: sim.knownHosts, Observer: clock.observe})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &fenceSim{client: c, dataDir: sim.dataDir, clock: clock}
}

// answerClock records when (CLOCK_MONOTONIC) the answer to each /disk set
// arrived, by what it assigned.
type answerClock struct {
	mu      sync.Mutex
	answers []setAnswer
}

type setAnswer struct {
	assign string // e.g. "nvme-tcp-export=no"
	at     int64
	err    error
}

func (a *answerClock) observe(r rds.CommandRecord) {
	at := blocktag.Now()
	if !strings.HasPrefix(r.Command, "/disk set ") {
		return
	}
	i := strings.LastIndex(r.Command, "] ")
	if i < 0 {
		return
	}
	a.mu.Lock()
	a.answers = append(a.answers, setAnswer{assign: r.Command[i+2:], at: at, err: r.Err})
	a.mu.Unlock()
}

// last returns the time of the last successful set that assigned assign
// (a prefix), after since.
func (a *answerClock) last(assign string, since int64) (int64, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := len(a.answers) - 1; i >= 0; i-- {
		s := a.answers[i]
		if s.at > since && s.err == nil && strings.HasPrefix(s.assign, assign) {
			return s.at, true
		}
	}
	return 0, false
}

// fenceDisk creates a disk exported to no host and opens it to host.
func (s *fenceSim) fenceDisk(t *testing.T, ctx context.Context, slot, nqn, host string) string {
	t.Helper()
	closedDisk(t, ctx, s.client, slot, nqn, fenceDiskSize)
	if _, err := s.client.SetExportHost(ctx, slot, host, true); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(s.dataDir, slot+".img")
}

// closedDisk creates a disk of size bytes in the simulator's pool, closed
// and exported as nqn on fencePort once opened, and removes it with the
// controllers of nqn when the test ends.
func closedDisk(t testing.TB, ctx context.Context, c *rds.Client, slot, nqn string, size int64) *rds.Disk {
	t.Helper()
	d, err := c.CreateDisk(ctx, rds.CreateDiskRequest{
		Slot: slot, FilePath: "/" + rdssim.DefaultPoolName + "/" + slot + ".img", Size: size,
		Export: &rds.Export{Port: fencePort, NQN: nqn, Closed: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		deleteControllersOf(t, nqn)
		if err := c.DeleteDisk(context.Background(), slot, d.FilePath); err != nil {
			t.Errorf("deleting disk %s: %v", slot, err)
		}
	})
	return d
}

// fenceConnector is one host's connector: its own host NQN, ctrl_loss_tmo
// 5 s (see the top of the file), and fast_io_fail_tmo as given (0: the
// default).
func fenceConnector(t testing.TB, fastIOFail time.Duration) (*nvme.TCPConnector, string) {
	t.Helper()
	c, err := nvme.NewTCPConnector(nvme.Config{
		NQNPrefix:         fenceNQNPrefix,
		EtcNVMeDir:        t.TempDir(),
		CtrlLossTimeout:   5 * time.Second,
		ReconnectDelay:    time.Second,
		FastIOFailTimeout: fastIOFail,
	})
	if err != nil {
		t.Fatal(err)
	}
	id, err := c.HostIdentity()
	if err != nil {
		t.Fatal(err)
	}
	return c, id.NQN
}

// startWriter opens dev with O_DIRECT and starts w on it until the test
// (or stop) ends it.
func startWriter(t *testing.T, dev string, w *blocktag.Writer) (stop func() []blocktag.Record) {
	t.Helper()
	// The node can be there a moment before the disk is live (add_disk
	// creates it first): open answers ENXIO until then.
	var f *os.File
	waitFor(t, 30*time.Second, "opening "+dev+" succeeds", func() bool {
		var err error
		f, err = blocktag.OpenDirect(dev)
		if err != nil && !errors.Is(err, unix.ENXIO) {
			t.Fatal(err)
		}
		return err == nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	w.Start(ctx, f)
	var once sync.Once
	var recs []blocktag.Record
	stop = func() []blocktag.Record {
		once.Do(func() {
			cancel()
			recs = w.Wait()
			f.Close()
		})
		return recs
	}
	t.Cleanup(func() { stop() })
	return stop
}

// waitFor polls cond until it holds, failing the test after d.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting until %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func countRecords(recs []blocktag.Record, keep func(blocktag.Record) bool) int {
	n := 0
	for _, r := range recs {
		if keep(r) {
			n++
		}
	}
	return n
}

// hostControllers lists the controllers of subsystem nqn that host
// (a host NQN) has in this kernel.
func hostControllers(t testing.TB, nqn, host string) []string {
	t.Helper()
	entries, err := os.ReadDir("/sys/class/nvme")
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		dir := filepath.Join("/sys/class/nvme", e.Name())
		if sysAttr(dir, "subsysnqn") == nqn && (host == "" || sysAttr(dir, "hostnqn") == host) {
			out = append(out, e.Name())
		}
	}
	return out
}

func sysAttr(dir, name string) string {
	b, _ := os.ReadFile(filepath.Join(dir, name))
	return strings.TrimSpace(string(b))
}

// deleteControllersOf removes what a test left connected to nqn.
func deleteControllersOf(t testing.TB, nqn string) {
	for _, c := range hostControllers(t, nqn, "") {
		_ = os.WriteFile(filepath.Join("/sys/class/nvme", c, "delete_controller"), []byte("1"), 0)
	}
	waitFor(t, time.Minute, "the controllers of "+nqn+" are gone", func() bool { return len(hostControllers(t, nqn, "")) == 0 })
}

// kmsg reads the kernel log from the moment it was opened. Raw reads:
// an *os.File of a non-blocking fd would wait in Go's poller.
type kmsg struct{ fd int }

func openKmsg(t *testing.T) *kmsg {
	t.Helper()
	fd, err := unix.Open("/dev/kmsg", unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Logf("no kernel log: %v", err)
		return &kmsg{fd: -1}
	}
	if _, err := unix.Seek(fd, 0, io.SeekEnd); err != nil {
		t.Logf("kernel log: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return &kmsg{fd: fd}
}

// lines returns the messages logged since the last call.
func (k *kmsg) lines() []string {
	if k.fd < 0 {
		return nil
	}
	var out []string
	buf := make([]byte, 8192)
	for {
		n, err := unix.Read(k.fd, buf)
		if errors.Is(err, unix.EPIPE) {
			continue // records overwritten before we read them: skip ahead
		}
		if err != nil || n <= 0 {
			return out // EAGAIN: nothing more
		}
		if _, msg, ok := strings.Cut(string(buf[:n]), ";"); ok {
			msg, _, _ = strings.Cut(msg, "\n")
			out = append(out, msg)
		}
	}
}

func ms(d int64) string { return time.Duration(d).Round(time.Microsecond).String() }

// The fence a partitioned node cannot outlive: host A (still running,
// still writing) holds the volume; the controller fences it with
// CloseExport(A) and publishes to B with SetExportHost(B, drop=true). A's
// writes fail from the fence on and never succeed again, and the final
// image holds no block of A's submitted after the fence (nor after B's
// first write), every write acknowledged to A before the fence, and every
// block of B's intact. Under both simulator behaviours for an
// allowed-host change, and with A's fast_io_fail_tmo at once (I/O errors
// at once) and unset (I/O waits for ctrl_loss_tmo, then fails).
func TestVMFenceCutsWriter(t *testing.T) {
	if os.Getenv("RDS_NVME_VM") != "1" {
		t.Skip("runs inside the NVMe/TCP VM only (make e2e-nvme)")
	}
	for _, tc := range []struct {
		sim        string
		fastIOFail time.Duration
	}{
		{"keep", nvme.FailIOAtOnce},
		{"drop", nvme.FailIOAtOnce},
		{"keep", nvme.HoldIOUntilCtrlLoss},
		{"drop", nvme.HoldIOUntilCtrlLoss},
	} {
		name := fmt.Sprintf("sim=%s/fast_io_fail=%s", tc.sim, fastIOFailLabel(tc.fastIOFail))
		t.Run(name, func(t *testing.T) { fenceCutsWriter(t, tc.sim, tc.fastIOFail) })
	}
}

func fastIOFailLabel(d time.Duration) string {
	switch {
	case d == nvme.FailIOAtOnce:
		return "0"
	case d == nvme.HoldIOUntilCtrlLoss:
		return "unset"
	}
	return d.String()
}

func fenceCutsWriter(t *testing.T, simMode string, fastIOFail time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sim := startFenceSim(t, simMode)
	slot := "fence-" + simMode + "-failfast"
	if fastIOFail == nvme.HoldIOUntilCtrlLoss {
		slot = "fence-" + simMode + "-queued"
	}
	nqn := fenceNQNPrefix + slot
	connA, nqnA := fenceConnector(t, fastIOFail)
	connB, nqnB := fenceConnector(t, nvme.FailIOAtOnce)
	image := sim.fenceDisk(t, ctx, slot, nqn, nqnA)
	target := nvme.Target{Address: "127.0.0.1", Port: fencePort, NQN: nqn}

	devA, err := connA.Connect(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	wA := &blocktag.Writer{Host: hostA, FirstSlot: 0, Slots: slotsPerHost, FailurePause: 2 * time.Millisecond}
	stopA := startWriter(t, devA, wA)
	waitFor(t, 2*time.Minute, "A has 2 acknowledged writes per slot", func() bool {
		return countRecords(wA.Records(), blocktag.Record.OK) >= 2*slotsPerHost
	})
	log := openKmsg(t)

	// The fence, as the controller does it: cut A, then publish to B.
	fenceStart := blocktag.Now()
	closed, err := sim.client.CloseExport(ctx, slot, nqnA)
	if err != nil || !closed {
		t.Fatalf("CloseExport(%s) = %v, %v; want true, nil", nqnA, closed, err)
	}
	fence, ok := sim.clock.last("nvme-tcp-export=no", fenceStart)
	if !ok {
		t.Fatal("CloseExport sent no nvme-tcp-export=no")
	}
	ch, err := sim.client.SetExportHost(ctx, slot, nqnB, true)
	if err != nil || !ch.Changed {
		t.Fatalf("SetExportHost(%s) = %+v, %v", nqnB, ch, err)
	}
	on, ok := sim.clock.last("nvme-tcp-export=yes", fence)
	if !ok {
		t.Fatal("SetExportHost sent no nvme-tcp-export=yes")
	}

	waitFor(t, 2*time.Minute, "a write of A's fails after the fence", func() bool {
		return countRecords(wA.Records(), func(r blocktag.Record) bool { return !r.OK() && r.CompleteNS >= fence }) > 0
	})
	// One kernel: B only after A's controller has given up (see the top).
	waitFor(t, 2*time.Minute, "A's controller is gone", func() bool { return len(hostControllers(t, nqn, nqnA)) == 0 })
	aGone := blocktag.Now()

	devB, err := connB.Connect(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	if got := hostControllers(t, nqn, ""); len(got) != 1 || len(hostControllers(t, nqn, nqnB)) != 1 {
		t.Fatalf("controllers of %s after B connected: %v, want B's only", nqn, got)
	}
	wB := &blocktag.Writer{Host: hostB, FirstSlot: slotsPerHost, Slots: slotsPerHost, Limit: 2 * slotsPerHost}
	stopB := startWriter(t, devB, wB)
	select {
	case <-wB.Done():
	case <-ctx.Done():
		t.Fatal("B's writes did not finish")
	}
	recB := stopB()
	lastB := recB[len(recB)-1].CompleteNS
	// A kept trying while B wrote, and after.
	waitFor(t, time.Minute, "A tries a write after B's last", func() bool {
		recs := wA.Records()
		return recs[len(recs)-1].SubmitNS > lastB
	})
	recA := stopA()
	if err := connB.Disconnect(ctx, nqn, func(context.Context, string) (bool, error) { return false, nil }); err != nil {
		t.Errorf("disconnecting B: %v", err)
	}

	img, err := os.ReadFile(image)
	if err != nil {
		t.Fatal(err)
	}
	if bad := countRecords(recB, func(r blocktag.Record) bool { return !r.OK() }); bad > 0 {
		t.Errorf("%d of B's %d writes failed", bad, len(recB))
	}
	histA := blocktag.History{Host: hostA, Records: recA, FencedAt: fence}
	stA, problems := blocktag.CheckFenced(histA)
	for _, p := range problems {
		t.Error(p)
	}
	for _, r := range stA.LateAcks {
		if fastIOFail == nvme.FailIOAtOnce {
			t.Errorf("%s; with fast_io_fail_tmo=0 a write in flight at the cut must fail", blocktag.DescribeLateAck(r, fence))
		} else {
			// Seen with multipath: the write in flight at the cut was
			// answered with success when ctrl_loss_tmo ran out. Its
			// block landed before the fence, which the image check
			// requires of every acknowledged write.
			t.Logf("FENCE late acknowledgement: %s", blocktag.DescribeLateAck(r, fence))
		}
	}
	firstB := blocktag.FirstOK(recB)
	stImg, problems := blocktag.CheckImage(img, firstB, histA, blocktag.History{Host: hostB, Records: recB})
	for _, p := range problems {
		t.Error("image: " + p)
	}
	if stA.FailedAfter == 0 {
		t.Error("A submitted no write after the fence")
	}
	if stImg.Blocks[hostA] != slotsPerHost || stImg.Blocks[hostB] != slotsPerHost {
		t.Errorf("image holds %d blocks of A's and %d of B's, want %d each", stImg.Blocks[hostA], stImg.Blocks[hostB], slotsPerHost)
	}

	refused, missing := 0, 0 // A's reconnect attempts, as the kernel logged them
	for _, l := range log.lines() {
		switch {
		case strings.HasPrefix(l, "nvme nvme") && strings.Contains(l, nqnA) && strings.Contains(l, "not allowed"):
			refused++ // the host's line; nvmet logs its own too
		case strings.Contains(l, "invalid subsystem") && strings.Contains(l, nqn):
			missing++
		}
	}
	failed := countRecords(recA, func(r blocktag.Record) bool { return !r.OK() })
	t.Logf("FENCE sim=%s fast_io_fail=%s: CloseExport answered %s after it was called; gap (export off answered -> on answered) %s; ExportChange %+v",
		simMode, fastIOFailLabel(fastIOFail), ms(fence-fenceStart), ms(on-fence), struct{ Changed, Dropped bool }{ch.Changed, ch.Dropped})
	t.Logf("FENCE A: %d writes, %d acknowledged before the fence (last acknowledged %s before it), %d acknowledged after it (in flight at the cut), %d failed (%d submitted after the fence); first error %s after the fence (%v)",
		stA.Writes, stA.OKBefore, ms(fence-stA.LastOKComplete), len(stA.LateAcks), failed, stA.FailedAfter, ms(stA.FirstErrorAfter-fence), stA.FirstError)
	t.Logf("FENCE A's controller gone %s after the fence (ctrl_loss_tmo 5 s); A's reconnects refused as not allowed: %d, to a missing subsystem: %d (kernel log)",
		ms(aGone-fence), refused, missing)
	t.Logf("FENCE B: first acknowledged write %s after the fence, %d writes, all acknowledged: %v; image: A %d blocks (latest submitted %s before the fence), B %d blocks, %d empty",
		ms(firstB-fence), len(recB), countRecords(recB, blocktag.Record.OK) == len(recB), stImg.Blocks[hostA], ms(fence-stImg.LastSubmit[hostA]), stImg.Blocks[hostB], stImg.Empty)
}

// What the allowed-host change alone (no export off) does to A's
// established connection, as the simulator models it: keep (Linux nvmet:
// hosts are checked at connect only) leaves A writing; drop (the
// simulator bounces the port link) cuts A, whose writes then fail and
// whose reconnects are refused.
func TestVMAllowedHostChangeOnly(t *testing.T) {
	if os.Getenv("RDS_NVME_VM") != "1" {
		t.Skip("runs inside the NVMe/TCP VM only (make e2e-nvme)")
	}
	for _, mode := range []string{"keep", "drop"} {
		t.Run("sim="+mode, func(t *testing.T) { allowedHostChangeOnly(t, mode) })
	}
}

func allowedHostChangeOnly(t *testing.T, simMode string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sim := startFenceSim(t, simMode)
	slot := "hostchange-" + simMode
	nqn := fenceNQNPrefix + slot
	connA, nqnA := fenceConnector(t, nvme.FailIOAtOnce)
	_, nqnB := fenceConnector(t, nvme.FailIOAtOnce)
	sim.fenceDisk(t, ctx, slot, nqn, nqnA)
	devA, err := connA.Connect(ctx, nvme.Target{Address: "127.0.0.1", Port: fencePort, NQN: nqn})
	if err != nil {
		t.Fatal(err)
	}
	wA := &blocktag.Writer{Host: hostA, FirstSlot: 0, Slots: slotsPerHost, FailurePause: 2 * time.Millisecond}
	stopA := startWriter(t, devA, wA)
	waitFor(t, 2*time.Minute, "A has acknowledged writes", func() bool {
		return countRecords(wA.Records(), blocktag.Record.OK) >= slotsPerHost
	})

	start := blocktag.Now()
	ch, err := sim.client.SetExportHost(ctx, slot, nqnB, false)
	if err != nil || !ch.Changed || ch.Dropped {
		t.Fatalf("SetExportHost(%s, drop=false) = %+v, %v; want a change without export off", nqnB, ch, err)
	}
	changed, ok := sim.clock.last("nvme-tcp-server-allow-host-name=", start)
	if !ok {
		t.Fatal("SetExportHost set no allowed host")
	}
	after := func(keep func(blocktag.Record) bool) int {
		return countRecords(wA.Records(), func(r blocktag.Record) bool { return r.SubmitNS >= changed && keep(r) })
	}
	switch simMode {
	case "keep":
		waitFor(t, 2*time.Minute, "A has acknowledged writes after the change", func() bool {
			return after(blocktag.Record.OK) >= 2*slotsPerHost || after(func(r blocktag.Record) bool { return !r.OK() }) > 0
		})
		recA := stopA()
		if n := countRecords(recA, func(r blocktag.Record) bool { return !r.OK() }); n > 0 {
			t.Errorf("%d of A's writes failed; with keep, A's established connection should have lived on", n)
		}
		ctrls := hostControllers(t, nqn, nqnA)
		if len(ctrls) != 1 || sysAttr(filepath.Join("/sys/class/nvme", ctrls[0]), "state") != "live" {
			t.Errorf("A's controllers after the change: %v, want one live", ctrls)
		}
		t.Logf("HOSTCHANGE sim=keep: A's connection lived on: %d writes acknowledged after the allowed host moved to B, none failed",
			after(blocktag.Record.OK))
	case "drop":
		waitFor(t, 2*time.Minute, "a write of A's fails after the change", func() bool {
			return after(func(r blocktag.Record) bool { return !r.OK() }) > 0
		})
		recA := stopA()
		st, problems := blocktag.CheckFenced(blocktag.History{Host: hostA, Records: recA, FencedAt: changed})
		for _, p := range problems {
			t.Error(p)
		}
		for _, r := range st.LateAcks {
			t.Errorf("%s; with fast_io_fail_tmo=0 a write in flight at the cut must fail", blocktag.DescribeLateAck(r, changed))
		}
		t.Logf("HOSTCHANGE sim=drop: A cut: first error %s after the change was answered (%v), %d writes failed after it, none acknowledged",
			ms(st.FirstErrorAfter-changed), st.FirstError, st.FailedAfter)
	}
}
