// Package rdshealth polls the RDS's own health and load (issue 27): its
// RAID arrays and failed or missing drives, the drives' S.M.A.R.T. values,
// the pool's capacity and rates, and each volume's I/O counters, and keeps
// the last good poll as a snapshot for the metrics to read.
//
// Only the controller's leader runs a Poller (Run, on the leadership's
// context), on its own interval; each poll is a fixed three commands
// whatever the number of volumes (pkg/rds/health.go). Prometheus scrapes
// read View, which never touches the RDS.
//
// It must never report a value it did not read: a failed poll keeps the
// last good snapshot, with its age, for at most StaleAfter, then reports
// none (the series disappear); a part that failed (the statistics, the
// pool's traffic) reports nothing for that part. Failures are counted by
// part. It must never label a series with anything but a PV name of this
// driver, a drive or an array slot (bounded: the cluster's PVs, capped at
// MaxVolumes, and the RDS's hardware).
package rdshealth
