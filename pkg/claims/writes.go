package claims

import (
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
)

// writes remembers, per PV, the state the API server answered this
// replica's last claim write with, so that the next decision on that PV
// need not wait for the PV watch to deliver the replica's own write (a
// repeated publish right after the first would otherwise conflict with
// it: an extra round trip and a wait, 36-40 % of repeats in the e2e
// benchmark). It only ever stands for states the API server answered.
type writes struct {
	mu   sync.Mutex
	byPV map[string]pvWrite
}

// pvWrite is a PV as a chain of this replica's writes left it: each write
// was conditional on the resourceVersion the previous one produced, so no
// other writer came between them, and an index at any resourceVersion of
// the chain (over) is behind only by these writes.
type pvWrite struct {
	handle   string // the PV's volume handle (a name may be reused)
	rv       string
	over     []string // the resourceVersions the chain replaced, oldest first
	claims   Set
	retiring []Retiring
}

// maxWrites bounds the PVs remembered (an entry goes as soon as the index
// catches up; this bounds the ones never decided on again).
const maxWrites = 1024

// maxChain bounds the writes of one chain remembered.
const maxChain = 8

// record notes that a write conditional on base left pv at its
// resourceVersion; a response it cannot read forgets the PV.
func (w *writes) record(base string, pv *corev1.PersistentVolume) {
	w.mu.Lock()
	defer w.mu.Unlock()
	claims, err := DecodeClaims(pv)
	retiring, rerr := ParseRetiring(pv.Annotations[RetiringAnnotation])
	if err != nil || rerr != nil || base == "" || pv.ResourceVersion == "" {
		delete(w.byPV, pv.Name)
		return
	}
	over := []string{base}
	if prev, ok := w.byPV[pv.Name]; ok && prev.rv == base {
		over = append(prev.over[max(0, len(prev.over)-maxChain+1):len(prev.over):len(prev.over)], base)
	}
	if w.byPV == nil {
		w.byPV = map[string]pvWrite{}
	}
	if prev, ok := w.byPV[pv.Name]; ok && prev.rv != base && slices.Contains(prev.over, pv.ResourceVersion) {
		return // a later write of the chain was recorded first
	}
	if _, ok := w.byPV[pv.Name]; !ok && len(w.byPV) >= maxWrites {
		for name := range w.byPV {
			delete(w.byPV, name)
			break
		}
	}
	handle := ""
	if pv.Spec.CSI != nil {
		handle = pv.Spec.CSI.VolumeHandle
	}
	w.byPV[pv.Name] = pvWrite{handle: handle, rv: pv.ResourceVersion, over: over, claims: NewSet(claims), retiring: retiring}
}

// forget drops what is remembered of pvName (a write on it conflicted:
// someone else wrote).
func (w *writes) forget(pvName string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.byPV, pvName)
}

// newer returns what this replica's writes left on pvName when the index,
// at resourceVersion seen, is behind only by them; otherwise nothing (and
// an entry the index has caught up with, or that is of no use any more,
// is dropped).
func (w *writes) newer(pvName, handle, seen string) (pvWrite, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e, ok := w.byPV[pvName]
	if !ok {
		return pvWrite{}, false
	}
	if e.handle == handle && slices.Contains(e.over, seen) {
		return e, true
	}
	delete(w.byPV, pvName)
	return pvWrite{}, false
}
