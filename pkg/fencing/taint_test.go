package fencing

import (
	"context"
	"errors"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// The Tainter's node updates go through the same retry.
func TestTaintDoesNotSwallowATimedOutRead(t *testing.T) {
	client := fake.NewClientset(node("node-a", false, t0))
	client.PrependReactor("get", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, fmt.Errorf("injected: %w", context.DeadlineExceeded)
	})
	tt := NewTainter(client, driver, nil)
	err := tt.updateNode(context.Background(), "node-a", func(*corev1.Node) (bool, error) { return true, nil })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("updateNode = %v, want the read's deadline error", err)
	}
}
