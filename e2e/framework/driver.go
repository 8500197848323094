package framework

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/srvlab/rds-csi/pkg/flagonce"
	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// DriverName is the CSI driver name the e2e deployment uses (the driver's
// default; the harness tests the binary, so it does not import pkg/csi).
const DriverName = "rds.csi.srvlab.io"

// RDSName names the simulator in topology (--rds-name).
const RDSName = "rds-e2e"

// VolumePath is the directory of the volumes' backing files on the RDS.
const VolumePath = "/storage-pool/kubernetes-volumes"

// versionFlag stamps the e2e builds of the driver.
var versionFlag = []string{"-ldflags", "-X github.com/srvlab/rds-csi/pkg/version.Version=e2e"}

var raceDriver = GoBuild{Name: "rds-csi-driver", Flags: append([]string{"-race"}, versionFlag...), Pkg: "./cmd/rds-csi-driver"}

// BuildDriver builds cmd/rds-csi-driver once per test binary into
// .cache/e2e/ (with the race detector, so e2e also checks the driver for
// data races) and returns the binary's path. RDS_CSI_E2E_DRIVER_BIN names
// a prebuilt binary to use instead.
func BuildDriver(tb testing.TB, tl *Timeline, root string) string {
	tb.Helper()
	if bin := os.Getenv("RDS_CSI_E2E_DRIVER_BIN"); bin != "" {
		tl.Logf("driver binary from RDS_CSI_E2E_DRIVER_BIN: %s", bin)
		return bin
	}
	return raceDriver.Path(tb, tl, root)
}

// Driver is the driver binary running in controller mode.
type Driver struct {
	*Process
	Socket   string // unix socket path
	Endpoint string // unix://<Socket>
}

// DriverOptions configure StartDriver.
type DriverOptions struct {
	Name      string   // process name in logs and the timeline; default "rds-csi-driver"
	Socket    string   // default <SocketDir>/<Name>.sock, not in dir: see socketBase
	ExtraArgs []string // replace the standard flags of the same names (the driver refuses a flag given twice)
	// Hostname runs the driver in its own UTS namespace with this host
	// name (leader election identity); see SidecarOptions.Hostname.
	Hostname string
}

// StartDriver runs the driver with --mode=controller against sim, its log
// in dir and its unix socket in a short directory of its own (SocketDir),
// with the Kubernetes API as dep's ServiceAccount and leader election in
// dep's namespace, and waits until it answers Probe with ready. With a nil dep the driver runs without the API (--publish=false).
// It is stopped (SIGTERM) in tb.Cleanup; tests may Kill it earlier to
// simulate a crash.
func StartDriver(tb testing.TB, tl *Timeline, bin, dir string, sim *Sim, dep *Deployment, opts DriverOptions) *Driver {
	tb.Helper()
	if opts.Name == "" {
		opts.Name = "rds-csi-driver"
	}
	if opts.Socket == "" {
		opts.Socket = filepath.Join(SocketDir(tb), opts.Name+".sock")
	}
	if err := checkSocketPath(opts.Socket); err != nil {
		tb.Fatalf("%s: %v", opts.Name, err)
	}
	endpoint := "unix://" + opts.Socket
	args := []string{
		"--mode=controller",
		"--endpoint=" + endpoint,
		"--driver-name=" + DriverName,
		"--rds-address=" + sim.Host,
		"--rds-port=" + strconv.Itoa(sim.Port),
		"--rds-user=admin",
		"--rds-key-file=" + sim.KeyFile,
		"--rds-known-hosts-file=" + sim.KnownHostsFile,
		"--rds-pool=" + rdssim.DefaultPoolName,
		"--rds-volume-path=" + VolumePath,
		"--rds-name=" + RDSName,
		"--shutdown-grace=5s",
		"--v=4",
	}
	if dep != nil {
		args = append(args, "--kubeconfig="+dep.Kubeconfig, "--leader-election", "--leader-election-namespace="+dep.Namespace)
	} else {
		args = append(args, "--publish=false")
	}
	args = flagonce.Replace(args, opts.ExtraArgs)
	bin, args = withHostname(opts.Hostname, bin, args)
	p := StartProcess(tb, tl, opts.Name, filepath.Join(dir, opts.Name+".log"), bin, args...)
	d := &Driver{Process: p, Socket: opts.Socket, Endpoint: endpoint}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := d.WaitReady(ctx); err != nil {
		tb.Fatalf("%s not ready: %v\n%s", opts.Name, err, tail(p.LogPath, 30))
	}
	tl.Logf("%s ready on %s", opts.Name, endpoint)
	return d
}

// WaitReady polls the driver's Probe until it reports ready, the process
// exits, or ctx ends.
func (d *Driver) WaitReady(ctx context.Context) error {
	conn, err := grpc.NewClient("unix://"+d.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ident := csipb.NewIdentityClient(conn)
	var last error
	err = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if d.Exited() {
			return false, fmt.Errorf("exited: %v", d.ExitErr())
		}
		if _, err := os.Stat(d.Socket); err != nil {
			last = err
			return false, nil
		}
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		resp, err := ident.Probe(rctx, &csipb.ProbeRequest{})
		if err != nil {
			last = err
			return false, nil
		}
		if r := resp.GetReady(); r != nil && !r.GetValue() {
			last = fmt.Errorf("probe: not ready")
			return false, nil
		}
		return true, nil
	})
	if err != nil && last != nil {
		return fmt.Errorf("%w (last: %v)", err, last)
	}
	return err
}

// GetPluginInfo asks the CSI Identity service at endpoint (unix://...)
// for the plugin's name and vendor version.
func GetPluginInfo(ctx context.Context, endpoint string) (*csipb.GetPluginInfoResponse, error) {
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return csipb.NewIdentityClient(conn).GetPluginInfo(ctx, &csipb.GetPluginInfoRequest{})
}
