package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	csispec "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/srvlab/rds-csi/pkg/health"
	"github.com/srvlab/rds-csi/pkg/metrics"
)

// diagnostics is the --http-endpoint of a process whose controller process
// does not serve one: node mode, and a controller with --publish=false.
// The controller process serves its own (with the index's checks); then
// diagnostics only lends it the node's metrics through the shared registry.
type diagnostics struct {
	registry           *prometheus.Registry
	checks             []health.Check
	servedByController bool
}

func newDiagnostics() *diagnostics { return &diagnostics{registry: metrics.NewProcessRegistry()} }

// start serves /healthz, /readyz and /metrics on lis (--http-endpoint,
// opened at start) until ctx ends; the returned function waits for the
// server to stop.
func (g *diagnostics) start(ctx context.Context, lis net.Listener) (wait func(), err error) {
	if lis == nil || g.servedByController {
		return func() {}, nil
	}
	srv, err := health.New(g.checks...)
	if err != nil {
		return nil, err
	}
	srv.Handle("/metrics", metrics.RegistryHandler(g.registry))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ctx, lis); err != nil {
			klog.FromContext(ctx).Error(err, "HTTP endpoint failed", "address", lis.Addr().String())
		}
	}()
	return func() { <-done }, nil
}

// timedNode times the node operations a kubelet waits on.
type timedNode struct {
	csispec.NodeServer
	m *metrics.NodeMetrics
}

func timed[Req, Resp any](m *metrics.NodeMetrics, op string, f func(context.Context, Req) (Resp, error)) func(context.Context, Req) (Resp, error) {
	return func(ctx context.Context, req Req) (Resp, error) {
		start := time.Now()
		resp, err := f(ctx, req)
		m.Observe(op, time.Since(start), err)
		return resp, err
	}
}

func (n timedNode) NodeStageVolume(ctx context.Context, r *csispec.NodeStageVolumeRequest) (*csispec.NodeStageVolumeResponse, error) {
	return timed(n.m, metrics.NodeStage, n.NodeServer.NodeStageVolume)(ctx, r)
}

func (n timedNode) NodeUnstageVolume(ctx context.Context, r *csispec.NodeUnstageVolumeRequest) (*csispec.NodeUnstageVolumeResponse, error) {
	return timed(n.m, metrics.NodeUnstage, n.NodeServer.NodeUnstageVolume)(ctx, r)
}

func (n timedNode) NodePublishVolume(ctx context.Context, r *csispec.NodePublishVolumeRequest) (*csispec.NodePublishVolumeResponse, error) {
	return timed(n.m, metrics.NodePublish, n.NodeServer.NodePublishVolume)(ctx, r)
}

func (n timedNode) NodeUnpublishVolume(ctx context.Context, r *csispec.NodeUnpublishVolumeRequest) (*csispec.NodeUnpublishVolumeResponse, error) {
	return timed(n.m, metrics.NodeUnpublish, n.NodeServer.NodeUnpublishVolume)(ctx, r)
}

func (n timedNode) NodeExpandVolume(ctx context.Context, r *csispec.NodeExpandVolumeRequest) (*csispec.NodeExpandVolumeResponse, error) {
	return timed(n.m, metrics.NodeExpand, n.NodeServer.NodeExpandVolume)(ctx, r)
}

// connectedSubsystems counts the NVMe subsystems in sysfs whose NQN has
// the driver's prefix (read at scrape time; 0 when sysfs has none).
func connectedSubsystems(sysRoot, nqnPrefix string) func() float64 {
	return func() float64 {
		files, _ := filepath.Glob(filepath.Join(sysRoot, "class", "nvme-subsystem", "*", "subsysnqn"))
		n := 0
		for _, f := range files {
			if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), nqnPrefix) {
				n++
			}
		}
		return float64(n)
	}
}
