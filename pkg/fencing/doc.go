// Package fencing decides whether a volume may be published to a node.
//
// Decide is a pure function of the volume's attachment state (from the
// attachment index), the request, the nodes' health, the clock and the
// configuration. It makes no API server or RDS call and keeps no state, so
// every rule is table-tested and two controller replicas given the same
// inputs reach the same decision. Acting on a decision (committing the
// claim, fencing a stale holder, emitting events and metrics) belongs to the
// caller.
//
// It must never allow two healthy nodes to hold a single-node volume, nor a
// third node to join a live migration.
package fencing
