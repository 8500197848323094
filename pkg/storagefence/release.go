package storagefence

import (
	"context"
	"errors"
	"fmt"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// Release is one release of a node's attachment of a volume: an
// unpublish's, or a fence's of a stale node.
type Release struct {
	Handle string
	// PV is the volume's primary PersistentVolume; PVs every PV of the
	// handle this replica knows. PVs a release record names are
	// followed too.
	PV   string
	PVs  []string
	Node string
	// May says, after each read of a PV holding the node's claim, whether
	// that claim goes: an unpublish's, when no live VolumeAttachment of the
	// node stands on it; a fence's, when a live read shows the claimed
	// incarnation stale. A write that conflicts asks again on the fresh
	// read.
	May func(ctx context.Context, c claims.Claim) (bool, error)
	// Graceful, when set, reports whether the node let go of the volume
	// itself (Kubernetes detaches from a Ready node only after its kubelet
	// unstaged it, so it holds no connection). Otherwise, or when it says
	// false, the cut drops the attachment's connections too.
	Graceful func(ctx context.Context) (bool, error)
}

// Released is what a Release did.
type Released struct {
	// Released: a claim of the node went, on at least one PV.
	Released bool
	// Retiring: the node's released attachments still retiring, by PV
	// (released now, or by a replica that stopped before the export
	// change after its release; storage fencing only).
	Retiring map[string][]claims.Retiring
	// SettleErr: the settle after the release failed; the records stay
	// and the leader makes the change (Reconcile). Nil without storage
	// fencing.
	SettleErr error
}

// Release drops the node's claim on every PV of the volume where r.May
// holds. With storage fencing it runs whole: cut → release → settle (the
// settle whenever it cut, released or found a record of the node; a
// release that did none of them leaves the export alone). The
// attachment is cut off the export before its first claim goes (a cut
// that fails keeps every claim: never a released claim whose host is
// still let in), and after the releases the export is settled on the live
// claims whatever came of them: released, the export changes once more,
// so that an open of the released attachment that was in flight cannot
// land; not released (the node recovered and published again while the
// cut was in flight, or the write failed), the holder is let back in at
// once.
func (f *Fence) Release(ctx context.Context, r Release) (Released, error) {
	out := Released{Retiring: map[string][]claims.Retiring{}}
	if f.fencing && !f.isVolumeID(r.Handle) {
		return out, fmt.Errorf("volume handle %q is not this driver's", r.Handle)
	}
	// cut: the attachment cut off the export (the claims are mirrored on
	// every PV: one cut is enough); a write that conflicts asks May again,
	// and an attachment it approves that is not the one cut (the node
	// published again meanwhile) is cut too. tried: a cut was made, or
	// may have landed part-way.
	var cut *claims.Retiring
	tried := false
	// first: the attachment released on the first PV that had one; the
	// other PVs release that attachment only (another attachment of the
	// node there is a newer one, published since: its own release cuts
	// it).
	var first *claims.Retiring
	may := func(ctx context.Context, c claims.Claim) (bool, error) {
		if first != nil {
			return first.Is(r.Node, c), nil
		}
		if ok, err := r.May(ctx, c); err != nil || !ok {
			return false, err
		}
		if f.fencing && (cut == nil || !cut.Is(r.Node, c)) {
			tried = true
			if err := f.cut(ctx, r, c); err != nil {
				return false, err
			}
			rc := claims.RetiringOf(r.Node, c)
			cut = &rc
		}
		return true, nil
	}
	var err error
	pvs := append([]string{r.PV}, r.PVs...)
	seen := map[string]bool{}
	for i := 0; i < len(pvs) && len(seen) < maxHandlePVs; i++ {
		name := pvs[i]
		if name == "" || seen[name] {
			continue
		}
		seen[name] = true
		var released bool
		var records []claims.Retiring
		released, records, err = f.store.ReleaseIf(ctx, name, r.Handle, r.Node, may)
		if err != nil {
			err = fmt.Errorf("releasing node %s's attachment of volume %s on PV %s: %w", r.Node, r.Handle, name, err)
			break
		}
		if released && first == nil {
			// Without storage fencing nothing is recorded, and every PV
			// releases the node's claim.
			first = lastOf(r.Node, records)
		}
		out.Released = out.Released || released
		if len(records) > 0 {
			out.Retiring[name] = records
		}
		for _, rec := range records {
			pvs = append(pvs, rec.PVs...)
		}
	}
	if f.fencing && (tried || out.Released || len(out.Retiring) > 0) {
		// Nothing cut, released or recorded (May said no, or the node
		// held no claim): the export is not this release's to change.
		// A fence whose live read found the node healthy must not touch
		// it, nor a release that found no claim to read (its PV gone).
		out.SettleErr = f.settle(ctx, r, out.Retiring)
	}
	return out, err
}

// cut shuts node's attachment c out of the export before its claim goes:
// the export is re-derived from the live claims without it, changing its
// state at least once, and dropping every connection unless the node let
// go gracefully. A newer attachment of the node is not touched.
func (f *Fence) cut(ctx context.Context, r Release, c claims.Claim) error {
	drop := true
	if r.Graceful != nil {
		graceful, err := r.Graceful(ctx)
		if err != nil {
			return err
		}
		drop = !graceful
	}
	_, err := f.syncExport(ctx, r.Handle, exportGoal{pv: r.PV, gone: []claims.Retiring{claims.RetiringOf(r.Node, c)}, retire: true, cut: drop})
	if err != nil && !errors.Is(err, rds.ErrNotFound) {
		return fmt.Errorf("storage fencing could not cut node %s's attachment off volume %s on the RDS: %w", r.Node, r.Handle, err)
	}
	return nil
}

// settle brings the export in line with the live claims after a release:
// with the released attachments of the node (retiring, by PV) treated as
// gone on every PV and the state changed once more; with none, as the
// live claims call for. Either way it lets in only a holder a live
// VolumeAttachment stands on (a release never decides to let anyone in:
// a claim brought back by hand stays shut out).
func (f *Fence) settle(ctx context.Context, r Release, retiring map[string][]claims.Retiring) error {
	var err error
	if len(retiring) > 0 {
		_, err = f.retire(ctx, r.Handle, r.PV, retiring)
	} else if _, err = f.syncExport(ctx, r.Handle, exportGoal{pv: r.PV, standing: true}); errors.Is(err, rds.ErrNotFound) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("storage fencing could not bring the export of volume %s in line with its claims on the RDS: %w", r.Handle, err)
	}
	return nil
}

// lastOf is the attachment of node a release just recorded (the last of
// node's records), or nil.
func lastOf(node string, records []claims.Retiring) *claims.Retiring {
	for i := len(records) - 1; i >= 0; i-- {
		if records[i].Node == node {
			return &records[i]
		}
	}
	return nil
}
