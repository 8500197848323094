// Command publish-latency prints the p50 and p99 of the successful
// ControllerPublishVolume calls in driver logs (-v=4), e.g. those an e2e
// run keeps under e2e/artifacts/<test>-<time>/rds-csi-driver-*.log. The
// publish latency figures in docs/BENCHMARKS.md come from it.
package main

import (
	"fmt"
	"os"
	"time"

	"github.com/srvlab/rds-csi/e2e/framework"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: publish-latency DRIVER-LOG...")
		os.Exit(2)
	}
	ds, err := framework.PublishDurations(os.Args[1:]...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	r := func(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }
	fmt.Printf("%d publishes: p50 %s, p90 %s, p99 %s, max %s\n", len(ds),
		r(framework.Quantile(ds, 0.5)), r(framework.Quantile(ds, 0.9)), r(framework.Quantile(ds, 0.99)), r(framework.Quantile(ds, 1)))
}
