package storagefence

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/informers"
	"github.com/srvlab/rds-csi/pkg/rds"
	"k8s.io/klog/v2"
)

// retire changes the export's state once more after the release of the
// retired attachments (done: the records of those releases, by PV; a
// fresh tombstone when the export stays closed), with them treated as
// gone, so that no open of one that was in flight can land afterwards;
// it lets in only a holder a live VolumeAttachment stands on. Then it
// removes each record whose attachment no PV of the handle claims
// any more: one another PV still claims stays, keeping that claim from
// being let in until its own release. A record it fails to remove is
// removed by the leader (RetireMarked).
func (f *Fence) retire(ctx context.Context, handle, pvName string, done map[string][]claims.Retiring) (exportResult, error) {
	var gone []claims.Retiring
	for _, rs := range done {
		gone = append(gone, rs...)
	}
	res, err := f.syncExport(ctx, handle, exportGoal{pv: pvName, gone: gone, retire: true, standing: true})
	if errors.Is(err, rds.ErrNotFound) {
		res, err = exportResult{}, nil // no disk, no export
	}
	if err != nil {
		return res, err
	}
	for pv, rs := range done {
		var clear []claims.Retiring
		for _, r := range rs {
			if !r.In(res.shown) {
				clear = append(clear, r)
			}
		}
		if len(clear) == 0 {
			continue
		}
		if err := f.store.ClearRetiring(ctx, pv, clear); err != nil {
			klog.FromContext(ctx).Error(err, "storage fencing: removing the record of a retired attachment; the leader removes it", "volume", handle, "pv", pv)
		}
	}
	return res, nil
}

// RetireMarked makes, for every released attachment the index lists as
// retiring (informers.RetiringAnnotation: a replica released its claim
// and then failed, or stopped, before the export change after the
// release, or its release did not reach every PV of the handle), that
// change, and then removes the record. A release that did not reach every
// PV is completed first: the same attachment's claim on another PV goes
// too. An export found open to a retired attachment (an open of it that
// landed late) is reported. The leader runs it every few seconds and at
// the start of each reconcile. It acts on the live claims, stops before
// its next RDS write once ctx is done, and returns how many volumes are
// still retiring.
func (f *Fence) RetireMarked(ctx context.Context, report func(Mismatch)) (int, error) {
	if !f.fencing {
		return 0, nil
	}
	left := 0
	var errs []error
	for _, v := range f.index.Retiring() {
		done := map[string][]claims.Retiring{}
		for _, pv := range v.PVs {
			if len(pv.Retiring) > 0 {
				done[pv.Name] = append(done[pv.Name], pv.Retiring...)
			}
		}
		if err := f.completeReleases(ctx, v, done); err != nil {
			errs = append(errs, fmt.Errorf("volume %s: %w", v.Handle, err))
			left++
			continue
		}
		res, err := f.retire(ctx, v.Handle, v.PVName, done)
		if err != nil {
			errs = append(errs, fmt.Errorf("volume %s: %w", v.Handle, err))
			left++
			continue
		}
		if report != nil && res.first.Open && res.first != res.state && f.retiredHost(v.Handle, done, res.first.Host) {
			report(Mismatch{Volume: v.Handle, PV: v.PVName, Found: res.first, Now: res.state})
		}
	}
	return left, errors.Join(errs...)
}

// completeReleases releases, on every other PV of v's handle (those the
// index knows and those a record names), the claims of the attachments
// done records as released, adding each PV where it released one to done.
func (f *Fence) completeReleases(ctx context.Context, v *informers.Volume, done map[string][]claims.Retiring) error {
	for pvName, rs := range done {
		for _, r := range rs {
			others := slices.Clone(r.PVs)
			for _, pv := range v.PVs {
				others = append(others, pv.Name)
			}
			for _, q := range others {
				if q == pvName || r.In(done[q]) {
					continue
				}
				ok, err := f.store.ReleaseRetired(ctx, q, v.Handle, r)
				if err != nil {
					return fmt.Errorf("releasing node %s's retired attachment on PV %s: %w", r.Node, q, err)
				}
				if ok {
					done[q] = append(done[q], r)
				}
			}
		}
	}
	return nil
}

// retiredHost: host is the host NQN of one of the retired attachments.
func (f *Fence) retiredHost(handle string, done map[string][]claims.Retiring, host string) bool {
	for _, rs := range done {
		for _, r := range rs {
			if h := f.HostOf(handle, r.Node, claims.Claim{At: r.At, NodeUID: r.NodeUID, Nonce: r.Nonce}); h != "" && h == host {
				return true
			}
		}
	}
	return false
}

// Mismatch is one volume whose export did not match its live claims when
// the reconcile found it, and what it did.
type Mismatch struct {
	Volume string
	PV     string
	Found  rds.ExportState
	Now    rds.ExportState
	Err    error
}

// Reconcile is the leader's pass of storage fencing over every
// volume disk on the RDS, in both directions: an export open although no
// live claim calls for it (a volume made before storage fencing was on, a
// step that landed late, a replica that died between a release and its
// export change) is closed; one that is closed or open to another host
// than its live claims call for is moved. The index picks the candidates
// (no API call for a volume that matches it); each is then decided on its
// live claims (syncExport), so a lagging index never closes a live
// export. A disk with no PV in the index is not this pass's to judge:
// call it only once the index has synced. It stops before its next RDS
// write once ctx is done: pass the leader's leading context. report is
// called for every mismatch found.
func (f *Fence) Reconcile(ctx context.Context, report func(Mismatch)) (int, error) {
	if !f.fencing {
		return 0, nil
	}
	var errs []error
	if _, err := f.RetireMarked(ctx, report); err != nil {
		errs = append(errs, err)
	}
	disks, err := f.rds.ListDisks(ctx)
	if err != nil {
		return 0, errors.Join(append(errs, err)...)
	}
	sort.Slice(disks, func(i, j int) bool { return disks[i].Slot < disks[j].Slot })
	fixed := 0
	for i := range disks {
		disk := &disks[i]
		if !f.isVolumeDisk(disk) {
			continue
		}
		v := f.index.Volume(disk.Slot)
		if !v.Indexed() {
			continue
		}
		found := rds.StateOf(disk)
		held := v.Claims.Map()
		if want, _ := f.wanted(disk.Slot, v, held); matches(found, want) {
			continue
		}
		// A park on the way from a live holder is a move under way (or
		// one whose replica stopped half-way): finished, not reported.
		moving := found.Open && f.parkedFromHolder(disk.Slot, held, found.Host)
		if err := ctx.Err(); err != nil {
			return fixed, errors.Join(append(errs, err)...)
		}
		res, err := f.syncExport(ctx, disk.Slot, exportGoal{pv: v.PVName, standing: true})
		if errors.Is(err, rds.ErrNotFound) {
			continue
		}
		if err == nil && (res.state == found || moving) {
			continue // the index was behind (the live claims agree with the RDS), or a move was finished
		}
		m := Mismatch{Volume: disk.Slot, PV: v.PVName, Found: found, Now: res.state, Err: err}
		if err != nil {
			errs = append(errs, fmt.Errorf("volume %s: %w", disk.Slot, err))
		} else {
			fixed++
		}
		if report != nil {
			report(m)
		}
	}
	return fixed, errors.Join(errs...)
}
