package csi

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/srvlab/rds-csi/pkg/nvme"
)

// tcpConnectorIn is the production NVMe/TCP connector with etcNVMe in
// place of the host's /etc/nvme. Building it and asking its identity
// touch nothing else.
func tcpConnectorIn(t *testing.T, etcNVMe string) *nvme.TCPConnector {
	t.Helper()
	c, err := nvme.NewTCPConnector(nvme.Config{NQNPrefix: testNQNPrefix, EtcNVMeDir: etcNVMe})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestNodeGetInfoNodeID(t *testing.T) {
	const hostNQN = "nqn.2014-08.org.nvmexpress:uuid:0f6c2d1e-8a7b-4c3d-9e0f-1a2b3c4d5e6f"
	loop, err := nvme.NewLoopConnector(nvme.LoopConfig{NQNPrefix: testNQNPrefix,
		Resolve: func(context.Context, string) (string, error) { return "", errors.New("not used") }})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		c    func(t *testing.T) Connector
	}{
		// The node ID is the node name alone: every attachment gets its
		// own host NQN in publish_context (storage fencing), so the
		// node's own says nothing the controller needs.
		{"tcp with the host's /etc/nvme/hostnqn", func(t *testing.T) Connector {
			dir := filepath.Join(t.TempDir(), "nvme")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "hostnqn"), []byte(hostNQN+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			return tcpConnectorIn(t, dir)
		}},
		{"loop", func(*testing.T) Connector { return loop }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			info, err := nodeInfoServer(t, tc.c(t)).NodeGetInfo(context.Background(), &csi.NodeGetInfoRequest{})
			if err != nil {
				t.Fatalf("NodeGetInfo: %v", err)
			}
			if info.NodeId != "worker-1" {
				t.Errorf("node ID %q, want %q", info.NodeId, "worker-1")
			}
			if info.MaxVolumesPerNode != 20 || info.AccessibleTopology.GetSegments()["topology."+DefaultDriverName+"/rds"] != "rds1" {
				t.Errorf("NodeGetInfo = %v", info)
			}
		})
	}
}

// The node's own host NQN (for attachments made before per-attachment
// NQNs) is created on first use and stays the same across restarts.
func TestNodeGetInfoCreatesAStableHostNQN(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "etc", "nvme") // not there yet
	var nqns []string
	for range 2 {
		info, err := nodeInfoServer(t, tcpConnectorIn(t, dir)).NodeGetInfo(context.Background(), &csi.NodeGetInfoRequest{})
		if err != nil || info.NodeId != "worker-1" {
			t.Fatalf("NodeGetInfo: %v, %v", info, err)
		}
		b, err := os.ReadFile(filepath.Join(dir, "hostnqn"))
		if err != nil {
			t.Fatal(err)
		}
		nqns = append(nqns, strings.TrimSpace(string(b)))
	}
	if nqns[0] != nqns[1] || !strings.HasPrefix(nqns[0], "nqn.2014-08.org.nvmexpress:uuid:") {
		t.Errorf("hostnqn %q, then %q after a restart", nqns[0], nqns[1])
	}
}

// The node refuses to register an ID Kubernetes would refuse, or without
// the identity the RDS will see, and says what to fix.
func TestNodeGetInfoRefusals(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string)
		want  []string
	}{
		{"a hostnqn that is no NQN", func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, "hostnqn"), []byte("not an nqn\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, []string{"worker-1", "hostnqn"}},
		{"a hostid that is no UUID", func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, "hostid"), []byte("42\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, []string{"worker-1", "hostid", "not a UUID"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.setup(t, dir)
			ns := nodeInfoServer(t, tcpConnectorIn(t, dir))
			if _, err := ns.NodeID(); err == nil {
				t.Error("NodeID succeeded")
			}
			_, err := ns.NodeGetInfo(context.Background(), &csi.NodeGetInfoRequest{})
			if status.Code(err) != codes.FailedPrecondition {
				t.Fatalf("NodeGetInfo: %v, want FailedPrecondition", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not mention %q", err, w)
				}
			}
		})
	}
}
