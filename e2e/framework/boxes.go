package framework

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/crypto/ssh"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/yaml"

	"github.com/srvlab/rds-csi/pkg/rds"
	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// Several RDS boxes (issue 36): the driver's default box is the Sim of
// StartDriver; more boxes are listed in a --rds-config file (BoxConfig,
// WriteRDSConfig). A box that a test stops (SIGSTOP) or kills is a
// separate simulator process (SimProcess).

// BoxConfig is one entry of --rds-config.
type BoxConfig struct {
	Name           string   `json:"name"`
	Address        string   `json:"address"`
	Port           int      `json:"port"`
	KeyFile        string   `json:"keyFile"`
	KnownHostsFile string   `json:"knownHostsFile"`
	NVMePort       int      `json:"nvmePort"`
	Nodes          []string `json:"nodes,omitempty"`
	CommandTimeout string   `json:"commandTimeout,omitempty"`
}

// Box is the in-process simulator as a box of the list named name, its
// NVMe/TCP port nvmePort (boxes on one address need ports of their own).
func (s *Sim) Box(name string, nvmePort int) BoxConfig {
	return BoxConfig{Name: name, Address: s.Host, Port: s.Port, KeyFile: s.KeyFile, KnownHostsFile: s.KnownHostsFile, NVMePort: nvmePort}
}

// WriteRDSConfig writes the --rds-config list of boxes into dir and
// returns its path.
func WriteRDSConfig(tb testing.TB, dir string, boxes ...BoxConfig) string {
	tb.Helper()
	b, err := yaml.Marshal(map[string][]BoxConfig{"rds": boxes})
	if err != nil {
		tb.Fatal(err)
	}
	p := filepath.Join(dir, "rds-config.yaml")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		tb.Fatal(err)
	}
	return p
}

var simBuild = GoBuild{Name: "rds-sim", Flags: versionFlag, Pkg: "./cmd/rds-sim"}

// SimProcess is bin/rds-sim as a process of its own: a box a test can
// freeze (Pause, SIGSTOP: commands hang, connections stay), continue, or
// kill, and start again on its pool (Restart).
type SimProcess struct {
	*Process
	Name           string
	Host           string
	Port           int
	KeyFile        string
	KnownHostsFile string
	PoolDir        string
	FaultSocket    string
	args           []string
	bin, logPath   string
}

// StartSimProcess builds and starts rds-sim with its pool, host key,
// client key and known_hosts under dir/name, on a port of its own, and
// waits until it accepts connections. poolSize 0: 100 GiB.
func StartSimProcess(tb testing.TB, tl *Timeline, root, dir, name string, poolSize int64) *SimProcess {
	tb.Helper()
	if poolSize == 0 {
		poolSize = 100 << 30
	}
	base := filepath.Join(dir, name)
	keys := filepath.Join(base, "ssh")
	if err := os.MkdirAll(keys, 0o700); err != nil {
		tb.Fatal(err)
	}
	s := &SimProcess{Name: name, Host: "127.0.0.1", KeyFile: filepath.Join(keys, "id_ed25519"), KnownHostsFile: filepath.Join(keys, "known_hosts"),
		PoolDir: filepath.Join(base, "rds"), FaultSocket: filepath.Join(SocketDir(tb), name+"-faults.sock"),
		bin: simBuild.Path(tb, tl, root), logPath: filepath.Join(dir, name+".log")}
	pub, err := rdssim.WriteClientKey(s.KeyFile, "rds-csi e2e "+name)
	if err != nil {
		tb.Fatal(err)
	}
	authKeys := filepath.Join(keys, "authorized_keys")
	if err := os.WriteFile(authKeys, ssh.MarshalAuthorizedKey(pub), 0o600); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.Remove(s.KeyFile) })
	if s.Port, err = FreePort(); err != nil {
		tb.Fatal(err)
	}
	s.args = []string{"--listen", net.JoinHostPort(s.Host, strconv.Itoa(s.Port)), "--data-dir", s.PoolDir,
		"--host-key", filepath.Join(base, "host_key"), "--authorized-keys", authKeys, "--write-known-hosts", s.KnownHostsFile,
		"--pool-size", strconv.FormatInt(poolSize, 10), "--nvme-export=none", "--fault-control", s.FaultSocket}
	s.start(tb, tl)
	return s
}

func (s *SimProcess) start(tb testing.TB, tl *Timeline) {
	tb.Helper()
	_ = os.Remove(s.FaultSocket)
	s.Process = StartProcess(tb, tl, s.Name, s.logPath, s.bin, s.args...)
	addr := net.JoinHostPort(s.Host, strconv.Itoa(s.Port))
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		if s.Exited() {
			return false, fmt.Errorf("exited: %v\n%s", s.ExitErr(), tail(s.logPath, 20))
		}
		if _, err := os.Stat(s.KnownHostsFile); err != nil {
			return false, nil
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false, nil
		}
		c.Close()
		return true, nil
	})
	if err != nil {
		tb.Fatalf("%s on %s: %v", s.Name, addr, err)
	}
	tl.Logf("%s (rds-sim process) listening on %s, pool in %s", s.Name, addr, s.PoolDir)
}

// Restart starts the simulator again on its port, host key and pool,
// after a Kill: the box comes back with the disks it had.
func (s *SimProcess) Restart(tb testing.TB, tl *Timeline) {
	tb.Helper()
	s.start(tb, tl)
}

// Box is the process as a box of the list.
func (s *SimProcess) Box(nvmePort int) BoxConfig {
	return BoxConfig{Name: s.Name, Address: s.Host, Port: s.Port, KeyFile: s.KeyFile, KnownHostsFile: s.KnownHostsFile, NVMePort: nvmePort}
}

// Control sends one fault control request (faults.go) to the process.
func (s *SimProcess) Control(ctx context.Context, request string) (string, error) {
	return FaultControl(ctx, s.FaultSocket, request)
}

// Client is the driver's own RouterOS client for the box (its key and
// pinned host key), to look at what the box holds; closed in tb.Cleanup.
func (s *SimProcess) Client(tb testing.TB) *rds.Client {
	tb.Helper()
	c, err := rds.NewClient(rds.Config{Address: s.Host, Port: s.Port, User: "admin", KeyFile: s.KeyFile, KnownHostsFile: s.KnownHostsFile,
		CommandTimeout: 10 * time.Second, MaxAttempts: 1})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// RegisterTopology is what the kubelet does with a node plugin's
// NodeGetInfo at registration: the CSINode gets the segments' keys as the
// driver's topology keys, and the Node the segments as labels.
func (k *FakeKubelet) RegisterTopology(ctx context.Context, info *csipb.NodeGetInfoResponse) error {
	seg := info.GetAccessibleTopology().GetSegments()
	keys := make([]string, 0, len(seg))
	for key := range seg {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	k.topologyKeys = keys
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := k.client.CoreV1().Nodes().Get(ctx, k.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for key, v := range seg {
			n.Labels[key] = v
		}
		_, err = k.client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("node %s: labels: %w", k.Name, err)
	}
	// A driver's topology keys in a CSINode are immutable: the kubelet
	// drops the driver when its plugin deregisters (the pod's restart)
	// and adds it with the new plugin's keys.
	for _, drivers := range [][]storagev1.CSINodeDriver{nil, {{Name: DriverName, NodeID: k.id(), TopologyKeys: keys}}} {
		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cn, err := k.client.StorageV1().CSINodes().Get(ctx, k.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			cn.Spec.Drivers = drivers
			_, err = k.client.StorageV1().CSINodes().Update(ctx, cn, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("node %s: CSINode: %w", k.Name, err)
	}
	k.tl.Logf("node %s: topology %v registered (as the kubelet does from NodeGetInfo)", k.Name, seg)
	return nil
}
