// Package metrics holds the driver's Prometheus metrics: one Metrics value,
// built in main and passed down, owns every collector and the registry they
// are registered on. All families share the prefix rds_csi_ and follow the
// Prometheus naming conventions (counters end in _total, durations are
// histograms in _seconds, booleans are 0/1 gauges).
//
// Callers record through small methods (ObservePublish, ObserveFence,
// SetLeader, ...) whose label values come from the constants declared here;
// a value outside them is recorded as "other", so a caller can never blow up
// the number of series by passing, say, an error message.
//
// It must never register on the global prometheus.DefaultRegisterer or keep
// package-level mutable state: two Metrics values (two drivers in one test
// binary) are fully independent.
package metrics
