// Package storagefence is the one home of the storage-fence protocol: how
// a node's claim on a volume is made (Commit: stand, cut, commit, confirm,
// open) and released (Release: cut, release, settle, always settling),
// and how the leader brings every export back in line with the live
// claims (Reconcile). ControllerPublishVolume, ControllerUnpublishVolume,
// the node fencer (NodeFencer, the informers' Reactor) and the leader's
// reconcile loop all go through these verbs; none of them writes a step
// itself. Without storage fencing the same verbs keep the claims alone.
//
// It must never answer a write on a claim the API server did not confirm
// in the same call, never release a claim whose attachment it could not
// cut off first, never leave a cut without a settle, and never condition
// an export change only on an RDS state read a moment earlier: every
// change carries the claim it serves and is checked against the live
// claims after it lands.
//
// Storage fencing (--storage-fencing=allow-host): the export follows the
// claims.
//
// The claims on the PV are the truth; the RDS export is derived from
// them: closed when no node claims the volume; otherwise open to the host
// NQN of the newest claim's attachment (tokens.go) and to no one else.
// Two claims are a raw-block ReadWriteMany volume in a KubeVirt live
// migration: the export goes to the newer one, the target, without
// dropping the source's established connection (RouterOS takes one
// allowed host per disk; Linux nvmet checks it only at connect, RouterOS
// is assumed to do the same, docs/routeros.md).
//
// Every change is one compare-and-swap on the RDS (rds.Client.SwapExport),
// made by syncExport in rounds of: read the export, THEN read the live
// claims, then swap from the state read to the state those claims call
// for. An open state comes back whenever the export returns to its host
// (a migration aborted, a cut reopened to the remaining holder), so no
// swap conditioned on one lets a host in: it leads to a state that never
// was before, a fresh tombstone (closed) or a park (open to a fresh host
// nobody has, keeping the connections; parkedNQN); only from those is a
// host let in. A swap whose outcome is unknown is never re-sent
// (rds.Client), so each fresh state is made at most once, and a swap
// conditioned on it that lands late (any RDS command may land up to its
// timeout late) matches nothing once anything changed. A retirement
// (an unpublish, a fence) always changes the state at least once. So a
// round that opens the export to attachment X succeeds only if no state
// change happened between its read of the export and its swap; and since
// it read the claims after the export, a retirement of X (release, then a
// state change) that finished before it read the claims is seen, and one
// that had not changed the state yet will change it after the open and so
// undo it before the retirement reports done. No write of a retired
// attachment can land after its retirement completed. Each round re-reads
// the claims after the previous swap landed: a step whose claim is gone
// or replaced is undone by the next round.
package storagefence
