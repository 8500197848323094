package metrics

import (
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/status"
)

// Node operations timed by NodeMetrics.
const (
	NodeStage     = "stage"
	NodeUnstage   = "unstage"
	NodePublish   = "publish"
	NodeUnpublish = "unpublish"
	NodeExpand    = "expand"
)

// ResultSuccess is the result label of an operation that succeeded; a
// failure is labelled with its lowercase gRPC code (failedprecondition,
// internal, ...).
const ResultSuccess = "success"

var nodeBuckets = []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}

// NodeMetrics are the node plugin's families: operation latency and
// errors, and the NVMe subsystems connected for this driver.
type NodeMetrics struct {
	ops *prometheus.HistogramVec
}

// NewNodeMetrics registers the node families on reg; connected reports the
// number of this driver's connected NVMe subsystems when scraped.
func NewNodeMetrics(reg prometheus.Registerer, connected func() float64) *NodeMetrics {
	n := &NodeMetrics{ops: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: Namespace, Name: "node_operation_duration_seconds",
		Help:    "Duration of the node service's operations (stage, unstage, publish, unpublish, expand) by result (success, or the failure's lowercase gRPC code).",
		Buckets: nodeBuckets,
	}, []string{"operation", "result"})}
	reg.MustRegister(n.ops, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "node_connected_subsystems",
		Help: "NVMe subsystems of this driver (NQN prefix) connected on this node.",
	}, connected))
	for _, op := range []string{NodeStage, NodeUnstage, NodePublish, NodeUnpublish, NodeExpand} {
		n.ops.WithLabelValues(op, ResultSuccess)
	}
	return n
}

// Observe records one operation.
func (n *NodeMetrics) Observe(op string, d time.Duration, err error) {
	result := ResultSuccess
	if err != nil {
		result = label(strings.ToLower(status.Code(err).String()))
	}
	n.ops.WithLabelValues(label(op), result).Observe(d.Seconds())
}

// NewProcessRegistry is a registry with the Go runtime and process
// collectors, for a process without the controller's Metrics (node mode).
func NewProcessRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// RegistryHandler serves reg in the Prometheus exposition format.
func RegistryHandler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg, ErrorHandling: promhttp.ContinueOnError})
}
