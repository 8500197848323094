package claims

import (
	"context"
	"errors"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// A read that times out during a release is an error, never a release
// done. client-go's retry.RetryOnConflict before v0.37 counted an error
// wrapping context.DeadlineExceeded as its own backoff running out and
// returned nil: ControllerUnpublishVolume then answered OK with the claim
// still on the PV, and the volume could not move while that node stayed
// Ready (found by the publish model check with client-go v0.36.3, seed 1).
func TestReleaseDoesNotSwallowATimedOutRead(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"deadline", fmt.Errorf("injected: %w", context.DeadlineExceeded)},
		{"canceled", fmt.Errorf("injected: %w", context.Canceled)},
		{"server timeout", apierrors.NewServerTimeout(corev1.Resource("persistentvolumes"), "get", 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(pv("pv-1", "vol-1", corev1.ReadWriteOnce, `{"node-a":"2026-11-22T12:00:00Z"}`))
			client.PrependReactor("get", "persistentvolumes", func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, tc.err
			})
			released, _, _, err := NewStore(client, driver, false).ReleaseIf(context.Background(), "pv-1", "vol-1", "node-a", always)
			if released || !errors.Is(err, tc.err) {
				t.Fatalf("ReleaseIf = %t, %v; want the read's error %v", released, err, tc.err)
			}
		})
	}
}

// Conflicts are retried a bounded number of times, then returned; a
// conflict that clears is a release.
func TestReleaseRetriesConflicts(t *testing.T) {
	for _, tc := range []struct {
		conflicts    int
		wantReleased bool
	}{{1, true}, {conflictAttempts - 1, true}, {conflictAttempts, false}} {
		t.Run(fmt.Sprint(tc.conflicts), func(t *testing.T) {
			client := fake.NewClientset(pv("pv-1", "vol-1", corev1.ReadWriteOnce, `{"node-a":"2026-11-22T12:00:00Z"}`))
			left := tc.conflicts
			client.PrependReactor("patch", "persistentvolumes", func(k8stesting.Action) (bool, runtime.Object, error) {
				if left == 0 {
					return false, nil, nil
				}
				left--
				return true, nil, apierrors.NewConflict(corev1.Resource("persistentvolumes"), "pv-1", errors.New("changed"))
			})
			released, _, _, err := NewStore(client, driver, false).ReleaseIf(context.Background(), "pv-1", "vol-1", "node-a", always)
			if released != tc.wantReleased || (err == nil) != tc.wantReleased {
				t.Fatalf("after %d conflicts: ReleaseIf = %t, %v", tc.conflicts, released, err)
			}
			if _, kept := apiClaims(t, client, "pv-1")["node-a"]; kept == tc.wantReleased {
				t.Errorf("claim kept %t after %d conflicts", kept, tc.conflicts)
			}
		})
	}
}

// apiClaims are the claims on PV name as the (fake) API server has them.
func apiClaims(t *testing.T, client *fake.Clientset, name string) map[string]Claim {
	t.Helper()
	pv, err := client.CoreV1().PersistentVolumes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := DecodeClaims(pv)
	if err != nil {
		t.Fatal(err)
	}
	return cl
}
