// Command lab-livenessprobe answers a kubelet's HTTP liveness probe with
// the CSI plugin's own Probe, the job of the kubernetes-csi livenessprobe
// sidecar, for the kubelet tier (make e2e-kubelet) on machines where that
// sidecar cannot be built: its module is not served by the Go module proxy
// this project builds from. It takes the flags the chart gives
// livenessprobe and refuses any other:
//
//	--csi-address=/csi/csi.sock   the plugin's socket
//	--http-endpoint=ADDR          where /healthz is served
//	--probe-timeout=5s            the Probe call's deadline
//
// /healthz answers 200 when Probe returns without error and reports ready
// (or leaves ready unset), 500 with the reason otherwise.
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
	"strings"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "lab-livenessprobe:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("lab-livenessprobe", flag.ContinueOnError)
	csiAddress := fs.String("csi-address", "", "the CSI plugin's unix socket")
	httpEndpoint := fs.String("http-endpoint", "", "address of /healthz")
	timeout := fs.Duration("probe-timeout", time.Second, "deadline of each Probe call")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 || *csiAddress == "" || *httpEndpoint == "" {
		return errors.New("--csi-address and --http-endpoint are required, and nothing else")
	}
	conn, err := grpc.NewClient("unix://"+strings.TrimPrefix(*csiAddress, "unix://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	id := csi.NewIdentityClient(conn)
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), *timeout)
		defer cancel()
		resp, err := id.Probe(ctx, &csi.ProbeRequest{})
		switch {
		case err != nil:
			http.Error(w, "Probe: "+err.Error(), http.StatusInternalServerError)
		case resp.GetReady() != nil && !resp.GetReady().GetValue():
			http.Error(w, "the plugin reports not ready", http.StatusInternalServerError)
		default:
			fmt.Fprintln(w, "ok")
		}
	})
	l, err := net.Listen("tcp", *httpEndpoint)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	fmt.Printf("serving /healthz on %s, probing %s\n", l.Addr(), *csiAddress)
	if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
