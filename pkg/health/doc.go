// Package health serves the controller's diagnostics over HTTP: /healthz
// (the process is alive and serving), /readyz (every named readiness check
// passes: informers synced, RDS reachable, ...) and any further handler the
// caller mounts, in practice /metrics from pkg/metrics.
//
// /healthz must never depend on anything outside the process: the kubelet
// restarts a container whose liveness fails, and restarting the controller
// does not bring back an unreachable RDS. Readiness is where dependencies
// show. Checks are plain functions passed in by main; this package knows
// nothing of informers, SSH or Prometheus.
package health
