package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/srvlab/rds-csi/pkg/csi"
	"github.com/srvlab/rds-csi/pkg/nvme"
)

// A node whose kernel authenticates keeps one node key across restarts
// and registers it; a node whose kernel cannot registers its name alone.
func TestNodeKeyFollowsTheKernel(t *testing.T) {
	const tokens = "instance=-1,cntlid=-1,transport=%s,nqn=%s,hostnqn=%s,dhchap_secret=%s,dhchap_ctrl_secret=%s\n"
	opts := csi.Options{DriverName: csi.DefaultDriverName, NodeID: "worker-1", NQNPrefix: "nqn.2000-02.com.mikrotik:"}
	start := func(t *testing.T, root string, auth bool) string {
		t.Helper()
		sys, fabrics := filepath.Join(root, "sys"), filepath.Join(root, "nvme-fabrics")
		content := strings.Replace(tokens, ",dhchap_secret=%s,dhchap_ctrl_secret=%s", "", 1)
		if auth {
			content = tokens
			if err := os.MkdirAll(filepath.Join(sys, "module", "nvme_auth"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(fabrics, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		o := &connectorOptions{Kind: connectorTCP, NVMeDir: filepath.Join(root, "etc-nvme")}
		cfg := o.tcpConfig(opts.NQNPrefix)
		cfg.SysRoot, cfg.FabricsPath = sys, fabrics
		c, err := nvme.NewTCPConnector(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ns := csi.NewNodeServer(csi.NewDriver(opts, nil), c, "")
		if err := o.nodeKey(context.Background(), ns, c, opts); err != nil {
			t.Fatal(err)
		}
		id, err := ns.NodeID()
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	root := t.TempDir()
	first := start(t, root, true)
	if !strings.HasPrefix(first, "worker-1/x25519:") {
		t.Fatalf("node ID %q has no node key", first)
	}
	if st, err := os.Stat(filepath.Join(root, "etc-nvme", "rds.csi.srvlab.io.node-key")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("node key file: %v, %v", st, err)
	}
	if again := start(t, root, true); again != first {
		t.Fatalf("the node ID changed across a restart: %q then %q", first, again)
	}
	if without := start(t, t.TempDir(), false); without != "worker-1" {
		t.Fatalf("a node without authentication registered %q", without)
	}
}
