package informers

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/srvlab/rds-csi/pkg/claims"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestCommitWritesAPVOnlyItsOwnClaimsBesideADeletedPV: Commit takes the
// volume's claims for a single PV whose own set is empty (Set has no
// nil map to tell "none read" from "none there"). That is only safe while
// an index-built entry with one PV never shows claims that PV does not
// have: here the handle's entry merges a live PV without claims (no
// annotation, or "{}") with the VolumeAttachment of a deleted PV that had
// node-a's claim; the commit must not bring node-a's claim back onto the
// live PV.
func TestCommitWritesAPVOnlyItsOwnClaimsBesideADeletedPV(t *testing.T) {
	for _, own := range []string{"", `{}`} {
		x := NewAttachmentIndex()
		x.setPV("pv-0", func(v *Volume) {
			v.Handle, v.ResourceVersion = "vol-1", "5"
			v.Claims = claims.NewSet(map[string]claims.Claim{"node-a": {At: t0, NodeUID: "u-a", Nonce: "n-a"}})
		})
		x.setAttachment("va-0", "pv-0", Attachment{Node: "node-a", VAName: "va-0", Attached: true, Since: t0})
		x.deletePV("pv-0")
		m, err := claims.ParseClaims(own)
		if err != nil {
			t.Fatal(err)
		}
		p1 := pv("pv-1", "vol-1", corev1.ReadWriteOnce, own)
		x.setPV("pv-1", func(v *Volume) {
			v.Handle, v.ResourceVersion, v.Claims = "vol-1", p1.ResourceVersion, claims.NewSet(m)
		})
		v := x.Volume("vol-1")
		if len(v.PVs) != 1 || v.PVs[0].Name != "pv-1" || len(v.Attachments) != 1 {
			t.Fatalf("%q: scripting: the entry should merge pv-1 with the deleted pv-0's attachment: %+v", own, v)
		}
		client := fake.NewClientset(p1)
		if err := claims.NewStore(client, driver, false).Commit(context.Background(), v.Handle, v.PVs, v.Claims, "node-b", claims.Claim{At: t0.Add(time.Second), NodeUID: "u-b"}, true, nil); err != nil {
			t.Fatalf("%q: %v", own, err)
		}
		got, err := client.CoreV1().PersistentVolumes().Get(context.Background(), "pv-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		held, err := claims.DecodeClaims(got)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := held["node-b"]; len(held) != 1 || !ok {
			t.Errorf("annotation %q: Commit wrote %v to pv-1, want node-b's claim only (node-a's was on the deleted PV)", own, held)
		}
	}
}
