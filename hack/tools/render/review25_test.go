//go:build review25

package render

import (
	"path/filepath"
	"strings"
	"testing"
)

// HOLE: values the schema lets through render manifests that the API
// server refuses or a driver that never starts; each should fail the
// render (or helm install) with the value named, as TestChartRefusesBadValues
// does for others:
//   - namespace.name="" with namespace.create=true (the default): the
//     chart then makes the Namespace of the release itself, the very
//     thing values.yaml says to avoid (Helm's release record inside the
//     Namespace the chart owns; helm install -n X fails on a missing X,
//     and with --create-namespace the chart's Namespace conflicts with it;
//     an uninstall deletes the release record's namespace).
//   - rds.name="rds 1": not a label value; both driver pods crashloop on
//     the flag error (--rds-name must be a Kubernetes label value).
//   - rds.volumePath="/storage-pool" (the pool itself) or "/": the driver
//     refuses it at start (crashloop), the schema's ^/ accepts it.
//   - storageClasses[0].name="Fast_NVMe": not a DNS subdomain; the API
//     server refuses the StorageClass (the install fails half-way).
//   - controller.extraArgs=--storage-fencing=allow-host with
//     storageFencing.enabled=false: storage fencing turned on without the
//     RBAC the chart adds for it (node updates for the taint, etc.) and
//     without the values that go with it; the flag is last-wins over the
//     chart's own --storage-fencing.
//   - controller.extraArgs=--rds-address=other: a flag the chart already
//     sets from a value, given twice; the driver silently takes the last.
func TestReview25ChartRefusesMoreBadValues(t *testing.T) {
	chart := filepath.Join(root(t), "charts", "rds-csi")
	for _, c := range []struct {
		set  []string
		want string
	}{
		{[]string{"namespace.name="}, "namespace"},
		{[]string{"rds.name=rds 1"}, "name"},
		{[]string{"rds.volumePath=/storage-pool"}, "volumePath"},
		{[]string{"rds.volumePath=/"}, "volumePath"},
		{[]string{"storageClasses[0].name=Fast_NVMe"}, "name"},
		{[]string{"controller.extraArgs[0]=--storage-fencing=allow-host"}, "storage-fencing"},
		{[]string{"controller.extraArgs[0]=--rds-address=other"}, "rds-address"},
	} {
		out, err := Helm(chart, HelmOptions{Set: c.set})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--set %q: err = %v (render of %d bytes), want a refusal naming %q", c.set, err, len(out), c.want)
		}
	}
}
