package csi

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"google.golang.org/grpc/codes"
	"k8s.io/klog/v2"

	"github.com/srvlab/rds-csi/pkg/informers"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// Storage fencing (--storage-fencing=allow-host) keeps each volume's
// NVMe/TCP export open to the hosts its claims name, and to no one else:
//
//   - no claim: export off (a new volume is created so);
//   - one claim: exported to that node's host NQN alone;
//   - two claims (a raw-block ReadWriteMany volume during a KubeVirt live
//     migration): exported to the newer holder, the migration target,
//     without dropping connections. RouterOS takes one allowed host name
//     per disk; the source keeps the connection it has (Linux nvmet checks
//     the allowed hosts only at connect; RouterOS is assumed to do the
//     same), and no third host, a fenced one included, can connect. If
//     RouterOS does drop established connections when the allowed host
//     changes, the source loses its connection: an availability problem
//     for that migration, never a second writer. Opening the export to any
//     host instead would let a fenced node that is still running
//     reconnect. A publish that makes a second holder while it fences a
//     third node is ABORTED until the fence has cut that node off (the
//     drop would cut off the source too).
//
// A publish changes the export before it answers success, so a node is
// told it may write only once the RDS lets it and nobody else in; when it
// moves the export away from another host it turns the export off first
// (dropping established connections, whatever RouterOS does to them when
// the allowed host changes), sets the host, and turns it on. A fence cuts
// the fenced host off before its claim is released. Every change is
// conditioned on the allowed host read before it (rds.ErrExportChanged
// otherwise), so a replica acting on old state never undoes a newer
// change. Nothing here reads the API server: the claims given are the ones
// the caller just committed or read live.

// exportWant is the export the claims call for.
type exportWant struct {
	open bool   // exported at all
	host string // allowed host when open; "" = any host
}

// wantedExport is the export claims call for; newest names the holder the
// export goes to when there are two (a publish's requester; otherwise the
// claim made last).
func wantedExport(claims map[string]informers.Claim, newest string) exportWant {
	if len(claims) == 0 {
		return exportWant{}
	}
	if _, ok := claims[newest]; !ok {
		newest = ""
		for node, c := range claims {
			if best, ok := claims[newest]; !ok || c.At.After(best.At) || (c.At.Equal(best.At) && node > newest) {
				newest = node
			}
		}
	}
	// A claim from before storage fencing was on records no host NQN: its
	// volume stays open to any host, as it was, until its next publish.
	return exportWant{open: true, host: claims[newest].HostNQN}
}

// exportMove says how fenceExport may get there.
type exportMove struct {
	// newest: the holder the export goes to when two hold it (a publish's
	// requester).
	newest string
	// departing is the host NQN of the node that gave up its claim ("" when
	// none or unknown): closing is conditioned on it, so an export some
	// concurrent publish already moved on is left alone.
	departing string
	// drop: moving the export from another host, or from any host, drops
	// every established connection first.
	drop bool
	// cut: a node that may still be connected is being shut out (a fence,
	// a detach from a node that did not unstage): connections are dropped
	// even when the allowed host is already the wanted one, since with
	// RouterOS keeping established connections (as nvmet does) the
	// allowed host does not tell who is connected. The remaining holder
	// reconnects.
	cut bool
}

// fenceExport brings the volume's export in line with claims after a
// publish, an unpublish or a fence.
func (s *ControllerServer) fenceExport(ctx context.Context, id string, claims map[string]informers.Claim, mv exportMove) error {
	want := wantedExport(claims, mv.newest)
	logger := klog.FromContext(ctx).WithValues("volume", id)
	if !want.open {
		closed, err := s.d.rds.CloseExport(ctx, id, mv.departing)
		if err == nil && !closed && mv.departing != "" {
			// Open to any host (made before storage fencing was on) is
			// closed too.
			closed, err = s.d.rds.CloseExport(ctx, id, "")
		}
		if err != nil {
			return err
		}
		if closed {
			logger.Info("storage fencing: export closed", "host", mv.departing)
		}
		return nil
	}
	change, err := s.d.rds.SetExportHost(ctx, id, want.host, mv.drop || mv.cut)
	if err != nil {
		return err
	}
	if change.Changed {
		logger.Info("storage fencing: export set", "host", orAnyHost(want.host), "was", orAnyHost(change.Before.AllowHost),
			"wasExported", change.Before.Exported, "dropped", change.Dropped, "gap", change.Gap)
	}
	if mv.cut && !change.Dropped {
		// Already allowed to the wanted host: turn it off and on again.
		if _, err := s.d.rds.CloseExport(ctx, id, want.host); err != nil {
			return err
		}
		if _, err := s.d.rds.SetExportHost(ctx, id, want.host, false); err != nil {
			return err
		}
		logger.Info("storage fencing: connections dropped", "host", want.host)
	}
	return nil
}

// CutOff cuts a fenced node's host off a volume on the RDS before its
// claim is released (informers.StorageCut): with no other holder the
// export is closed (it was open to the fenced host, or to any host); with
// one, it is moved to that holder, dropping every connection (the holder
// reconnects). Two others cannot hold it besides the fenced node.
func (s *ControllerServer) CutOff(ctx context.Context, handle, node string, fenced informers.Claim, remaining map[string]informers.Claim) error {
	if !isVolumeID(handle) {
		return fmt.Errorf("volume handle %q is not this driver's", handle)
	}
	if len(remaining) > 1 {
		nodes := make([]string, 0, len(remaining))
		for n := range remaining {
			nodes = append(nodes, n)
		}
		sort.Strings(nodes)
		return fmt.Errorf("volume %s is exported to any host while %v hold it besides %s: the RDS cannot shut out one host (one allowed host per disk)", handle, nodes, node)
	}
	err := s.fenceExport(ctx, handle, remaining, exportMove{departing: fenced.HostNQN, drop: true, cut: true})
	if errors.Is(err, rds.ErrNotFound) {
		return nil // no disk, no export
	}
	return err
}

func orAnyHost(h string) string {
	if h == "" {
		return "any host"
	}
	return h
}

// storageError is how a failed export change fails a publish: nothing lets
// the node write, and the request is retried.
func storageError(id, node string, err error) error {
	if errors.Is(err, rds.ErrExportChanged) {
		return statusf(codes.Aborted, "volume %s: its export on the RDS changed while opening it to node %s (another controller replica or an operator): %v; the request is retried", id, node, err)
	}
	return statusf(codes.Unavailable, "volume %s: storage fencing could not open its export on the RDS to node %s, so it is not attached: %v", id, node, err)
}

// CloseUnclaimedExports closes, when storage fencing is on, the exports
// that are still open to any host although no node claims or attaches
// their volume: volumes made before storage fencing was turned on, which
// would otherwise stay open until their next publish. The leader runs it
// once the index has synced. Only exports open to any host are touched,
// each conditioned on still being so, so an export a publish on another
// replica has just opened to its node is left alone. Closing never lets a
// node write. Returns how many it closed.
func (s *ControllerServer) CloseUnclaimedExports(ctx context.Context) (int, error) {
	if !s.d.opts.AllowHostFencing() || s.pub == nil || !s.pub.Synced() {
		return 0, nil
	}
	disks, err := s.d.rds.ListDisks(ctx)
	if err != nil {
		return 0, err
	}
	closed := 0
	var errs []error
	for i := range disks {
		d := &disks[i]
		if !s.d.isVolumeDisk(d) || !d.Exported || d.AllowHost != "" {
			continue
		}
		v := s.pub.Index.Volume(d.Slot)
		if !v.Indexed() || len(v.Claims) > 0 || len(v.Attachments) > 0 {
			continue // no PV (not ours to judge), or in use
		}
		ok, err := s.d.rds.CloseExport(ctx, d.Slot, "")
		if err != nil && !errors.Is(err, rds.ErrNotFound) {
			errs = append(errs, fmt.Errorf("volume %s: %w", d.Slot, err))
			continue
		}
		if ok {
			closed++
			klog.FromContext(ctx).Info("storage fencing: closed an export open to any host of an unclaimed volume", "volume", d.Slot)
		}
	}
	return closed, errors.Join(errs...)
}
