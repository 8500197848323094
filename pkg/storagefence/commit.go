package storagefence

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/informers"
	"github.com/srvlab/rds-csi/pkg/nvme"
	"github.com/srvlab/rds-csi/pkg/rds"
	"k8s.io/klog/v2"
)

// Commit is one publish's commit of a node's claim on a volume.
type Commit struct {
	// Volume is the index entry the decision was made on (the PVs and
	// the resourceVersions the claim writes are conditional on).
	Volume *informers.Volume
	Node   string
	// Claim is the node's claim as it is to be written, its publish count
	// already counted.
	Claim claims.Claim
	// Created: a new attachment, not the node's live one published again.
	// One that no longer stands once committed is taken back.
	Created bool
	// Fenced: the stale holders the decision found, each confirmed by a
	// live read of its node; their claims go with the commit.
	Fenced []fencing.Fence
	// Replaces: the node's own earlier attachment the claim replaces (of
	// another incarnation of the node, or one only a stale PV showed).
	Replaces *claims.Retiring
}

// Committed is what a Commit let the node write through.
type Committed struct {
	// Claim is the node's live claim the export was opened for.
	Claim claims.Claim
	// HostNQN is the attachment's own host NQN ("": the node connects
	// with its own: no storage fencing, or an attachment from before
	// per-attachment NQNs).
	HostNQN string
	// Export, Secret, SecretUnreadable: the export as it was opened, and
	// its secret as read back (authenticated exports).
	Export           rds.ExportState
	Secret           nvme.DHCHAPSecret
	SecretUnreadable bool
}

// Commit makes c's claim stand, in five steps, each of which leaves
// nothing that lets the node write when it fails:
//   - stand: a live, non-deleting VolumeAttachment of the volume on the
//     node exists (a replica that wakes up after a detach leaves no claim);
//   - cut: with storage fencing, the attachments the claim retires (the
//     fenced holders', the node's own replaced one) are cut off the
//     export before their claims go;
//   - commit: the claim is written to every PV of the volume, conditional
//     on the resourceVersions the decision read (claims.ErrConflict when
//     one changed: the caller decides again);
//   - confirm: the VolumeAttachment and the Node are read back; if either
//     no longer stands, a claim this call created is taken back;
//   - open: with storage fencing, the export is opened to the claim's
//     attachment on the live claims, and the attachment is answered only
//     if the claim opened for is still the node's live one.
//
// A failure after a cut (or of the cut itself) is followed by a settle on
// the live claims, as a Release's cut is (settleAfterCut). Every failure is
// a *StepError, except claims.ErrConflict.
func (f *Fence) Commit(ctx context.Context, c Commit) (Committed, error) {
	if err := f.stand(ctx, c); err != nil {
		return Committed{}, err
	}
	gone := c.retires()
	cut, err := f.cutRetired(ctx, c, gone)
	committed := false
	if err == nil {
		if err = f.commit(ctx, c); err == nil {
			committed = true
			err = f.confirm(ctx, c)
		}
	}
	if err != nil {
		if cut {
			f.settleAfterCut(ctx, c, committed, gone)
		}
		return Committed{}, err
	}
	return f.open(ctx, c, gone)
}

// settleAfterCut brings the export in line with the live claims after a
// commit that cut attachments off and then failed, as a Release settles
// after its cut: a commit that did not land left the cut holders' claims,
// and they are let back in at once (not at the leader's next reconcile);
// one that landed released them, and the state changes once more. Only a
// holder a live VolumeAttachment stands on is let in. A failure is logged:
// the leader's reconcile makes the change.
func (f *Fence) settleAfterCut(ctx context.Context, c Commit, committed bool, gone []claims.Retiring) {
	g := exportGoal{pv: c.Volume.PVName, standing: true}
	if committed {
		g.gone, g.retire = gone, true
	}
	if _, err := f.syncExport(ctx, c.Volume.Handle, g); err != nil && !errors.Is(err, rds.ErrNotFound) {
		klog.FromContext(ctx).Error(err, "storage fencing: settling the export after a failed publish that cut attachments off; the leader's reconcile settles it", "volume", c.Volume.Handle, "node", c.Node)
	}
}

// retires is the attachments c retires, as the decision saw them: one
// replaced or released since (another replica's publish of the same
// node) is not cut again.
func (c Commit) retires() []claims.Retiring {
	var gone []claims.Retiring
	for _, fd := range c.Fenced {
		if cl, ok := c.Volume.Claims.Get(fd.Node); ok {
			gone = append(gone, claims.RetiringOf(fd.Node, cl))
		}
	}
	if c.Replaces != nil {
		gone = append(gone, *c.Replaces)
	}
	return gone
}

// stand: a live, non-deleting VolumeAttachment of the volume on the node
// exists, read from the API server. It is read before the commit as well
// as after it (confirm): a claim written for an attachment already gone
// could only be taken back by this call (no attacher calls again for a
// VolumeAttachment that is gone), so every failure of that take-back
// would leave it for good.
func (f *Fence) stand(ctx context.Context, c Commit) error {
	id := c.Volume.Handle
	ok, err := f.store.LiveAttachment(ctx, id, c.Node, PVNames(c.Volume))
	if err != nil {
		return stepErr("unconfirmed", Unavailable, "volume %s: cannot confirm its VolumeAttachment on node %s with the API server (%v); retry", id, c.Node, err)
	}
	if !ok {
		return stepErr("no-attachment", Aborted, "volume %s: no live VolumeAttachment of it on node %s (it was detached or is being deleted, e.g. this request comes from an attacher that lost its lease); nothing was recorded", id, c.Node)
	}
	return nil
}

// cutRetired cuts the attachments the commit retires off the export before
// their claims go with it (as a Release does): a cut that fails keeps the
// claims and the publish is retried, never a released claim whose host is
// still connected with nothing left to cut it. It reports whether it
// changed the export, or may have (a cut that failed part-way): Commit
// then settles whatever comes after. Joining another holder (a
// migration) moves the export without a drop, which would leave a fenced
// node connected: that waits for the fence.
func (f *Fence) cutRetired(ctx context.Context, c Commit, gone []claims.Retiring) (bool, error) {
	if !f.fencing {
		return false, nil
	}
	id := c.Volume.Handle
	var fenced []string
	for _, fd := range c.Fenced {
		fenced = append(fenced, fd.Node)
	}
	holders := 1
	for n := range c.Volume.Claims.All() {
		if n != c.Node && !slices.Contains(fenced, n) {
			holders++
		}
	}
	if holders > 1 && len(fenced) > 0 {
		return false, stepErr("storage", Aborted, "volume %s: node(s) %v must be cut off the RDS before %s joins %d other holder(s); the fence is under way and the request is retried", id, fenced, c.Node, holders-1)
	}
	if len(gone) == 0 {
		return false, nil
	}
	if _, err := f.syncExport(ctx, id, exportGoal{pv: c.Volume.PVName, gone: gone, retire: true, cut: true}); err != nil && !errors.Is(err, rds.ErrNotFound) {
		// Some of the cut may have landed: settled like a later failure.
		return true, storageStep(id, c.Node, fmt.Errorf("cutting %v off before releasing their claims: %w", gone, err))
	}
	return true, nil
}

// commit writes the claim to every PV of the volume (the fenced holders'
// claims go with it), and reports each fence it made.
func (f *Fence) commit(ctx context.Context, c Commit) error {
	v := c.Volume
	var fenced []string
	for _, fd := range c.Fenced {
		fenced = append(fenced, fd.Node)
	}
	if err := f.store.Commit(ctx, v.Handle, v.PVs, v.Claims, c.Node, c.Claim, c.Created, fenced); err != nil {
		if errors.Is(err, claims.ErrConflict) {
			return err
		}
		return stepErr("error", Unavailable, "volume %s: recording the attachment to node %s on PV %s (nothing was answered; the attach is retried): %w", v.Handle, c.Node, v.PVName, err)
	}
	for _, fd := range c.Fenced {
		f.reporter.Fenced(v.Ref(), fd.Node, fd.Reason)
	}
	return nil
}

// confirm re-reads the VolumeAttachment and the Node after the commit
// (both at once: each read is after the write, so their order does not
// matter); if either no longer stands, nothing is answered, and a claim
// this call created is taken back. A claim that was there before (a
// repeated publish of an attachment already answered) stays: its
// attachment's detach releases it, and until then that node may be
// writing.
func (f *Fence) confirm(ctx context.Context, c Commit) error {
	v, id, node := c.Volume, c.Volume.Handle, c.Node
	var (
		attached bool
		vaErr    error
		read     = make(chan struct{})
	)
	go func() {
		defer close(read)
		attached, vaErr = f.store.LiveAttachment(ctx, id, node, PVNames(v))
	}()
	n, nodeErr := f.nodes.LiveNode(ctx, node)
	<-read
	why := ""
	switch {
	case nodeErr != nil:
		// Unconfirmed: a claim this call created must not outlive it.
		why = "its Node could not be read back"
	case !n.Exists:
		why = "its Node was deleted"
	case n.UID != c.Claim.NodeUID:
		why = "its Node was deleted and re-created"
	case vaErr != nil:
		why = "its VolumeAttachment could not be read back"
	case !attached:
		why = "its VolumeAttachment was detached or is being deleted"
	}
	if why == "" {
		return nil
	}
	if !c.Created {
		return stepErr("no-attachment", Aborted, "volume %s: the attachment to node %s no longer stands (%s); nothing was answered, and its detach releases the claim", id, node, why)
	}
	for _, pv := range v.PVs {
		if _, err := f.store.Withdraw(ctx, pv.Name, node, c.Claim); err != nil {
			return stepErr("no-attachment", Unavailable, "volume %s: the attachment to node %s no longer stands (%s) and taking its claim back on PV %s failed: %v; retry", id, node, why, pv.Name, err)
		}
	}
	return stepErr("no-attachment", Aborted, "volume %s: the attachment to node %s no longer stands (%s); its claim was taken back and nothing was answered", id, node, why)
}

// open lets the attachment in on the RDS (and everyone else out) before
// the node is told it may write: the export follows the live claims,
// preferring the requester. After a commit that retired other
// attachments (cut above), the state changes once more, so that no open
// of a retired attachment in flight lands. The node is answered only for
// the claim the export was opened for.
func (f *Fence) open(ctx context.Context, c Commit, gone []claims.Retiring) (Committed, error) {
	if !f.fencing {
		return Committed{Claim: c.Claim}, nil
	}
	id, node := c.Volume.Handle, c.Node
	res, err := f.syncExport(ctx, id, exportGoal{pv: c.Volume.PVName, prefer: node, gone: gone, retire: len(gone) > 0, readBack: true})
	if err != nil {
		return Committed{}, storageStep(id, node, err)
	}
	live, ok := res.held[node]
	if !ok || live.Nonce != c.Claim.Nonce || live.NodeUID != c.Claim.NodeUID {
		return Committed{}, stepErr("conflict", Aborted, "volume %s: node %s's claim was released or replaced while its export was being opened (a concurrent unpublish or fence); the export follows the live claims, and the request is retried", id, node)
	}
	out := Committed{Claim: live, Export: res.state, Secret: res.secret, SecretUnreadable: res.secretUnreadable}
	if live.Nonce != "" {
		// Without it (an attachment from before per-attachment host
		// NQNs) the node connects with its own NQN.
		out.HostNQN = f.HostOf(id, node, live)
	}
	return out, nil
}

// storageStep is how a failed export change fails a publish: nothing lets
// the node write, and the request is retried (or refused, when RouterOS
// refuses export passwords).
func storageStep(id, node string, err error) error {
	switch {
	case errors.Is(err, ErrExportTaken):
		return &StepError{Step: "storage", Outcome: Aborted, Err: err}
	case errors.Is(err, ErrPasswordRefused):
		return stepErr("storage", Refused, "volume %s: storage fencing could not open its export on the RDS to node %s, so it is not attached: %w", id, node, err)
	case errors.Is(err, rds.ErrExportChanged):
		return stepErr("storage", Aborted, "volume %s: its export on the RDS kept changing while opening it to node %s (another controller replica or an operator): %w; the request is retried", id, node, err)
	}
	return stepErr("storage", Unavailable, "volume %s: storage fencing could not open its export on the RDS to node %s, so it is not attached: %w", id, node, err)
}

// NewClaim is a new attachment's claim, made at: with storage fencing it
// gets its own nonce (its host NQN), and under authenticated exports it
// is made authenticated (a publish of it answers its secret or fails).
func (f *Fence) NewClaim(at time.Time) (claims.Claim, error) {
	c := claims.Claim{At: at}
	if !f.fencing {
		return c, nil
	}
	nonce, err := NewNonce()
	if err != nil {
		return claims.Claim{}, err
	}
	c.Nonce, c.Auth = nonce, f.auth
	return c, nil
}

// PVNames is the names of v's PersistentVolumes.
func PVNames(v *informers.Volume) []string {
	if v == nil {
		return nil
	}
	names := make([]string, 0, len(v.PVs))
	for _, pv := range v.PVs {
		names = append(names, pv.Name)
	}
	return names
}
