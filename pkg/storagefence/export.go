package storagefence

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/informers"
	"github.com/srvlab/rds-csi/pkg/nvme"
	"github.com/srvlab/rds-csi/pkg/rds"
	"k8s.io/klog/v2"
)

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
	gone []claims.Retiring
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
	state rds.ExportState
	held  map[string]claims.Claim
	// first: the export as syncExport first read it.
	first rds.ExportState
	// shown: retiring attachments (informers.RetiringAnnotation) that a
	// PV of the handle still claims: their records must stay.
	shown []claims.Retiring
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
func readersOnly(v *informers.Volume, held map[string]claims.Claim) bool {
	if len(held) == 0 || !v.Indexed() || len(v.AccessModes) == 0 {
		return false
	}
	for _, m := range v.AccessModes {
		if m != corev1.ReadOnlyMany {
			return false
		}
	}
	for _, c := range held {
		if !strings.HasSuffix(c.Capability, "/"+csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY.String()) {
			return false
		}
	}
	return true
}

// wanted is the export claims on volume v call for, and the node it is
// open to ("" with readers only: open to any host).
func (f *Fence) wanted(handle string, v *informers.Volume, held map[string]claims.Claim) (rds.ExportState, string) {
	if readersOnly(v, held) {
		return rds.ExportState{Open: true}, ""
	}
	newest := ""
	for node, c := range held {
		if best, ok := held[newest]; !ok || c.At.After(best.At) || (c.At.Equal(best.At) && node > newest) {
			newest = node
		}
	}
	if newest == "" {
		return rds.ExportState{}, ""
	}
	return rds.ExportState{Open: true, Host: f.HostOf(handle, newest, held[newest])}, newest
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
func (f *Fence) parkedState(handle, host string) (rds.ExportState, error) {
	p, err := parkedNQN(f.key, handle, host)
	return rds.ExportState{Open: true, Host: p}, err
}

// parkedFromHolder: host is a park (parkedNQN) on the way from the host
// of one of claims' attachments, which is still connected.
func (f *Fence) parkedFromHolder(handle string, held map[string]claims.Claim, host string) bool {
	for node, c := range held {
		if h := f.HostOf(handle, node, c); h != "" && parkedFrom(f.key, handle, host, h) {
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
func (f *Fence) syncExport(ctx context.Context, handle string, g exportGoal) (exportResult, error) {
	s := &exportSync{f: f, ctx: ctx, handle: handle, g: g, logger: klog.FromContext(ctx).WithValues("volume", handle)}
	var first rds.ExportState
	for round := 0; round < syncRounds; round++ {
		d, err := f.readExport(ctx, handle, s.readBack)
		s.readBack = nil
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
			if err := s.swap(cur, next, "", func() (rds.ExportState, error) { return f.rds.Retombstone(ctx, handle, next) }); err != nil {
				return exportResult{}, err
			}
			continue
		}
		live, err := f.liveClaims(ctx, handle, g.pv)
		if err != nil {
			return exportResult{}, err
		}
		held, departing, cut := s.remaining(live.held)
		want, holder, err := s.target(cur, held)
		if err != nil {
			return exportResult{}, err
		}
		next, done, err := s.step(cur, want, held, departing, cut)
		switch {
		case err != nil:
			return exportResult{}, err
		case done:
			return exportResult{state: cur, held: held, first: first, shown: live.shown, secret: d.Secret, secretUnreadable: d.SecretUnreadable}, nil
		}
		if err := s.swap(cur, next, holder, func() (rds.ExportState, error) { return f.swapExport(ctx, handle, d, next, &s.secret, &s.secretRead) }); err != nil {
			return exportResult{}, err
		}
	}
	return exportResult{}, fmt.Errorf("%w: the export of volume %s kept changing for %d rounds (other controller replicas or an operator)", rds.ErrExportChanged, handle, syncRounds)
}

// exportSync is one syncExport call's state across its rounds.
type exportSync struct {
	f      *Fence
	ctx    context.Context
	handle string
	g      exportGoal
	logger klog.Logger
	// changed: a swap of this call landed.
	changed bool
	// ownPark: a park this call made on the way from a departing host
	// whose connections are gone (a graceful retirement), to be finished
	// without a drop. dropPark: a park this call made on the way to a
	// drop (step).
	ownPark, dropPark rds.ExportState
	// readBack: the export as the last swap read it back, for the next
	// round (exportGoal.readBack).
	readBack *rds.Disk
	// secret, secretRead: what the last swap read back of the secret
	// (secretRead false: a swap that does not read it, whose read back
	// is then not taken for the next round under --export-auth).
	secret     nvme.DHCHAPSecret
	secretRead bool
}

// swap makes one change from `from` to `to` with do, unless the call's
// context is done; an export that changed under it is no error (the next
// round decides again).
func (s *exportSync) swap(from, to rds.ExportState, holder string, do func() (rds.ExportState, error)) error {
	if err := s.ctx.Err(); err != nil {
		return fmt.Errorf("stopped before changing the export of volume %s: %w", s.handle, err)
	}
	s.secret, s.secretRead = nvme.DHCHAPSecret{}, false
	after, err := do()
	switch {
	case errors.Is(err, rds.ErrExportChanged):
		s.logger.V(2).Info("storage fencing: the export changed under a swap; deciding again", "found", after.String())
		return nil
	case err != nil:
		return err
	}
	if s.g.readBack && (s.secretRead || !s.f.auth) {
		s.readBack = &rds.Disk{Slot: s.handle, Exported: after.Open, AllowHost: after.Host, Secret: s.secret}
	}
	s.changed = true
	s.logger.Info("storage fencing: export changed", "from", from.String(), "to", exportLabel(to), "holder", holder)
	return nil
}

// remaining is the live claims without the attachments the goal retires
// (gone), the host of the one the export may still allow (departing),
// and whether its connections are to be dropped (cut: only while it is
// still claimed: one no longer claimed was retired, and cut as its
// retirement called for, by whoever released it).
func (s *exportSync) remaining(held map[string]claims.Claim) (map[string]claims.Claim, string, bool) {
	departing, cut := "", false
	for _, r := range s.g.gone {
		if c, ok := held[r.Node]; ok && r.Is(r.Node, c) {
			departing, cut = s.f.HostOf(s.handle, r.Node, c), s.g.cut
			held = without(held, r.Node)
		}
	}
	return held, departing, cut
}

// target is the export the claims held call for, given the export cur
// and the goal: open to the newest attachment, or to the requester, or
// left at a holder it allows; and the holder it is open to. Under the
// reconcile (standing), no one is let in on a claim no VolumeAttachment
// stands on.
func (s *exportSync) target(cur rds.ExportState, held map[string]claims.Claim) (rds.ExportState, string, error) {
	f, handle, g := s.f, s.handle, s.g
	want, holder := f.wanted(handle, f.index.Volume(handle), held)
	atHolder := cur.Open && f.holderHost(handle, held, cur.Host)
	if want.Open && want.Host == "" && holder == "" {
		// Readers only: open to any host, whoever asks.
	} else if c, ok := held[g.prefer]; ok && g.prefer != "" && (g.prefer == holder || !atHolder) {
		// The newest attachment (a migration's target, joining or
		// again), or an export that allows no live holder: the
		// requester's (it is told it may write only once it is let in).
		want, holder = rds.ExportState{Open: true, Host: f.HostOf(handle, g.prefer, c)}, g.prefer
	} else if ok && g.prefer != "" && cur.Open && cur.Host == f.HostOf(handle, g.prefer, c) {
		// The export already allows the requester, the older holder
		// (let in again by a move back): left so.
		want = cur
	} else if ok && g.prefer != "" {
		return rds.ExportState{}, "", fmt.Errorf("%w: volume %s: its export allows the newer holder %s (a migration's target), not node %s: one allowed host cannot take both; a connection node %s already has is kept, but it is not told it may write; retry once the migration settled",
			ErrExportTaken, handle, holder, g.prefer, g.prefer)
	} else if atHolder && len(held) > 1 {
		// A migration's export allows one of its holders: left alone.
		// Moving it to the other would shut out the one allowed.
		want = cur
	}
	if !g.standing || !want.Open || holder == "" || want == cur {
		return want, holder, nil
	}
	stands, err := f.standsOnAttachment(s.ctx, handle, holder)
	if err != nil || stands {
		return want, holder, err
	}
	// The reconcile lets no one in on a claim that no live
	// VolumeAttachment stands on (a claim brought back by hand, or whose
	// release reached one PV of the handle before that PV was deleted):
	// the publish of a live attachment opens the export itself. What it
	// finds open to a live holder, or parked on the way from one, stays;
	// anything else is closed.
	if cur.Open && (f.holderHost(handle, held, cur.Host) || f.parkedFromHolder(handle, held, cur.Host)) {
		return cur, holder, nil
	}
	return rds.ExportState{}, "", nil
}

// step is the next state on the way from cur to want (done: cur is what
// the goal calls for). A swap conditioned on an open state, which comes
// back whenever the export returns to its host, only ever leads to a
// state that never was before (a fresh tombstone, or a park); only such a
// state lets a host in.
func (s *exportSync) step(cur, want rds.ExportState, held map[string]claims.Claim, departing string, cut bool) (rds.ExportState, bool, error) {
	f, handle, changed := s.f, s.handle, s.changed
	switch {
	case matches(cur, want) && (changed || !s.g.retire || (want.Open && !cut)):
		return cur, true, nil
	case cur.Open && cur == s.dropPark:
		// The park of a drop: a fresh tombstone (every connection goes
		// with the export).
		next, err := closedState()
		return next, false, err
	case cur.Open && cut && !changed && f.holderHost(handle, held, cur.Host):
		// A drop of an export open to a live holder, to be reopened to
		// it: that open state comes back, so a drop conditioned on it
		// that landed late would close the export under the holder. Park
		// first, and drop from the park.
		next, err := f.parkedState(handle, cur.Host)
		s.dropPark = next
		return next, false, err
	case !want.Open, cur.Open && cut && !changed:
		// Close, or drop before opening: a fresh tombstone (every
		// connection goes with the export).
		next, err := closedState()
		return next, false, err
	case cur.Open && (cur == s.ownPark || f.parkedFromHolder(handle, held, cur.Host)):
		// Parked on its way from a live holder, whose connection stays,
		// or from a host that left gracefully: let the wanted host in.
		return want, false, nil
	case cur.Open && want.Open && !cut && departing != "" && cur.Host == departing:
		// A graceful retirement (its node Ready: it unstaged before the
		// detach, so it is not connected) of the host the export allows,
		// another holder remaining (a migration aborted): park on the way
		// to it, so that the remaining holder keeps its connection.
		next, err := f.parkedState(handle, cur.Host)
		s.ownPark = next
		return next, false, err
	case cur.Open && f.holderHost(handle, held, cur.Host):
		// A move between two live holders without a drop (a migration):
		// park first.
		next, err := f.parkedState(handle, cur.Host)
		return next, false, err
	case cur.Open:
		// Open to a host no live claim has (a retired attachment, a park
		// from one, any host): its connections go with the export.
		next, err := closedState()
		return next, false, err
	}
	// Open from closed.
	return want, false, nil
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
func (f *Fence) swapExport(ctx context.Context, handle string, d *rds.Disk, next rds.ExportState, secret *nvme.DHCHAPSecret, secretRead *bool) (rds.ExportState, error) {
	cur := rds.StateOf(d)
	if !f.auth {
		if d.Secret.IsZero() && !d.SecretUnreadable {
			return f.rds.SwapExport(ctx, handle, cur, next)
		}
		after, _, err := f.rds.SwapExportAuth(ctx, handle, cur, next, rds.ExportPassword{})
		return after, err
	}
	if next.Open && next.Host != "" && parkedFrom(f.key, handle, next.Host, cur.Host) {
		return f.rds.SwapExport(ctx, handle, cur, next)
	}
	var pw rds.ExportPassword
	if next.Open && next.Host != "" {
		var err error
		if pw, err = exportPassword(f.key, handle, next.Host); err != nil {
			return rds.ExportState{}, err
		}
	}
	after, sec, err := f.rds.SwapExportAuth(ctx, handle, cur, next, pw)
	*secret, *secretRead = sec, err == nil
	if err != nil && !pw.IsZero() && rds.RefusedInput(err) {
		// RouterOS refused the command as bad input, and every value in
		// it was validated before it was sent: the property itself was
		// refused, and every authenticated publish will be.
		err = fmt.Errorf("%w: %w", ErrPasswordRefused, err)
	}
	return after, err
}

// readExport reads volume handle's disk for a round of syncExport, or
// takes it from known: a swap's read-back, made after its command landed
// (its allowed host is known: a swap reads back nothing else).
func (f *Fence) readExport(ctx context.Context, handle string, known *rds.Disk) (*rds.Disk, error) {
	if known != nil {
		return known, nil
	}
	return f.rds.GetDisk(ctx, handle)
}

// liveState is what liveClaims read.
type liveState struct {
	// claims: the live claims, joined over the PVs, without retiring
	// attachments.
	held map[string]claims.Claim
	// retiring: the records of every PV read; shown: those a PV still
	// claims.
	retiring, shown []claims.Retiring
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
func (f *Fence) liveClaims(ctx context.Context, handle, pv string) (liveState, error) {
	names := []string{pv}
	if v := f.index.Volume(handle); v.Indexed() {
		for _, p := range v.PVs {
			names = append(names, p.Name)
		}
	}
	var st liveState
	type pvClaim struct {
		node string
		c    claims.Claim
	}
	var all []pvClaim
	seen := map[string]bool{}
	for i := 0; i < len(names) && len(seen) < maxHandlePVs; i++ {
		name := names[i]
		if name == "" || seen[name] {
			continue
		}
		seen[name] = true
		held, recs, err := f.store.LiveState(ctx, name, handle)
		if err != nil {
			return liveState{}, err
		}
		for n, c := range held {
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
		if claims.Retired(st.retiring, pc.node, pc.c) {
			continue
		}
		if st.held == nil {
			st.held = map[string]claims.Claim{}
		}
		if cur, ok := st.held[pc.node]; !ok || pc.c.At.After(cur.At) || (pc.c.At.Equal(cur.At) && pc.c.Gen > cur.Gen) {
			st.held[pc.node] = pc.c
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
func (f *Fence) standsOnAttachment(ctx context.Context, handle, node string) (bool, error) {
	v := f.index.Volume(handle)
	if v != nil {
		if _, ok := v.AttachmentOn(node); ok {
			return true, nil
		}
	}
	return f.store.AttachmentExists(ctx, handle, node, PVNames(v))
}

// holderHost: host is the allowed host of one of claims' attachments
// (moving from it to another holder needs no drop: a migration).
func (f *Fence) holderHost(handle string, held map[string]claims.Claim, host string) bool {
	if host == "" {
		// Any host: whoever connected while it was so must be dropped
		// when it narrows.
		return false
	}
	for node, c := range held {
		if f.HostOf(handle, node, c) == host {
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

func without(held map[string]claims.Claim, node string) map[string]claims.Claim {
	if _, ok := held[node]; !ok {
		return held
	}
	out := make(map[string]claims.Claim, len(held))
	for n, c := range held {
		if n != node {
			out[n] = c
		}
	}
	return out
}

// LiveClaim reads node's claim on volume handle from the API server, joined
// over every PV of the handle as the export follows them (pv, those the
// index knows, those a claim or record names): ok false when it has none,
// or only one a release record retires (released, its release not yet on
// every PV).
func (f *Fence) LiveClaim(ctx context.Context, handle, pv, node string) (claims.Claim, bool, error) {
	live, err := f.liveClaims(ctx, handle, pv)
	if err != nil {
		return claims.Claim{}, false, err
	}
	c, ok := live.held[node]
	return c, ok, nil
}
