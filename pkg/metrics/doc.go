// Package metrics holds the driver's Prometheus metrics: one Metrics value,
// built in main and passed down, owns every collector and the registry they
// are registered on. All families share the prefix rds_csi_ and follow the
// Prometheus naming conventions (counters end in _total, durations are
// histograms in _seconds, booleans are 0/1 gauges).
//
// Callers record through small methods (PublishResult, Fenced,
// ObserveRDSCommand, SetLeader, ...). A label value that is not a short
// identifier is recorded as "other" and an RDS command keeps only its menu
// path and verb, so a caller can never blow up the number of series by
// passing, say, an error message or a command with a volume ID in it.
//
// It must never register on the global prometheus.DefaultRegisterer or keep
// package-level mutable state: two Metrics values (two drivers in one test
// binary) are fully independent.
package metrics
