package main

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/srvlab/rds-csi/pkg/csi"
	"github.com/srvlab/rds-csi/pkg/nvme"
)

func TestNodeConnectorChoice(t *testing.T) {
	dir := t.TempDir()
	node := []string{"--mode=node", "--node-id=n1", "--rds-name=rds1", "--endpoint=unix://" + dir + "/csi.sock"}
	badNQN := filepath.Join(dir, "bad-nqn")
	if err := os.MkdirAll(badNQN, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(badNQN, "hostnqn"), []byte("not an nqn\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown connector", []string{"--node-connector=iscsi"}, "--node-connector must be tcp or loop"},
		{"loop without its data dir", []string{"--node-connector=loop"}, "needs --node-loop-data-dir"},
		{"loop with a missing data dir", []string{"--node-connector=loop", "--node-loop-data-dir=" + dir + "/nope"}, "is not a directory"},
		{"a data dir without loop", []string{"--node-loop-data-dir=" + dir}, "needs --node-connector=loop"},
		{"an NVMe dir with loop", []string{"--node-connector=loop", "--node-loop-data-dir=" + dir, "--node-nvme-dir=" + dir}, "--node-nvme-dir is for --node-connector=tcp"},
		// Loaded at start: a broken identity stops the plugin before the
		// kubelet registers it, naming the file.
		{"a hostnqn that is no NQN", []string{"--node-nvme-dir=" + badNQN}, badNQN + "/hostnqn"},
		{"an NVMe dir that is a file", []string{"--node-nvme-dir=" + badNQN + "/hostnqn"}, "host's /etc/nvme"},
		{"a negative fast I/O fail timeout", []string{"--nvme-fast-io-fail-timeout=-1s"}, "--nvme-fast-io-fail-timeout must not be negative"},
		{"a fast I/O fail timeout beyond the default ctrl loss timeout", []string{"--nvme-fast-io-fail-timeout=6m"}, "--nvme-fast-io-fail-timeout=6m0s must be shorter than --nvme-ctrl-loss-timeout=5m0s"},
		{"a fast I/O fail timeout as long as the ctrl loss timeout", []string{"--nvme-ctrl-loss-timeout=1m", "--nvme-fast-io-fail-timeout=1m"}, "must be shorter than --nvme-ctrl-loss-timeout=1m0s"},
		{"a fast I/O fail timeout under a second", []string{"--nvme-fast-io-fail-timeout=500ms"}, "shorter than 1s; 0 turns it off"},
		{"a ctrl loss timeout too short to ride out an outage", []string{"--nvme-ctrl-loss-timeout=10s", "--nvme-fast-io-fail-timeout=5s"}, "--nvme-ctrl-loss-timeout=10s is outside 30s..1h0m0s"},
		{"a ctrl loss timeout of forever", []string{"--nvme-ctrl-loss-timeout=-1s"}, "--nvme-ctrl-loss-timeout=-1s is outside"},
		{"a ctrl loss timeout of hours", []string{"--nvme-ctrl-loss-timeout=2h"}, "--nvme-ctrl-loss-timeout=2h0m0s is outside"},
	} {
		var stdout, stderr bytes.Buffer
		want := 2 // a usage error; a broken identity is the host's (1)
		if strings.HasPrefix(tc.name, "a hostnqn") || strings.HasPrefix(tc.name, "an NVMe dir that") {
			want = 1
		}
		if code := run(context.Background(), append(node, tc.args...), &stdout, &stderr); code != want || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%s: exit %d, %q, want %d and %q", tc.name, code, stderr.String(), want, tc.want)
		}
	}
	var o connectorOptions
	if err := (&connectorOptions{Kind: connectorLoop, LoopDataDir: dir}).validate(csi.ModeController); err == nil {
		t.Error("loop accepted in controller mode")
	}
	// The default is NVMe/TCP.
	fsOpts := newFlagSet(&o)
	if err := fsOpts.Parse(nil); err != nil || o.Kind != connectorTCP {
		t.Errorf("default connector %q", o.Kind)
	}
	c, err := o.connector(context.Background(), csi.Options{NQNPrefix: "nqn.2000-02.com.mikrotik:"})
	if _, ok := c.(*nvme.TCPConnector); err != nil || !ok {
		t.Errorf("default connector = %T, %v", c, err)
	}
}

func TestSimulatorFile(t *testing.T) {
	opts := csi.Options{NQNPrefix: "nqn.2000-02.com.mikrotik:", RDSPool: "storage-pool", VolumePath: "/storage-pool/kubernetes-volumes"}
	resolve := simulatorFile("/tmp/rds", opts)
	got, err := resolve(context.Background(), "nqn.2000-02.com.mikrotik:pvc-1")
	if err != nil || got != filepath.FromSlash("/tmp/rds/kubernetes-volumes/pvc-1.img") {
		t.Errorf("resolve = %s, %v", got, err)
	}
	for _, nqn := range []string{"nqn.other:pvc-1", "nqn.2000-02.com.mikrotik:../x"} {
		if _, err := resolve(context.Background(), nqn); err == nil {
			t.Errorf("resolve(%s) accepted", nqn)
		}
	}
}

func newFlagSet(o *connectorOptions) *flag.FlagSet {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	o.addFlags(fs)
	return fs
}

// The NVMe/TCP timers: bounded by default (docs/node.md says why), both
// overridable, and the fast I/O fail timeout's 0 is "off": I/O waits up to
// the ctrl loss timeout.
func TestNVMeTimerFlags(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		args                 []string
		ctrlLoss, fastIOFail time.Duration
	}{
		{"defaults", nil, nvme.DefaultCtrlLossTimeout, nvme.DefaultFastIOFailTimeout},
		{"both set", []string{"--nvme-ctrl-loss-timeout=10m", "--nvme-fast-io-fail-timeout=2m"}, 10 * time.Minute, 2 * time.Minute},
		{"fast I/O fail off", []string{"--nvme-fast-io-fail-timeout=0"}, nvme.DefaultCtrlLossTimeout, nvme.HoldIOUntilCtrlLoss},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var o connectorOptions
			if err := newFlagSet(&o).Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			if err := o.validate(csi.ModeNode); err != nil {
				t.Fatal(err)
			}
			cfg := o.tcpConfig("nqn.2000-02.com.mikrotik:")
			if cfg.CtrlLossTimeout != tc.ctrlLoss || cfg.FastIOFailTimeout != tc.fastIOFail {
				t.Errorf("ctrl loss %v, fast I/O fail %v; want %v, %v", cfg.CtrlLossTimeout, cfg.FastIOFailTimeout, tc.ctrlLoss, tc.fastIOFail)
			}
			if _, err := nvme.NewTCPConnector(cfg); err != nil {
				t.Errorf("the connector refuses the flags' configuration: %v", err)
			}
		})
	}
	if nvme.DefaultFastIOFailTimeout >= nvme.DefaultCtrlLossTimeout || nvme.DefaultCtrlLossTimeout < 3*time.Minute {
		t.Errorf("defaults: fast I/O fail %v must be shorter than ctrl loss %v, and ctrl loss must outlast a 3-minute RDS reboot",
			nvme.DefaultFastIOFailTimeout, nvme.DefaultCtrlLossTimeout)
	}
}

// The node's mount records go where --node-state-dir says, by default
// beside a unix endpoint's socket (in the chart: the host's kubelet plugin
// directory of the driver, which outlives the node plugin's pod); a tcp
// endpoint has no such place.
func TestNodeStateDir(t *testing.T) {
	for _, tc := range []struct {
		flag, endpoint, want string
	}{
		{"", "unix:///csi/csi.sock", "/csi/node-state"},
		{"", "unix:///var/lib/kubelet/plugins/rds.csi.srvlab.io/csi.sock", "/var/lib/kubelet/plugins/rds.csi.srvlab.io/node-state"},
		{"/var/lib/rds-csi", "unix:///csi/csi.sock", "/var/lib/rds-csi"},
		{"/var/lib/rds-csi", "tcp://127.0.0.1:10000", "/var/lib/rds-csi"},
		{"", "tcp://127.0.0.1:10000", ""},
	} {
		if got := (&connectorOptions{StateDir: tc.flag}).stateDir(tc.endpoint); got != tc.want {
			t.Errorf("--node-state-dir=%q --endpoint=%s: %q, want %q", tc.flag, tc.endpoint, got, tc.want)
		}
	}
}
