package rds

import (
	"errors"
	"strings"
	"testing"
)

func TestValidateSlotRejectsHostile(t *testing.T) {
	for _, v := range hostile {
		if err := ValidateSlot(v); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ValidateSlot(%q) = %v, want ErrInvalidArgument", v, err)
		}
	}
	for _, ok := range []string{"a", "pvc-1", "pvc-3f1c2f5e-6a1b-4c3d-9e8f-0123456789ab", "snap-0", strings.Repeat("a", 64)} {
		if err := ValidateSlot(ok); err != nil {
			t.Errorf("ValidateSlot(%q) = %v", ok, err)
		}
	}
}

func TestValidateFilePath(t *testing.T) {
	for _, ok := range []string{"/storage-pool/k8s/pvc-1.img", "/p/a_b.c-d"} {
		if err := ValidateFilePath(ok); err != nil {
			t.Errorf("ValidateFilePath(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "relative/x.img", "/", "/a//b", "/a/../b", "/a/./b", "/a/b;c", `/a/"b`, "/a/b c", "/a/$b", "/a/b]", "/a/b\n", "/" + strings.Repeat("a", 300), "/a/.hidden"} {
		if err := ValidateFilePath(bad); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ValidateFilePath(%q) = %v, want ErrInvalidArgument", bad, err)
		}
	}
}

func TestValidateNQN(t *testing.T) {
	for _, ok := range []string{"nqn.2000-02.com.mikrotik:pvc-1", "nqn.2014-08.org.nvmexpress:uuid:3f1c2f5e-6a1b-4c3d-9e8f-0123456789ab"} {
		if err := ValidateNQN(ok); err != nil {
			t.Errorf("ValidateNQN(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "nqn", "iqn.2000-02.com.x:a", "nqn.2000-02.com.mikrotik:pvc 1", `nqn.2000-02.com.mikrotik:a"`, "nqn.2000-02.com.mikrotik:a;b", "nqn.2000-02.com.mikrotik:" + strings.Repeat("a", 220)} {
		if err := ValidateNQN(bad); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ValidateNQN(%q) = %v, want ErrInvalidArgument", bad, err)
		}
	}
}

// TestQuoteRefusesUnvalidatedValue: a value that skipped validation is an
// error, not a panic that takes the controller down, and never a command.
func TestQuoteRefusesUnvalidatedValue(t *testing.T) {
	for _, bad := range []string{`a"b`, `a\b`, "a$b", "a;b", "a[b", "a\nb", "\xff"} {
		if q, err := quote(bad); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("quote(%q) = %q, %v; want ErrInvalidArgument", bad, q, err)
		}
		if cmd, err := command("/disk remove [find slot=%s]", "ok", bad); !errors.Is(err, ErrInvalidArgument) || cmd != "" {
			t.Errorf("command with %q = %q, %v; want no command", bad, cmd, err)
		}
	}
	if q, err := quote("pvc-1"); err != nil || q != `"pvc-1"` {
		t.Errorf("quote(pvc-1) = %q, %v", q, err)
	}
}

// TestValidateHost: an address is a host alone; a port, brackets or a
// space in it are refused by name before anything is dialled.
func TestValidateHost(t *testing.T) {
	for _, ok := range []string{"10.0.0.1", "fd00::1", "fe80::1%eth0", "rds", "rds1.lan", "RDS-1.example.com.", "127.0.0.1"} {
		if err := ValidateHost(ok); err != nil {
			t.Errorf("ValidateHost(%q) = %v", ok, err)
		}
	}
	for _, tc := range []struct{ bad, says string }{
		{"10.0.0.1:4420", "has a port (4420)"},
		{"[fd00::1]:22", "has a port (22)"},
		{"rds.lan:22", "has a port (22)"},
		{"[fd00::1]", "without brackets"},
		{"rds 1", "not a host name"},
		{"", "not a host name"},
		{"-rds", "not a host name"},
		{"rds_1", "not a host name"},
		{"a..b", "not a host name"},
		{"ssh://rds", "not a host name"},
		{strings.Repeat("a", 64), "not a host name"},
		{strings.Repeat("a.", 127) + "aa", "not a host name"},
	} {
		err := ValidateHost(tc.bad)
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("ValidateHost(%q) = %v, want ErrInvalidArgument saying %q", tc.bad, err, tc.says)
		}
	}
}
