//go:build review27

package rdshealth

import (
	"context"
	"testing"
	"time"

	"github.com/srvlab/rds-csi/pkg/rds"
)

// Review of issue 27 (outside reviewer): holes in the poller.

// review27BlockingSource blocks /disk print detail until its context ends,
// as an SSH command does when the leadership's context is cancelled
// mid-poll.
type review27BlockingSource struct{ entered chan struct{} }

func (s review27BlockingSource) Health(ctx context.Context, _ string) (rds.HealthReport, error) {
	close(s.entered)
	<-ctx.Done()
	return rds.HealthReport{}, ctx.Err()
}

func (review27BlockingSource) DiskStats(context.Context) (rds.StatsReport, error) {
	return rds.StatsReport{}, nil
}

func (review27BlockingSource) PoolTraffic(context.Context, string) (rds.IOStats, error) {
	return rds.IOStats{}, nil
}

// HOLE (every leadership hand-over that lands during a poll, such as a
// rolling update of the controller, counts a failed `disks` poll in
// rds_csi_rds_health_poll_errors_total although the RDS answered nothing
// wrong: the poll's error counter, which the issue makes the signal of a
// failing poll, counts the replica's own cancellation; the log line is
// suppressed for it, the count is not):
// input: the leadership's context is cancelled while /disk print detail runs.
func TestReview27LeadershipLossIsNotAPollError(t *testing.T) {
	src := review27BlockingSource{entered: make(chan struct{})}
	p, err := New(src, Config{Pool: "storage-pool", Interval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	<-src.entered
	cancel()
	<-done
	if n := p.View().Errors[PartDisks]; n != 0 {
		t.Errorf("losing the leadership mid-poll counted %d failed disks poll(s)", n)
	}
}
