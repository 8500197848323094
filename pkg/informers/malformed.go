package informers

import (
	"slices"
	"strings"
	"sync"

	"github.com/srvlab/rds-csi/pkg/claims"
	"k8s.io/klog/v2"
)

// Kinds and reasons of malformed objects (the labels of
// rds_csi_malformed_objects).
const (
	MalformedKindPV = "PersistentVolume"
	// MalformedClaims: claims.ClaimsAnnotation cannot be read. The PV is not
	// (re)indexed: the index keeps its last readable claims, or does not
	// know the PV at all, and every publish of its volume is refused.
	MalformedClaims = "unreadable-claims"
	// MalformedRetiring: claims.RetiringAnnotation cannot be read. The PV is
	// indexed without it; with storage fencing its volume's publishes and
	// releases are refused, since they would write over the record.
	MalformedRetiring = "unreadable-retiring"
)

// MalformedReasons are every (kind, reason) the index reports, so that
// their series exist at 0.
var MalformedReasons = [][2]string{{MalformedKindPV, MalformedClaims}, {MalformedKindPV, MalformedRetiring}}

// Malformed is one problem of one object the index skipped, in whole or
// in part.
type Malformed struct {
	Kind string `json:"kind"`
	Name string `json:"name"`
	// Handle is a PV's volume handle.
	Handle          string `json:"handle,omitempty"`
	ResourceVersion string `json:"resourceVersion"`
	Reason          string `json:"reason"`
	Annotation      string `json:"annotation"`
	Error           string `json:"error"`
}

// objectKey names an object in a MalformedSet.
type objectKey struct{ kind, name string }

// MalformedSet holds the objects the index skips as malformed right now.
// The index's worker writes it; publishes and the metrics read it.
type MalformedSet struct {
	mu sync.RWMutex
	// byObject: an object -> its problems.
	byObject map[objectKey][]Malformed
	// byHandle: a volume handle -> the PVs of it with problems.
	byHandle map[string][]objectKey
	// seen is told each problem the first time it is found in a
	// resourceVersion of its object.
	seen func(Malformed)
}

// NewMalformedSet returns an empty set; seen (may be nil) is told each
// problem once per resourceVersion of its object: report it there (an
// event, a counter), not per sync.
func NewMalformedSet(seen func(Malformed)) *MalformedSet {
	return &MalformedSet{byObject: map[objectKey][]Malformed{}, byHandle: map[string][]objectKey{}, seen: seen}
}

// set replaces the problems of kind/name with found (none: the object is
// fine, or gone), and tells seen about those its set did not hold in this
// resourceVersion.
func (s *MalformedSet) set(kind, name string, found []Malformed) {
	id := objectKey{kind, name}
	if len(found) == 0 {
		// The common case, every readable object: no write lock.
		s.mu.RLock()
		_, known := s.byObject[id]
		s.mu.RUnlock()
		if !known {
			return
		}
	}
	s.mu.Lock()
	old := s.byObject[id]
	for _, m := range old {
		s.unlinkLocked(m.Handle, id)
	}
	if len(found) == 0 {
		delete(s.byObject, id)
	} else {
		s.byObject[id] = found
		for _, m := range found {
			if m.Handle != "" && !slices.Contains(s.byHandle[m.Handle], id) {
				s.byHandle[m.Handle] = append(s.byHandle[m.Handle], id)
			}
		}
	}
	s.mu.Unlock()
	for _, m := range found {
		known := slices.ContainsFunc(old, func(o Malformed) bool {
			return o.Reason == m.Reason && o.ResourceVersion == m.ResourceVersion
		})
		if known {
			continue
		}
		logMalformed(m)
		if s.seen != nil {
			s.seen(m)
		}
	}
}

func (s *MalformedSet) unlinkLocked(handle string, id objectKey) {
	ids := slices.DeleteFunc(s.byHandle[handle], func(x objectKey) bool { return x == id })
	if len(ids) == 0 {
		delete(s.byHandle, handle)
	} else {
		s.byHandle[handle] = ids
	}
}

// ForHandle lists the problems of the PVs of a volume handle.
func (s *MalformedSet) ForHandle(handle string) []Malformed {
	if s == nil {
		return nil
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []Malformed
	for _, id := range s.byHandle[handle] {
		out = append(out, s.byObject[id]...)
	}
	return out
}

// List is every problem, sorted by kind, name and reason.
func (s *MalformedSet) List() []Malformed {
	if s == nil {
		return nil
	}
	s.mu.RLock()
	var out []Malformed
	for _, ms := range s.byObject {
		out = append(out, ms...)
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b Malformed) int {
		return strings.Compare(a.Kind+"/"+a.Name+"/"+a.Reason, b.Kind+"/"+b.Name+"/"+b.Reason)
	})
	return out
}

// Counts is the number of objects with each problem, every known (kind,
// reason) included.
func (s *MalformedSet) Counts() map[[2]string]int {
	out := make(map[[2]string]int, len(MalformedReasons))
	for _, kr := range MalformedReasons {
		out[kr] = 0
	}
	if s == nil {
		return out
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, ms := range s.byObject {
		for _, m := range ms {
			out[[2]string{m.Kind, m.Reason}]++
		}
	}
	return out
}

// malformedPV records what of pv (nil: gone, or not this driver's) the
// index could not read: claimsErr, retiringErr. Each problem is logged
// and reported once per resourceVersion; a PV that reads again is
// cleared.
func (c *Controller) malformedPV(name string, pv *pvRecord, claimsErr, retiringErr error) {
	if c.cfg.Malformed == nil {
		c.cfg.Malformed = NewMalformedSet(nil)
	}
	var found []Malformed
	for _, p := range []struct {
		reason, annotation string
		err                error
	}{{MalformedClaims, claims.ClaimsAnnotation, claimsErr}, {MalformedRetiring, claims.RetiringAnnotation, retiringErr}} {
		if p.err == nil || pv == nil {
			continue
		}
		m := Malformed{Kind: MalformedKindPV, Name: name, ResourceVersion: pv.resourceVersion,
			Reason: p.reason, Annotation: p.annotation, Error: p.err.Error(), Handle: pv.handle}
		found = append(found, m)
	}
	c.cfg.Malformed.set(MalformedKindPV, name, found)
}

// logMalformed is the log line of a problem (once per resourceVersion).
func logMalformed(m Malformed) {
	klog.Background().Info("skipping what the index cannot read; not retried until the object changes",
		"kind", m.Kind, "name", m.Name, "handle", m.Handle, "resourceVersion", m.ResourceVersion,
		"reason", m.Reason, "annotation", m.Annotation, "err", m.Error)
}
