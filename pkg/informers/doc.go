// Package informers keeps the live attachment index: shared informers on
// VolumeAttachment, PersistentVolume and Node feed a rate-limited workqueue
// whose single worker updates an AttachmentIndex.
//
// The index is the only state ControllerPublishVolume consults, and it is
// read through immutable snapshots without API calls. There is no startup
// List-and-rebuild path: a restart is informers syncing, and the index
// reports ready only once every informer has synced. Handlers only enqueue
// keys; nothing here writes to the API server except through the Claims
// type, whose every write is a conditional update.
package informers
