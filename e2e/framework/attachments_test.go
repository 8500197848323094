package framework

import (
	"context"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

func va(name, pv, node string, attached bool) *storagev1.VolumeAttachment {
	return &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: DriverName, NodeName: node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: ptr.To(pv)},
		},
		Status: storagev1.VolumeAttachmentStatus{Attached: attached},
	}
}

// stepClock advances one second per reading.
func stepClock() func() time.Time {
	t := time.Unix(1000, 0)
	return func() time.Time { t = t.Add(time.Second); return t }
}

func TestAttachmentMonitorHandoff(t *testing.T) {
	m := newAttachmentMonitor(stepClock())
	m.update(va("va-a", "pv1", "node-a", false), false) // created, not attached: no change
	m.update(va("va-a", "pv1", "node-a", true), false)  // t=1001: {a}
	m.update(va("other", "pv2", "node-b", true), false) // another PV: own history
	m.update(va("va-b", "pv1", "node-b", false), false) // b waits
	m.update(va("va-a", "pv1", "node-a", true), true)   // t=1002: {} (a detached and deleted)
	m.update(va("va-b", "pv1", "node-b", true), false)  // t=1003: {b}

	h := m.History("pv1")
	if len(h) != 3 || len(h[0].Nodes) != 1 || h[0].Nodes[0] != "node-a" || len(h[1].Nodes) != 0 || h[2].Nodes[0] != "node-b" {
		t.Fatalf("history %+v", h)
	}
	if got := m.MaxAttached("pv1"); got != 1 {
		t.Errorf("MaxAttached = %d, want 1", got)
	}
	if d, ok := m.Handoff("pv1", "node-a", "node-b"); !ok || d != time.Second {
		t.Errorf("Handoff = %s %t, want 1s true", d, ok)
	}
	if _, ok := m.Handoff("pv1", "node-b", "node-a"); ok {
		t.Error("Handoff b->a reported, never happened")
	}
	if got := len(m.History("pv2")); got != 1 {
		t.Errorf("pv2 history has %d changes, want 1", got)
	}
}

func TestAttachmentMonitorSeesDoubleAttach(t *testing.T) {
	m := newAttachmentMonitor(stepClock())
	m.update(va("va-a", "pv1", "node-a", true), false)
	m.update(va("va-b", "pv1", "node-b", true), false) // both at once
	m.update(va("va-a", "pv1", "node-a", false), false)
	if got := m.MaxAttached("pv1"); got != 2 {
		t.Errorf("MaxAttached = %d, want 2", got)
	}
	// With no moment of {} in between, the handoff has no gap.
	if d, ok := m.Handoff("pv1", "node-a", "node-b"); !ok || d != 0 {
		t.Errorf("Handoff = %s %t, want 0 true", d, ok)
	}
}

// The informer wiring: objects written through a clientset reach the
// monitor, including deletions.
func TestWatchAttachments(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := fake.NewClientset()
	m, err := WatchAttachments(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	vas := c.StorageV1().VolumeAttachments()
	if _, err := vas.Create(ctx, va("va-a", "pv1", "node-a", true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitHistory := func(n int) {
		t.Helper()
		err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			return len(m.History("pv1")) == n, nil
		})
		if err != nil {
			t.Fatalf("history %+v, want %d changes: %v", m.History("pv1"), n, err)
		}
	}
	waitHistory(1)
	if err := vas.Delete(ctx, "va-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitHistory(2)
	if h := m.History("pv1"); len(h[1].Nodes) != 0 {
		t.Errorf("after the delete: %+v", h[1])
	}
}

// The API already says node-b is attached while the monitor's watch has
// not delivered it yet: SeenAttached holds only once the monitor has
// seen it, and gives the monitor's moment, never one before since.
func TestSeenAttachedWaitsForTheWatch(t *testing.T) {
	m := newAttachmentMonitor(stepClock())
	m.update(va("va-b", "pv1", "node-b", true), false) // t=1001: an earlier attachment
	m.update(va("va-b", "pv1", "node-b", true), true)  // t=1002: gone
	since := time.Unix(1002, 500)
	var at time.Time
	cond := m.SeenAttached("pv1", "node-b", since, &at)
	if done, state, err := cond(context.Background()); done || err != nil {
		t.Fatalf("held before the watch delivered the attachment after %v (at %v): %s %v", since, at, state, err)
	}
	m.update(va("va-b2", "pv1", "node-b", true), false) // t=1003: the watch catches up
	if done, state, err := cond(context.Background()); !done || err != nil {
		t.Fatalf("not held once the monitor saw it: %s %v", state, err)
	}
	if want := time.Unix(1003, 0); !at.Equal(want) {
		t.Errorf("at %v, want %v", at, want)
	}
}
