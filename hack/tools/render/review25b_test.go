//go:build review25b

package render

import (
	"path/filepath"
	"strings"
	"testing"
)

// Values the chart renders although the driver or the API server refuses what
// they become (make chart-test's TestChartRefusesBadValues lets each through).
// Each should fail the render naming the value, as the chart's other checks do.
func TestReview25bChartRefusesWhatTheDriverOrAPIRefuses(t *testing.T) {
	for _, c := range []struct {
		hole string
		set  []string
		want string
	}{
		// HOLE (install fails half-way: the API server refuses the
		// Deployment, "quantities must match the regular expression"):
		// go run ./cmd/render helm -set controller.resources.limits.memory=abc
		// renders `memory: abc`; the schema checks the field names only.
		{"resource quantity", []string{"controller.resources.limits.memory=abc"}, "controller.resources.limits.memory"},
		{"resource quantity", []string{"node.resources.requests.cpu=lots"}, "node.resources.requests.cpu"},
		// HOLE (controller crashloop: the driver refuses at start
		// "--heartbeat-threshold needs --storage-fencing=allow-host"):
		// -set controller.extraArgs[0]=--heartbeat-threshold=10s with
		// storageFencing.enabled=false (the default) renders.
		{"flag needs fencing", []string{"controller.extraArgs[0]=--heartbeat-threshold=10s"}, "storageFencing.enabled"},
		// HOLE (every volume attaches without the driver's attachment index
		// or fencing: the chart's CSIDriver says attachRequired: true, and
		// the driver's own -h says --publish=false is "only for deployments
		// without attach (CSIDriver attachRequired: false)"):
		// -set controller.extraArgs[0]=--publish=false renders.
		{"publish off with attach", []string{"controller.extraArgs[0]=--publish=false"}, "--publish"},
		// HOLE (controller crashloop: the driver refuses at start
		// "--out-of-service-taint needs ... a positive --not-ready-threshold
		// or --heartbeat-threshold"): storageFencing.outOfServiceTaint is
		// true by default, and turning both thresholds off renders. Input:
		// -set storageFencing.enabled=true
		// -set controller.extraArgs[0]=--not-ready-threshold=0
		// -set controller.extraArgs[1]=--heartbeat-threshold=0
		{"taint without a threshold", []string{"storageFencing.enabled=true", "controller.extraArgs[0]=--not-ready-threshold=0",
			"controller.extraArgs[1]=--heartbeat-threshold=0"}, "storageFencing.outOfServiceTaint"},
		// HOLE (controller crashloop: the driver refuses the value at
		// start): extraArgs values are never checked, only flag names:
		// -set controller.extraArgs[0]=--rds-health-interval=1s (driver: 5s
		// to 1h), --not-ready-threshold=abc (not a duration),
		// --shutdown-grace=-1s, node.extraArgs[0]=--max-volumes-per-node=-5.
		{"flag value", []string{"controller.extraArgs[0]=--rds-health-interval=1s"}, "--rds-health-interval"},
		{"flag value", []string{"controller.extraArgs[0]=--not-ready-threshold=abc"}, "--not-ready-threshold"},
		{"flag value", []string{"controller.extraArgs[0]=--shutdown-grace=-1s"}, "--shutdown-grace"},
		{"flag value", []string{"node.extraArgs[0]=--max-volumes-per-node=-5"}, "--max-volumes-per-node"},
		// HOLE (controller crashloop: the driver refuses at start "known_hosts
		// has no entry for 192.0.2.10", or "for [192.0.2.10]:2222" on another
		// port): with rds.sshSecret.create the chart checks that knownHosts
		// looks like known_hosts lines, not that one names rds.address (in
		// [host]:port form when rds.port is not 22). Inputs:
		// -set rds.address=192.0.2.10,rds.sshSecret.create=true,
		//   rds.sshSecret.privateKey=<PEM>,rds.sshSecret.knownHosts="rds-old ssh-ed25519 AAAA"
		// and the same with knownHosts "192.0.2.10 ssh-ed25519 AAAA" and rds.port=2222.
		{"known_hosts without the RDS", []string{"rds.address=192.0.2.10", "rds.sshSecret.create=true",
			"rds.sshSecret.privateKey=-----BEGIN OPENSSH PRIVATE KEY-----", "rds.sshSecret.knownHosts=rds-old ssh-ed25519 AAAAHOST"}, "rds.sshSecret.knownHosts"},
		{"known_hosts without the RDS's port", []string{"rds.address=192.0.2.10", "rds.port=2222", "rds.sshSecret.create=true",
			"rds.sshSecret.privateKey=-----BEGIN OPENSSH PRIVATE KEY-----", "rds.sshSecret.knownHosts=192.0.2.10 ssh-ed25519 AAAAHOST"}, "rds.sshSecret.knownHosts"},
	} {
		out, err := Helm(filepath.Join(root(t), "charts", "rds-csi"), HelmOptions{Set: c.set})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: --set %q: err = %v (render of %d bytes), want a refusal naming %q", c.hole, c.set, err, len(out), c.want)
		}
	}
}
