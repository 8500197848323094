package rds

import (
	"context"
	"errors"
	"testing"

	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// Retombstone against a simulator that hides a closed export's properties:
// a client that did not write the closed export's allowed host reads it as
// unknown, and Retombstone gives it one the client knows, in one command
// conditioned on the export being off alone; on an open export it changes
// nothing.
func TestRetombstone(t *testing.T) {
	ctx := context.Background()
	env := startSimWith(t, 10*GiB, func(c *rdssim.Config) { c.ClosedExportProps = rdssim.ClosedExportHidden })
	writer := env.client(t, nil)
	env.prepare(t, writer, diskState{false, hostC})
	reader := env.client(t, nil) // another replica: never saw hostC
	d, err := reader.GetDisk(ctx, "pvc-a")
	if err != nil {
		t.Fatal(err)
	}
	if !d.AllowHostUnknown {
		t.Fatalf("scripting: a client that did not write the tombstone should not know it: %+v", d)
	}
	after, err := reader.Retombstone(ctx, "pvc-a", ExportState{Host: hostA})
	if err != nil || after != (ExportState{Host: hostA}) {
		t.Fatalf("Retombstone = %s, %v; want closed to A", after, err)
	}
	if got := env.exportState(t, "pvc-a"); got != (diskState{false, hostA}) {
		t.Fatalf("the disk is %+v, want closed with A", got)
	}
	// Now the reader can condition an open on it.
	if _, err := reader.SwapExport(ctx, "pvc-a", ExportState{Host: hostA}, ExportState{Open: true, Host: hostB}); err != nil {
		t.Fatalf("open from the known tombstone: %v", err)
	}
	// On an open export it matches nothing.
	if _, err := reader.Retombstone(ctx, "pvc-a", ExportState{Host: hostC}); !errors.Is(err, ErrExportChanged) {
		t.Fatalf("Retombstone of an open export: %v, want ErrExportChanged", err)
	}
	if got := env.exportState(t, "pvc-a"); got != (diskState{true, hostB}) {
		t.Fatalf("the open export became %+v", got)
	}
	if _, err := reader.Retombstone(ctx, "pvc-a", ExportState{Open: true, Host: hostC}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("Retombstone to an open state: %v, want ErrInvalidArgument", err)
	}
}
