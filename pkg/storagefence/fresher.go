package storagefence

import (
	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/informers"
)

// Fresher returns v as the API server holds it after this replica's own
// latest claim writes on v's PV when v's index entry is behind only by
// those (a copy of v with that PV's claims, retiring records and
// resourceVersion as the API server answered the last of them);
// otherwise v. A decision on it that is committed conditional on its
// resourceVersion is as safe as one on the index entry: the write
// conflicts if anything changed since. Only for a handle with one PV: a
// repeated publish right after the first then need not wait for the PV
// watch to deliver the replica's own write.
func (f *Fence) Fresher(v *informers.Volume) *informers.Volume {
	if !v.Indexed() || len(v.PVs) != 1 {
		return v
	}
	pv := v.PVs[0]
	w, ok := f.store.Newer(pv.Name, v.Handle, pv.ResourceVersion)
	if !ok {
		return v
	}
	out := *v
	out.PVs = []claims.PVRef{w}
	out.Claims, out.Retiring = w.Claims, w.Retiring
	if out.PVName == pv.Name {
		out.ResourceVersion = w.ResourceVersion
	}
	return &out
}
