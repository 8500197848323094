package csi

import (
	"bytes"
	"strings"
	"testing"

	"github.com/srvlab/rds-csi/pkg/exportauth"
)

func TestNodeIDRoundTrip(t *testing.T) {
	const nqn = "nqn.2014-08.org.nvmexpress:uuid:0f6c2d1e-8a7b-4c3d-9e0f-1a2b3c4d5e6f"
	for _, tc := range []struct{ name, nqn, want string }{
		{"worker-1", nqn, "worker-1/" + nqn},
		{"worker-1.example.com", "", "worker-1.example.com"},
	} {
		id, err := FormatNodeID(tc.name, tc.nqn)
		if err != nil || id != tc.want {
			t.Fatalf("FormatNodeID(%q, %q) = %q, %v; want %q", tc.name, tc.nqn, id, err, tc.want)
		}
		got, err := ParseNodeID(id)
		if err != nil || got.Name != tc.name || got.HostNQN != tc.nqn {
			t.Fatalf("ParseNodeID(%q) = %+v, %v", id, got, err)
		}
	}
}

func TestNodeIDRefusesWhatNoNodeRegisters(t *testing.T) {
	for _, id := range []string{"", "Worker_1", "worker-1/", "worker-1/not an nqn", "/nqn.2014-08.org.nvmexpress:uuid:x", "a/b/c"} {
		if got, err := ParseNodeID(id); err == nil {
			t.Errorf("ParseNodeID(%q) = %+v, want an error", id, got)
		}
	}
	long := "nqn.2014-08.com.example:" + strings.Repeat("x", 180)
	if _, err := FormatNodeID("worker-1", long); err == nil || !strings.Contains(err.Error(), "192") {
		t.Errorf("a node ID over 192 bytes: %v", err)
	}
}

func TestNodeIDCarriesTheNodeKey(t *testing.T) {
	k, err := exportauth.NewNodeKey(bytes.NewReader(bytes.Repeat([]byte{3}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	id, err := FormatNodeID("worker-1", k.Public.String())
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseNodeID(id)
	if err != nil || got.Name != "worker-1" || got.HostNQN != "" || got.Key == nil || *got.Key != k.Public {
		t.Fatalf("ParseNodeID(%q) = %+v, %v", id, got, err)
	}
	for _, bad := range []string{"worker-1/x25519:", "worker-1/x25519:short", "worker-1/x25519:" + strings.Repeat("A", 44)} {
		if _, err := ParseNodeID(bad); err == nil {
			t.Errorf("ParseNodeID(%q) accepted a bad key", bad)
		}
	}
	// The longest name that still fits with a key is said in the error.
	if _, err := FormatNodeID(strings.Repeat("a", 63)+"."+strings.Repeat("b", 63)+"."+strings.Repeat("c", 30), k.Public.String()); err == nil || !strings.Contains(err.Error(), "at most 141 bytes") {
		t.Errorf("a name too long for a key: %v", err)
	}
}

// A node name of 141 bytes still registers its key (192 bytes in all, the
// CSINode limit); 142 bytes do not fit, and the node plugin then registers
// its name alone and refuses authenticated attachments, saying why.
func TestNodeIDWithAKeyAtTheLengthLimit(t *testing.T) {
	k, err := exportauth.NewNodeKey(bytes.NewReader(bytes.Repeat([]byte{5}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	name := func(n int) string {
		return strings.Repeat("a", 63) + "." + strings.Repeat("b", 63) + "." + strings.Repeat("c", n-128)
	}
	id, err := FormatNodeID(name(141), k.Public.String())
	if err != nil || len(id) != MaxNodeIDLength {
		t.Fatalf("a 141-byte name with a key: %d bytes, %v", len(id), err)
	}
	if got, err := ParseNodeID(id); err != nil || got.Key == nil || *got.Key != k.Public || got.Name != name(141) {
		t.Fatalf("ParseNodeID of the longest ID: %+v, %v", got, err)
	}
	d := NewDriver(Options{DriverName: DefaultDriverName, NodeID: name(142)}, nil)
	ns := NewNodeServer(d, nil, "")
	ns.SetNodeKey(k, "")
	if why := ns.AuthUnavailable(); !strings.Contains(why, "at most 141 bytes") {
		t.Fatalf("a 142-byte name with a key: AuthUnavailable = %q", why)
	}
	if id, err := ns.NodeID(); err != nil || id != name(142) {
		t.Fatalf("a 142-byte name registers %q, %v; want its name alone", id, err)
	}
}
