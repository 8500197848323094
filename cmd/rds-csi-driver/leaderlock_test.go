package main

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	ktesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// leaseAPI is a fake API server for one Lease that, as the real one,
// refuses an update whose resourceVersion is not the stored one, and
// reports each holder written.
func leaseAPI(t *testing.T) (*fake.Clientset, <-chan string) {
	t.Helper()
	client := fake.NewClientset()
	gvr := coordinationv1.SchemeGroupVersion.WithResource("leases")
	written := make(chan string, 16)
	client.PrependReactor("create", "leases", func(a ktesting.Action) (bool, runtime.Object, error) {
		l := a.(ktesting.CreateAction).GetObject().(*coordinationv1.Lease).DeepCopy()
		l.ResourceVersion = "1"
		if err := client.Tracker().Create(gvr, l, l.Namespace); err != nil {
			return true, nil, err
		}
		written <- holderOf(l)
		return true, l, nil
	})
	client.PrependReactor("update", "leases", func(a ktesting.Action) (bool, runtime.Object, error) {
		l := a.(ktesting.UpdateAction).GetObject().(*coordinationv1.Lease).DeepCopy()
		cur, err := client.Tracker().Get(gvr, l.Namespace, l.Name)
		if err != nil {
			return true, nil, err
		}
		stored := cur.(*coordinationv1.Lease).ResourceVersion
		if l.ResourceVersion != stored {
			return true, nil, apierrors.NewConflict(gvr.GroupResource(), l.Name, errors.New("the object has been modified"))
		}
		n, _ := strconv.Atoi(stored)
		l.ResourceVersion = strconv.Itoa(n + 1)
		if err := client.Tracker().Update(gvr, l, l.Namespace); err != nil {
			return true, nil, err
		}
		written <- holderOf(l)
		return true, l, nil
	})
	return client, written
}

func holderOf(l *coordinationv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

func waitWritten(t *testing.T, written <-chan string, holder string) {
	t.Helper()
	timeout := time.After(time.Minute) // a safety net; the write comes at once
	for {
		select {
		case h := <-written:
			if h == holder {
				return
			}
		case <-timeout:
			t.Fatalf("no Lease write naming %q", holder)
		}
	}
}

// leadAsA runs ctrl-a's election on lock until it has acquired the Lease
// and renewed it once; stop ends the election and returns once it ended.
func leadAsA(t *testing.T, lock *heldLease, written <-chan string) (stop func()) {
	t.Helper()
	stopped := make(chan struct{})
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, ReleaseOnCancel: true, Name: "test",
		// Long periods: no renewal between the test's steps.
		LeaseDuration: 10 * time.Minute, RenewDeadline: 5 * time.Minute, RetryPeriod: 4 * time.Minute,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) {},
			OnStoppedLeading: func() { close(stopped) },
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go le.Run(ctx)
	// Acquired (a create), then renewed once at once (an update).
	waitWritten(t, written, "ctrl-a")
	waitWritten(t, written, "ctrl-a")
	return func() { cancel(); <-stopped }
}

func lockOf(client *fake.Clientset) *heldLease {
	return &heldLease{LeaseLock: &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: "rds-csi", Name: "rds-csi-srvlab-io-controller"},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: "ctrl-a"},
	}}
}

// A replica whose election ends (its renewal failed after a pause, or it
// is shut down) after another replica took the Lease over leaves that
// Lease alone. client-go's release judged by the record this replica last
// observed, itself, and wrote the Lease without a holder over the other
// replica's: the paused replica then took it again at once, and both led
// (TestPausedReplicaMidPublish, under load).
func TestAReplicaReleasesOnlyItsOwnLease(t *testing.T) {
	client, written := leaseAPI(t)
	stop := leadAsA(t, lockOf(client), written)

	// ctrl-b takes the Lease over, as after ctrl-a's Lease ran out.
	leases := client.CoordinationV1().Leases("rds-csi")
	l, err := leases.Get(context.Background(), "rds-csi-srvlab-io-controller", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b := "ctrl-b"
	l.Spec.HolderIdentity = &b
	now := metav1.NewMicroTime(time.Now())
	l.Spec.AcquireTime, l.Spec.RenewTime = &now, &now
	if _, err := leases.Update(context.Background(), l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitWritten(t, written, "ctrl-b")

	stop() // ctrl-a's election ends
	l, err = leases.Get(context.Background(), "rds-csi-srvlab-io-controller", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := holderOf(l); h != "ctrl-b" {
		t.Fatalf("after ctrl-a's election ended, the Lease names %q; want ctrl-b's Lease left alone", h)
	}
}

// The replica's own Lease is still released when its election ends, so
// that another replica takes over at once on a rollout.
func TestAReplicaReleasesItsLeaseWhenItStops(t *testing.T) {
	client, written := leaseAPI(t)
	lock := lockOf(client)
	leadAsA(t, lock, written)()
	waitWritten(t, written, "")

	// Without a successful read, nothing is released.
	if _, _, err := lock.Get(context.Background()); err != nil {
		t.Fatal(err)
	}
	client.PrependReactor("get", "leases", func(ktesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("the API server is away")
	})
	if _, _, err := lock.Get(context.Background()); err == nil {
		t.Fatal("the failing read succeeded")
	}
	if err := lock.Update(context.Background(), resourcelock.LeaderElectionRecord{LeaseDurationSeconds: 1}); !errors.Is(err, errLeaseNotHeld) {
		t.Fatalf("a release after a failed read: %v; want it refused", err)
	}
}
