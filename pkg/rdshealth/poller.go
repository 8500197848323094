package rdshealth

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/srvlab/rds-csi/pkg/rds"
)

// Source is what a poll reads from the RDS (*rds.Client).
type Source interface {
	Health(ctx context.Context, pool string) (rds.HealthReport, error)
	DiskStats(ctx context.Context) (rds.StatsReport, error)
	PoolTraffic(ctx context.Context, slot string) (rds.IOStats, error)
}

// The parts of a poll, the part label of its error counter.
const (
	PartDisks       = "disks"        // /disk print detail: arrays, drives, pool; a poll without it is failed
	PartStats       = "stats"        // /disk print stats detail: I/O counters, S.M.A.R.T.
	PartPoolTraffic = "pool_traffic" // /disk monitor-traffic <pool> once
)

// Parts lists every part.
var Parts = []string{PartDisks, PartStats, PartPoolTraffic}

// Bounds of Config.Interval (--rds-health-interval): below 5s the polls
// are a load of their own on the RDS; beyond an hour a dead drive waits
// too long to be seen.
const (
	MinInterval = 5 * time.Second
	MaxInterval = time.Hour
)

// DefaultMaxVolumes caps the volumes with series of their own.
const DefaultMaxVolumes = 5000

// Config of a Poller.
type Config struct {
	Pool     string        // the pool's mount point (--rds-pool)
	Interval time.Duration // between the starts of two polls
	// PVName maps a volume's slot (its volume handle) to its PV name;
	// false leaves it out of the per-volume series (a snapshot, another
	// tool's disk, a volume whose PV is gone). Its I/O still counts in
	// the pool's.
	PVName func(slot string) (string, bool)
	// MaxVolumes caps the volumes with series of their own (default
	// DefaultMaxVolumes); the ones beyond it, by PV name, are counted in
	// View.VolumesDropped.
	MaxVolumes int
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Polled, when set, is called by Run after each poll with its error.
	Polled func(error)
}

// ValidateInterval checks --rds-health-interval: 0 (off) or within
// MinInterval..MaxInterval.
func ValidateInterval(d time.Duration) error {
	if d != 0 && (d < MinInterval || d > MaxInterval) {
		return fmt.Errorf("--rds-health-interval=%s must be 0 (off) or between %s and %s", d, MinInterval, MaxInterval)
	}
	return nil
}

// Volume is one volume of this driver in a snapshot.
type Volume struct {
	PV   string
	Slot string
	IO   rds.IOStats // Has 0: the statistics did not say
}

// Snapshot is one good poll.
type Snapshot struct {
	Taken   time.Time
	Arrays  []rds.Array
	Drives  []rds.Drive
	Pool    *rds.Pool    // nil: no disk is mounted at the pool
	PoolIO  *rds.IOStats // nil: monitor-traffic failed or printed nothing
	Volumes []Volume     // sorted by PV name
	// VolumesDropped: volumes of this driver beyond MaxVolumes.
	VolumesDropped int
	// Unreadable: entries of the poll's listings the parser skipped, and
	// values it dropped from entries it kept.
	Unreadable int
	// Took: how long the poll's commands took.
	Took time.Duration
}

// View is what the metrics read: never the RDS.
type View struct {
	// Polling: this replica polls (it leads). Only then are the other
	// fields more than zero.
	Polling  bool
	Interval time.Duration
	// Staleness: since the last good poll, or since polling started when
	// none has succeeded yet.
	Staleness time.Duration
	// Snapshot: the last good poll, nil when there is none or it is older
	// than StaleAfter.
	Snapshot *Snapshot
	// Errors: failed parts of polls by part, since the process started
	// (every part present).
	Errors map[string]uint64
	// Failing: by part, the polls in a row in which it failed, 0 since it
	// last succeeded (every part present while polling). The alert on a
	// failing part reads it: a count of polls, whatever the interval.
	Failing map[string]uint64
}

// StaleAfter is how old a snapshot may be and still be reported: three
// intervals, so one failed poll never makes a series blink out, and a
// failing RDS stops reporting old values within minutes.
func StaleAfter(interval time.Duration) time.Duration { return 3 * interval }

// Poller polls one RDS. Safe for concurrent use: Run writes, View reads.
type Poller struct {
	cfg Config
	src Source

	mu      sync.Mutex
	polling int // Runs in progress (one normally)
	since   time.Time
	last    *Snapshot
	errors  map[string]uint64
	failing map[string]uint64 // failed polls in a row, by part
}

// New returns a Poller; nothing runs until Run.
func New(src Source, cfg Config) (*Poller, error) {
	if err := rds.ValidatePoolName(cfg.Pool); err != nil {
		return nil, err
	}
	if cfg.Interval < MinInterval || cfg.Interval > MaxInterval {
		return nil, fmt.Errorf("%w: poll interval %s is outside %s..%s", rds.ErrInvalidArgument, cfg.Interval, MinInterval, MaxInterval)
	}
	if cfg.MaxVolumes <= 0 {
		cfg.MaxVolumes = DefaultMaxVolumes
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.PVName == nil {
		cfg.PVName = func(string) (string, bool) { return "", false }
	}
	p := &Poller{cfg: cfg, src: src, errors: map[string]uint64{}, failing: map[string]uint64{}}
	for _, part := range Parts {
		p.errors[part], p.failing[part] = 0, 0
	}
	return p, nil
}

// Run polls at once and then every Interval until ctx is done (the
// leadership's context: a replica that loses the lease stops polling and
// reports nothing more). Each poll is bounded by the interval.
func (p *Poller) Run(ctx context.Context) {
	p.begin()
	defer p.end()
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, p.cfg.Interval)
		err := p.Poll(pctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			klog.FromContext(ctx).Error(err, "polling the RDS's health failed; its metrics age (rds_csi_rds_health_staleness_seconds)")
		}
		if p.cfg.Polled != nil {
			p.cfg.Polled(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// begin starts a Run's polling.
func (p *Poller) begin() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.polling == 0 {
		p.since, p.last = p.cfg.Now(), nil
	}
	p.polling++
}

// end ends a Run's polling: a replica that no longer leads reports
// nothing, and no part failing.
func (p *Poller) end() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.polling--
	if p.polling == 0 {
		p.last = nil
		for part := range p.failing {
			p.failing[part] = 0
		}
	}
}

// Poll polls once: the disks (which make a poll good or failed), then
// the statistics and the pool's traffic (each counted when it fails, its
// values then absent from the snapshot). It returns the disks' error, or
// the parts' joined. A part cut by the cancellation of ctx (the replica
// lost the leadership) is not counted as failed: the RDS did nothing
// wrong; one cut by ctx's deadline (the interval) is.
func (p *Poller) Poll(ctx context.Context) error {
	start := p.cfg.Now()
	logger := klog.FromContext(ctx)
	report, err := p.src.Health(ctx, p.cfg.Pool)
	if err != nil {
		p.count(ctx, PartDisks)
		return fmt.Errorf("RDS health (/disk print detail): %w", err)
	}
	p.succeeded(PartDisks)
	var errs []error
	st, err := p.src.DiskStats(ctx)
	if err != nil {
		p.count(ctx, PartStats)
		errs = append(errs, fmt.Errorf("RDS disk statistics (/disk print stats detail): %w", err))
	} else {
		p.succeeded(PartStats)
		report.ApplyStats(st)
	}
	snap := &Snapshot{Arrays: report.Arrays, Drives: report.Drives, Pool: report.Pool, Unreadable: len(report.Skipped) + len(st.Skipped)}
	for _, s := range append(report.Skipped, st.Skipped...) {
		logger.Info("WARNING: skipped an RDS health entry the driver cannot read", "entry", s.Number, "reason", s.Err.Error())
	}
	if report.Pool != nil {
		io, err := p.src.PoolTraffic(ctx, report.Pool.Slot)
		if err != nil {
			p.count(ctx, PartPoolTraffic)
			errs = append(errs, fmt.Errorf("RDS pool traffic (/disk monitor-traffic %s once): %w", report.Pool.Slot, err))
		} else {
			p.succeeded(PartPoolTraffic)
			snap.PoolIO = &io
		}
	}
	for _, v := range report.Volumes {
		if pv, ok := p.cfg.PVName(v.Slot); ok && pv != "" {
			snap.Volumes = append(snap.Volumes, Volume{PV: pv, Slot: v.Slot, IO: v.IO})
		}
	}
	sort.Slice(snap.Volumes, func(i, j int) bool { return snap.Volumes[i].PV < snap.Volumes[j].PV })
	if n := len(snap.Volumes) - p.cfg.MaxVolumes; n > 0 {
		snap.VolumesDropped = n
		snap.Volumes = snap.Volumes[:p.cfg.MaxVolumes]
	}
	snap.Taken = p.cfg.Now()
	snap.Took = snap.Taken.Sub(start)
	p.mu.Lock()
	p.last = snap
	p.mu.Unlock()
	return errors.Join(errs...)
}

// count counts a failed part, unless ctx was cancelled (not timed out):
// the leadership ended, and the part was cut, not refused.
func (p *Poller) count(ctx context.Context, part string) {
	if errors.Is(ctx.Err(), context.Canceled) {
		return
	}
	p.mu.Lock()
	p.errors[part]++
	p.failing[part]++
	p.mu.Unlock()
}

// succeeded ends a part's run of failed polls.
func (p *Poller) succeeded(part string) {
	p.mu.Lock()
	p.failing[part] = 0
	p.mu.Unlock()
}

// View is the state for the metrics, read without touching the RDS.
func (p *Poller) View() View {
	p.mu.Lock()
	defer p.mu.Unlock()
	v := View{Polling: p.polling > 0, Errors: make(map[string]uint64, len(p.errors))}
	for k, n := range p.errors {
		v.Errors[k] = n
	}
	if !v.Polling {
		return v
	}
	v.Failing = make(map[string]uint64, len(p.failing))
	for k, n := range p.failing {
		v.Failing[k] = n
	}
	v.Interval = p.cfg.Interval
	now := p.cfg.Now()
	v.Staleness = now.Sub(p.since)
	if p.last != nil {
		v.Staleness = now.Sub(p.last.Taken)
		if v.Staleness <= StaleAfter(p.cfg.Interval) {
			v.Snapshot = p.last
		}
	}
	return v
}
