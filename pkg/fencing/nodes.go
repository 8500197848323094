package fencing

import (
	corev1 "k8s.io/api/core/v1"
)

// OutOfServiceTaint is the taint an operator puts on a node that is down
// for good (non-graceful node shutdown).
const OutOfServiceTaint = "node.kubernetes.io/out-of-service"

// NodeStateOf extracts what the policy needs from a Node.
func NodeStateOf(n *corev1.Node) NodeState {
	s := NodeState{Exists: true, UID: string(n.UID)}
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			s.Ready = cond.Status == corev1.ConditionTrue
			if !s.Ready {
				s.NotReadySince = cond.LastTransitionTime.Time
			}
		}
	}
	for _, t := range n.Spec.Taints {
		if t.Key == OutOfServiceTaint {
			s.OutOfService = true
		}
	}
	return s
}

// HasDriverTaint reports whether n carries the out-of-service taint this
// driver puts on a node it fenced (DriverOutOfServiceValue).
func HasDriverTaint(n *corev1.Node) bool {
	for _, taint := range n.Spec.Taints {
		if taint.Key == OutOfServiceTaint && taint.Value == DriverOutOfServiceValue {
			return true
		}
	}
	return false
}
