package storagefence

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/informers"
)

// The fixtures the protocol's unit tests share. Its behaviour through the
// CSI RPCs, on the fake RDS and on the simulator, is tested in pkg/csi.

const driver = "rds.csi.srvlab.io"

var t0 = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

// pv is a PersistentVolume of this driver holding the claims annotation
// held ("": none).
func pv(name, handle string, mode corev1.PersistentVolumeAccessMode, held string) *corev1.PersistentVolume {
	p := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1", Annotations: map[string]string{}},
		Spec: corev1.PersistentVolumeSpec{
			AccessModes:            []corev1.PersistentVolumeAccessMode{mode},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: handle}},
		},
	}
	if held != "" {
		p.Annotations[claims.ClaimsAnnotation] = held
	}
	return p
}

// node is a Node, Ready or not since since.
func node(name string, ready bool, since time.Time) *corev1.Node {
	status := corev1.ConditionTrue
	if !ready {
		status = corev1.ConditionFalse
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, LastTransitionTime: metav1.NewTime(since)}},
		},
	}
}

// apiClaims are the claims on PV name as the (fake) API server has them.
func apiClaims(t *testing.T, client *fake.Clientset, name string) map[string]claims.Claim {
	t.Helper()
	p, err := client.CoreV1().PersistentVolumes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	held, err := claims.DecodeClaims(p)
	if err != nil {
		t.Fatal(err)
	}
	return held
}

// newClaimsOnlyFencer is a node fencer of the protocol without storage
// fencing, on client, with live reads of client.
func newClaimsOnlyFencer(t *testing.T, client *fake.Clientset, reporter *fencing.Reporter) *NodeFencer {
	t.Helper()
	live := fencing.NewLiveness(fencing.LivenessConfig{Client: client})
	f, err := New(Config{Store: claims.NewStore(client, driver, false), Index: informers.NewAttachmentIndex(), Nodes: live, Reporter: reporter})
	if err != nil {
		t.Fatal(err)
	}
	return NewNodeFencer(NodeFencerConfig{Fence: f, Nodes: live, Policy: fencing.DefaultConfig(), Reporter: reporter})
}

// fenceCounts is fencing.Metrics that keeps the fences' reasons.
type fenceCounts struct {
	reasons []fencing.FenceReason
}

func (*fenceCounts) PublishResult(string)                {}
func (*fenceCounts) UnpublishResult(string)              {}
func (*fenceCounts) PublishDecision(time.Duration)       {}
func (*fenceCounts) Conflict()                           {}
func (m *fenceCounts) Fenced(reason fencing.FenceReason) { m.reasons = append(m.reasons, reason) }
func (*fenceCounts) OrphanedClaims(int)                  {}
func (*fenceCounts) MigrationStarted()                   {}
func (*fenceCounts) MigrationFinished()                  {}
func (*fenceCounts) MigrationTimedOut()                  {}
func (*fenceCounts) ExportMismatch(bool)                 {}
func (*fenceCounts) GuardHolding(bool)                   {}
func (*fenceCounts) NodeFlapped()                        {}
