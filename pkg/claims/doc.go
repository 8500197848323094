// Package claims is the record of who may write a volume: a node's claim
// on a PersistentVolume (ClaimsAnnotation), the attachments released and
// still retiring (RetiringAnnotation), their compact in-memory form (Set),
// and the Store that reads and writes them on the API server.
//
// Every write of the Store is a merge patch conditional on the
// resourceVersion its decision read, so two controller replicas deciding
// at once cannot both commit; every read a decision stands on is live.
// It must never treat an unreadable annotation as "nothing recorded",
// never write a claim a PV did not hold into another PV of the handle,
// and never decide anything itself: callers (pkg/storagefence) decide,
// the Store records. It imports no other package of this driver.
package claims
