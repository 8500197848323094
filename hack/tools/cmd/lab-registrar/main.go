// Command lab-registrar registers a CSI node plugin with the kubelet, the
// job of the kubernetes-csi node-driver-registrar sidecar, for the
// kubelet tier (make e2e-kubelet) on machines where that sidecar cannot be
// built: its module is not served by the Go module proxy this project
// builds from (docs/BENCHMARKS.md, "The kubelet tier"). It takes the flags
// the chart's DaemonSet gives node-driver-registrar and refuses any other,
// so that the DaemonSet runs as shipped with only the image changed:
//
//	--csi-address=/csi/csi.sock                 the node plugin's socket, in this container
//	--kubelet-registration-path=<kubelet dir>/plugins/<driver>/csi.sock
//	                                            the same socket as the kubelet reaches it
//	--http-endpoint=127.0.0.1:9819              /healthz
//	--v=2
//
// It asks the node plugin its name (GetPluginInfo), serves the kubelet's
// plugin registration API (k8s.io/kubelet pluginregistration v1) on
// /registration/<driver>-reg.sock, where the kubelet's plugin watcher
// finds it, and answers GetInfo with the registration path. /healthz
// answers 200 while the registration socket accepts connections and the
// kubelet has not refused the plugin. A refusal (NotifyRegistrationStatus
// with an error) is logged and ends the process with status 1, so the
// container restarts and the kubelet tries again.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// registrationDir is where the DaemonSet mounts the kubelet's
// plugins_registry directory.
const registrationDir = "/registration"

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "lab-registrar:", err)
		os.Exit(1)
	}
}

type registrar struct {
	registerapi.UnimplementedRegistrationServer
	driver, endpoint string
	refused          atomic.Value // string: the kubelet's error
	registered       atomic.Bool
	fail             chan error
}

func (r *registrar) GetInfo(ctx context.Context, _ *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	fmt.Printf("kubelet: GetInfo; answering %s at %s\n", r.driver, r.endpoint)
	return &registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: r.driver, Endpoint: r.endpoint, SupportedVersions: []string{"1.0.0"}}, nil
}

func (r *registrar) NotifyRegistrationStatus(ctx context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if !s.PluginRegistered {
		r.refused.Store(s.Error)
		fmt.Printf("kubelet: registration of %s refused: %s\n", r.driver, s.Error)
		select {
		case r.fail <- fmt.Errorf("the kubelet refused the plugin: %s", s.Error):
		default:
		}
		return &registerapi.RegistrationStatusResponse{}, nil
	}
	r.registered.Store(true)
	fmt.Printf("kubelet: %s registered\n", r.driver)
	return &registerapi.RegistrationStatusResponse{}, nil
}

func run(args []string) error {
	fs := flag.NewFlagSet("lab-registrar", flag.ContinueOnError)
	csiAddress := fs.String("csi-address", "", "the CSI node plugin's unix socket in this container")
	regPath := fs.String("kubelet-registration-path", "", "the same socket as the kubelet reaches it on the node")
	httpEndpoint := fs.String("http-endpoint", "", "address of the /healthz endpoint (empty: none)")
	fs.Int("v", 0, "log level (accepted for node-driver-registrar's flags; this program logs every step)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 || *csiAddress == "" || *regPath == "" {
		return errors.New("--csi-address and --kubelet-registration-path are required, and nothing else")
	}
	if !filepath.IsAbs(*regPath) {
		return fmt.Errorf("--kubelet-registration-path %q is not an absolute path", *regPath)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	driver, err := pluginName(ctx, *csiAddress)
	if err != nil {
		return err
	}
	sock := filepath.Join(registrationDir, driver+"-reg.sock")
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("registration socket: %w", err)
	}
	r := &registrar{driver: driver, endpoint: *regPath, fail: make(chan error, 1)}
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, r)
	go func() { _ = srv.Serve(l) }()
	defer srv.Stop()
	fmt.Printf("serving the registration of %s on %s (kubelet endpoint %s)\n", driver, sock, *regPath)

	if *httpEndpoint != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
			if e, _ := r.refused.Load().(string); e != "" {
				http.Error(w, "the kubelet refused the plugin: "+e, http.StatusServiceUnavailable)
				return
			}
			c, err := net.DialTimeout("unix", sock, time.Second)
			if err != nil {
				http.Error(w, "registration socket: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
			c.Close()
			fmt.Fprintln(w, "ok")
		})
		hl, err := net.Listen("tcp", *httpEndpoint)
		if err != nil {
			return err
		}
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = hs.Serve(hl) }()
		defer hs.Close()
	}
	select {
	case <-ctx.Done():
		_ = os.Remove(sock)
		return nil
	case err := <-r.fail:
		_ = os.Remove(sock)
		return err
	}
}

// pluginName asks the node plugin on address its name, retrying until it
// answers (the plugin may start after this container).
func pluginName(ctx context.Context, address string) (string, error) {
	target := "unix://" + strings.TrimPrefix(address, "unix://")
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	id := csi.NewIdentityClient(conn)
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := id.GetPluginInfo(cctx, &csi.GetPluginInfoRequest{})
		cancel()
		if err == nil {
			if resp.GetName() == "" {
				return "", errors.New("the plugin reports no name")
			}
			return resp.GetName(), nil
		}
		fmt.Printf("waiting for the CSI plugin at %s: %v\n", address, err)
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
