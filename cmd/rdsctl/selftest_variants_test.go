package main

import (
	"strings"
	"testing"

	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// TestSelftestOtherVariants runs the self-test against the simulator in
// each variant of the other unknown RouterOS behaviours: every check
// passes (the client tolerates each), the facts that measure the variant
// say which it was, and nothing is left behind.
func TestSelftestOtherVariants(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*rdssim.Config)
		fact string // "" or "id=status"
	}{
		{"closed export hides its properties", func(c *rdssim.Config) { c.ClosedExportProps = rdssim.ClosedExportHidden }, "closed-print=contradicted"},
		{"closed export shows its properties", func(c *rdssim.Config) { c.ClosedExportProps = rdssim.ClosedExportShown }, "closed-print=confirmed"},
		{"keepalive rejected", func(c *rdssim.Config) { c.GlobalRequests = "reject" }, ""},
		{"keepalive ignored", func(c *rdssim.Config) { c.GlobalRequests = "ignore" }, ""},
		{"keepalive closes the connection", func(c *rdssim.Config) { c.GlobalRequests = "close" }, ""},
		{"allowed host change drops connections", func(c *rdssim.Config) { c.AllowHostChange = rdssim.AllowHostChangeDrop }, ""},
		{"exit status 0 on a refusal, LF", func(c *rdssim.Config) { c.ExitStatusOnFailure, c.CRLF = false, false }, ""},
		{"no wrapping", func(c *rdssim.Config) { c.TerminalWidth = -1 }, ""},
		{"a legend naming every flag", func(c *rdssim.Config) { c.Legend = rdssim.LegendAll }, "legend-used=contradicted"},
		{"values broken before a hyphen, short of the width", func(c *rdssim.Config) { c.ValueBreak = rdssim.ValueBreakHyphen }, "wrap-rejoin=confirmed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, cfg := selftestSim(t, tc.mod)
			o := selftestOpts()
			o.data = simDataPath{srv: srv}
			report, err := runSelftest(cfg, o)
			if err != nil {
				t.Fatalf("%v\n%s", err, report)
			}
			if id, status, ok := strings.Cut(tc.fact, "="); ok {
				if got := factStatus(t, report, id); got != status {
					t.Errorf("fact %s: %s, want %s\n%s", id, got, status, report)
				}
			}
			neverOpenToAnyHost(t, srv)
			nothingLeft(t, srv)
		})
	}
}

// TestSelftestLoginWidth: with the driver's default login options the
// simulator honours the width (as RouterOS is assumed to), and the
// self-test reports the fact confirmed with the longest line it saw.
func TestSelftestLoginWidth(t *testing.T) {
	srv, cfg := selftestSim(t, nil)
	cfg.LoginOptions = "ct511w4098h"
	o := selftestOpts()
	o.loginOptions = cfg.LoginOptions
	report, err := runSelftest(cfg, o)
	if err != nil {
		t.Fatalf("%v\n%s", err, report)
	}
	if got := factStatus(t, report, "login-width"); got != confirmed {
		t.Errorf("login-width %s\n%s", got, report)
	}
	nothingLeft(t, srv)
}
