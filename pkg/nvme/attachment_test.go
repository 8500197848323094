package nvme

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Host NQNs of attachments, as the controller derives them (UUID form),
// and one in another form.
const (
	attachUUID  = "3f2b8c1d-6e4a-4b5c-9d8e-7f6a5b4c3d2e"
	attachA     = uuidNQNPrefix + attachUUID
	attachOld   = "nqn.2014-08.org.nvmexpress:uuid:9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
	attachNamed = "nqn.2024-01.lan.example:attachment-7"
	// attachNamedID: the version 5 UUID of attachNamed in hostIDNamespace
	// (Python: uuid.uuid5(uuid.UUID("0ca6089a-c382-4fef-959c-5d03bfe06606"), name)).
	attachNamedID = "4fec1075-b3e5-5158-9dc3-8518dc70ba3b"
)

func TestAttachmentHostIdentity(t *testing.T) {
	for _, tt := range []struct {
		name, nqn string
		want      HostIdentity
		wantErr   string // part of the error; "" = valid
	}{
		{name: "UUID form: the UUID is the host ID", nqn: attachA, want: HostIdentity{NQN: attachA, ID: attachUUID}},
		{name: "UUID form in capitals", nqn: uuidNQNPrefix + strings.ToUpper(attachUUID), want: HostIdentity{NQN: uuidNQNPrefix + strings.ToUpper(attachUUID), ID: attachUUID}},
		{name: "another form: a UUID derived from the NQN", nqn: attachNamed, want: HostIdentity{NQN: attachNamed, ID: attachNamedID}},
		{name: "empty", nqn: "", wantErr: "empty"},
		{name: "an option smuggled in", nqn: attachA + ",hostid=" + testHostID, wantErr: "not an NVMe qualified name"},
		{name: "whitespace", nqn: attachA + " ", wantErr: "not an NVMe qualified name"},
		{name: "not an NQN", nqn: "worker-1", wantErr: "not an NVMe qualified name"},
		{name: "longer than an NQN may be", nqn: "nqn.2024-01.lan.example:" + strings.Repeat("x", 200), wantErr: "more than the 223"},
		{name: "the discovery NQN", nqn: discoveryNQN, wantErr: "discovery"},
		{name: "UUID form without a UUID", nqn: uuidNQNPrefix + "node-7", wantErr: "no UUID"},
		{name: "UUID form with more after the UUID", nqn: attachA + ":x", wantErr: "no UUID"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := AttachmentHostIdentity(tt.nqn)
			if tt.wantErr != "" {
				if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("AttachmentHostIdentity = %+v, %v; want ErrInvalidArgument saying %q", got, err, tt.wantErr)
				}
				if tt.nqn != "" && strings.Contains(err.Error(), tt.nqn) {
					t.Errorf("the error %q quotes the host NQN, a fencing token", err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("AttachmentHostIdentity = %+v, %v; want %+v", got, err, tt.want)
			}
			if again, _ := AttachmentHostIdentity(tt.nqn); again != got {
				t.Errorf("a second call gave %+v, first %+v", again, got)
			}
		})
	}
}

// The name-based UUID is RFC 9562's version 5 (its example: www.example.com
// in the DNS namespace).
func TestNameUUID(t *testing.T) {
	dns := [16]byte{0x6b, 0xa7, 0xb8, 0x10, 0x9d, 0xad, 0x11, 0xd1, 0x80, 0xb4, 0x00, 0xc0, 0x4f, 0xd4, 0x30, 0xc8}
	if got, want := nameUUID(dns, "www.example.com"), "2ed6657d-e927-568b-95e1-2665a8aea6a2"; got != want {
		t.Errorf("nameUUID = %s, want %s", got, want)
	}
}

// A target with a host NQN connects as that host, with the host ID derived
// from it and never the node's own; without one (or with the node's own
// NQN) as the node.
func TestConnectAsAttachment(t *testing.T) {
	for _, tt := range []struct {
		name            string
		hostNQN         string
		wantNQN, wantID string
		wantErr         error
		nodeID, nodeNQN string // the node's /etc/nvme, when not the default
	}{
		{name: "no host NQN: the node's own", wantNQN: testHostNQN, wantID: testHostID},
		{name: "the node's own NQN named: its own host ID", hostNQN: testHostNQN, wantNQN: testHostNQN, wantID: testHostID},
		{name: "UUID-form attachment NQN", hostNQN: attachA, wantNQN: attachA, wantID: attachUUID},
		{name: "another form", hostNQN: attachNamed, wantNQN: attachNamed, wantID: attachNamedID},
		{name: "malformed", hostNQN: "nqn.2024-01.lan.example:a,b", wantErr: ErrInvalidArgument},
		{name: "the node's host ID under another NQN", hostNQN: uuidNQNPrefix + testHostID, wantErr: ErrInvalidArgument,
			nodeNQN: "nqn.2024-01.lan.example:node-7", nodeID: testHostID},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newFakeHost(t)
			if tt.nodeNQN != "" {
				h.write(filepath.Join(h.etc, "hostnqn"), tt.nodeNQN+"\n")
				h.write(filepath.Join(h.etc, "hostid"), tt.nodeID+"\n")
			}
			c := h.connector()
			var saw []string
			c.kernel = h.connectingKernel("nvme-subsys0", "nvme0", "nvme0n1", &saw)
			_, err := c.Connect(testCtx(t), Target{Address: "10.0.0.5", NQN: nqnA, HostNQN: tt.hostNQN})
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Connect = %v, want %v", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), tt.hostNQN) {
					t.Errorf("the error %q quotes the attachment's host NQN", err)
				}
				if w := h.fabricsWritten(); w != "" {
					t.Errorf("fabrics written: %q", w)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(saw) != 1 {
				t.Fatalf("connects %q, want one", saw)
			}
			if got := optionValue(saw[0], "hostnqn"); got != tt.wantNQN {
				t.Errorf("hostnqn=%s, want %s", got, tt.wantNQN)
			}
			if got := optionValue(saw[0], "hostid"); got != tt.wantID {
				t.Errorf("hostid=%s, want %s", got, tt.wantID)
			}
		})
	}
}

// A refused connect as an attachment is diagnosed with discovery as that
// attachment, and the error does not quote its host NQN.
func TestConnectAsAttachmentRefused(t *testing.T) {
	h := newFakeHost(t)
	c := h.connector()
	c.kernel = func(string) error { return &os.PathError{Op: "write", Path: h.fabrics, Err: syscall.EIO} }
	var asked HostIdentity
	c.discover = func(_ context.Context, _ string, _ int, id HostIdentity) ([]string, error) {
		asked = id
		return nil, nil
	}
	_, err := c.Connect(testCtx(t), Target{Address: "10.0.0.5", NQN: nqnA, HostNQN: attachA})
	if !errors.Is(err, ErrSubsystemNotFound) {
		t.Fatalf("Connect = %v, want ErrSubsystemNotFound", err)
	}
	if strings.Contains(err.Error(), attachA) || !strings.Contains(err.Error(), "attachment host NQN sha256:") {
		t.Errorf("the error %q should name the attachment's host by fingerprint only", err)
	}
	if asked != (HostIdentity{NQN: attachA, ID: attachUUID}) {
		t.Errorf("discovery asked as %+v", asked)
	}
}

// Controllers of the subsystem connected as another host (earlier
// attachments) are disconnected before the connect, and the connect waits
// until they are gone; one connected as the same host is the same
// attachment. A foreign subsystem connected as another host stays.
func TestConnectRemovesEarlierAttachments(t *testing.T) {
	for _, tt := range []struct {
		name        string
		hostNQN     string // the new attachment's; "" = the node's own
		setup       func(h *fakeHost)
		wantDeleted []string // delete_controller written
		wantReaped  []string // gone by the end, written or not
		wantConnect bool
		wantDevice  string
	}{
		{
			name:    "the same attachment again: idempotent",
			hostNQN: attachA,
			setup: func(h *fakeHost) {
				h.subsystem("nvme-subsys0", nqnA)
				h.controllerAs("nvme-subsys0", "nvme0", nqnA, attachA, "live")
				h.head("nvme-subsys0", "nvme0n1")
			},
			wantDevice: "nvme0n1",
		},
		{
			name:    "an earlier attachment's live controller",
			hostNQN: attachA,
			setup: func(h *fakeHost) {
				h.subsystem("nvme-subsys0", nqnA)
				h.controllerAs("nvme-subsys0", "nvme0", nqnA, attachOld, "live")
				h.head("nvme-subsys0", "nvme0n1")
			},
			wantDeleted: []string{"nvme0"}, wantReaped: []string{"nvme0"}, wantConnect: true, wantDevice: "nvme4n1",
		},
		{
			name:    "an attachment from before the upgrade, on the node's own NQN",
			hostNQN: attachA,
			setup: func(h *fakeHost) {
				h.subsystem("nvme-subsys0", nqnA)
				h.controller("nvme-subsys0", "nvme0", nqnA, "live")
				h.head("nvme-subsys0", "nvme0n1")
			},
			wantDeleted: []string{"nvme0"}, wantReaped: []string{"nvme0"}, wantConnect: true, wantDevice: "nvme4n1",
		},
		{
			name:    "a fenced attachment still reconnecting, two paths",
			hostNQN: attachA,
			setup: func(h *fakeHost) {
				h.subsystem("nvme-subsys0", nqnA)
				h.controllerAs("nvme-subsys0", "nvme0", nqnA, attachOld, "connecting")
				h.controllerAs("", "nvme1", nqnA, attachOld, "resetting")
				h.path("nvme0", "nvme0c0n1")
				h.head("nvme-subsys0", "nvme0n1")
			},
			wantDeleted: []string{"nvme0", "nvme1"}, wantReaped: []string{"nvme0", "nvme1"}, wantConnect: true, wantDevice: "nvme4n1",
		},
		{
			name:    "an earlier attachment already being deleted: waited for, not written to",
			hostNQN: attachA,
			setup: func(h *fakeHost) {
				h.subsystem("nvme-subsys0", nqnA)
				h.controllerAs("nvme-subsys0", "nvme0", nqnA, attachOld, "deleting")
			},
			wantReaped: []string{"nvme0"}, wantConnect: true, wantDevice: "nvme4n1",
		},
		{
			name: "an attachment's controller when connecting as the node",
			setup: func(h *fakeHost) {
				h.subsystem("nvme-subsys0", nqnA)
				h.controllerAs("nvme-subsys0", "nvme0", nqnA, attachOld, "live")
				h.head("nvme-subsys0", "nvme0n1")
			},
			wantDeleted: []string{"nvme0"}, wantReaped: []string{"nvme0"}, wantConnect: true, wantDevice: "nvme4n1",
		},
		{
			name:    "the current attachment beside an earlier one: the earlier goes, no connect",
			hostNQN: attachA,
			setup: func(h *fakeHost) {
				h.subsystem("nvme-subsys0", nqnA)
				h.controllerAs("nvme-subsys0", "nvme0", nqnA, attachOld, "connecting")
				h.controllerAs("nvme-subsys0", "nvme3", nqnA, attachA, "live")
				h.head("nvme-subsys0", "nvme0n1")
			},
			wantDeleted: []string{"nvme0"}, wantReaped: []string{"nvme0"}, wantDevice: "nvme0n1",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newFakeHost(t)
			h.subsystem("nvme-subsys9", nqnForeign)
			h.controllerAs("nvme-subsys9", "nvme9", nqnForeign, attachOld, "live")
			tt.setup(h)
			reaped := h.reapDeleted()
			cfg := h.config()
			cfg.PollInterval = time.Millisecond
			c, err := NewTCPConnector(cfg)
			if err != nil {
				t.Fatal(err)
			}
			var saw []string
			kernel := h.connectingKernel("nvme-subsys4", "nvme4", "nvme4n1", &saw)
			c.kernel = func(opts string) error {
				for _, ctrl := range tt.wantReaped {
					if _, err := os.Stat(h.ctrlDir(ctrl)); err == nil {
						t.Errorf("connecting while %s of an earlier attachment is still there", ctrl)
					}
				}
				return kernel(opts)
			}
			dev, err := c.Connect(testCtx(t), Target{Address: "10.0.0.5", NQN: nqnA, HostNQN: tt.hostNQN})
			if err != nil {
				t.Fatal(err)
			}
			if want := filepath.Join(h.dev, tt.wantDevice); dev != want {
				t.Errorf("Connect = %s, want %s", dev, want)
			}
			if tt.wantConnect != (len(saw) == 1) || len(saw) > 1 {
				t.Errorf("connects %q, want a connect: %v", saw, tt.wantConnect)
			}
			want := tt.hostNQN
			if want == "" {
				want = testHostNQN
			}
			for _, opts := range saw {
				if got := optionValue(opts, "hostnqn"); got != want {
					t.Errorf("connected as %s, want %s", got, want)
				}
			}
			got := reaped()
			for _, ctrl := range tt.wantReaped {
				if _, ok := got[ctrl]; !ok {
					t.Errorf("%s of an earlier attachment is still there", ctrl)
				}
			}
			for ctrl, del := range got {
				if wantDel := map[bool]string{true: "1", false: ""}[slices.Contains(tt.wantDeleted, ctrl)]; del != wantDel {
					t.Errorf("%s/delete_controller was %q when it went, want %q", ctrl, del, wantDel)
				}
				if !slices.Contains(tt.wantReaped, ctrl) {
					t.Errorf("%s was deleted", ctrl)
				}
			}
			if got := h.ctrlAttr("nvme9", "delete_controller"); got != "" {
				t.Errorf("the foreign subsystem's controller was deleted (%q)", got)
			}
		})
	}
}

// An earlier attachment's controller that does not go: Connect fails when
// its deadline ends, naming it, and never connects beside it.
func TestConnectWaitsForEarlierAttachmentToGo(t *testing.T) {
	h := newFakeHost(t)
	h.subsystem("nvme-subsys0", nqnA)
	h.controllerAs("nvme-subsys0", "nvme0", nqnA, attachOld, "connecting")
	h.head("nvme-subsys0", "nvme0n1")
	c := h.connector()
	c.kernel = func(string) error {
		t.Error("the kernel was asked to connect beside an earlier attachment")
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := c.Connect(ctx, Target{Address: "10.0.0.5", NQN: nqnA, HostNQN: attachA})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "nvme0") {
		t.Fatalf("Connect = %v, want DeadlineExceeded naming nvme0", err)
	}
	if got := h.ctrlAttr("nvme0", "delete_controller"); got != "1" {
		t.Errorf("nvme0/delete_controller = %q, want 1", got)
	}
}

// A controller whose host NQN sysfs does not show cannot be told apart
// from an earlier attachment's: Connect neither shares nor deletes it;
// it waits (the kernel removes a deleted controller's attributes one by
// one) and when its deadline ends says why.
func TestConnectControllerWithoutHostNQN(t *testing.T) {
	h := newFakeHost(t)
	h.subsystem("nvme-subsys0", nqnA)
	h.controller("nvme-subsys0", "nvme0", nqnA, "live")
	h.head("nvme-subsys0", "nvme0n1")
	h.remove(filepath.Join(h.ctrlDir("nvme0"), "hostnqn"))
	c := h.connector()
	c.kernel = func(string) error { t.Error("the kernel was asked to connect"); return nil }
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := c.Connect(ctx, Target{Address: "10.0.0.5", NQN: nqnA, HostNQN: attachA})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "nvme0") || !strings.Contains(err.Error(), "no hostnqn") {
		t.Fatalf("Connect = %v, want DeadlineExceeded naming nvme0 and the missing hostnqn", err)
	}
	if got := h.ctrlAttr("nvme0", "delete_controller"); got != "" {
		t.Errorf("nvme0 was deleted (%q)", got)
	}
}

// A sysfs attribute read that answers ENODEV (a controller being torn
// down) counts as gone, as ENOENT does: the node's view of its
// controllers skips it instead of failing NodeUnstageVolume.
func TestAttrErrTreatsENODEVAsGone(t *testing.T) {
	err := attrErr(&fs.PathError{Op: "read", Path: "/sys/class/nvme/nvme0/state", Err: syscall.ENODEV})
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("%v: not fs.ErrNotExist", err)
	}
	other := &fs.PathError{Op: "read", Path: "x", Err: syscall.EIO}
	if got := attrErr(other); errors.Is(got, fs.ErrNotExist) || got != error(other) {
		t.Fatalf("EIO became %v", got)
	}
}
