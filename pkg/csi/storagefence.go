package csi

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"

	"google.golang.org/grpc/codes"
	"k8s.io/klog/v2"

	"github.com/srvlab/rds-csi/pkg/informers"
	"github.com/srvlab/rds-csi/pkg/nvme"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// Storage fencing (--storage-fencing=allow-host): the export follows the
// claims.
//
// The claims on the PV are the truth; the RDS export is derived from
// them: closed when no node claims the volume; otherwise open to the host
// NQN of the newest claim's attachment (attachment.go) and to no one else.
// Two claims are a raw-block ReadWriteMany volume in a KubeVirt live
// migration: the export goes to the newer one, the target, without
// dropping the source's established connection (RouterOS takes one
// allowed host per disk; Linux nvmet checks it only at connect, RouterOS
// is assumed to do the same, docs/routeros.md).
//
// Every change is one compare-and-swap on the RDS (rds.Client.SwapExport),
// made by syncExport in rounds of: read the export, THEN read the live
// claims, then swap from the state read to the state those claims call
// for. An open state comes back whenever the export returns to its host
// (a migration aborted, a cut reopened to the remaining holder), so no
// swap conditioned on one lets a host in: it leads to a state that never
// was before, a fresh tombstone (closed) or a park (open to a fresh host
// nobody has, keeping the connections; parkedNQN); only from those is a
// host let in. A swap whose outcome is unknown is never re-sent
// (rds.Client), so each fresh state is made at most once, and a swap
// conditioned on it that lands late (any RDS command may land up to its
// timeout late) matches nothing once anything changed. A retirement
// (an unpublish, a fence) always changes the state at least once. So a
// round that opens the export to attachment X succeeds only if no state
// change happened between its read of the export and its swap; and since
// it read the claims after the export, a retirement of X (release, then a
// state change) that finished before it read the claims is seen, and one
// that had not changed the state yet will change it after the open and so
// undo it before the retirement reports done. No write of a retired
// attachment can land after its retirement completed. Each round re-reads
// the claims after the previous swap landed: a step whose claim is gone
// or replaced is undone by the next round.

// errExportTaken: the export allows another live holder that may still
// have to connect; the requester is refused (ABORTED), not let in.
var errExportTaken = errors.New("the export is taken by another holder")

// syncRounds bounds syncExport; each round makes at most one swap.
const syncRounds = 8

// exportGoal is what one syncExport call is for.
type exportGoal struct {
	// pv is the PersistentVolume whose live claims are read (every PV of
	// a handle carries the same claims).
	pv string
	// gone: the attachments a retirement is for, treated as gone on every
	// PV: cut off before their release (an unpublish's shutOut, a fence's
	// CutOff, a publish's fenced nodes), or changed after it. Named by
	// attachment, never by node: a newer attachment of the same node (the
	// node published again, or re-created) stands, and is neither cut nor
	// excluded by a step that was decided on an older one.
	gone []informers.Retiring
	// prefer: a publish's requester. The export is opened to it when it
	// allows no live holder; with two holders (a migration) it goes to
	// the newer (the target). A repeated publish of the older (the
	// source) is refused while the export allows the newer: the source
	// may keep a connection it has, but nothing here can tell that it
	// still has one (a cut may have dropped it), and a success is only
	// ever answered with the export open to the requester's attachment.
	prefer string
	// retire: an attachment is being retired; the state changes at least
	// once (a fresh tombstone when closed stays closed; with cut, a drop
	// and reopen when the wanted host is already allowed).
	retire bool
	// standing: the export is opened or moved only to a holder a live
	// VolumeAttachment in the index stands on (the reconcile).
	standing bool
	// cut: connections are dropped even where the allowed host would not
	// change (the departing host may still be connected: a migration
	// source, or a node that did not unstage), while an attachment of gone
	// is still claimed (one no longer claimed was retired, and cut as its
	// retirement called for, by whoever released it).
	cut bool
	// readBack: a round after a swap takes the export from the swap's own
	// read-back (rds.Client.SwapExport reads the disk after its command
	// landed) instead of reading it again: the same read, made after the
	// swap and before that round's claims read, one RouterOS command
	// less per swap (a publish's open).
	readBack bool
}

// exportResult is the export and the claims syncExport left it matching.
type exportResult struct {
	state  rds.ExportState
	claims map[string]informers.Claim
	// first: the export as syncExport first read it.
	first rds.ExportState
	// shown: retiring attachments (informers.RetiringAnnotation) that a
	// PV of the handle still claims: their records must stay.
	shown []informers.Retiring
	// secret: the export's secret as read with state (zero: none
	// printed); secretUnreadable: printed in a form the client cannot
	// read (--export-auth=dhchap).
	secret           nvme.DHCHAPSecret
	secretUnreadable bool
}

// readersOnly: every claim is a MULTI_NODE_READER_ONLY publish and the
// volume's PV grants nothing but ReadOnlyMany, so no attachment of it has
// ever been able to write through this driver. Its export is open to any
// host: one allowed host per disk would shut every reader but one out,
// and a reader has no write to fence. (A PV that also grants a writable
// mode keeps one allowed host: opening it to any host could let a fenced
// writer's kernel reconnect with its queued writes.)
func readersOnly(v *informers.Volume, claims map[string]informers.Claim) bool {
	if len(claims) == 0 || !v.Indexed() || len(v.AccessModes) == 0 {
		return false
	}
	for _, m := range v.AccessModes {
		if m != corev1.ReadOnlyMany {
			return false
		}
	}
	for _, c := range claims {
		if !strings.HasSuffix(c.Capability, "/"+csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY.String()) {
			return false
		}
	}
	return true
}

// wanted is the export claims on volume v call for, and the node it is
// open to ("" with readers only: open to any host).
func (d *Driver) wanted(handle string, v *informers.Volume, claims map[string]informers.Claim) (rds.ExportState, string) {
	if readersOnly(v, claims) {
		return rds.ExportState{Open: true}, ""
	}
	newest := ""
	for node, c := range claims {
		if best, ok := claims[newest]; !ok || c.At.After(best.At) || (c.At.Equal(best.At) && node > newest) {
			newest = node
		}
	}
	if newest == "" {
		return rds.ExportState{}, ""
	}
	return rds.ExportState{Open: true, Host: d.claimHost(handle, newest, claims[newest])}, newest
}

// matches: the export is what want calls for (a closed export's host is
// a tombstone and does not matter).
func matches(cur, want rds.ExportState) bool {
	if !want.Open {
		return !cur.Open
	}
	return cur == want
}

// parkedState is a fresh open state on the way from host (parkedNQN).
func (d *Driver) parkedState(handle, host string) (rds.ExportState, error) {
	p, err := parkedNQN(d.opts.AttachmentKey, handle, host)
	return rds.ExportState{Open: true, Host: p}, err
}

// parkedFromHolder: host is a park (parkedNQN) on the way from the host
// of one of claims' attachments, which is still connected.
func (d *Driver) parkedFromHolder(handle string, claims map[string]informers.Claim, host string) bool {
	for node, c := range claims {
		if h := d.claimHost(handle, node, c); h != "" && parkedFrom(d.opts.AttachmentKey, handle, host, h) {
			return true
		}
	}
	return false
}

// closedState is a fresh closed state.
func closedState() (rds.ExportState, error) {
	t, err := tombstoneNQN()
	return rds.ExportState{Host: t}, err
}

// syncExport brings the volume's export in line with its live claims
// (see the top of this file). It stops before its next RDS write once ctx
// is done (a leader that lost its lease passes its leading context).
func (s *ControllerServer) syncExport(ctx context.Context, handle string, g exportGoal) (exportResult, error) {
	logger := klog.FromContext(ctx).WithValues("volume", handle)
	changed := false
	// ownPark: a park this call made on the way from a departing host
	// whose connections are gone (a graceful retirement), to be finished
	// without a drop.
	var ownPark rds.ExportState
	// dropPark: a park this call made on the way to a drop (see below).
	var dropPark rds.ExportState
	// swap makes one change from `from` to `to` with do, unless ctx is
	// done; an export that changed under it is no error (the next round
	// decides again).
	// readBack: the export as the last swap read it back, for the next
	// round (g.readBack).
	var readBack *rds.Disk
	// secret, secretRead: what the last swap read back of the secret
	// (secretRead false: a swap that does not read it, whose read back
	// is then not taken for the next round under --export-auth).
	var (
		secret     nvme.DHCHAPSecret
		secretRead bool
	)
	swap := func(from, to rds.ExportState, holder string, do func() (rds.ExportState, error)) error {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("stopped before changing the export of volume %s: %w", handle, err)
		}
		secret, secretRead = nvme.DHCHAPSecret{}, false
		after, err := do()
		switch {
		case errors.Is(err, rds.ErrExportChanged):
			logger.V(2).Info("storage fencing: the export changed under a swap; deciding again", "found", after.String())
			return nil
		case err != nil:
			return err
		}
		if g.readBack && (secretRead || !s.d.opts.ExportAuthOn()) {
			readBack = &rds.Disk{Slot: handle, Exported: after.Open, AllowHost: after.Host, Secret: secret}
		}
		changed = true
		logger.Info("storage fencing: export changed", "from", from.String(), "to", exportLabel(to), "holder", holder)
		return nil
	}
	var first rds.ExportState
	for round := 0; round < syncRounds; round++ {
		d, err := s.readExport(ctx, handle, readBack)
		readBack = nil
		if err != nil {
			return exportResult{}, err
		}
		cur := rds.StateOf(d)
		if round == 0 {
			first = cur
		}
		if d.AllowHostUnknown {
			// Closed, its allowed host not printed and not one this
			// replica wrote: no swap can be conditioned on it. A fresh
			// tombstone first (it lets no one in).
			next, err := closedState()
			if err != nil {
				return exportResult{}, err
			}
			if err := swap(cur, next, "", func() (rds.ExportState, error) { return s.d.rds.Retombstone(ctx, handle, next) }); err != nil {
				return exportResult{}, err
			}
			continue
		}
		live, err := s.liveClaims(ctx, handle, g.pv)
		if err != nil {
			return exportResult{}, err
		}
		claims := live.claims
		departing, cut := "", false
		for _, r := range g.gone {
			if c, ok := claims[r.Node]; ok && r.Is(r.Node, c) {
				departing, cut = s.d.claimHost(handle, r.Node, c), g.cut
				claims = without(claims, r.Node)
			}
		}
		want, holder := s.d.wanted(handle, s.pub.Index.Volume(handle), claims)
		atHolder := cur.Open && s.d.holderHost(handle, claims, cur.Host)
		if want.Open && want.Host == "" && holder == "" {
			// Readers only: open to any host, whoever asks.
		} else if c, ok := claims[g.prefer]; ok && g.prefer != "" && (g.prefer == holder || !atHolder) {
			// The newest attachment (a migration's target, joining or
			// again), or an export that allows no live holder: the
			// requester's (it is told it may write only once it is let in).
			want, holder = rds.ExportState{Open: true, Host: s.d.claimHost(handle, g.prefer, c)}, g.prefer
		} else if ok && g.prefer != "" && cur.Open && cur.Host == s.d.claimHost(handle, g.prefer, c) {
			// The export already allows the requester, the older holder
			// (let in again by a move back): left so.
			want = cur
		} else if ok && g.prefer != "" {
			return exportResult{}, fmt.Errorf("%w: volume %s: its export allows the newer holder %s (a migration's target), not node %s: one allowed host cannot take both; a connection node %s already has is kept, but it is not told it may write; retry once the migration settled",
				errExportTaken, handle, holder, g.prefer, g.prefer)
		} else if atHolder && len(claims) > 1 {
			// A migration's export allows one of its holders: left alone.
			// Moving it to the other would shut out the one allowed.
			want = cur
		}
		stands := true
		if g.standing && want.Open && holder != "" && want != cur {
			if stands, err = s.standsOnAttachment(ctx, handle, holder); err != nil {
				return exportResult{}, err
			}
		}
		if !stands {
			// The reconcile lets no one in on a claim that no live
			// VolumeAttachment stands on (a claim brought back by hand, or
			// whose release reached one PV of the handle before that PV
			// was deleted): the publish of a live attachment opens the
			// export itself. What it finds open to a live holder, or
			// parked on the way from one, stays; anything else is closed.
			if cur.Open && (s.d.holderHost(handle, claims, cur.Host) || s.d.parkedFromHolder(handle, claims, cur.Host)) {
				want = cur
			} else {
				want, holder = rds.ExportState{}, ""
			}
		}
		var next rds.ExportState
		switch {
		case matches(cur, want) && (changed || !g.retire || (want.Open && !cut)):
			return exportResult{state: cur, claims: claims, first: first, shown: live.shown, secret: d.Secret, secretUnreadable: d.SecretUnreadable}, nil
		case cur.Open && cur == dropPark:
			// The park of a drop: a fresh tombstone (every connection
			// goes with the export).
			if next, err = closedState(); err != nil {
				return exportResult{}, err
			}
		case cur.Open && cut && !changed && s.d.holderHost(handle, claims, cur.Host):
			// A drop of an export open to a live holder, to be reopened
			// to it: that open state comes back, so a drop conditioned on
			// it that landed late would close the export under the
			// holder. Park first, and drop from the park.
			if next, err = s.d.parkedState(handle, cur.Host); err != nil {
				return exportResult{}, err
			}
			dropPark = next
		case !want.Open, cur.Open && cut && !changed:
			// Close, or drop before opening: a fresh tombstone (every
			// connection goes with the export).
			if next, err = closedState(); err != nil {
				return exportResult{}, err
			}
		case cur.Open && (cur == ownPark || s.d.parkedFromHolder(handle, claims, cur.Host)):
			// Parked on its way from a live holder, whose connection
			// stays, or from a host that left gracefully: let the wanted
			// host in.
			next = want
		case cur.Open && want.Open && !cut && departing != "" && cur.Host == departing:
			// A graceful retirement (its node Ready: it unstaged before
			// the detach, so it is not connected) of the host the export
			// allows, another holder remaining (a migration aborted): park
			// on the way to it, so that the remaining holder keeps its
			// connection.
			if next, err = s.d.parkedState(handle, cur.Host); err != nil {
				return exportResult{}, err
			}
			ownPark = next
		case cur.Open && s.d.holderHost(handle, claims, cur.Host):
			// A move between two live holders without a drop (a
			// migration): park first. A swap conditioned on an open
			// state (which comes back whenever the export returns to
			// that host) only ever leads to a state that never was
			// before; only such a state lets a host in.
			if next, err = s.d.parkedState(handle, cur.Host); err != nil {
				return exportResult{}, err
			}
		case cur.Open:
			// Open to a host no live claim has (a retired attachment, a
			// park from one, any host): its connections go with the
			// export.
			if next, err = closedState(); err != nil {
				return exportResult{}, err
			}
		default:
			// Open from closed.
			next = want
		}
		if err := swap(cur, next, holder, func() (rds.ExportState, error) { return s.swapExport(ctx, handle, d, next, &secret, &secretRead) }); err != nil {
			return exportResult{}, err
		}
	}
	return exportResult{}, fmt.Errorf("%w: the export of volume %s kept changing for %d rounds (other controller replicas or an operator)", rds.ErrExportChanged, handle, syncRounds)
}

// swapExport makes one swap of syncExport. With --export-auth=dhchap the
// password goes in the same command (rds.Client.SwapExportAuth): an open
// to an attachment's host gets that attachment's password (exportPassword),
// a close or an open to any host (readers only) none; a park keeps the
// password it has (its host is one nobody has, so nobody can use it, and
// a password change might drop the connections the park is there to
// keep: docs/routeros.md). The secret read back goes to secret, and
// secretRead says whether it was read. Without the mode, an export d
// shows a secret of (made while the mode was on) has its password cleared
// by the swap: its next holder is told of no secret.
func (s *ControllerServer) swapExport(ctx context.Context, handle string, d *rds.Disk, next rds.ExportState, secret *nvme.DHCHAPSecret, secretRead *bool) (rds.ExportState, error) {
	cur := rds.StateOf(d)
	if !s.d.opts.ExportAuthOn() {
		if d.Secret.IsZero() && !d.SecretUnreadable {
			return s.d.rds.SwapExport(ctx, handle, cur, next)
		}
		after, _, err := s.d.rds.SwapExportAuth(ctx, handle, cur, next, rds.ExportPassword{})
		return after, err
	}
	if next.Open && next.Host != "" && parkedFrom(s.d.opts.AttachmentKey, handle, next.Host, cur.Host) {
		return s.d.rds.SwapExport(ctx, handle, cur, next)
	}
	var pw rds.ExportPassword
	if next.Open && next.Host != "" {
		var err error
		if pw, err = exportPassword(s.d.opts.AttachmentKey, handle, next.Host); err != nil {
			return rds.ExportState{}, err
		}
	}
	after, sec, err := s.d.rds.SwapExportAuth(ctx, handle, cur, next, pw)
	*secret, *secretRead = sec, err == nil
	if err != nil && !pw.IsZero() && rds.RefusedInput(err) {
		// RouterOS refused the command as bad input, and every value in
		// it was validated before it was sent: the property itself was
		// refused, and every authenticated publish will be.
		err = fmt.Errorf("%w: %w", errPasswordRefused, err)
	}
	return after, err
}

// errPasswordRefused: RouterOS refused a swap that sets an export password
// as bad input, as one without export passwords would (docs/routeros.md).
var errPasswordRefused = errors.New("the RDS refused the export password (nvme-tcp-server-password), as a RouterOS without export passwords would: check its version and the driver user's policies, or turn --export-auth off (docs/routeros.md)")

// readExport reads volume handle's disk for a round of syncExport, or
// takes it from known: a swap's read-back, made after its command landed
// (its allowed host is known: a swap reads back nothing else).
func (s *ControllerServer) readExport(ctx context.Context, handle string, known *rds.Disk) (*rds.Disk, error) {
	if known != nil {
		return known, nil
	}
	return s.d.rds.GetDisk(ctx, handle)
}

// liveState is what liveClaims read.
type liveState struct {
	// claims: the live claims, joined over the PVs, without retiring
	// attachments.
	claims map[string]informers.Claim
	// retiring: the records of every PV read; shown: those a PV still
	// claims.
	retiring, shown []informers.Retiring
}

// maxHandlePVs bounds the PVs liveClaims reads for one handle.
const maxHandlePVs = 16

// liveClaims reads the claims and retiring attachments of every
// PersistentVolume of handle this replica knows, pv, and every PV a claim
// or record names (one this replica's index has not seen yet), from the
// API server, and joins them: a PV made again for the same handle (a
// Retained volume's PV re-created) starts with none, and a claim on any PV
// stands, unless a record on any PV retires that very attachment (its
// release has not reached every PV yet). Where two PVs disagree on a
// node's claim, the newer (time, then publish count) is taken.
func (s *ControllerServer) liveClaims(ctx context.Context, handle, pv string) (liveState, error) {
	names := []string{pv}
	if v := s.pub.Index.Volume(handle); v.Indexed() {
		for _, p := range v.PVs {
			names = append(names, p.Name)
		}
	}
	var st liveState
	type pvClaim struct {
		node string
		c    informers.Claim
	}
	var all []pvClaim
	seen := map[string]bool{}
	for i := 0; i < len(names) && len(seen) < maxHandlePVs; i++ {
		name := names[i]
		if name == "" || seen[name] {
			continue
		}
		seen[name] = true
		claims, recs, err := s.pub.Claims.LiveState(ctx, name, handle)
		if err != nil {
			return liveState{}, err
		}
		for n, c := range claims {
			all = append(all, pvClaim{n, c})
			names = append(names, c.PVs...)
		}
		for _, r := range recs {
			if !r.In(st.retiring) {
				st.retiring = append(st.retiring, r)
			}
			names = append(names, r.PVs...)
		}
	}
	for _, pc := range all {
		if informers.Retired(st.retiring, pc.node, pc.c) {
			continue
		}
		if st.claims == nil {
			st.claims = map[string]informers.Claim{}
		}
		if cur, ok := st.claims[pc.node]; !ok || pc.c.At.After(cur.At) || (pc.c.At.Equal(cur.At) && pc.c.Gen > cur.Gen) {
			st.claims[pc.node] = pc.c
		}
	}
	for _, r := range st.retiring {
		for _, pc := range all {
			if r.Is(pc.node, pc.c) {
				st.shown = append(st.shown, r)
				break
			}
		}
	}
	return st, nil
}

// standsOnAttachment: node has a VolumeAttachment of handle (one being
// deleted still stands: the node may use the volume until its detach
// completes), in the index or, where the index shows none (it may lag
// behind the attach the claim came with), on the API server.
func (s *ControllerServer) standsOnAttachment(ctx context.Context, handle, node string) (bool, error) {
	v := s.pub.Index.Volume(handle)
	if v != nil {
		if _, ok := v.AttachmentOn(node); ok {
			return true, nil
		}
	}
	return s.pub.Claims.AttachmentExists(ctx, handle, node, pvNamesOf(v))
}

// holderHost: host is the allowed host of one of claims' attachments
// (moving from it to another holder needs no drop: a migration).
func (d *Driver) holderHost(handle string, claims map[string]informers.Claim, host string) bool {
	if host == "" {
		// Any host: whoever connected while it was so must be dropped
		// when it narrows.
		return false
	}
	for node, c := range claims {
		if d.claimHost(handle, node, c) == host {
			return true
		}
	}
	return false
}

func exportLabel(e rds.ExportState) string {
	if !e.Open {
		return "closed"
	}
	return e.String()
}

func without(claims map[string]informers.Claim, node string) map[string]informers.Claim {
	if _, ok := claims[node]; !ok {
		return claims
	}
	out := make(map[string]informers.Claim, len(claims))
	for n, c := range claims {
		if n != node {
			out[n] = c
		}
	}
	return out
}

// CutOff cuts a fenced attachment off a volume on the RDS before its
// claim is released (informers.StorageFence): the export is re-derived
// from the live claims without it, dropping every connection. A newer
// attachment of the node (published again since the fence read its claim)
// is not touched. Two others cannot hold it besides the fenced node.
func (s *ControllerServer) CutOff(ctx context.Context, pvName, handle string, attachment informers.Retiring) error {
	if !isVolumeID(handle) {
		return fmt.Errorf("volume handle %q is not this driver's", handle)
	}
	_, err := s.syncExport(ctx, handle, exportGoal{pv: pvName, gone: []informers.Retiring{attachment}, retire: true, cut: true})
	if errors.Is(err, rds.ErrNotFound) {
		return nil // no disk, no export
	}
	return err
}

// Settle re-derives a volume's export from its live claims after a fence
// released node's claim (informers.StorageFence), changing its state once
// more so that no open of the fenced attachment that was in flight can
// land. The released attachment counts as gone on every PV: another PV of
// the handle still shows it until its own release, and re-deriving from
// that would let the fenced attachment in again. When it fails, the
// release's RetiringAnnotation entry stays, and the leader makes the
// change (RetireMarked).
func (s *ControllerServer) Settle(ctx context.Context, pvName, handle string, released informers.Retiring) error {
	if !isVolumeID(handle) {
		return fmt.Errorf("volume handle %q is not this driver's", handle)
	}
	if released.Node == "" {
		// A cut whose release gave up: the export follows the live
		// claims again (the holder is let back in).
		_, err := s.syncExport(ctx, handle, exportGoal{pv: pvName})
		if errors.Is(err, rds.ErrNotFound) {
			return nil
		}
		return err
	}
	_, err := s.retire(ctx, handle, pvName, map[string][]informers.Retiring{pvName: {released}})
	return err
}

// retire changes the export's state once more after the release of the
// retired attachments (done: the records of those releases, by PV; a
// fresh tombstone when the export stays closed), with them treated as
// gone, so that no open of one that was in flight can land afterwards.
// Then it removes each record whose attachment no PV of the handle claims
// any more: one another PV still claims stays, keeping that claim from
// being let in until its own release. A record it fails to remove is
// removed by the leader (RetireMarked).
func (s *ControllerServer) retire(ctx context.Context, handle, pvName string, done map[string][]informers.Retiring) (exportResult, error) {
	var gone []informers.Retiring
	for _, rs := range done {
		gone = append(gone, rs...)
	}
	res, err := s.syncExport(ctx, handle, exportGoal{pv: pvName, gone: gone, retire: true})
	if errors.Is(err, rds.ErrNotFound) {
		res, err = exportResult{}, nil // no disk, no export
	}
	if err != nil {
		return res, err
	}
	for pv, rs := range done {
		var clear []informers.Retiring
		for _, r := range rs {
			if !r.In(res.shown) {
				clear = append(clear, r)
			}
		}
		if len(clear) == 0 {
			continue
		}
		if err := s.pub.Claims.ClearRetiring(ctx, pv, clear); err != nil {
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
func (s *ControllerServer) RetireMarked(ctx context.Context, report func(Mismatch)) (int, error) {
	if !s.d.opts.AllowHostFencing() || s.pub == nil {
		return 0, nil
	}
	left := 0
	var errs []error
	for _, v := range s.pub.Index.Retiring() {
		done := map[string][]informers.Retiring{}
		for _, pv := range v.PVs {
			if len(pv.Retiring) > 0 {
				done[pv.Name] = append(done[pv.Name], pv.Retiring...)
			}
		}
		if err := s.completeReleases(ctx, v, done); err != nil {
			errs = append(errs, fmt.Errorf("volume %s: %w", v.Handle, err))
			left++
			continue
		}
		res, err := s.retire(ctx, v.Handle, v.PVName, done)
		if err != nil {
			errs = append(errs, fmt.Errorf("volume %s: %w", v.Handle, err))
			left++
			continue
		}
		if report != nil && res.first.Open && res.first != res.state && s.d.retiredHost(v.Handle, done, res.first.Host) {
			report(Mismatch{Volume: v.Handle, PV: v.PVName, Found: res.first, Now: res.state})
		}
	}
	return left, errors.Join(errs...)
}

// completeReleases releases, on every other PV of v's handle (those the
// index knows and those a record names), the claims of the attachments
// done records as released, adding each PV where it released one to done.
func (s *ControllerServer) completeReleases(ctx context.Context, v *informers.Volume, done map[string][]informers.Retiring) error {
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
				ok, err := s.pub.Claims.ReleaseRetired(ctx, q, v.Handle, r)
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
func (d *Driver) retiredHost(handle string, done map[string][]informers.Retiring, host string) bool {
	for _, rs := range done {
		for _, r := range rs {
			if h := d.claimHost(handle, r.Node, informers.Claim{At: r.At, NodeUID: r.NodeUID, Nonce: r.Nonce}); h != "" && h == host {
				return true
			}
		}
	}
	return false
}

// storageError is how a failed export change fails a publish: nothing lets
// the node write, and the request is retried.
func storageError(id, node string, err error) error {
	if errors.Is(err, errExportTaken) {
		return statusf(codes.Aborted, "%v", err)
	}
	if errors.Is(err, errPasswordRefused) {
		return statusf(codes.FailedPrecondition, "volume %s: storage fencing could not open its export on the RDS to node %s, so it is not attached: %v", id, node, err)
	}
	if errors.Is(err, rds.ErrExportChanged) {
		return statusf(codes.Aborted, "volume %s: its export on the RDS kept changing while opening it to node %s (another controller replica or an operator): %v; the request is retried", id, node, err)
	}
	return statusf(codes.Unavailable, "volume %s: storage fencing could not open its export on the RDS to node %s, so it is not attached: %v", id, node, err)
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

// ReconcileExports is the leader's pass of storage fencing over every
// volume disk on the RDS, in both directions: an export open although no
// live claim calls for it (a volume made before storage fencing was on, a
// step that landed late, a replica that died between a release and its
// export change) is closed; one that is closed or open to another host
// than its live claims call for is moved. The index picks the candidates
// (no API call for a volume that matches it); each is then decided on its
// live claims (syncExport), so a lagging index never closes a live
// export. A disk with no PV in the index is not this pass's to judge. It
// stops before its next RDS write once ctx is done: pass the leader's
// leading context. report is called for every mismatch found.
func (s *ControllerServer) ReconcileExports(ctx context.Context, report func(Mismatch)) (int, error) {
	if !s.d.opts.AllowHostFencing() || s.pub == nil || !s.pub.Synced() {
		return 0, nil
	}
	var errs []error
	if _, err := s.RetireMarked(ctx, report); err != nil {
		errs = append(errs, err)
	}
	disks, err := s.d.rds.ListDisks(ctx)
	if err != nil {
		return 0, errors.Join(append(errs, err)...)
	}
	sort.Slice(disks, func(i, j int) bool { return disks[i].Slot < disks[j].Slot })
	fixed := 0
	for i := range disks {
		disk := &disks[i]
		if !s.d.isVolumeDisk(disk) {
			continue
		}
		v := s.pub.Index.Volume(disk.Slot)
		if !v.Indexed() {
			continue
		}
		found := rds.StateOf(disk)
		claims := v.Claims.Map()
		if want, _ := s.d.wanted(disk.Slot, v, claims); matches(found, want) {
			continue
		}
		// A park on the way from a live holder is a move under way (or
		// one whose replica stopped half-way): finished, not reported.
		moving := found.Open && s.d.parkedFromHolder(disk.Slot, claims, found.Host)
		if err := ctx.Err(); err != nil {
			return fixed, errors.Join(append(errs, err)...)
		}
		res, err := s.syncExport(ctx, disk.Slot, exportGoal{pv: v.PVName, standing: true})
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
