package fencing

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The fixtures the liveness and tainter tests share.

const driver = "rds.csi.srvlab.io"

var t0 = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

// node is a Node, Ready or not since since, with taints.
func node(name string, ready bool, since time.Time, taints ...corev1.Taint) *corev1.Node {
	status := corev1.ConditionTrue
	if !ready {
		status = corev1.ConditionFalse
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.NodeSpec{Taints: taints},
		Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, LastTransitionTime: metav1.NewTime(since)}},
		},
	}
}
