// Package nodelease is the node plugin's own heartbeat: a Lease per node,
// renewed by the node plugin like the kubelet renews its own in
// kube-node-lease, that the controller reads as a second sign of life
// (pkg/fencing.Liveness). A node whose kubelet is away for longer than
// its heartbeat threshold (a restart, an upgrade, a crash loop) while the
// node runs on is then not fenced: its node plugin still renews.
//
// It must never stop or slow the node plugin: a Lease that cannot be
// renewed is logged (rate-limited) and retried, and the CSI service runs
// on regardless. It uses coordination/v1 Leases directly; there is no
// leader election here, each node plugin owns its node's Lease.
package nodelease
