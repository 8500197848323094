package framework

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// kube-controller-manager changes a new Node (the not-ready taint) between
// its creation and the fake kubelet's first status post; the post is
// retried on the fresh object instead of failing the registration.
func TestNewNodeRetriesItsFirstStatusOnConflict(t *testing.T) {
	client := fake.NewClientset()
	conflicts := 0
	client.PrependReactor("update", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "status" && conflicts == 0 {
			conflicts++
			return true, nil, apierrors.NewConflict(corev1.Resource("nodes"), "node-a", nil)
		}
		return false, nil, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	k, err := NewNode(ctx, NewTimeline(t, t.TempDir()), client, "node-a")
	if err != nil {
		t.Fatalf("NewNode after one conflict: %v", err)
	}
	defer k.Fail()
	n, err := client.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if conflicts != 1 || len(n.Status.Conditions) != 1 || n.Status.Conditions[0].Status != corev1.ConditionTrue {
		t.Errorf("conflicts %d, status %+v", conflicts, n.Status)
	}
}

// A running fake kubelet with a status cadence posts Ready again when the
// API says otherwise (kube-controller-manager marked it Unknown while the
// API server was away), as a real kubelet's status sync does.
func TestFakeKubeletRepostsReady(t *testing.T) {
	client := fake.NewClientset()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	k, err := NewNodeWith(ctx, NewTimeline(t, t.TempDir()), client, "node-a", KubeletCadence{Renew: time.Hour, Duration: 4 * time.Hour, Status: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Fail()
	n, err := client.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Conditions[0].Status = corev1.ConditionUnknown
	if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, err := client.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if n.Status.Conditions[0].Status == corev1.ConditionTrue {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the fake kubelet never posted Ready again")
		}
		<-time.After(time.Millisecond) // poll
	}
}

// AnyOf: a condition that fails because the world moved on between the
// conditions (what an earlier one waits for happened in between) does not
// fail the wait when that earlier one holds now (TestPausedReplicaMidPublish
// failed once on it: attached after VolumeAttached looked, before
// AttachRefused did).
func TestAnyOfRechecksAfterAnError(t *testing.T) {
	attached := false
	isAttached := func(context.Context) (bool, string, error) { return attached, "", nil }
	refused := func(context.Context) (bool, string, error) {
		attached = true // it attaches while the conditions are evaluated
		return false, "", errors.New("attached, so not refused")
	}
	done, _, err := AnyOf(isAttached, refused)(context.Background())
	if !done || err != nil {
		t.Fatalf("AnyOf = %t, %v; want done: the first condition holds by now", done, err)
	}
	failing := func(context.Context) (bool, string, error) { return false, "", errors.New("broken") }
	if _, _, err := AnyOf(func(context.Context) (bool, string, error) { return false, "", nil }, failing)(context.Background()); err == nil {
		t.Fatal("an error with nothing holding is lost")
	}
}

// A fake kubelet's Lease states the duration its renewals follow (a
// quarter of it apart), as a real kubelet's does: the driver derives each
// node's shortest heartbeat threshold from it. A cadence no kubelet can
// have is refused.
func TestFakeKubeletLeaseStatesItsCadence(t *testing.T) {
	for _, cadence := range []KubeletCadence{FastCadence, KubeletDefaultCadence, KubeletFastHeartbeatCadence} {
		client := fake.NewClientset()
		ctx, cancel := context.WithCancel(context.Background())
		k, err := NewNodeWith(ctx, NewTimeline(t, t.TempDir()), client, "node-a", cadence)
		if err != nil {
			t.Fatal(err)
		}
		l, err := client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, "node-a", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := l.Spec.LeaseDurationSeconds; got == nil || time.Duration(*got)*time.Second != cadence.Duration || cadence.Renew*4 != cadence.Duration {
			t.Errorf("cadence %+v: the Lease states leaseDurationSeconds %v", cadence, got)
		}
		k.Fail()
		cancel()
	}
	if _, err := NewNodeWith(context.Background(), NewTimeline(t, t.TempDir()), fake.NewClientset(), "node-b", KubeletCadence{Renew: 2 * time.Second, Duration: 40 * time.Second}); err == nil {
		t.Error("a cadence renewing every 2 s with a Lease of 40 s was accepted")
	}
}
