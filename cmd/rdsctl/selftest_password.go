package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/srvlab/rds-csi/pkg/nvme"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// passwordChecks settle the export password (issue 26, docs/routeros.md
// "The export password"), all assumed until a box answers: the disk slot,
// open as at, is moved to host with a password of this run's in one
// compare-and-swap set (rds.Client.SwapExportAuth, as --export-auth
// does), and the secret is read back; with -data the host then connects
// with the secret and without it. A box that takes no password, prints
// no secret or does not require it is a finding (the facts say which),
// not a failed check: the rest of the self-test does not depend on it.
// It returns the disk's export state afterwards and whether it holds a
// password now (then only SwapExportAuth may close it: the plain set
// would leave the password behind).
func (st *selftestRun) passwordChecks(slot, nqn string, at rds.ExportState, host string) (rds.ExportState, bool) {
	c, ctx := st.c, st.ctx
	to := rds.ExportState{Open: true, Host: host}
	var secret nvme.DHCHAPSecret
	withPassword := false
	ok := st.check("export password: open to host C with a password", func() (string, error) {
		// 32 hex digits (128 bits), within what the client accepts.
		hexPW, err := randomHex(16)
		if err != nil {
			return "", err
		}
		pw, err := rds.NewExportPassword(hexPW)
		if err != nil {
			return "", err
		}
		after, sec, err := c.SwapExportAuth(ctx, slot, at, to, pw)
		if err == nil {
			at, secret, withPassword = after, sec, true
			st.fact("password-secret", confirmed, "the password was taken with the allowed host, and nvme-tcp-server-secret read back in the DHHC-1 form (not shown)")
			return "secret read back (DHHC-1; not shown)", nil
		}
		if ctx.Err() != nil {
			return "", err
		}
		// Refused, or taken without a readable secret: where is the disk?
		d, gerr := c.GetDisk(ctx, slot)
		if gerr != nil {
			return "", errors.Join(err, gerr)
		}
		switch now := rds.StateOf(d); {
		case now == at:
			st.fact("password-secret", contradicted, "the set with nvme-tcp-server-password was refused, nothing changed: %v", err)
			return "refused, nothing changed (the box takes no export password)", nil
		case now == to && errors.Is(err, rds.ErrBadOutput):
			at, withPassword = now, true
			st.fact("password-secret", contradicted, "the set was taken; %v", err)
			return "taken, but no readable secret printed", nil
		default:
			return "", fmt.Errorf("%w (the disk is now %s)", err, describe(now))
		}
	})
	if !ok || st.o.data == nil {
		return at, withPassword
	}
	if secret.IsZero() {
		st.fact("password-enforced", skipped, "no secret was read back to connect with")
		return at, withPassword
	}
	st.check("data: the allowed host with the secret", func() (string, error) {
		if _, err := st.o.data.read(ctx, nqn, host, secret, dataOffset, 512); err != nil {
			if ctx.Err() != nil {
				return "", err
			}
			st.fact("password-enforced", contradicted, "the allowed host presenting the secret read back was refused: %v", err)
			return "", fmt.Errorf("the allowed host with the secret read back was refused: the secret is not what the box requires (--export-auth cannot work here): %w", err)
		}
		return "connected and read over " + st.o.data.describe(), nil
	})
	st.check("data: the allowed host without the secret", func() (string, error) {
		rctx, cancel := context.WithTimeout(ctx, otherHostWait)
		defer cancel()
		_, err := st.o.data.read(rctx, nqn, host, nvme.DHCHAPSecret{}, dataOffset, 512)
		if err == nil {
			st.fact("password-enforced", contradicted, "the allowed host connected and read without the secret: the password is not required")
			return "", fmt.Errorf("the allowed host connected to %s without the secret: the export password is not enforced", nqn)
		}
		if ctx.Err() != nil {
			return "", err
		}
		st.fact("password-enforced", confirmed, "the allowed host connected with the secret and was refused without it (%v)", err)
		return "refused: " + err.Error(), nil
	})
	return at, withPassword
}
