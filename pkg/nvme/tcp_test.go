package nvme

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"
)

const (
	nqnA       = testPrefix + "vol-a"
	nqnB       = testPrefix + "vol-b"
	nqnForeign = "nqn.2014-08.org.example:boot-disk"
)

// testCtx bounds a test that waits for something the test itself makes
// happen; the bound is a safety net, never part of an assertion.
// Logs go to the test's log.
func testCtx(t *testing.T) context.Context {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func expiredCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithDeadline(context.Background(), time.Unix(0, 0))
	t.Cleanup(cancel)
	return ctx
}

func notInUse(context.Context, string) (bool, error) { return false, nil }

func TestDevicePath(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(h *fakeHost)
		want    string // device name under DevRoot
		wantErr error
	}{
		{
			name: "single path without multipath",
			setup: func(h *fakeHost) {
				h.subsystem("nvme-subsys0", nqnA)
				h.controller("nvme-subsys0", "nvme0", nqnA, "live")
				h.private("nvme0", "nvme0n1")
			},
			want: "nvme0n1",
		},
		{
			name: "native multipath prefers the head over the paths",
			setup: func(h *fakeHost) {
				h.subsystem("nvme-subsys0", nqnA)
				h.controller("nvme-subsys0", "nvme0", nqnA, "live")
				h.controller("nvme-subsys0", "nvme1", nqnA, "live")
				h.path("nvme0", "nvme0c0n1")
				h.path("nvme1", "nvme0c1n1")
				h.devNode("nvme0c0n1") // even if a path had a node, the head wins
				h.head("nvme-subsys0", "nvme0n1")
			},
			want: "nvme0n1",
		},
		{
			name: "only a path with a device node: use it",
			setup: func(h *fakeHost) {
				h.subsystem("nvme-subsys0", nqnA)
				h.controller("nvme-subsys0", "nvme0", nqnA, "live")
				h.path("nvme0", "nvme0c0n1")
				h.devNode("nvme0c0n1")
			},
			want: "nvme0c0n1",
		},
		{
			name: "only a hidden path: no device yet",
			setup: func(h *fakeHost) {
				h.subsystem("nvme-subsys0", nqnA)
				h.controller("nvme-subsys0", "nvme0", nqnA, "live")
				h.path("nvme0", "nvme0c0n1")
			},
			wantErr: ErrNoDevice,
		},
		{
			name: "head in sysfs but no device node yet",
			setup: func(h *fakeHost) {
				h.subsystem("nvme-subsys0", nqnA)
				h.controller("nvme-subsys0", "nvme0", nqnA, "live")
				h.write(filepath.Join(h.subsysDir("nvme-subsys0"), "nvme0n1", "size"), "2048\n")
			},
			wantErr: ErrNoDevice,
		},
		{
			name: "other subsystems around: picks by NQN",
			setup: func(h *fakeHost) {
				h.subsystem("nvme-subsys0", nqnForeign)
				h.controller("nvme-subsys0", "nvme0", nqnForeign, "live")
				h.head("nvme-subsys0", "nvme0n1")
				h.subsystem("nvme-subsys1", nqnB)
				h.controller("nvme-subsys1", "nvme1", nqnB, "live")
				h.head("nvme-subsys1", "nvme1n1")
				h.subsystem("nvme-subsys2", nqnA)
				h.controller("nvme-subsys2", "nvme2", nqnA, "live")
				h.head("nvme-subsys2", "nvme2n1")
			},
			want: "nvme2n1",
		},
		{
			name: "several namespaces: lowest namespace ID",
			setup: func(h *fakeHost) {
				h.subsystem("nvme-subsys0", nqnA)
				h.controller("nvme-subsys0", "nvme0", nqnA, "live")
				h.head("nvme-subsys0", "nvme0n10")
				h.head("nvme-subsys0", "nvme0n2")
			},
			want: "nvme0n2",
		},
		{
			name: "controller not linked from the subsystem directory",
			setup: func(h *fakeHost) {
				h.controller("", "nvme4", nqnA, "live")
				h.private("nvme4", "nvme4n1")
			},
			want: "nvme4n1",
		},
		{
			name:    "not connected",
			setup:   func(h *fakeHost) { h.subsystem("nvme-subsys0", nqnB) },
			wantErr: ErrNotConnected,
		},
		{
			name:    "no NVMe core at all",
			setup:   func(h *fakeHost) { h.remove(filepath.Join(h.sys, "class")) },
			wantErr: ErrNotConnected,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newFakeHost(t)
			tt.setup(h)
			got, err := h.connector().DevicePath(context.Background(), nqnA)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("DevicePath = %q, %v; want %v", got, err, tt.wantErr)
				}
				if !strings.Contains(err.Error(), nqnA) {
					t.Errorf("error %q does not name the NQN", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := filepath.Join(h.dev, tt.want); got != want {
				t.Errorf("DevicePath = %q, want %q", got, want)
			}
		})
	}
}

func TestConnectFresh(t *testing.T) {
	h := newFakeHost(t)
	c := h.connector()
	var kernelSaw string
	c.kernel = func(opts string) error {
		kernelSaw = opts
		h.subsystem("nvme-subsys3", nqnA)
		h.controller("nvme-subsys3", "nvme3", nqnA, "live")
		h.path("nvme3", "nvme3c3n1")
		h.head("nvme-subsys3", "nvme3n1")
		return nil
	}
	got, err := c.Connect(testCtx(t), Target{Address: "10.0.0.5", Port: 4420, NQN: nqnA})
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(h.dev, "nvme3n1"); got != want {
		t.Errorf("Connect = %q, want %q", got, want)
	}
	want := "transport=tcp,traddr=10.0.0.5,trsvcid=4420,nqn=" + nqnA +
		",hostnqn=" + testHostNQN + ",hostid=" + testHostID +
		",ctrl_loss_tmo=300,reconnect_delay=5,keep_alive_tmo=5,fast_io_fail_tmo=30"
	if w := h.fabricsWritten(); w != want {
		t.Errorf("fabrics got\n%q\nwant\n%q", w, want)
	}
	if kernelSaw != want {
		t.Errorf("the kernel saw %q", kernelSaw)
	}
}

func TestConnectOptions(t *testing.T) {
	h := newFakeHost(t)
	cfg := h.config()
	cfg.CtrlLossTimeout = -1
	cfg.ReconnectDelay = 1500 * time.Millisecond
	cfg.KeepAliveTimeout = 30 * time.Second
	cfg.Resolver = fakeResolver{"rds.storage.lan": {{IP: net.ParseIP("fd00::7")}, {IP: net.ParseIP("192.168.88.10")}}}
	c, err := NewTCPConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w := connectWritten(t, h, c, "rds.storage.lan")
	for _, part := range []string{"traddr=192.168.88.10,", "trsvcid=4420,", ",ctrl_loss_tmo=-1,", ",reconnect_delay=2,", ",keep_alive_tmo=30"} {
		if !strings.Contains(w, part) {
			t.Errorf("fabrics %q lacks %q", w, part)
		}
	}
}

// fast_io_fail_tmo is bounded by default (30 s, within a shorter
// ctrl_loss_tmo); HoldIOUntilCtrlLoss passes none, the kernel's default
// (I/O waits for ctrl_loss_tmo).
func TestConnectOptionsFastIOFail(t *testing.T) {
	tests := []struct {
		name     string
		timeout  time.Duration
		ctrlLoss time.Duration
		want     string // "" = absent
		badCfg   bool
	}{
		{name: "default", want: ",fast_io_fail_tmo=30"},
		{name: "default within a shorter ctrl loss", ctrlLoss: 20 * time.Second, want: ",fast_io_fail_tmo=20"},
		{name: "default with ctrl loss forever", ctrlLoss: -1, want: ",fast_io_fail_tmo=30"},
		{name: "at once", timeout: FailIOAtOnce, want: ",fast_io_fail_tmo=0"},
		{name: "rounded up", timeout: 1500 * time.Millisecond, want: ",fast_io_fail_tmo=2"},
		{name: "hold until ctrl loss", timeout: HoldIOUntilCtrlLoss},
		{name: "other negative", timeout: -3 * time.Second, badCfg: true},
		{name: "longer than the default ctrl loss", timeout: 6 * time.Minute, badCfg: true},
		{name: "longer than ctrl loss", timeout: time.Minute, ctrlLoss: 30 * time.Second, badCfg: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newFakeHost(t)
			cfg := h.config()
			cfg.FastIOFailTimeout = tc.timeout
			cfg.CtrlLossTimeout = tc.ctrlLoss
			c, err := NewTCPConnector(cfg)
			if tc.badCfg {
				if !errors.Is(err, ErrInvalidArgument) {
					t.Fatalf("NewTCPConnector = %v, want ErrInvalidArgument", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			w := connectWritten(t, h, c, "10.0.0.5")
			switch {
			case tc.want == "" && strings.Contains(w, "fast_io_fail_tmo"):
				t.Errorf("fabrics %q passes fast_io_fail_tmo", w)
			case tc.want != "" && !strings.HasSuffix(w, tc.want):
				t.Errorf("fabrics %q does not end with %q", w, tc.want)
			}
		})
	}
}

// connectWritten connects nqnA at address through a kernel that makes the
// controller and its namespace, and returns what was written to
// /dev/nvme-fabrics.
func connectWritten(t *testing.T, h *fakeHost, c *TCPConnector, address string) string {
	t.Helper()
	c.kernel = func(string) error {
		h.controller("", "nvme0", nqnA, "live")
		h.private("nvme0", "nvme0n1")
		return nil
	}
	if _, err := c.Connect(testCtx(t), Target{Address: address, NQN: nqnA}); err != nil {
		t.Fatal(err)
	}
	return h.fabricsWritten()
}

type fakeResolver map[string][]net.IPAddr

func (r fakeResolver) LookupIPAddr(_ context.Context, host string) ([]net.IPAddr, error) {
	if a, ok := r[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func TestConnectAlreadyConnected(t *testing.T) {
	h := newFakeHost(t)
	h.subsystem("nvme-subsys0", nqnA)
	h.controller("nvme-subsys0", "nvme0", nqnA, "live")
	h.head("nvme-subsys0", "nvme0n1")
	c := h.connector()
	c.kernel = func(string) error { t.Error("the kernel was asked to connect again"); return nil }
	got, err := c.Connect(testCtx(t), Target{Address: "10.0.0.5", NQN: nqnA})
	if err != nil {
		t.Fatal(err)
	}
	if got != filepath.Join(h.dev, "nvme0n1") {
		t.Errorf("Connect = %q", got)
	}
	if w := h.fabricsWritten(); w != "" {
		t.Errorf("fabrics written although connected: %q", w)
	}
}

func TestConnectKernelSaysAlready(t *testing.T) {
	// The controller is reconnecting (not live), so a connect is attempted;
	// the kernel answers EALREADY, which is success.
	h := newFakeHost(t)
	h.subsystem("nvme-subsys0", nqnA)
	h.controller("nvme-subsys0", "nvme0", nqnA, "connecting")
	h.head("nvme-subsys0", "nvme0n1")
	c := h.connector()
	c.kernel = func(string) error { return &os.PathError{Op: "write", Path: h.fabrics, Err: syscall.EALREADY} }
	got, err := c.Connect(testCtx(t), Target{Address: "10.0.0.5", NQN: nqnA})
	if err != nil {
		t.Fatal(err)
	}
	if got != filepath.Join(h.dev, "nvme0n1") {
		t.Errorf("Connect = %q", got)
	}
	if h.fabricsWritten() == "" {
		t.Error("no connect was attempted for a controller that is not live")
	}
}

func TestConnectKernelErrors(t *testing.T) {
	for _, tt := range []struct {
		errno syscall.Errno
		want  error
	}{
		{syscall.ECONNREFUSED, ErrTargetUnreachable},
		{syscall.ETIMEDOUT, ErrTargetUnreachable},
		{syscall.EINVAL, ErrConnectFailed},
		{syscall.EIO, ErrConnectFailed},
	} {
		t.Run(tt.errno.Error(), func(t *testing.T) {
			h := newFakeHost(t)
			c := h.connector()
			c.kernel = func(string) error { return &os.PathError{Op: "write", Path: h.fabrics, Err: tt.errno} }
			_, err := c.Connect(testCtx(t), Target{Address: "10.0.0.5", NQN: nqnA})
			if !errors.Is(err, tt.want) || !errors.Is(err, tt.errno) {
				t.Fatalf("Connect err = %v, want %v wrapping %v", err, tt.want, tt.errno)
			}
			if !strings.Contains(err.Error(), nqnA) || !strings.Contains(err.Error(), "10.0.0.5:4420") {
				t.Errorf("error %q does not name the NQN and the target", err)
			}
		})
	}
}

func TestConnectRejectsBadInput(t *testing.T) {
	for _, tt := range []struct {
		name string
		t    Target
		want error
	}{
		{"comma in NQN", Target{Address: "10.0.0.5", NQN: nqnA + ",duplicate_connect"}, ErrInvalidArgument},
		{"foreign NQN", Target{Address: "10.0.0.5", NQN: nqnForeign}, ErrForeignNQN},
		{"prefix alone", Target{Address: "10.0.0.5", NQN: testPrefix}, ErrForeignNQN},
		{"option in address", Target{Address: "10.0.0.5,hostnqn=x", NQN: nqnA}, ErrInvalidArgument},
		{"empty address", Target{NQN: nqnA}, ErrInvalidArgument},
		{"unknown host", Target{Address: "nowhere.invalid", NQN: nqnA}, ErrTargetUnreachable},
		{"bad port", Target{Address: "10.0.0.5", Port: 70000, NQN: nqnA}, ErrInvalidArgument},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newFakeHost(t)
			cfg := h.config()
			cfg.Resolver = fakeResolver{}
			c, err := NewTCPConnector(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Connect(testCtx(t), tt.t); !errors.Is(err, tt.want) {
				t.Fatalf("Connect err = %v, want %v", err, tt.want)
			}
			if w := h.fabricsWritten(); w != "" {
				t.Errorf("fabrics written: %q", w)
			}
		})
	}
}

func TestConnectMissingNamespace(t *testing.T) {
	h := newFakeHost(t)
	h.subsystem("nvme-subsys0", nqnA)
	h.controller("nvme-subsys0", "nvme0", nqnA, "live")
	_, err := h.connector().Connect(expiredCtx(t), Target{Address: "10.0.0.5", NQN: nqnA})
	if !errors.Is(err, ErrNoDevice) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Connect err = %v, want ErrNoDevice and DeadlineExceeded", err)
	}
	for _, s := range []string{nqnA, "nvme0(live)", "exported"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q lacks %q", err, s)
		}
	}
	if got := h.ctrlAttr("nvme0", "delete_controller"); got != "" {
		t.Errorf("a controller this call did not make was deleted (%q)", got)
	}
}

func TestConnectWaitsForNamespace(t *testing.T) {
	h := newFakeHost(t)
	h.subsystem("nvme-subsys0", nqnA)
	h.controller("nvme-subsys0", "nvme0", nqnA, "live")
	c := h.connector()
	type result struct {
		path string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		p, err := c.Connect(testCtx(t), Target{Address: "10.0.0.5", NQN: nqnA})
		done <- result{p, err}
	}()
	// Whether Connect has scanned yet or not, it must find the namespace.
	h.head("nvme-subsys0", "nvme0n1")
	r := <-done
	if r.err != nil || r.path != filepath.Join(h.dev, "nvme0n1") {
		t.Fatalf("Connect = %q, %v", r.path, r.err)
	}
}

func TestConnectRenumbered(t *testing.T) {
	h := newFakeHost(t)
	h.subsystem("nvme-subsys0", nqnA)
	h.controller("nvme-subsys0", "nvme0", nqnA, "live")
	h.head("nvme-subsys0", "nvme0n1")
	c := h.connector()
	ctx := testCtx(t)
	if got, err := c.DevicePath(ctx, nqnA); err != nil || got != filepath.Join(h.dev, "nvme0n1") {
		t.Fatalf("before: DevicePath = %q, %v", got, err)
	}

	// The RDS went away; the kernel dropped the controller and subsystem.
	// Another volume was connected meanwhile and took the freed numbers,
	// and volume A came back under new ones.
	h.remove(h.subsysDir("nvme-subsys0"), h.ctrlDir("nvme0"), filepath.Join(h.dev, "nvme0n1"))
	h.subsystem("nvme-subsys0", nqnB)
	h.controller("nvme-subsys0", "nvme0", nqnB, "live")
	h.head("nvme-subsys0", "nvme0n1")
	h.subsystem("nvme-subsys1", nqnA)
	h.controller("nvme-subsys1", "nvme1", nqnA, "live")
	h.path("nvme1", "nvme1c1n1")
	h.head("nvme-subsys1", "nvme1n1")

	if got, err := c.DevicePath(ctx, nqnA); err != nil || got != filepath.Join(h.dev, "nvme1n1") {
		t.Fatalf("after: DevicePath(A) = %q, %v", got, err)
	}
	if got, err := c.DevicePath(ctx, nqnB); err != nil || got != filepath.Join(h.dev, "nvme0n1") {
		t.Fatalf("after: DevicePath(B) = %q, %v", got, err)
	}
	c.kernel = func(string) error { t.Error("the kernel was asked to connect again"); return nil }
	if got, err := c.Connect(ctx, Target{Address: "10.0.0.5", NQN: nqnA}); err != nil || got != filepath.Join(h.dev, "nvme1n1") {
		t.Fatalf("after: Connect(A) = %q, %v", got, err)
	}
}

func TestConnectMissingFabricsLoadsModule(t *testing.T) {
	h := newFakeHost(t)
	h.remove(h.fabrics)
	cfg := h.config()
	var ran []string
	cfg.Runner = RunnerFunc(func(_ context.Context, name string, args ...string) ([]byte, error) {
		ran = append(ran, name+" "+strings.Join(args, " "))
		h.write(h.fabrics, "")
		return nil, nil
	})
	c, err := NewTCPConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.kernel = func(string) error {
		h.controller("", "nvme0", nqnA, "live")
		h.private("nvme0", "nvme0n1")
		return nil
	}
	if _, err := c.Connect(testCtx(t), Target{Address: "10.0.0.5", NQN: nqnA}); err != nil {
		t.Fatal(err)
	}
	if len(ran) != 1 || ran[0] != "modprobe nvme-tcp" {
		t.Errorf("ran %q, want modprobe nvme-tcp once", ran)
	}
}

func TestConnectCancelledWhileKernelConnects(t *testing.T) {
	h := newFakeHost(t)
	c := h.connector()
	entered := make(chan struct{})
	release := make(chan struct{})
	c.kernel = func(string) error {
		close(entered)
		<-release
		h.controller("", "nvme0", nqnA, "live")
		h.private("nvme0", "nvme0n1")
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := c.Connect(ctx, Target{Address: "10.0.0.5", NQN: nqnA})
		done <- err
	}()
	<-entered
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Connect err = %v, want Canceled", err)
	}

	// The kernel has not answered yet: the NQN stays locked, so a
	// Disconnect cannot run between the connect and its result.
	if err := c.Disconnect(expiredCtx(t), nqnA, notInUse); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Disconnect during the in-flight connect = %v, want DeadlineExceeded", err)
	}
	if got := h.read(filepath.Join(h.dev, "nvme-fabrics")); got == "" {
		t.Error("nothing was written to fabrics")
	}
	close(release)
	// Once the kernel answers, the connector itself deletes the controller
	// the caller was told had failed, and only then releases the lock.
	unlock, err := c.locks.lock(testCtx(t), nqnA)
	if err != nil {
		t.Fatal(err)
	}
	unlock()
	if got := h.ctrlAttr("nvme0", "delete_controller"); got != "1" {
		t.Errorf("delete_controller = %q, want 1: a late connect left its controller behind", got)
	}
}

// disconnectHost has volume A on two paths (one controller linked only from
// class/nvme), one of its controllers already being deleted, another volume
// of this driver, and a foreign subsystem.
func disconnectHost(t *testing.T) *fakeHost {
	h := newFakeHost(t)
	h.subsystem("nvme-subsys0", nqnForeign)
	h.controller("nvme-subsys0", "nvme0", nqnForeign, "live")
	h.head("nvme-subsys0", "nvme0n1")
	h.subsystem("nvme-subsys1", nqnA)
	h.controller("nvme-subsys1", "nvme1", nqnA, "live")
	h.controller("", "nvme2", nqnA, "connecting")
	h.controller("nvme-subsys1", "nvme5", nqnA, "deleting")
	h.path("nvme1", "nvme1c1n1")
	h.path("nvme2", "nvme1c2n1")
	h.head("nvme-subsys1", "nvme1n1")
	h.subsystem("nvme-subsys3", nqnB)
	h.controller("nvme-subsys3", "nvme3", nqnB, "live")
	h.head("nvme-subsys3", "nvme3n1")
	return h
}

var errMountinfo = errors.New("mountinfo unreadable")

func TestDisconnect(t *testing.T) {
	all := []string{"nvme0", "nvme1", "nvme2", "nvme3", "nvme5"}
	tests := []struct {
		name        string
		nqn         string
		inUse       InUseFunc
		wantErr     error
		wantDeleted []string
		wantAsked   bool
	}{
		{name: "deletes only the NQN's controllers", nqn: nqnA, inUse: notInUse, wantDeleted: []string{"nvme1", "nvme2"}, wantAsked: true},
		{name: "not connected is success", nqn: testPrefix + "vol-gone", inUse: notInUse},
		{name: "foreign NQN refused", nqn: nqnForeign, inUse: notInUse, wantErr: ErrForeignNQN},
		{name: "in use", nqn: nqnA, inUse: func(context.Context, string) (bool, error) { return true, nil }, wantErr: ErrInUse, wantAsked: true},
		{name: "in-use check fails", nqn: nqnA, inUse: func(context.Context, string) (bool, error) { return false, errMountinfo }, wantErr: errMountinfo, wantAsked: true},
		{name: "no in-use check", nqn: nqnA, wantErr: ErrInvalidArgument},
		{name: "invalid NQN", nqn: nqnA + ",x", inUse: notInUse, wantErr: ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := disconnectHost(t)
			asked := false
			var inUse InUseFunc
			if tt.inUse != nil {
				inUse = func(ctx context.Context, nqn string) (bool, error) {
					asked = true
					if nqn != tt.nqn {
						t.Errorf("in-use check asked about %q", nqn)
					}
					return tt.inUse(ctx, nqn)
				}
			}
			err := h.connector().Disconnect(testCtx(t), tt.nqn, inUse)
			switch {
			case tt.wantErr == nil && err != nil:
				t.Fatal(err)
			case tt.wantErr != nil && err == nil:
				t.Fatalf("Disconnect succeeded, want %v", tt.wantErr)
			case tt.wantErr != nil && !errors.Is(err, tt.wantErr):
				t.Fatalf("Disconnect err = %v, want %v", err, tt.wantErr)
			}
			if asked != tt.wantAsked {
				t.Errorf("in-use check asked = %v, want %v", asked, tt.wantAsked)
			}
			deleted := map[string]bool{}
			for _, c := range tt.wantDeleted {
				deleted[c] = true
			}
			for _, c := range all {
				got := h.ctrlAttr(c, "delete_controller")
				if want := map[bool]string{true: "1", false: ""}[deleted[c]]; got != want {
					t.Errorf("%s/delete_controller = %q, want %q", c, got, want)
				}
			}
		})
	}
}

func TestDisconnectSkipsControllerThatChangedSubsystem(t *testing.T) {
	h := newFakeHost(t)
	h.subsystem("nvme-subsys1", nqnA)
	// The subsystem directory still links nvme1, but by the time we look
	// at the controller itself it belongs to another subsystem.
	h.controller("nvme-subsys1", "nvme1", nqnForeign, "live")
	if err := h.connector().Disconnect(testCtx(t), nqnA, notInUse); err != nil {
		t.Fatal(err)
	}
	if got := h.ctrlAttr("nvme1", "delete_controller"); got != "" {
		t.Errorf("foreign controller was deleted: %q", got)
	}
}

func TestIsConnected(t *testing.T) {
	h := disconnectHost(t)
	h.subsystem("nvme-subsys7", testPrefix+"vol-dying")
	h.controller("nvme-subsys7", "nvme7", testPrefix+"vol-dying", "deleting (no IO)")
	c := h.connector()
	for nqn, want := range map[string]bool{nqnA: true, nqnB: true, nqnForeign: true, testPrefix + "vol-gone": false, testPrefix + "vol-dying": false} {
		got, err := c.IsConnected(context.Background(), nqn)
		if err != nil || got != want {
			t.Errorf("IsConnected(%s) = %v, %v; want %v", nqn, got, err, want)
		}
	}
}

func TestRefreshSize(t *testing.T) {
	h := disconnectHost(t)
	c := h.connector()
	if err := c.RefreshSize(context.Background(), nqnA); err != nil {
		t.Fatal(err)
	}
	for ctrl, want := range map[string]string{"nvme0": "", "nvme1": "1", "nvme2": "", "nvme3": "", "nvme5": ""} {
		if got := h.ctrlAttr(ctrl, "rescan_controller"); got != want {
			t.Errorf("%s/rescan_controller = %q, want %q", ctrl, got, want)
		}
	}
	if err := c.RefreshSize(context.Background(), testPrefix+"vol-gone"); !errors.Is(err, ErrNotConnected) {
		t.Errorf("RefreshSize(not connected) = %v", err)
	}
	if err := c.RefreshSize(context.Background(), nqnForeign); !errors.Is(err, ErrForeignNQN) {
		t.Errorf("RefreshSize(foreign) = %v", err)
	}
}

func TestNewTCPConnectorValidates(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  Config
	}{
		{"no prefix", Config{}},
		{"prefix without nqn.", Config{NQNPrefix: "2000-02.com.mikrotik:pvc-"}},
		{"prefix with comma", Config{NQNPrefix: "nqn.2000-02.com.mikrotik:pvc,"}},
		{"ctrl loss shorter than reconnect delay", Config{NQNPrefix: testPrefix, CtrlLossTimeout: time.Second, ReconnectDelay: 10 * time.Second}},
		{"negative keep-alive", Config{NQNPrefix: testPrefix, KeepAliveTimeout: -time.Second}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := NewTCPConnector(tt.cfg); !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("NewTCPConnector err = %v, want ErrInvalidArgument", err)
			}
		})
	}
	if _, err := NewTCPConnector(Config{NQNPrefix: "nqn.2000-02.com.mikrotik"}); err != nil {
		t.Errorf("a bare authority prefix is fine: %v", err)
	}
}

func TestKeyedMutex(t *testing.T) {
	var k keyedMutex
	unlockA, err := k.lock(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.lock(expiredCtx(t), "a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second lock of a held key = %v", err)
	}
	unlockB, err := k.lock(context.Background(), "b")
	if err != nil {
		t.Fatalf("other key blocked: %v", err)
	}
	unlockB()
	unlockA()
	unlockA() // releasing twice is harmless
	unlockA2, err := k.lock(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	unlockA2()
	if len(k.locks) != 0 {
		t.Errorf("%d lock entries left behind", len(k.locks))
	}
}

// A refused connect (EIO) is told apart by the target's discovery log: an
// NQN it does not offer this host is ErrSubsystemNotFound; anything else
// stays ErrConnectFailed. EINVAL without the nvme_tcp module names the fix.
func TestConnectRefusedDiagnosis(t *testing.T) {
	errDiscovery := errors.New("discovery failed")
	for _, tt := range []struct {
		name      string
		errno     syscall.Errno
		offered   []string
		discErr   error
		tcpLoaded bool
		want      error
		wantText  string
	}{
		{"NQN not offered", syscall.EIO, []string{nqnB}, nil, true, ErrSubsystemNotFound, testHostNQN},
		{"NQN offered but refused", syscall.EIO, []string{nqnB, nqnA}, nil, true, ErrConnectFailed, "dmesg"},
		{"discovery fails", syscall.EIO, nil, errDiscovery, true, ErrConnectFailed, "dmesg"},
		{"no nvme-tcp module", syscall.EINVAL, nil, nil, false, ErrConnectFailed, "modprobe nvme-tcp"},
		{"EINVAL with the module", syscall.EINVAL, nil, nil, true, ErrConnectFailed, "dmesg"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newFakeHost(t)
			if tt.tcpLoaded {
				h.mkdir(filepath.Join(h.sys, "module", "nvme_tcp"))
			}
			c := h.connector()
			c.kernel = func(string) error { return &os.PathError{Op: "write", Path: h.fabrics, Err: tt.errno} }
			var asked string
			c.discover = func(_ context.Context, addr string, port int, id HostIdentity) ([]string, error) {
				asked = fmt.Sprintf("%s:%d as %s", addr, port, id.NQN)
				return tt.offered, tt.discErr
			}
			_, err := c.Connect(testCtx(t), Target{Address: "10.0.0.5", NQN: nqnA})
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.wantText) {
				t.Fatalf("Connect err = %v, want %v mentioning %q", err, tt.want, tt.wantText)
			}
			if tt.errno == syscall.EIO && asked != "10.0.0.5:4420 as "+testHostNQN {
				t.Errorf("discovery asked %q", asked)
			}
			if tt.errno != syscall.EIO && asked != "" {
				t.Errorf("discovery ran for %v", tt.errno)
			}
		})
	}
}

func TestPaths(t *testing.T) {
	h := disconnectHost(t) // A: nvme1 live, nvme2 connecting, nvme5 deleting
	c := h.connector()
	for _, tt := range []struct {
		nqn         string
		live, total int
	}{{nqnA, 1, 2}, {nqnB, 1, 1}, {testPrefix + "absent", 0, 0}} {
		live, total, err := c.Paths(testCtx(t), tt.nqn)
		if err != nil || live != tt.live || total != tt.total {
			t.Errorf("Paths(%s) = %d, %d, %v; want %d live of %d", tt.nqn, live, total, err, tt.live, tt.total)
		}
	}
}

// A connect that made a controller whose namespace never appeared before
// the caller's deadline takes that controller down again: the caller got
// an error and will not disconnect it. One that was connected before is
// left alone (TestConnectMissingNamespace).
func TestConnectFreshWithoutNamespaceIsUndone(t *testing.T) {
	h := newFakeHost(t)
	c := h.connector()
	c.kernel = func(string) error {
		h.subsystem("nvme-subsys0", nqnA)
		h.controller("nvme-subsys0", "nvme0", nqnA, "live")
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := c.Connect(ctx, Target{Address: "10.0.0.5", NQN: nqnA})
	if !errors.Is(err, ErrNoDevice) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Connect err = %v, want ErrNoDevice and DeadlineExceeded", err)
	}
	if got := h.ctrlAttr("nvme0", "delete_controller"); got != "1" {
		t.Errorf("delete_controller = %q, want 1: the fresh controller was left behind", got)
	}
}

// A device node that exists but does not open yet (ENXIO: the disk is not
// live, seen right after a connect with nvme_core.multipath=N) is not
// handed out; Connect waits for it.
func TestConnectWaitsForAnOpenableDevice(t *testing.T) {
	h := newFakeHost(t)
	h.subsystem("nvme-subsys0", nqnA)
	h.controller("nvme-subsys0", "nvme0", nqnA, "live")
	h.head("nvme-subsys0", "nvme0n1")
	dev := filepath.Join(h.dev, "nvme0n1")
	// A socket opens with ENXIO, as such a node does.
	if err := os.Remove(dev); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", dev)
	if err != nil {
		t.Fatal(err)
	}
	c := h.connector()
	if p, err := c.Connect(expiredCtx(t), Target{Address: "10.0.0.5", NQN: nqnA}); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("Connect with a device that does not open = %q, %v; want ErrNoDevice", p, err)
	}
	l.Close()
	os.Remove(dev)
	h.head("nvme-subsys0", "nvme0n1")
	if p, err := c.Connect(testCtx(t), Target{Address: "10.0.0.5", NQN: nqnA}); err != nil || p != dev {
		t.Fatalf("Connect = %q, %v; want %s", p, err, dev)
	}
}

// A controller of the volume's subsystem that connected as another host
// belongs to an earlier attachment: here one with its own host NQN, still
// live on this node after it was fenced, writes queued. Connect must never
// hand out its device or connect beside it (the new controller would join
// its kernel subsystem and multipath head, and its queued writes would go
// out on the new path): it disconnects it, waits until it is gone, and
// only then connects. Controllers of other subsystems are not touched.
func TestConnectNeverReusesAnotherHostsController(t *testing.T) {
	const earlier = "nqn.2014-08.org.nvmexpress:uuid:7d1c9a52-4e3b-4f60-a1d2-3c4b5a697887"
	h := newFakeHost(t)
	h.subsystem("nvme-subsys0", nqnA)
	h.controllerAs("nvme-subsys0", "nvme0", nqnA, earlier, "live")
	h.head("nvme-subsys0", "nvme0n1")
	h.subsystem("nvme-subsys1", nqnB)
	h.controllerAs("nvme-subsys1", "nvme1", nqnB, earlier, "live")
	h.head("nvme-subsys1", "nvme1n1")
	reaped := h.reapDeleted()
	c := h.connector()
	var saw []string
	kernel := h.connectingKernel("nvme-subsys2", "nvme2", "nvme2n1", &saw)
	c.kernel = func(opts string) error {
		if _, err := os.Stat(h.ctrlDir("nvme0")); err == nil {
			t.Error("the kernel was asked to connect while the earlier attachment's controller nvme0 was still there")
		}
		return kernel(opts)
	}
	got, err := c.Connect(testCtx(t), Target{Address: "10.0.0.5", NQN: nqnA})
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(h.dev, "nvme2n1"); got != want {
		t.Errorf("Connect = %q, want the new controller's %q: the earlier attachment's controller was reused", got, want)
	}
	if del := reaped()["nvme0"]; del != "1" {
		t.Errorf("nvme0 (connected as another host) was not disconnected (delete_controller %q)", del)
	}
	if len(saw) != 1 || optionValue(saw[0], "hostnqn") != testHostNQN {
		t.Errorf("connects %q, want one as the node's host NQN", saw)
	}
	if got := h.ctrlAttr("nvme1", "delete_controller"); got != "" {
		t.Errorf("volume B's controller was deleted (%q)", got)
	}
}

// A subsystem NQN is connected to one target; a Connect of the same NQN
// at another target (the same slot on another RDS: the NQN names no box)
// is refused, never answered with the device of the first, another disk.
func TestConnectRefusesAnNQNConnectedToAnotherTarget(t *testing.T) {
	for _, tc := range []struct {
		name, address string
		port          int
		ok            bool
	}{
		{"the same target", "10.0.0.5", 4420, true},
		{"another address", "10.0.1.5", 4420, false},
		{"another port", "10.0.0.5", 4421, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newFakeHost(t)
			h.subsystem("nvme-subsys0", nqnA)
			h.controller("nvme-subsys0", "nvme0", nqnA, "live")
			h.write(filepath.Join(h.ctrlDir("nvme0"), "address"), "traddr=10.0.0.5,trsvcid=4420,src_addr=10.0.9.9\n")
			h.head("nvme-subsys0", "nvme0n1")
			c := h.connector()
			c.kernel = func(string) error { t.Error("the kernel was asked to connect again"); return nil }
			got, err := c.Connect(testCtx(t), Target{Address: tc.address, Port: tc.port, NQN: nqnA})
			if tc.ok {
				if err != nil || got != filepath.Join(h.dev, "nvme0n1") {
					t.Fatalf("Connect = %q, %v", got, err)
				}
				return
			}
			if !errors.Is(err, ErrOtherTarget) || got != "" {
				t.Fatalf("Connect = %q, %v; want ErrOtherTarget", got, err)
			}
		})
	}
}
