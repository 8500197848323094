package rds

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// A compare-and-swap whose command timed out after it was sent is not
// sent again: the first copy may still land, and a second copy in flight
// is a second chance for its condition to match after the state it is
// conditioned on came back. The caller sees
// ErrOutcomeUnknown and re-reads; the held copy lands once, when released.
func TestSwapExportNotResentAfterTimeout(t *testing.T) {
	ctx := context.Background()
	env := startSim(t, 10*GiB)
	c := env.client(t, func(c *Config) {
		c.CommandTimeout = 100 * time.Millisecond
		c.MaxAttempts = 4
	})
	env.prepare(t, c, diskState{true, hostA})
	env.sim.InjectFault(rdssim.Fault{Kind: rdssim.FaultLate, Match: "allow-host-name=", Count: -1})
	before := len(env.setCommands())
	_, err := c.SwapExport(ctx, "pvc-a", ExportState{Open: true, Host: hostA}, ExportState{Open: true, Host: hostB})
	if !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("SwapExport with its command held past the timeout: %v, want ErrOutcomeUnknown", err)
	}
	if n := env.sim.HeldCommands(); n != 1 {
		t.Fatalf("%d copies of the swap in flight, want 1 (a timed-out compare-and-swap must not be re-sent)", n)
	}
	env.sim.ClearFaults()
	env.sim.ReleaseLate()
	if got := env.exportState(t, "pvc-a"); got != (diskState{true, hostB}) {
		t.Fatalf("after the held copy landed: %+v, want open to B", got)
	}
	if sets := env.setCommands()[before:]; len(sets) != 1 {
		t.Fatalf("%d set commands sent, want 1: %q", len(sets), sets)
	}
}
