//go:build e2e

package e2e

import (
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/srvlab/rds-csi/e2e/framework"
	"github.com/srvlab/rds-csi/pkg/exportauth"
	"github.com/srvlab/rds-csi/pkg/nvme"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// Authenticated attachments (issue 26), the controller's side on the real
// control plane with the simulator: --export-auth=dhchap with storage
// fencing. node-a and node-b register node keys, node-c none. node-a's
// publish_context carries a secret sealed to its key that opens to the
// secret the simulator prints for the disk; an attach to node-c is refused
// with FAILED_PRECONDITION (no key); a move to node-b gives node-b another
// secret, sealed to its key alone, again the simulator's.
func TestExportAuthAttachAndMove(t *testing.T) {
	t.Parallel()
	keys := map[string]*exportauth.NodeKey{}
	ids := map[string]string{}
	for _, n := range []string{"node-a", "node-b"} {
		k, err := exportauth.NewNodeKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		keys[n], ids[n] = k, n+"/"+k.Public.String()
	}
	w := startAttachWorldWith(t, attachOptions{grace: nodeMonitorGrace, fenced: true, nodeIDs: ids,
		driverArgs: []string{"--storage-fencing=allow-host", "--export-auth=dhchap"}}, "node-a", "node-b", "node-c")
	ctx, c, tl, ns := w.e.Ctx, w.e.Client, w.e.TL, framework.TestNamespace
	client, err := rds.NewClient(rds.Config{Address: w.sim.Host, Port: w.sim.Port, User: "admin", KeyFile: w.sim.KeyFile, KnownHostsFile: w.sim.KnownHostsFile})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	// printed is the secret the simulator prints for the volume's disk.
	printed := func() nvme.DHCHAPSecret {
		t.Helper()
		d, err := client.GetDisk(ctx, w.handle)
		if err != nil {
			t.Fatal(err)
		}
		if d.Secret.IsZero() {
			t.Fatalf("the simulator prints no secret for %s (export %v to %s)", w.handle, d.Exported, d.AllowHost)
		}
		return d.Secret
	}
	// opened is the secret node's VolumeAttachment carries, opened with key.
	opened := func(va storagev1.VolumeAttachment, key *exportauth.NodeKey) (nvme.DHCHAPSecret, error) {
		md := va.Status.AttachmentMetadata
		if md["auth"] != "dhchap" || md["dhchapSecret"] == "" {
			t.Fatalf("VolumeAttachment %s's publish_context has no authentication: keys %v", va.Name, mapKeys(md))
		}
		return key.Open(md["dhchapSecret"])
	}

	done := tl.Step("node-a's publish_context opens, with node-a's key, to the secret the RDS prints")
	if _, err := framework.WaitFor(ctx, tl, 10*time.Second, "export allows node-a only", diskExportTo(w, "node-a")); err != nil {
		t.Fatal(err)
	}
	secretA, err := opened(w.vaA, keys["node-a"])
	if err != nil {
		t.Fatalf("node-a cannot open its secret: %v", err)
	}
	if !secretA.Equal(printed()) {
		t.Fatal("node-a's secret is not the one the simulator prints for the disk")
	}
	if _, err := opened(w.vaA, keys["node-b"]); err == nil {
		t.Fatal("node-b's key opens node-a's secret")
	}
	done()

	done = tl.Step("an attach to node-c, whose node ID has no key, is refused")
	if _, err := framework.CreateVolumeAttachment(ctx, c, "e2e-nokey-node-c", w.pv, "node-c"); err != nil {
		t.Fatal(err)
	}
	var vaC storagev1.VolumeAttachment
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "node-c's VolumeAttachment refused: no node key",
		framework.AttachRefused(c, w.pv, "node-c", &vaC, "FailedPrecondition", "registers no node key")); err != nil {
		t.Fatal(err)
	}
	tl.Logf("node-c attach error: %s", vaC.Status.AttachError.Message)
	if err := c.StorageV1().VolumeAttachments().Delete(ctx, "e2e-nokey-node-c", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "node-c's VolumeAttachment gone", framework.NoVolumeAttachment(c, w.pv, "node-c")); err != nil {
		t.Fatal(err)
	}
	done()

	w.replacementWaits(t)
	done = tl.Step("pod-a goes: the volume moves to node-b with another secret, node-b's alone")
	if err := framework.ForceDeletePod(ctx, c, ns, "pod-a"); err != nil {
		t.Fatal(err)
	}
	var vaB storagev1.VolumeAttachment
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "volume attached to node-b", framework.VolumeAttached(c, w.pv, "node-b", &vaB)); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 10*time.Second, "export allows node-b only", diskExportTo(w, "node-b")); err != nil {
		t.Fatal(err)
	}
	secretB, err := opened(vaB, keys["node-b"])
	if err != nil {
		t.Fatalf("node-b cannot open its secret: %v", err)
	}
	if secretB.Equal(secretA) {
		t.Fatal("the move kept node-a's secret")
	}
	if !secretB.Equal(printed()) {
		t.Fatal("node-b's secret is not the one the simulator prints for the disk")
	}
	if _, err := opened(vaB, keys["node-a"]); err == nil {
		t.Fatal("node-a's key opens node-b's secret")
	}
	if got := w.mon.MaxAttached(w.pv); got != 1 {
		t.Errorf("PV %s was attached to %d nodes at once; history %+v", w.pv, got, w.mon.History(w.pv))
	}
	done()

	// Neither secret is in any component's log or on the timeline (which
	// holds every object change and event).
	for _, name := range []string{"rds-csi-driver.log", "csi-attacher.log", "csi-provisioner.log", "timeline.log"} {
		text, err := os.ReadFile(filepath.Join(w.e.Dir, name))
		if err != nil {
			t.Fatal(err)
		}
		for _, sec := range []nvme.DHCHAPSecret{secretA, secretB} {
			if strings.Contains(string(text), sec.Reveal()) {
				t.Errorf("%s shows an attachment's secret", name)
			}
		}
	}
}

func mapKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
