package rds

import (
	"context"
	"fmt"
	"strconv"
)

// A closed export may hide its server properties. On RDS2216 hardware
// every disk printed with nvme-tcp-export=no (the RAID arrays and members)
// showed no nvme-tcp-server-port, -nqn or -allow-host-name; only the
// exported disk did. Whether a closed file disk prints them is not known
// (docs/routeros.md), so the client never depends on them: a value that
// was not printed is confirmed by asking RouterOS for the disk with that
// value as a condition (`print detail where slot=S and
// nvme-tcp-server-allow-host-name=H`), which RouterOS evaluates on the
// property itself, as it does the conditions of the fencing sets. The
// candidates come from what this client created or set (or saw printed),
// "" only for a disk this client created closed without a host. A value
// no candidate confirms stays unknown (Disk.AllowHostUnknown).

// exportMemo is what this client last asked for or saw of a disk's export:
// candidates only, never taken without RouterOS confirming them.
type exportMemo struct {
	port      int
	nqn       string
	host      string
	hostKnown bool
}

// rememberExport notes the port and NQN a create or copy asks for.
func (c *Client) rememberExport(slot string, e *Export) {
	if e == nil {
		return
	}
	c.memoMu.Lock()
	defer c.memoMu.Unlock()
	m := c.memo[slot]
	m.port, m.nqn = e.Port, e.NQN
	if e.Closed {
		// Created (or copied) closed with no allowed host.
		m.host, m.hostKnown = "", true
	}
	c.memo[slot] = m
}

// rememberHost notes the allowed host an export change asked for.
func (c *Client) rememberHost(slot, host string) {
	c.memoMu.Lock()
	defer c.memoMu.Unlock()
	m := c.memo[slot]
	m.host, m.hostKnown = host, true
	c.memo[slot] = m
}

func (c *Client) recall(slot string) exportMemo {
	c.memoMu.Lock()
	defer c.memoMu.Unlock()
	return c.memo[slot]
}

// hidesExport reports that d was printed closed and without its NVMe/TCP
// server port (a port is 1-65535 when printed, so 0 means not printed).
func hidesExport(d *Disk) bool { return !d.Exported && d.Port == 0 }

// resolveHidden fills in the export properties a closed disk did not
// print, where a candidate is confirmed by RouterOS; what no candidate
// confirms stays unknown. A disk that printed them is only noted.
func (c *Client) resolveHidden(ctx context.Context, d *Disk) error {
	if !hidesExport(d) && !d.AllowHostUnknown {
		c.memoMu.Lock()
		m := c.memo[d.Slot]
		m.port, m.nqn = d.Port, d.NQN
		m.host, m.hostKnown = d.AllowHost, true
		c.memo[d.Slot] = m
		c.memoMu.Unlock()
		return nil
	}
	m := c.recall(d.Slot)
	if m.port != 0 && m.nqn != "" && d.NQN == "" {
		ok, err := c.holds(ctx, d.Slot, "nvme-tcp-server-port="+strconv.Itoa(m.port)+" and nvme-tcp-server-nqn=%s", m.nqn)
		if err != nil {
			return err
		}
		if ok {
			d.Port, d.NQN = m.port, m.nqn
		}
	}
	if !d.AllowHostUnknown {
		return nil
	}
	// Only what this client set or created is a candidate, "" too: a
	// RouterOS that compared a hidden property as empty would confirm ""
	// for every closed disk, a tombstone's too, and a swap conditioned on
	// closed "" would then match any closed state. Another client's host
	// stays unknown (storage fencing then writes a tombstone it knows).
	if !m.hostKnown {
		return c.resolveHost(ctx, d)
	}
	return c.resolveHost(ctx, d, m.host)
}

// resolveHost sets the allowed host of a disk that did not print it to
// the first candidate RouterOS confirms, else marks it unknown.
func (c *Client) resolveHost(ctx context.Context, d *Disk, candidates ...string) error {
	for _, h := range candidates {
		ok, err := c.holds(ctx, d.Slot, "nvme-tcp-server-allow-host-name=%s", h)
		if err != nil {
			return err
		}
		if ok {
			d.AllowHost, d.AllowHostUnknown = h, false
			return nil
		}
	}
	d.AllowHostUnknown = true
	return nil
}

// holds reports whether RouterOS lists the disk in slot under the extra
// condition cond (a format for command, its %s filled from values).
func (c *Client) holds(ctx context.Context, slot, cond string, values ...string) (bool, error) {
	l, err := c.printListing(ctx, "/disk print detail where slot=%s and "+cond, append([]string{slot}, values...)...)
	if err != nil {
		return false, fmt.Errorf("confirming a property disk %q did not print: %w", slot, err)
	}
	return len(l.Entries)+len(l.Skipped) > 0, nil
}

// ConfirmExport reports whether RouterOS holds slot in state now, asked
// with the state as a condition: it works whether or not a closed export
// prints its allowed host (a caller that keeps the closed host elsewhere,
// such as another controller replica, confirms it with this).
func (c *Client) ConfirmExport(ctx context.Context, slot string, state ExportState) (bool, error) {
	if err := ValidateSlot(slot); err != nil {
		return false, err
	}
	if state.Host != "" {
		if err := ValidateNQN(state.Host); err != nil {
			return false, err
		}
	}
	ok, err := c.holds(ctx, slot, "nvme-tcp-server-allow-host-name=%s and nvme-tcp-export="+yesNo(state.Open), state.Host)
	if err == nil && ok {
		c.rememberHost(slot, state.Host)
	}
	return ok, err
}
