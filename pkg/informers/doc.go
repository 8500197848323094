// Package informers keeps the live attachment index: shared informers on
// VolumeAttachment, PersistentVolume, Node and the heartbeat Leases feed a
// rate-limited workqueue whose single worker updates an AttachmentIndex.
//
// The index is the only state ControllerPublishVolume decides on, and it
// is read through immutable snapshots without API calls. There is no
// startup List-and-rebuild path: a restart is informers syncing, and the
// index reports ready only once every informer has synced. Handlers only
// enqueue keys. What the index shows that calls for action (a stale node,
// an overdue migration, an orphaned claim) goes to a Reactor
// (pkg/storagefence's NodeFencer), on a queue of its own.
//
// It must never write to the API server, never make a network call from
// the index's worker, and never act on a decision itself.
package informers
