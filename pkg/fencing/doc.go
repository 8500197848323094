// Package fencing makes the fence decisions and reports them.
//
// Decide is a pure function of the volume's attachment state (from the
// attachment index), the request, the nodes' health, the clock and the
// configuration: every rule is table-tested, and two controller replicas
// given the same inputs reach the same decision. Liveness is the nodes'
// health as this controller saw it, timed on its own clock and never on a
// timestamp another machine wrote, with the mass-outage guard; its
// LiveNode is the live read every fence of a node's claim stands on.
// Tainter declares a fenced node out of service. Reporter turns decisions
// into events and metrics. Acting on a decision (claims, exports) belongs
// to pkg/storagefence.
//
// It must never allow two healthy nodes to hold a single-node volume, nor
// a third node to join a live migration, and never time a node out across
// a stretch this controller could not see.
package fencing
