package rds

import (
	"context"
	"errors"
	"testing"
)

// SwapExport against the simulator over SSH: one conditional command per
// change, and a command conditioned on a state that has since changed
// (a late landing) changes nothing.
func TestSwapExport(t *testing.T) {
	ctx := context.Background()
	closed := func(h string) ExportState { return ExportState{Host: h} }
	open := func(h string) ExportState { return ExportState{Open: true, Host: h} }
	for _, tc := range []struct {
		name     string
		start    diskState
		from, to ExportState
		want     error
		final    diskState
	}{
		{"open a new disk to A", diskState{false, ""}, closed(""), open(hostA), nil, diskState{true, hostA}},
		{"close A to a tombstone", diskState{true, hostA}, open(hostA), closed(hostC), nil, diskState{false, hostC}},
		{"migrate A to B without a drop", diskState{true, hostA}, open(hostA), open(hostB), nil, diskState{true, hostB}},
		{"a late open conditioned on a closed state that was left", diskState{false, hostC}, closed(""), open(hostA), ErrExportChanged, diskState{false, hostC}},
		{"a late close conditioned on A after A's export moved to B", diskState{true, hostB}, open(hostA), closed(hostC), ErrExportChanged, diskState{true, hostB}},
		{"a late reopen to A after A was closed to a tombstone", diskState{false, hostC}, closed(hostA), open(hostA), ErrExportChanged, diskState{false, hostC}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := startSim(t, 10*GiB)
			c := env.client(t, nil)
			env.prepare(t, c, tc.start)
			after, err := c.SwapExport(ctx, "pvc-a", tc.from, tc.to)
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("SwapExport(%s -> %s) = %v, want %v", tc.from, tc.to, err, tc.want)
			}
			got := env.exportState(t, "pvc-a")
			if got != tc.final {
				t.Fatalf("final %+v, want %+v", got, tc.final)
			}
			if after != (ExportState{Open: got.exported, Host: got.host}) {
				t.Fatalf("SwapExport reported %s, the disk is %+v", after, got)
			}
			sets := env.setCommands()
			if len(sets) != 1 {
				t.Fatalf("sent %d set commands %q, want exactly one", len(sets), sets)
			}
			want := cond(tc.from.Host, yesNo(tc.from.Open)) + "nvme-tcp-export=" + yesNo(tc.to.Open) + ` nvme-tcp-server-allow-host-name="` + tc.to.Host + `"`
			if sets[0] != want {
				t.Fatalf("sent %q\nwant %q", sets[0], want)
			}
		})
	}
	// Missing disk; bad host.
	env := startSim(t, 10*GiB)
	c := env.client(t, nil)
	if _, err := c.SwapExport(ctx, "pvc-a", closed(""), open(hostA)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing disk: %v, want ErrNotFound", err)
	}
	if _, err := c.SwapExport(ctx, "pvc-a", closed(""), open("nqn bad;")); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("bad host: %v, want ErrInvalidArgument", err)
	}
}
