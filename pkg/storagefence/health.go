package storagefence

import (
	"sort"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// ShutOut reports the holders of the volume on disk d (as the index shows
// its claims) that its export does not let in: it is neither open to a
// holder's attachment (either of two in a migration) nor parked on its
// way between them. Empty: healthy, or no storage fencing, or not
// claimed. Read from the index, for volume health: the leader's
// reconcile, on the live claims, fixes what it finds.
func (f *Fence) ShutOut(d *rds.Disk) []string {
	if !f.fencing {
		return nil
	}
	v := f.index.Volume(d.Slot)
	if !v.Indexed() {
		return nil
	}
	held := map[string]claims.Claim{}
	for n, c := range v.Claims.All() {
		if !claims.Retired(v.Retiring, n, c) {
			held[n] = c
		}
	}
	if len(held) == 0 {
		return nil
	}
	cur := rds.StateOf(d)
	want, _ := f.wanted(d.Slot, v, held)
	if matches(cur, want) || (cur.Open && (f.holderHost(d.Slot, held, cur.Host) || f.parkedFromHolder(d.Slot, held, cur.Host))) {
		return nil
	}
	holders := make([]string, 0, len(held))
	for n := range held {
		holders = append(holders, n)
	}
	sort.Strings(holders)
	return holders
}
