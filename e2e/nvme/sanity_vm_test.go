//go:build nvmevm

package nvme

// Inside the VM (RDS_NVME_VM=1): csi-sanity's Node specs against the
// shipped binaries, as an operator would run them: bin/rds-sim exporting
// through the kernel's nvmet (--nvme-export=nvmet) and bin/rds-csi-driver
// --mode=all with its default, real NVMe/TCP connector.

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
	"github.com/onsi/gomega"
	"golang.org/x/crypto/ssh"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// startProcess runs a binary until the test ends and returns the first
// line of its standard output that starts with waitFor (with a deadline).
// simProcess is bin/rds-sim running with the kernel's nvmet backend, and
// what a client needs to reach it.
type simProcess struct {
	host, key, knownHosts, dataDir string
	port                           int
}

// startSimProcess starts bin/rds-sim (nvmet backend) on a loopback port
// with a fresh client key, its pool under dir; args are added.
func startSimProcess(t testing.TB, dir string, args ...string) simProcess {
	t.Helper()
	s := simProcess{key: filepath.Join(dir, "id_ed25519"), knownHosts: filepath.Join(dir, "known_hosts"), dataDir: filepath.Join(dir, "pool")}
	pub, err := rdssim.WriteClientKey(s.key, "rds-csi@vm")
	if err != nil {
		t.Fatal(err)
	}
	authKeys := filepath.Join(dir, "authorized_keys")
	if err := os.WriteFile(authKeys, ssh.MarshalAuthorizedKey(pub), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := startProcess(t, "rds-sim listening on ", filepath.Join(os.Getenv("RDS_NVME_VM_BIN"), "rds-sim"),
		append([]string{"--listen", "127.0.0.1:0", "--data-dir", s.dataDir,
			"--authorized-keys", authKeys, "--write-known-hosts", s.knownHosts, "--nvme-export=nvmet"}, args...)...)
	host, port, _ := strings.Cut(addr, ":")
	s.host = host
	if s.port, err = strconv.Atoi(port); err != nil {
		t.Fatalf("rds-sim address %q: %v", addr, err)
	}
	return s
}

func startProcess(t testing.TB, waitFor string, name string, args ...string) string {
	t.Helper()
	return startProcessLog(t, waitFor, filepath.Join(t.TempDir(), filepath.Base(name)+".log"), name, args...)
}

// startProcessLog is startProcess with the process's stderr in logPath.
func startProcessLog(t testing.TB, waitFor, logPath, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 30 * time.Second
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		logFile.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logFile.Name())
			t.Logf("%s stderr (tail):\n%s", filepath.Base(name), tailString(string(b), 40))
		}
	})
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if waitFor != "" && strings.HasPrefix(sc.Text(), waitFor) {
				found <- strings.TrimPrefix(sc.Text(), waitFor)
				waitFor = ""
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	if waitFor == "" {
		return ""
	}
	select {
	case v := <-found:
		return v
	case <-time.After(time.Minute):
		t.Fatalf("%s did not print %q within a minute", name, waitFor)
		return ""
	}
}

func tailString(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// startDriver runs bin/rds-csi-driver --mode=all (no publish) against
// sim on a socket in dir, with its default NVMe/TCP connector and extra
// flags, and waits until it answers Probe. It returns the endpoint and the
// file its log (stderr) goes to, and a connection to it (closed when the
// test ends).
func startDriver(t testing.TB, dir string, sim simProcess, extra ...string) (endpoint, logPath string, conn *grpc.ClientConn) {
	t.Helper()
	endpoint = "unix://" + filepath.Join(dir, "csi.sock")
	logPath = filepath.Join(dir, "rds-csi-driver.log")
	startProcessLog(t, "", logPath, filepath.Join(os.Getenv("RDS_NVME_VM_BIN"), "rds-csi-driver"),
		append([]string{"--mode=all", "--publish=false", "--endpoint=" + endpoint, "--node-id=vm-node", "--rds-address=" + sim.host, "--rds-port=" + strconv.Itoa(sim.port),
			"--rds-key-file=" + sim.key, "--rds-known-hosts-file=" + sim.knownHosts, "--shutdown-grace=5s"}, extra...)...)
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("the driver did not come up: %v", err)
	}
	return endpoint, logPath, conn
}

func TestVMSanityBinaries(t *testing.T) {
	if os.Getenv("RDS_NVME_VM") != "1" {
		t.Skip("runs inside the NVMe/TCP VM only (make e2e-nvme)")
	}
	dir := t.TempDir()
	sim := startSimProcess(t, dir, "--pool-size", "4T")
	endpoint, _, _ := startDriver(t, dir, sim)

	cfg := sanity.NewTestConfig()
	cfg.Address = endpoint
	cfg.TargetPath = filepath.Join(dir, "target")
	cfg.StagingPath = filepath.Join(dir, "staging")
	cfg.TestVolumeSize = 1<<30 + 24<<20
	cfg.TestVolumeParameters = map[string]string{"csi.storage.k8s.io/pvc/name": "sanity", "csi.storage.k8s.io/pvc/namespace": "default"}
	gomega.RegisterFailHandler(ginkgo.Fail)
	sc := sanity.GinkgoTest(&cfg)
	suite, reporter := ginkgo.GinkgoConfiguration()
	suite.FocusStrings = []string{"Node Service"}
	reporter.Succinct = true
	reporter.NoColor = true
	counts := map[types.SpecState]int{}
	ginkgo.ReportAfterSuite("counts", func(r ginkgo.Report) {
		for _, sr := range r.SpecReports {
			if sr.LeafNodeType == types.NodeTypeIt {
				counts[sr.State]++
			}
		}
	})
	passed := ginkgo.RunSpecs(t, "rds-csi sanity: Node specs against the binaries over NVMe/TCP", suite, reporter)
	sc.Finalize()
	t.Logf("csi-sanity Node specs against the binaries: %d passed, %d failed, %d skipped",
		counts[types.SpecStatePassed], counts[types.SpecStateFailed]+counts[types.SpecStatePanicked], counts[types.SpecStateSkipped])
	if !passed {
		t.Error("csi-sanity Node specs failed")
	}
}
