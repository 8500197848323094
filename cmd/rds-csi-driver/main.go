// Command rds-csi-driver is the CSI plugin for MikroTik ROSE Data Server:
// one binary, run as the controller (--mode=controller), on every node
// (--mode=node) or both (--mode=all). Settings are flags; secrets (the SSH
// key, the pinned known_hosts) are files mounted from a Kubernetes Secret.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/srvlab/rds-csi/pkg/csi"
	"github.com/srvlab/rds-csi/pkg/rds"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	klog.Flush()
	os.Exit(code)
}

// run starts the driver and serves until ctx is done (SIGTERM, SIGINT),
// then stops gracefully. A configuration error is one line on stderr and
// exit status 1.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("rds-csi-driver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	klog.InitFlags(fs)
	var opts csi.Options
	opts.AddFlags(fs)
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *showVersion {
		fmt.Fprintln(stdout, csi.Version)
		return 0
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "rds-csi-driver: "+format+"\n", a...)
		return 1
	}
	if fs.NArg() > 0 {
		return fail("unexpected arguments %q; every setting is a flag", fs.Args())
	}
	if err := opts.Validate(); err != nil {
		return fail("%v", err)
	}
	if opts.Mode == csi.ModeNode {
		return fail("invalid configuration: --mode=node: the node service is not implemented yet; run --mode=controller")
	}

	client, err := rds.NewClient(opts.RDSConfig())
	if err != nil {
		return fail("invalid configuration: RDS client: %v", err)
	}
	defer client.Close()
	d := csi.NewDriver(opts, client)
	srv := csi.NewGRPCServer(csi.NewIdentityServer(d), csi.NewControllerServer(d), nil)
	lis, err := csi.Listen(opts.Endpoint)
	if err != nil {
		return fail("listening on %s: %v", opts.Endpoint, err)
	}
	logger := klog.FromContext(ctx)
	if opts.Mode == csi.ModeAll {
		logger.Info("the node service is not implemented yet; --mode=all serves identity and controller only")
	}
	logger.Info("serving", "version", csi.Version, "driver", opts.DriverName, "mode", opts.Mode,
		"endpoint", opts.Endpoint, "rds", opts.RDSAddress, "rdsName", opts.RDSName)
	if err := csi.Serve(ctx, srv, lis, opts.ShutdownGrace); err != nil {
		logger.Error(err, "gRPC server failed")
		return 1
	}
	logger.Info("stopped")
	return 0
}
