package csi

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/protosanitizer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
)

// MaxSocketPath is the longest path a unix socket can be bound at: the
// kernel's sun_path, less its terminating NUL (107 bytes on Linux).
var MaxSocketPath = len(syscall.RawSockaddrUnix{}.Path) - 1

// CheckSocketPath refuses a unix socket path the kernel cannot bind (it
// would say only "bind: invalid argument").
func CheckSocketPath(p string) error {
	if len(p) > MaxSocketPath {
		return fmt.Errorf("the socket path %s is %d bytes, too long for a unix socket: at most %d bytes (choose a shorter directory)", p, len(p), MaxSocketPath)
	}
	return nil
}

// ParseEndpoint splits a CSI endpoint (unix:///path/csi.sock or
// tcp://127.0.0.1:10000) into a network and an address.
func ParseEndpoint(endpoint string) (network, address string, err error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return "", "", fmt.Errorf("endpoint %q: %w", endpoint, err)
	}
	switch u.Scheme {
	case "unix":
		address = u.Path
		if u.Host != "" { // unix://relative/path
			address = filepath.Join(u.Host, u.Path)
		}
		if address == "" {
			return "", "", fmt.Errorf("endpoint %q has no socket path", endpoint)
		}
		// A path ending in /, /. or /.. names a directory: the bind would
		// fail with "address already in use" once the directory was made.
		if base := path.Base(address); strings.HasSuffix(address, "/") || base == "." || base == ".." {
			return "", "", fmt.Errorf("endpoint %q: the socket path %s names a directory (it ends in /, /. or /..); name the socket file in it, for example %s", endpoint, address, path.Join(address, "csi.sock"))
		}
		if err := CheckSocketPath(address); err != nil {
			return "", "", fmt.Errorf("endpoint %q: %w", endpoint, err)
		}
		return "unix", address, nil
	case "tcp":
		if u.Host == "" {
			return "", "", fmt.Errorf("endpoint %q has no host:port", endpoint)
		}
		return "tcp", u.Host, nil
	}
	return "", "", fmt.Errorf("endpoint %q: scheme must be unix:// or tcp://", endpoint)
}

// Listen opens the endpoint, replacing a stale unix socket left by a
// previous run. A socket that still answers is a live driver's (a second
// start on the same path): it is refused, never unlinked.
func Listen(endpoint string) (net.Listener, error) {
	network, address, err := ParseEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	if network == "unix" {
		// Only a socket is replaced: a typo in --endpoint must never
		// delete a file that happens to be there.
		if fi, err := os.Lstat(address); err == nil {
			if fi.Mode()&os.ModeSocket == 0 {
				return nil, fmt.Errorf("endpoint %s: %s exists and is not a unix socket; refusing to replace it", endpoint, address)
			}
			if c, err := net.DialTimeout("unix", address, staleSocketDialTimeout); err == nil {
				c.Close()
				return nil, fmt.Errorf("endpoint %s: another process serves on %s; stop it first (or choose another --endpoint)", endpoint, address)
			}
			if err := os.Remove(address); err != nil && !os.IsNotExist(err) {
				return nil, fmt.Errorf("removing stale socket %s: %w", address, err)
			}
		} else if err := os.MkdirAll(filepath.Dir(address), 0o750); err != nil {
			return nil, err
		}
	}
	return net.Listen(network, address)
}

// staleSocketDialTimeout bounds the dial that tells a live socket from a
// stale one: a stale one refuses at once, a live one accepts into its
// backlog at once; only a wedged server with a full backlog waits.
const staleSocketDialTimeout = 2 * time.Second

var requestID atomic.Uint64

// logAndMapErrors logs each call with its request and response stripped of
// secrets, and turns any error into a gRPC status in one place.
func logAndMapErrors(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	logger := klog.FromContext(ctx).WithValues("method", info.FullMethod, "id", requestID.Add(1))
	ctx = klog.NewContext(ctx, logger)
	start := time.Now()
	logger.V(4).Info("request", "request", protosanitizer.StripSecrets(req))
	resp, err := handler(ctx, req)
	err = toStatus(err)
	if err != nil {
		logger.Error(err, "failed", "duration", time.Since(start))
	} else {
		logger.V(4).Info("response", "response", protosanitizer.StripSecrets(resp), "duration", time.Since(start))
	}
	return resp, err
}

// recoverPanics turns a panic in a handler into an INTERNAL error for that
// call, logged with its stack, instead of taking down the process and every
// call in flight with it.
func recoverPanics(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if r := recover(); r != nil {
			klog.FromContext(ctx).Error(nil, "panic in handler", "method", info.FullMethod, "panic", r, "stack", string(debug.Stack()))
			resp, err = nil, status.Errorf(codes.Internal, "%s: internal error (a bug in the driver, logged with its stack): %v", info.FullMethod, r)
		}
	}()
	return handler(ctx, req)
}

// NewGRPCServer returns a server with the driver's interceptors and the
// given services registered (nil services are skipped).
func NewGRPCServer(ids csi.IdentityServer, cs csi.ControllerServer, ns csi.NodeServer) *grpc.Server {
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(logAndMapErrors, recoverPanics))
	if ids != nil {
		csi.RegisterIdentityServer(srv, ids)
	}
	if cs != nil {
		csi.RegisterControllerServer(srv, cs)
	}
	if ns != nil {
		csi.RegisterNodeServer(srv, ns)
	}
	return srv
}

// Serve runs srv on lis until ctx is done, then stops gracefully: in-flight
// RPCs finish (bounded by grace), new ones are refused.
func Serve(ctx context.Context, srv *grpc.Server, lis net.Listener, grace time.Duration) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-stopped:
	case <-t.C:
		klog.Warning("graceful stop timed out; closing remaining connections")
		srv.Stop()
	}
	return nil
}
