package rds

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/klog/v2"

	"github.com/srvlab/rds-csi/pkg/nvme"
)

// Storage-level fencing: which host a disk's NVMe/TCP export is open to.
//
// What RouterOS does to ESTABLISHED connections when
// nvme-tcp-server-allow-host-name changes is not known (docs/routeros.md,
// assumed); Linux nvmet keeps them. So moving an export from one host to
// another turns it off first (which drops every connection), sets the
// host, and turns it on again: safe whichever way RouterOS behaves.
//
// Two controller replicas, or an operator, may change the same disk at the
// same time. Every /disk set here is conditioned on the state read (or
// just set) before it: the slot, the allowed host and the export flag, in
// one [find]. A set whose [find] matches nothing changes nothing, so a
// concurrent change is never overwritten; the disk is read back at the end
// and the read decides.

// ExportChange reports what SetExportHost did.
type ExportChange struct {
	Changed bool // a command was sent
	// Dropped: the export was turned off and on again (established
	// connections dropped). Also set when an error stopped the sequence
	// after the off command was answered: then the export is off.
	Dropped bool
	// Gap is the time from the off command's answer to the on command's
	// answer, when no host could reach the disk (0 when not dropped).
	Gap    time.Duration
	Before Disk // the disk as read before the change
}

// SetExportHost leaves slot exported to host alone ("" = any host).
//   - Already exported with AllowHost == host: no command (Changed=false).
//   - Export off: set the host, then export on (nothing to drop).
//   - Exported to another host, or to any host while host != "": when drop
//     is true, export off, set the host, export on; when drop is false, set
//     the host only (established connections of the old host may live on).
//   - Widening to "" (any host): set the host only, never drops.
//
// Each set is conditioned on the disk's allowed host and export flag as
// read before it; afterwards the disk is read back and must be exported
// with AllowHost == host, else the error wraps ErrExportChanged and names
// what was found (and ErrNotFound too when the disk is gone). The disk's
// port and NQN must be set already (CreateDisk with an Export). host is
// validated with ValidateNQN unless it is "". A failure part way leaves
// the export off or unchanged, never open to a host nobody asked for;
// calling again completes it.
func (c *Client) SetExportHost(ctx context.Context, slot, host string, drop bool) (ExportChange, error) {
	var ch ExportChange
	if err := ValidateSlot(slot); err != nil {
		return ch, err
	}
	if host != "" {
		if err := ValidateNQN(host); err != nil {
			return ch, err
		}
	}
	d, err := c.GetDisk(ctx, slot)
	if err != nil {
		return ch, err
	}
	ch.Before = *d
	if d.Port == 0 || d.NQN == "" {
		// A closed export may hide its port and NQN (hidden.go): then
		// RouterOS is asked whether its NQN is empty.
		none := true
		if hidesExport(d) && d.NQN == "" {
			if none, err = c.holds(ctx, slot, "nvme-tcp-server-nqn=%s", ""); err != nil {
				return ch, err
			}
		}
		if none {
			return ch, fmt.Errorf("%w: disk %q has no NVMe/TCP port and NQN to export (it was created without an export)", ErrInvalidArgument, slot)
		}
	}
	if d.Exported && d.AllowHost == host {
		return ch, nil
	}
	old := d.AllowHost
	steps := c.exportSteps(ctx, slot, &ch)
	switch {
	case !d.Exported:
		if old != host {
			steps.setHost(old, false, host)
		}
		steps.turn(host, true)
	case host == "" || !drop:
		steps.setHost(old, true, host)
	default:
		steps.turn(old, false)
		steps.setHost(old, false, host)
		steps.turn(host, true)
	}
	if steps.err != nil {
		if !steps.offAt.IsZero() {
			return ch, fmt.Errorf("exporting disk %q to %s: the export is off (no host can connect); retry to complete: %w", slot, hostLabel(host), steps.err)
		}
		return ch, fmt.Errorf("exporting disk %q to %s: %w", slot, hostLabel(host), steps.err)
	}
	after, err := c.GetDisk(ctx, slot)
	switch {
	case errors.Is(err, ErrNotFound):
		return ch, fmt.Errorf("%w: disk %q is gone after exporting it to %s: %w", ErrExportChanged, slot, hostLabel(host), err)
	case err != nil:
		return ch, fmt.Errorf("reading disk %q back after exporting it to %s: %w", slot, hostLabel(host), err)
	case !after.Exported || after.AllowHost != host:
		return ch, fmt.Errorf("%w: disk %q should be exported to %s, found %s (before: %s); another controller replica or an operator changed it and nothing was overwritten: re-read the volume's state before retrying",
			ErrExportChanged, slot, hostLabel(host), describeExport(after), describeExport(&ch.Before))
	case after.Port == 0 || after.NQN == "":
		return ch, fmt.Errorf("%w: disk %q is exported without an NVMe/TCP port or NQN (it was created without an export); set them with /disk set or recreate it", ErrInvalidArgument, slot)
	}
	c.rememberHost(slot, host)
	klog.FromContext(ctx).Info("RDS export host set", "slot", slot, "host", hostLabel(host), "before", describeExport(&ch.Before),
		"dropped", ch.Dropped, "gap", ch.Gap)
	return ch, nil
}

// CloseExport turns slot's export off (dropping every connection) and
// clears its allowed host, but only while its allowed host is expectHost
// ("" included), conditioned like SetExportHost. It returns changed=false
// and nil, sending nothing, when the disk is already not exported or is
// exported to another host (someone moved it on: not ours to close;
// expectHost != "" and an export open to any host count as another host).
// changed=true means commands were sent; the disk read back afterwards is
// then not exported, or exported to another host than expectHost (moved
// on concurrently, after our off dropped the connections). Still exported
// to expectHost is ErrExportChanged. A missing disk is ErrNotFound.
func (c *Client) CloseExport(ctx context.Context, slot, expectHost string) (changed bool, err error) {
	if err := ValidateSlot(slot); err != nil {
		return false, err
	}
	if expectHost != "" {
		if err := ValidateNQN(expectHost); err != nil {
			return false, err
		}
	}
	d, err := c.GetDisk(ctx, slot)
	if err != nil {
		return false, err
	}
	if !d.Exported || d.AllowHost != expectHost {
		return false, nil
	}
	var ch ExportChange
	steps := c.exportSteps(ctx, slot, &ch)
	steps.turn(expectHost, false)
	if expectHost != "" {
		// Conditioned on export=no too: had someone turned it on again for
		// the same host meanwhile, clearing the host would open it to all.
		steps.setHost(expectHost, false, "")
	}
	if steps.err != nil {
		return ch.Changed, fmt.Errorf("closing the export of disk %q to %s: %w", slot, hostLabel(expectHost), steps.err)
	}
	after, err := c.GetDisk(ctx, slot)
	switch {
	case errors.Is(err, ErrNotFound):
		return true, nil // nothing exports a disk that is gone
	case err != nil:
		return true, fmt.Errorf("reading disk %q back after closing its export: %w", slot, err)
	case after.Exported && after.AllowHost == expectHost:
		return true, fmt.Errorf("%w: disk %q is still exported to %s after closing it (before: %s); another controller replica or an operator opened it again",
			ErrExportChanged, slot, hostLabel(expectHost), describeExport(d))
	}
	if !after.Exported {
		c.rememberHost(slot, "")
	}
	klog.FromContext(ctx).Info("RDS export closed", "slot", slot, "host", hostLabel(expectHost), "after", describeExport(after))
	return true, nil
}

// exportSequence runs the conditional sets of one export change in order.
// After the first error, or a set whose [find] RouterOS said matched
// nothing, the rest is skipped: the disk changed under us, and the read
// back decides.
type exportSequence struct {
	c       *Client
	ctx     context.Context
	slot    string
	ch      *ExportChange
	stopped bool
	err     error
	offAt   time.Time
}

func (c *Client) exportSteps(ctx context.Context, slot string, ch *ExportChange) *exportSequence {
	return &exportSequence{c: c, ctx: ctx, slot: slot, ch: ch}
}

// turn sets nvme-tcp-export=on|off on the disk while its allowed host is
// host and its export is the opposite.
func (s *exportSequence) turn(host string, on bool) {
	assign := "nvme-tcp-export=no"
	if on {
		assign = "nvme-tcp-export=yes"
	}
	if !s.set(host, !on, assign) {
		return
	}
	now := time.Now()
	switch {
	case !on:
		s.offAt = now
		s.ch.Dropped = true
	case !s.offAt.IsZero():
		s.ch.Gap = now.Sub(s.offAt)
	}
}

// setHost sets the allowed host to host while it is old and the export is
// exported.
func (s *exportSequence) setHost(old string, exported bool, host string) {
	s.set(old, exported, "nvme-tcp-server-allow-host-name=%s", host)
}

// set runs `/disk set [find where slot=S and nvme-tcp-server-allow-host-name=H
// and nvme-tcp-export=yes|no] assign` and reports whether the sequence goes
// on. RouterOS may answer a set on an empty [find] with silence or with
// "no such item" (docs/routeros.md): the latter stops the sequence without
// an error.
func (s *exportSequence) set(host string, exported bool, assign string, values ...string) bool {
	if s.stopped || s.err != nil {
		return false
	}
	s.ch.Changed = true
	_, err := s.c.exec(s.ctx, "/disk set [find where slot=%s and nvme-tcp-server-allow-host-name=%s and nvme-tcp-export="+yesNo(exported)+"] "+assign,
		append([]string{s.slot, host}, values...)...)
	switch {
	case errors.Is(err, ErrNotFound):
		s.stopped = true
		return false
	case err != nil:
		s.err = err
		return false
	}
	return true
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func hostLabel(host string) string {
	if host == "" {
		return "any host"
	}
	return host
}

// describeExport says how a disk is exported, for errors and logs.
func describeExport(d *Disk) string {
	if !d.Exported {
		if d.AllowHost != "" {
			return fmt.Sprintf("not exported (allowed host %s kept)", d.AllowHost)
		}
		return "not exported"
	}
	return "exported to " + hostLabel(d.AllowHost)
}

// ExportState is a disk's export as storage fencing sees it: open or not,
// and the allowed host name (kept while closed). Storage fencing gives
// every attachment its own host NQN and every close a fresh one that no
// host has (a tombstone), so a state, once left, never comes back: a
// command conditioned on an old state can never match again.
type ExportState struct {
	Open bool
	Host string // "" = any host
}

func (e ExportState) String() string {
	if !e.Open {
		if e.Host != "" {
			return "closed (allowed host " + e.Host + ")"
		}
		return "closed"
	}
	return "open to " + hostLabel(e.Host)
}

// StateOf is the export state of d.
func StateOf(d *Disk) ExportState { return ExportState{Open: d.Exported, Host: d.AllowHost} }

// SwapExport moves slot's export from `from` to `to` in ONE command,
// `/disk set [find where slot=S and nvme-tcp-server-allow-host-name=F and
// nvme-tcp-export=yes|no] nvme-tcp-export=... nvme-tcp-server-allow-host-name=...`,
// which RouterOS applies only while the disk is still in `from`: a command
// that lands late, after some other change, matches nothing and changes
// nothing (compare-and-swap). Turning the export off drops every
// established connection. The disk is read back afterwards and its state
// returned; anything but `to` is ErrExportChanged (nothing was
// overwritten: re-read and decide again). A missing disk is ErrNotFound.
// Both hosts are validated (ValidateNQN) unless "". The export's password
// is left as it is (SwapExportAuth sets it).
//
// Whether RouterOS applies both properties of one set together is assumed
// (docs/routeros.md); the safety argument does not rest on their order:
// either intermediate state is closed, or open to a host that either
// state allowed.
func (c *Client) SwapExport(ctx context.Context, slot string, from, to ExportState) (ExportState, error) {
	_, after, err := c.swapExport(ctx, slot, from, to, nil)
	return after, err
}

// SwapExportAuth is SwapExport that sets the export's password in the
// same command (`... nvme-tcp-server-allow-host-name=T
// nvme-tcp-server-password=P`); a zero password clears it (`""`). It
// returns the secret read back with the state (nvme-tcp-server-secret,
// what the allowed host must present; zero when none is printed). With
// a password and `to` open, a read back that is `to` but shows no
// secret, or one in a form this client cannot read, is an error naming
// the slot (never the password): the host could not be told what to
// present.
//
// The compare-and-swap condition stays on the slot, the export flag and
// the allowed host alone, not on the password (which RouterOS never
// prints, so no condition could be read back anyway): every password is
// derived by the caller from the host it goes with, and storage fencing
// never reuses a host NQN (each attachment has its own, each close a fresh
// tombstone, each park a fresh one), so a state, host included, once left
// never comes back, and whoever matches the host matches the password the
// state was made with. The password travels in the command only: the
// command is never logged, observed or put into an error with it
// (runHiding).
//
// With from == to nothing is sent (a read back only), as SwapExport.
func (c *Client) SwapExportAuth(ctx context.Context, slot string, from, to ExportState, password ExportPassword) (ExportState, nvme.DHCHAPSecret, error) {
	d, after, err := c.swapExport(ctx, slot, from, to, &password)
	if err != nil || d == nil {
		return after, nvme.DHCHAPSecret{}, err
	}
	if to.Open && !password.IsZero() && from != to && (d.Secret.IsZero() || d.SecretUnreadable) {
		what := "prints no nvme-tcp-server-secret (a RouterOS user without the sensitive policy may not see it)"
		if d.SecretUnreadable {
			what = "prints its nvme-tcp-server-secret in a form this driver cannot read (not DHHC-1)"
		}
		return after, nvme.DHCHAPSecret{}, fmt.Errorf("%w: disk %q was given an export password with its allowed host, but %s: the host could not authenticate (RouterOS's export password is assumed, docs/routeros.md); run rdsctl selftest on this RDS, or turn --export-auth off", ErrBadOutput, slot, what)
	}
	return after, d.Secret, nil
}

// swapExport is SwapExport and SwapExportAuth (password nil: the password
// is left as it is). It returns the disk read back too (nil when none was
// read).
func (c *Client) swapExport(ctx context.Context, slot string, from, to ExportState, password *ExportPassword) (*Disk, ExportState, error) {
	if err := ValidateSlot(slot); err != nil {
		return nil, ExportState{}, err
	}
	for _, h := range []string{from.Host, to.Host} {
		if h != "" {
			if err := ValidateNQN(h); err != nil {
				return nil, ExportState{}, err
			}
		}
	}
	if password != nil && !password.IsZero() {
		if _, err := NewExportPassword(password.v()); err != nil {
			return nil, ExportState{}, err
		}
	}
	if from == to {
		d, err := c.swapReadBack(ctx, slot, from, to)
		if err != nil {
			return nil, ExportState{}, err
		}
		after, err := checkSwapRead(slot, from, to, d)
		return d, after, err
	}
	format := "/disk set [find where slot=%s and nvme-tcp-server-allow-host-name=%s and nvme-tcp-export=" + yesNo(from.Open) + "] nvme-tcp-export=" + yesNo(to.Open) + " nvme-tcp-server-allow-host-name=%s"
	values := []string{slot, from.Host, to.Host}
	var hidden []string
	if password != nil {
		format += " nvme-tcp-server-password=%s"
		values = append(values, password.v())
		hidden = []string{password.v()}
	}
	cmd, err := command(format, values...)
	if err == nil {
		_, err = c.runHiding(ctx, cmd, hidden)
	}
	if err != nil && !errors.Is(err, ErrNotFound) {
		// Timed out or failed: it may still land (or have landed); the
		// read back below cannot tell a late landing from none, so the
		// caller re-reads before deciding again.
		return nil, ExportState{}, fmt.Errorf("exporting disk %q: %s -> %s: %w", slot, from, to, err)
	}
	d, err := c.swapReadBack(ctx, slot, from, to)
	if err != nil {
		return nil, ExportState{}, err
	}
	after, err := checkSwapRead(slot, from, to, d)
	if err != nil {
		return d, after, err
	}
	klog.FromContext(ctx).Info("RDS export swapped", "slot", slot, "from", from.String(), "to", to.String(), "password", passwordLabel(password))
	return d, after, nil
}

// passwordLabel says what a swap did to the password, for logs.
func passwordLabel(p *ExportPassword) string {
	switch {
	case p == nil:
		return "kept"
	case p.IsZero():
		return "cleared"
	}
	return "set"
}

// Retombstone gives a closed export whose allowed host RouterOS does not
// print, and this client cannot confirm (Disk.AllowHostUnknown), the fresh
// host `to` (closed), in one command conditioned on the export being off
// alone: `/disk set [find where slot=S and nvme-tcp-export=no]
// nvme-tcp-export=no nvme-tcp-server-allow-host-name=T`. A controller that
// did not write a closed export's tombstone can then condition an open on
// one it knows. It lets no host in: landing late, it can only replace one
// closed state by another (and, never re-sent, it makes `to` once). The
// disk is read back; anything but `to` is ErrExportChanged.
func (c *Client) Retombstone(ctx context.Context, slot string, to ExportState) (ExportState, error) {
	if err := ValidateSlot(slot); err != nil {
		return ExportState{}, err
	}
	if to.Open || to.Host == "" {
		return ExportState{}, fmt.Errorf("%w: Retombstone needs a closed state with a host, not %s", ErrInvalidArgument, to)
	}
	if err := ValidateNQN(to.Host); err != nil {
		return ExportState{}, err
	}
	_, err := c.exec(ctx, "/disk set [find where slot=%s and nvme-tcp-export=no] nvme-tcp-export=no nvme-tcp-server-allow-host-name=%s", slot, to.Host)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return ExportState{}, fmt.Errorf("exporting disk %q: closed (allowed host not printed) -> %s: %w", slot, to, err)
	}
	d, err := c.swapReadBack(ctx, slot, to, to)
	if err != nil {
		return ExportState{}, err
	}
	return checkSwapRead(slot, ExportState{}, to, d)
}

// swapReadBack reads slot after a swap. A closed export that does not
// print its allowed host (hidden.go) has it confirmed against the two
// states of the swap, so a swap that landed, or one that matched nothing,
// reads as what RouterOS holds; a host no candidate confirms reads as ""
// and so never as the state asked for.
func (c *Client) swapReadBack(ctx context.Context, slot string, from, to ExportState) (*Disk, error) {
	d, err := c.GetDisk(ctx, slot)
	if err != nil {
		return nil, err
	}
	if d.AllowHostUnknown {
		if err := c.resolveHost(ctx, d, to.Host, from.Host); err != nil {
			return nil, err
		}
	}
	if !d.AllowHostUnknown {
		c.rememberHost(slot, d.AllowHost)
	}
	return d, nil
}

// checkSwapRead is checkSwap on a disk read back, which must not be a
// closed export whose allowed host is unknown (it reads as "" then).
func checkSwapRead(slot string, from, to ExportState, d *Disk) (ExportState, error) {
	if d.AllowHostUnknown {
		return StateOf(d), fmt.Errorf("%w: disk %q should be %s, found it closed with an allowed host that RouterOS does not print and that is neither %s nor %s; another controller replica or an operator changed it and nothing was overwritten",
			ErrExportChanged, slot, to, from, to)
	}
	return checkSwap(slot, from, to, StateOf(d))
}

func checkSwap(slot string, from, to, after ExportState) (ExportState, error) {
	if after != to {
		return after, fmt.Errorf("%w: disk %q should be %s, found %s (expected to move it from %s); another controller replica or an operator changed it and nothing was overwritten",
			ErrExportChanged, slot, to, after, from)
	}
	return after, nil
}
