package csi

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/srvlab/rds-csi/pkg/rds"
)

// BenchmarkNodeStage times NodeStageVolume of a fresh, blank volume: the
// connect (here: losetup over the simulator's sparse backing file), the
// blank check, mkfs and the mount; for both filesystems and for a 10 GiB
// and a 1 TiB volume. Creating the volume before and unstaging and
// deleting it after each stage are not timed. Needs root. Besides the mean
// (ns/op) it reports the median (median-ms). In the NVMe/TCP VM tier
// (build tag nvmevm) the connect is the kernel's nvme-tcp to nvmet:
//
//	go test -run '^$' -bench NodeStage -benchtime 20x ./pkg/csi/
func BenchmarkNodeStage(b *testing.B) {
	requireNodeHost(b)
	env := startSimEnv(b, simEnvConfig{PoolSize: 4 * rds.TiB, LoopNode: true})
	ctx := context.Background()
	for _, size := range []struct {
		name  string
		bytes int64
	}{{"10GiB", 10 * rds.GiB}, {"1TiB", rds.TiB}} {
		for _, fsType := range SupportedFsTypes {
			b.Run(fsType+"-"+size.name, func(b *testing.B) {
				took := make([]time.Duration, 0, b.N)
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					v := newNodeVolume(b, env, fmt.Sprintf("bench-%s-%s-%d", fsType, size.name, i), size.bytes, mountCapability(fsType, sw))
					b.StartTimer()
					start := time.Now()
					v.must(b, "NodeStageVolume", v.stage(b))
					took = append(took, time.Since(start))
					b.StopTimer()
					if got := blkidType(b, v.device(b)); got != fsType {
						b.Fatalf("staged volume holds %q, want %s", got, fsType)
					}
					v.must(b, "NodeUnstageVolume", v.unstage(b))
					if _, err := env.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.id()}); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
				// The mean (ns/op) hides a slow first run; the median does not.
				slices.Sort(took)
				b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "median-ms")
			})
		}
	}
}
