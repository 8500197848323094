package claims

import (
	"iter"
	"slices"
	"strings"
	"time"
	"unique"
)

// Set is a volume's claims by node as the index holds them: a slice
// sorted by node rather than a map, because a volume has one or two
// claims and a Go map of one entry costs about 1.3 KB. The strings that
// repeat across volumes (node name, node UID, capability, host NQN) are
// interned. The slice is behind a pointer so that a volume without claims
// (most of them) pays one word for it in its entry and in its PVRef. A
// Set is never modified once built; the zero value is empty. The
// annotation and the API writes keep map[string]Claim (Map).
type Set struct{ p *[]heldClaim }

// heldClaim is one node's Claim in a Set.
type heldClaim struct {
	node, nodeUID, capability, hostNQN unique.Handle[string]
	at                                 time.Time
	nonce                              string // one per attachment: not interned
	pvs                                []string
	gen                                int64
	readOnly, auth                     bool
}

// NewSet holds the claims of m (nil or empty: none).
func NewSet(m map[string]Claim) Set {
	if len(m) == 0 {
		return Set{}
	}
	s := make([]heldClaim, 0, len(m))
	for node, c := range m {
		s = append(s, heldClaim{
			node:       unique.Make(node),
			nodeUID:    unique.Make(c.NodeUID),
			capability: unique.Make(c.Capability),
			hostNQN:    unique.Make(c.HostNQN),
			at:         c.At,
			nonce:      c.Nonce,
			pvs:        c.PVs,
			gen:        c.Gen,
			readOnly:   c.ReadOnly,
			auth:       c.Auth,
		})
	}
	slices.SortFunc(s, func(a, b heldClaim) int { return strings.Compare(a.node.Value(), b.node.Value()) })
	return Set{p: &s}
}

// held is the set's slice (nil when empty).
func (s Set) held() []heldClaim {
	if s.p == nil {
		return nil
	}
	return *s.p
}

func (h heldClaim) claim() Claim {
	return Claim{
		At:         h.at,
		NodeUID:    h.nodeUID.Value(),
		Capability: h.capability.Value(),
		ReadOnly:   h.readOnly,
		Gen:        h.gen,
		HostNQN:    h.hostNQN.Value(),
		Nonce:      h.nonce,
		PVs:        h.pvs,
		Auth:       h.auth,
	}
}

// Len is the number of claims.
func (s Set) Len() int { return len(s.held()) }

// Get returns node's claim, if there is one.
func (s Set) Get(node string) (Claim, bool) {
	held := s.held()
	i, ok := slices.BinarySearchFunc(held, node, func(h heldClaim, node string) int { return strings.Compare(h.node.Value(), node) })
	if !ok {
		return Claim{}, false
	}
	return held[i].claim(), true
}

// Has reports whether node has a claim.
func (s Set) Has(node string) bool {
	_, ok := s.Get(node)
	return ok
}

// All yields every node and its claim, ordered by node.
func (s Set) All() iter.Seq2[string, Claim] {
	return func(yield func(string, Claim) bool) {
		for _, h := range s.held() {
			if !yield(h.node.Value(), h.claim()) {
				return
			}
		}
	}
}

// Map returns the claims as a new map (nil when there are none), the form
// the annotation and the claim writes use.
func (s Set) Map() map[string]Claim {
	if s.Len() == 0 {
		return nil
	}
	m := make(map[string]Claim, s.Len())
	for node, c := range s.All() {
		m[node] = c
	}
	return m
}
