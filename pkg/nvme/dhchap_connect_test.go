package nvme

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// The option list a kernel prints when /dev/nvme-fabrics is read without a
// controller: Linux 6.7+ lists dhchap_secret only when built with
// CONFIG_NVME_HOST_AUTH; 6.0 to 6.6 list it always.
const (
	fabricsTokensBase = "instance=-1,cntlid=-1,transport=%s,traddr=%s,trsvcid=%s,nqn=%s,queue_size=%d,nr_io_queues=%d,reconnect_delay=%d,ctrl_loss_tmo=%d,keep_alive_tmo=%d,hostnqn=%s,host_traddr=%s,host_iface=%s,hostid=%s,duplicate_connect,disable_sqflow,hdr_digest,data_digest,nr_write_queues=%d,nr_poll_queues=%d,tos=%d,fast_io_fail_tmo=%d,discovery"
	fabricsTokensAuth = fabricsTokensBase + ",dhchap_secret=%s,dhchap_ctrl_secret=%s\n"
)

// authHost is a fake host whose kernel has NVMe in-band authentication.
func authHost(t *testing.T) *fakeHost {
	h := newFakeHost(t)
	h.write(h.fabrics, fabricsTokensAuth)
	h.mkdir(filepath.Join(h.sys, "module", "nvme_auth"))
	return h
}

func testSecret(t *testing.T) DHCHAPSecret {
	t.Helper()
	s, err := ParseDHCHAPSecret(externalValidSecret)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConnectWithSecretAuthenticates(t *testing.T) {
	h := authHost(t)
	c := h.connector()
	var saw []string
	c.kernel = h.connectingKernel("nvme-subsys0", "nvme0", "nvme0n1", &saw)
	if _, err := c.Connect(testCtx(t), Target{Address: "10.0.0.5", NQN: nqnA, HostNQN: attachA, Secret: testSecret(t)}); err != nil {
		t.Fatal(err)
	}
	if len(saw) != 1 || optionValue(saw[0], "dhchap_secret") != externalValidSecret {
		t.Fatalf("the kernel saw %q, want dhchap_secret=%s", saw, externalValidSecret)
	}
	if optionValue(saw[0], "hostnqn") != attachA {
		t.Fatalf("the secret must go with the attachment's host NQN: %q", saw[0])
	}
}

func TestConnectWithoutSecretSendsNone(t *testing.T) {
	h := authHost(t)
	c := h.connector()
	var saw []string
	c.kernel = h.connectingKernel("nvme-subsys0", "nvme0", "nvme0n1", &saw)
	if _, err := c.Connect(testCtx(t), Target{Address: "10.0.0.5", NQN: nqnA, HostNQN: attachA}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(saw[0], "dhchap") {
		t.Fatalf("no secret, yet the kernel saw %q", saw[0])
	}
}

// A kernel without host authentication is found out before the connect,
// never by a connect that hangs or fails later; nothing reaches the
// kernel, and the error says what to do without showing the secret.
func TestConnectWithSecretRefusedWithoutKernelAuth(t *testing.T) {
	for _, tc := range []struct {
		name, tokens string
		module       string
		why          string
	}{
		{"6.7+ built without CONFIG_NVME_HOST_AUTH", fabricsTokensBase + "\n", "", "does not accept dhchap_secret"},
		{"6.0-6.6 listing the option without CONFIG_NVME_AUTH", fabricsTokensAuth, "", "neither nvme_auth nor nvme_common"},
		{"before 5.17: no option list", "", "", "lists no connect options"},
		{"6.0-6.6 with CONFIG_NVME_AUTH", fabricsTokensAuth, "nvme_common/holders/nvme_core", ""},
		// NVME_TARGET_AUTH selects nvme_common too: loaded for nvmet only,
		// it says nothing of the host.
		{"6.0-6.6 with target authentication only", fabricsTokensAuth, "nvme_common/holders/nvmet", "neither nvme_auth nor nvme_common"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newFakeHost(t)
			h.write(h.fabrics, tc.tokens)
			if tc.module != "" {
				h.mkdir(filepath.Join(h.sys, "module", tc.module))
			}
			c := h.connector()
			var saw []string
			c.kernel = h.connectingKernel("nvme-subsys0", "nvme0", "nvme0n1", &saw)
			_, err := c.Connect(testCtx(t), Target{Address: "10.0.0.5", NQN: nqnA, HostNQN: attachA, Secret: testSecret(t)})
			if tc.why == "" {
				if err != nil || len(saw) != 1 {
					t.Fatalf("Connect = %v after %d kernel connects, want one that succeeds", err, len(saw))
				}
				return
			}
			if !errors.Is(err, ErrAuthUnsupported) || !strings.Contains(err.Error(), tc.why) {
				t.Fatalf("Connect = %v, want ErrAuthUnsupported saying %q", err, tc.why)
			}
			if len(saw) != 0 {
				t.Fatalf("the kernel was asked to connect: %q", saw)
			}
			if strings.Contains(err.Error(), "MWPq") {
				t.Fatalf("the error shows the secret: %v", err)
			}
		})
	}
}

// The check at start loads no module: a missing fabrics device is reported.
func TestAuthUnsupportedWithoutNVMeTCP(t *testing.T) {
	h := newFakeHost(t)
	h.remove(h.fabrics)
	c := h.connector() // its Runner fails the test on any command
	if why := c.AuthUnsupported(); !strings.Contains(why, "nvme-tcp kernel module is not loaded") {
		t.Fatalf("AuthUnsupported = %q", why)
	}
}

// A connect the target refuses for authentication is said to be that
// (ErrAuthFailed, which the CSI layer turns into FAILED_PRECONDITION),
// never taken for an unreachable target or a host the target does not
// know, and without the secret in the message. The kernel answers ENOKEY
// when the target wants a secret and the connect had none, EKEYREJECTED
// when it rejected the secret (Linux 6.12: drivers/nvme/host/auth.c);
// EKEYREJECTED without a secret and EIO are not authentication.
func TestConnectRefusedForAuthentication(t *testing.T) {
	for _, tc := range []struct {
		name   string
		errno  syscall.Errno
		secret bool
		want   error
		says   string
	}{
		{"no secret, the target requires one", syscall.ENOKEY, false, ErrAuthFailed, "the attachment has no secret"},
		{"the secret rejected", syscall.EKEYREJECTED, true, ErrAuthFailed, "the export's password changed"},
		{"a key error without a secret", syscall.EKEYREJECTED, false, ErrConnectFailed, "dmesg"},
		// Older Linux (before nvme-auth answered -EKEYREJECTED) answers a
		// rejected secret with ECONNREFUSED; a target whose discovery
		// answers on the same port did not refuse the TCP connection.
		{"a rejected secret on an older kernel", syscall.ECONNREFUSED, true, ErrAuthFailed, "rejected the attachment's DH-HMAC-CHAP secret"},
		// Linux nvmet dropping the connection before its refusal arrives:
		// the kernel's EIO, the subsystem offered to this host.
		{"an I/O error with a secret, the subsystem offered", syscall.EIO, true, ErrConnectFailed, "the likely reason is the DH-HMAC-CHAP secret"},
		{"an I/O error without a secret, the subsystem offered", syscall.EIO, false, ErrConnectFailed, "e.g. an unknown NQN"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := authHost(t)
			c := h.connector()
			c.kernel = func(string) error { return &os.PathError{Op: "write", Path: h.fabrics, Err: tc.errno} }
			c.discover = func(context.Context, string, int, HostIdentity) ([]string, error) {
				return []string{nqnA}, nil
			}
			target := Target{Address: "10.0.0.5", NQN: nqnA, HostNQN: attachA}
			if tc.secret {
				target.Secret = testSecret(t)
			}
			_, err := c.Connect(testCtx(t), target)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("Connect = %v, want %v saying %q", err, tc.want, tc.says)
			}
			if strings.Contains(err.Error(), externalValidSecret) || strings.Contains(err.Error(), attachA) {
				t.Fatalf("the error shows the secret or the attachment's host NQN: %v", err)
			}
		})
	}
}

// Linux shows a controller's DH-HMAC-CHAP secret in sysfs
// (/sys/class/nvme/nvmeN/dhchap_secret) readable by every user, and sysfs
// is not namespaced: any process or pod on the node could read the secret
// with the host NQN next to it (also world-readable) and connect as the
// attachment from elsewhere. Connect leaves the attribute to root alone,
// also for a controller that was live already (connected by an earlier
// release).
func TestConnectHidesTheSecretInSysfs(t *testing.T) {
	for _, live := range []bool{false, true} {
		h := authHost(t)
		c := h.connector()
		var saw []string
		kernel := h.connectingKernel("nvme-subsys0", "nvme0", "nvme0n1", &saw)
		target := Target{Address: "10.0.0.5", NQN: nqnA, HostNQN: attachA, Secret: testSecret(t)}
		if live {
			// Connected before (options as this connect's), still live.
			if err := kernel(c.options("10.0.0.5", DefaultPort, nqnA, mustAttachmentIdentity(t, attachA), target.Secret)); err != nil {
				t.Fatal(err)
			}
		} else {
			c.kernel = kernel
		}
		if _, err := c.Connect(testCtx(t), target); err != nil {
			t.Fatal(err)
		}
		for _, attr := range []string{"dhchap_secret", "dhchap_ctrl_secret"} {
			fi, err := os.Stat(filepath.Join(h.ctrlDir("nvme0"), attr))
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm()&0o077 != 0 {
				t.Errorf("live=%v: %s is %v after the connect: every user on the node can read the attachment's secret", live, attr, fi.Mode().Perm())
			}
		}
	}
}

func mustAttachmentIdentity(t *testing.T, nqn string) HostIdentity {
	t.Helper()
	id, err := AttachmentHostIdentity(nqn)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// A refused TCP connection stays what it is, with a secret or without,
// when the target's discovery does not answer either.
func TestConnectRefusedTCPWithSecretIsUnreachable(t *testing.T) {
	for _, secret := range []bool{false, true} {
		h := authHost(t)
		c := h.connector()
		c.kernel = func(string) error { return &os.PathError{Op: "write", Path: h.fabrics, Err: syscall.ECONNREFUSED} }
		c.discover = func(context.Context, string, int, HostIdentity) ([]string, error) {
			return nil, syscall.ECONNREFUSED
		}
		target := Target{Address: "10.0.0.5", NQN: nqnA, HostNQN: attachA}
		if secret {
			target.Secret = testSecret(t)
		}
		_, err := c.Connect(testCtx(t), target)
		if !errors.Is(err, ErrTargetUnreachable) || !strings.Contains(err.Error(), "check the RDS address") {
			t.Fatalf("secret %v: Connect = %v, want %v", secret, err, ErrTargetUnreachable)
		}
	}
}

// A controller of the attachment's host that is live without a secret
// (connected before the export had a password) is taken as it is by a
// connect that now carries one: the stage succeeds, and the controller's
// next reconnect (any network blip) goes without the secret and is
// refused, which Do-Not-Retry kernels (6.12) answer by giving the
// controller up. Skipped: the controller hands a secret to a host NQN it
// published without one only if a password is set on a live pre-mode
// attachment's export, which docs/attachments.md ("Turning it on") says it
// never does; and the remedy is undecided: Linux refuses to add a secret
// to a controller made without one (nvme_ctrl_dhchap_secret_store:
// EINVAL), so it is a reconnect (safe only when nothing uses the device)
// or a refusal (which would stop a working volume from staging after a
// kubelet restart). The case of a live controller with another secret
// could write the new one to dhchap_secret (the kernel re-authenticates).
func TestConnectWithSecretToALiveControllerWithout(t *testing.T) {
	t.Skip("issue 26 review: a live controller without a secret is reused by a connect with one; remedy undecided (see the comment)")
	h := authHost(t)
	c := h.connector()
	var saw []string
	kernel := h.connectingKernel("nvme-subsys0", "nvme0", "nvme0n1", &saw)
	if err := kernel(c.options("10.0.0.5", DefaultPort, nqnA, mustAttachmentIdentity(t, attachA), DHCHAPSecret{})); err != nil {
		t.Fatal(err)
	}
	c.kernel = kernel
	_, err := c.Connect(testCtx(t), Target{Address: "10.0.0.5", NQN: nqnA, HostNQN: attachA, Secret: testSecret(t)})
	if err == nil && (len(saw) < 2 || optionValue(saw[len(saw)-1], "dhchap_secret") == "") {
		t.Fatal("a connect with a secret took a live controller made without one: its next reconnect will be refused")
	}
}
