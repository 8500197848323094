package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/srvlab/rds-csi/pkg/rds"
	"github.com/srvlab/rds-csi/pkg/rdshealth"
)

// The RDS's own health and load (issue 27), read from the leader's poll
// (pkg/rdshealth) at scrape time, never from the RDS. Only the replica
// that polls reports the RDS's series; a snapshot older than three poll
// intervals is not reported at all; a value RouterOS did not print is
// not reported (never 0). Per-volume series carry the PV name (this
// driver's PVs only, capped by rdshealth.Config.MaxVolumes); drives and
// arrays their RDS slot.

// Every family carries the RDS box's name (LabelRDS) first.
func healthDesc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(Namespace, "rds", name), help, append([]string{LabelRDS}, labels...), nil)
}

var (
	descPolling = healthDesc("health_polling",
		"1 while this controller replica polls the RDS's health (it leads), 0 otherwise; only the polling replica reports the rds_csi_rds_* health series below.")
	descPollErrors = healthDesc("health_poll_errors_total",
		"Parts of RDS health polls that failed, by part: disks (/disk print detail; the whole poll failed), stats (/disk print stats detail; no volume counters or S.M.A.R.T. values that poll), pool_traffic (/disk monitor-traffic; no pool rates).", "part")
	descPartFailing = healthDesc("health_part_failed_polls",
		"Polls in a row in which the part failed (disks, stats, pool_traffic as in health_poll_errors_total), 0 since it last succeeded; reported by the polling replica only. A count of polls, whatever the interval.", "part")
	descInterval = healthDesc("health_poll_interval_seconds",
		"--rds-health-interval of the polling replica.")
	descStaleness = healthDesc("health_staleness_seconds",
		"Seconds since the last good RDS health poll (since polling started when none has succeeded). Above three intervals the RDS's series are no longer reported.")
	descPollDuration = healthDesc("health_poll_duration_seconds",
		"How long the last good poll's commands took.")
	descUnreadable = healthDesc("health_unreadable_entries",
		"Entries of the last good poll's listings the driver could not read and skipped, and values it could not read and dropped from entries it kept (logged with their text).")
	descDropped = healthDesc("health_volumes_dropped",
		"Volumes of this driver left out of the per-volume series in the last poll because there were more than the cap.")

	descArrayDegraded = healthDesc("array_degraded",
		"1 when the RAID array has a failed or missing member, or RouterOS says it is degraded; 0 when healthy.", "array")
	descArrayFailed = healthDesc("array_failed_members",
		"Members of the RAID array that RouterOS marks failed (raid-member-failed=yes).", "array")
	descArrayMissing = healthDesc("array_missing_members",
		"Members the RAID array is built for (raid-device-count) that /disk no longer lists; absent when raid-device-count was not printed or not readable.", "array")
	descDriveFailed = healthDesc("drive_failed",
		"1 when the drive is marked failed in its RAID array, 0 otherwise.", "drive", "array")
	descDriveTemp = healthDesc("drive_temperature_celsius",
		"The drive's S.M.A.R.T. temperature.", "drive")
	descDriveUsed = healthDesc("drive_percentage_used",
		"The drive's S.M.A.R.T. endurance estimate in percent (100 is the rated life; it can exceed 100).", "drive")
	descDriveWarning = healthDesc("drive_critical_warning",
		"The drive's S.M.A.R.T. critical warning byte (NVMe); any value above 0 is a failing drive: spare, temperature, reliability, read-only or backup-device bits.", "drive")
	descDriveUnsafe = healthDesc("drive_unsafe_shutdowns_total",
		"The drive's S.M.A.R.T. unsafe shutdown count.", "drive")

	descPoolSize = healthDesc("pool_size_bytes", "The pool's size.", "pool")
	descPoolFree = healthDesc("pool_free_bytes", "The pool's free bytes.", "pool")
	descPoolRead = healthDesc("pool_read_ops_per_second",
		"The pool's read operations per second, as /disk monitor-traffic samples them.", "pool")
	descPoolWrite = healthDesc("pool_write_ops_per_second",
		"The pool's write operations per second, as /disk monitor-traffic samples them.", "pool")
	descPoolReadRate = healthDesc("pool_read_bytes_per_second",
		"The pool's read throughput.", "pool")
	descPoolWriteRate = healthDesc("pool_write_bytes_per_second",
		"The pool's write throughput.", "pool")
	descPoolInFlight = healthDesc("pool_in_flight_ops",
		"The pool's operations in flight (its queue depth) when sampled.", "pool")

	descVolReadOps = healthDesc("volume_read_ops_total",
		"Read operations the RDS completed on the volume's disk (rate() gives IOPS).", "pv")
	descVolWriteOps = healthDesc("volume_write_ops_total",
		"Write operations the RDS completed on the volume's disk.", "pv")
	descVolReadBytes = healthDesc("volume_read_bytes_total",
		"Bytes the RDS read from the volume's disk.", "pv")
	descVolWriteBytes = healthDesc("volume_write_bytes_total",
		"Bytes the RDS wrote to the volume's disk.", "pv")
	descVolErrors = healthDesc("volume_io_errors_total",
		"I/O errors on the volume's disk.", "pv")
	descVolActive = healthDesc("volume_active_seconds_total",
		"Time the volume's disk was busy (rate() gives its utilisation).", "pv")
	descVolWait = healthDesc("volume_wait_seconds_total",
		"Time requests to the volume's disk spent waiting.", "pv")
	descVolInFlight = healthDesc("volume_in_flight_ops",
		"Operations in flight on the volume's disk (its queue depth) at the last poll.", "pv")
)

// RDSHealthSource is one box's poller as the metrics read it.
type RDSHealthSource struct {
	RDS  string                // the box's name, the rds label
	View func() rdshealth.View // rdshealth.Poller.View
}

// rdsHealthCollector reports each box's poller's View.
type rdsHealthCollector struct {
	sources []RDSHealthSource
}

func (c rdsHealthCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPolling, descPollErrors, descPartFailing, descInterval, descStaleness, descPollDuration, descUnreadable, descDropped,
		descArrayDegraded, descArrayFailed, descArrayMissing, descDriveFailed, descDriveTemp, descDriveUsed, descDriveWarning, descDriveUnsafe,
		descPoolSize, descPoolFree, descPoolRead, descPoolWrite, descPoolReadRate, descPoolWriteRate, descPoolInFlight,
		descVolReadOps, descVolWriteOps, descVolReadBytes, descVolWriteBytes, descVolErrors, descVolActive, descVolWait, descVolInFlight} {
		ch <- d
	}
}

func (c rdsHealthCollector) Collect(ch chan<- prometheus.Metric) {
	for _, src := range c.sources {
		collectRDSHealth(ch, src.RDS, src.View())
	}
}

// collectRDSHealth reports one box's view.
func collectRDSHealth(ch chan<- prometheus.Metric, box string, v rdshealth.View) {
	gauge := func(d *prometheus.Desc, value float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, value, append([]string{box}, labels...)...)
	}
	counter := func(d *prometheus.Desc, value float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, value, append([]string{box}, labels...)...)
	}
	gauge(descPolling, boolValue(v.Polling))
	for _, part := range rdshealth.Parts {
		counter(descPollErrors, float64(v.Errors[part]), part)
	}
	if !v.Polling {
		return
	}
	for _, part := range rdshealth.Parts {
		gauge(descPartFailing, float64(v.Failing[part]), part)
	}
	gauge(descInterval, v.Interval.Seconds())
	gauge(descStaleness, v.Staleness.Seconds())
	s := v.Snapshot
	if s == nil {
		return
	}
	gauge(descPollDuration, s.Took.Seconds())
	gauge(descUnreadable, float64(s.Unreadable))
	gauge(descDropped, float64(s.VolumesDropped))
	for _, a := range s.Arrays {
		gauge(descArrayDegraded, boolValue(a.Degraded()), a.Slot)
		gauge(descArrayFailed, float64(len(a.Failed)), a.Slot)
		if a.Devices > 0 { // otherwise how many are missing is not known
			gauge(descArrayMissing, float64(a.Missing()), a.Slot)
		}
	}
	for _, d := range s.Drives {
		gauge(descDriveFailed, boolValue(d.Failed), d.Slot, d.Master)
		if d.Temperature != nil {
			gauge(descDriveTemp, *d.Temperature, d.Slot)
		}
		if d.PercentageUsed != nil {
			gauge(descDriveUsed, *d.PercentageUsed, d.Slot)
		}
		if d.CriticalWarning != nil {
			gauge(descDriveWarning, float64(*d.CriticalWarning), d.Slot)
		}
		if d.UnsafeShutdowns != nil {
			counter(descDriveUnsafe, float64(*d.UnsafeShutdowns), d.Slot)
		}
	}
	if p := s.Pool; p != nil {
		gauge(descPoolSize, float64(p.Capacity.Total), p.Slot)
		gauge(descPoolFree, float64(p.Capacity.Free), p.Slot)
		if io := s.PoolIO; io != nil {
			for _, f := range []struct {
				field rds.IOField
				desc  *prometheus.Desc
				value float64
			}{
				{rds.IOReadOpsRate, descPoolRead, io.ReadOpsRate}, {rds.IOWriteOpsRate, descPoolWrite, io.WriteOpsRate},
				{rds.IOReadRate, descPoolReadRate, io.ReadRate}, {rds.IOWriteRate, descPoolWriteRate, io.WriteRate},
				{rds.IOInFlight, descPoolInFlight, float64(io.InFlight)},
			} {
				if io.Has&f.field != 0 {
					gauge(f.desc, f.value, p.Slot)
				}
			}
		}
	}
	for _, vol := range s.Volumes {
		io := vol.IO
		for _, f := range []struct {
			field rds.IOField
			desc  *prometheus.Desc
			value float64
		}{
			{rds.IOReadOps, descVolReadOps, float64(io.ReadOps)}, {rds.IOWriteOps, descVolWriteOps, float64(io.WriteOps)},
			{rds.IOReadBytes, descVolReadBytes, float64(io.ReadBytes)}, {rds.IOWriteBytes, descVolWriteBytes, float64(io.WriteBytes)},
			{rds.IOErrors, descVolErrors, float64(io.Errors)},
			{rds.IOActiveTime, descVolActive, io.ActiveTime.Seconds()}, {rds.IOWaitTime, descVolWait, io.WaitTime.Seconds()},
		} {
			if io.Has&f.field != 0 {
				counter(f.desc, f.value, vol.PV)
			}
		}
		if io.Has&rds.IOInFlight != 0 {
			gauge(descVolInFlight, float64(io.InFlight), vol.PV)
		}
	}
}

// ReportRDSHealth registers the RDS health and load families (issue 27),
// read from each box's poller (rdshealth.Poller.View) at every scrape,
// labelled by box.
func (m *Metrics) ReportRDSHealth(sources ...RDSHealthSource) {
	m.registry.MustRegister(rdsHealthCollector{sources: sources})
}
