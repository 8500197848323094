package fencing

import "errors"

// StaleHolder is a node that became stale (deleted, out of service,
// NotReady past the threshold) while holding volumes. The attachment index
// reports it the moment the node's state changes.
type StaleHolder struct {
	Node    string
	Reason  FenceReason
	Volumes []VolumeRef
}

// ErrNotLeader: the reactions run on the leading replica only; a follower
// acts on nothing it was told, which stays unreported, and the next leader
// looks again.
var ErrNotLeader = errors.New("not the leader: background actions run on the leading replica")

// ErrNotTainted: the node was left without the out-of-service taint on
// purpose (it recovered, or it has volumes the driver cannot cut off).
var ErrNotTainted = errors.New("not tainted out of service")
