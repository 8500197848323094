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
//     migration): exported to any host. RouterOS takes one allowed host
//     name per disk, and a migration needs source and target connected at
//     once; for that window the volume is fenced by its claims only (the
//     driver still lets no third node publish). It narrows again to the
//     remaining node when one side unpublishes.
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

func wantedExport(claims map[string]informers.Claim) (exportWant, error) {
	switch len(claims) {
	case 0:
		return exportWant{}, nil
	case 1:
		for node, c := range claims {
			if c.HostNQN == "" {
				return exportWant{}, fmt.Errorf("node %s's claim records no host NQN (it was published without storage fencing)", node)
			}
			return exportWant{open: true, host: c.HostNQN}, nil
		}
	}
	return exportWant{open: true}, nil
}

// fenceExport brings the volume's export in line with claims after a
// publish (drop: moving it from another host drops that host's
// connections) or an unpublish (no drop: the departing node has unstaged).
// departing is the host NQN of the node that gave up its claim ("" when
// none or unknown): closing is conditioned on it, so an export some
// concurrent publish already moved on is left alone.
func (s *ControllerServer) fenceExport(ctx context.Context, id string, claims map[string]informers.Claim, departing string, drop bool) error {
	want, err := wantedExport(claims)
	if err != nil {
		return err
	}
	logger := klog.FromContext(ctx).WithValues("volume", id)
	if !want.open {
		closed, err := s.d.rds.CloseExport(ctx, id, departing)
		if err == nil && !closed && departing != "" {
			// Open to any host (after a migration, or made before storage
			// fencing was on) is closed too.
			closed, err = s.d.rds.CloseExport(ctx, id, "")
		}
		if err != nil {
			return err
		}
		if closed {
			logger.Info("storage fencing: export closed", "host", departing)
		}
		return nil
	}
	change, err := s.d.rds.SetExportHost(ctx, id, want.host, drop)
	if err != nil {
		return err
	}
	if change.Changed {
		logger.Info("storage fencing: export set", "host", orAnyHost(want.host), "was", orAnyHost(change.Before.AllowHost),
			"wasExported", change.Before.Exported, "dropped", change.Dropped, "gap", change.Gap)
	}
	return nil
}

// CutOff cuts a fenced node's host off a volume on the RDS before its
// claim is released (informers.StorageCut): with no other holder the
// export is closed (it was open to the fenced host, or to any host); with
// one, it is moved to that holder, dropping every connection; with two
// or more (open to any host), the fenced host cannot be told apart and
// the fence fails (the claim stays and the fence is retried).
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
	err := s.fenceExport(ctx, handle, remaining, fenced.HostNQN, true)
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
