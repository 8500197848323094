package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/srvlab/rds-csi/pkg/flagonce"
)

// Durations whose larger values quietly turn off what they bound: a
// migration timeout of years lets two nodes write a raw-block volume for
// years, a watch-disconnect threshold of years keeps a replica ready on a
// cache that stopped following the API, an export reconcile period of
// years leaves a wrong export standing, a fence call timeout of years
// lets one hung call hold a dead node's fence, an orphaned-claim
// threshold of years never reports a claim that keeps every other node off
// its volume, and a leader Lease of years holds every background action
// off after the leader dies. Each
// exits 2 with one line naming the flag and its ceiling; the ceiling
// itself is taken.
func TestDurationsThatTurnOffWhatTheyBoundRefused(t *testing.T) {
	dir := t.TempDir()
	_, host, port, keyFile, knownHosts := startSimulatorServer(t, dir)
	controller := []string{"--mode=controller", "--rds-address=" + host, "--rds-port=" + port, "--rds-key-file=" + keyFile,
		"--rds-known-hosts-file=" + knownHosts, "--kubeconfig=" + writeKubeconfig(t, dir), "--storage-fencing=allow-host"}
	election := "--leader-election --leader-election-renew-deadline=10s --leader-election-retry-period=5s"
	for i, tc := range []struct {
		args string
		want string // "" : taken
	}{
		{"--migration-timeout=100000h", "--migration-timeout=100000h0m0s is longer than 24h0m0s"},
		{"--migration-timeout=24h", ""},
		{"--orphaned-claim-threshold=100000h", "--orphaned-claim-threshold=100000h0m0s is longer than 24h0m0s"},
		{"--orphaned-claim-threshold=24h", ""},
		{"--orphaned-claim-threshold=0", ""},
		{"--watch-disconnect-threshold=100000h", "--watch-disconnect-threshold=100000h0m0s is longer than 10m0s"},
		{"--watch-disconnect-threshold=10m", ""},
		{"--export-reconcile-period=100000h", "--export-reconcile-period=100000h0m0s is longer than 1h0m0s"},
		{"--export-reconcile-period=1h", ""},
		{"--fence-call-timeout=100000h", "--fence-call-timeout=100000h0m0s is longer than 10m0s"},
		{"--fence-call-timeout=10m", ""},
		{election + " --leader-election-lease-duration=100000h", "--leader-election-lease-duration=100000h0m0s is longer than 5m0s"},
		{election + " --leader-election-lease-duration=5m", ""},
	} {
		endpoint := "unix://" + filepath.Join(dir, fmt.Sprintf("sock-%d", i), "csi.sock")
		args := flagonce.Replace(append([]string{"--endpoint=" + endpoint}, controller...), strings.Fields(tc.args))
		code, serving, out := startOrExit(t, args, endpoint)
		switch {
		case tc.want == "" && !serving:
			t.Errorf("%s: exit %d, stderr %q; want it taken", tc.args, code, out)
		case tc.want != "" && (serving || code != 2 || !strings.Contains(out, tc.want) || strings.Count(strings.TrimSpace(out), "\n") != 0):
			t.Errorf("%s: serving %v, exit %d, stderr %q; want exit 2 and one line saying %q", tc.args, serving, code, out, tc.want)
		}
	}
}
