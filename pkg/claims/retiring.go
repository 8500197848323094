package claims

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"
)

// RetiringAnnotation on a PersistentVolume (storage fencing) lists the
// attachments whose claims were released there and whose export has not
// been known to change since, as a JSON list of Retiring:
//
//	[{"node":"node-a","uid":"5f0c…","n":"…","at":"2026-11-22T10:00:00Z"}]
//
// An entry is written in the same merge patch as the release, so a
// replica that stops between the release and the export change after it
// (which makes any open of the retired attachment still in flight on the
// RDS fail or be undone) leaves it behind. The leader makes that change
// and then removes the entry (pkg/csi RetireMarked); an unpublish that
// finds its node's entry (a retry after the replica that released the
// claim died) makes it before it answers.
const RetiringAnnotation = "rds.csi.srvlab.io/retiring"

// Retiring names one released attachment (RetiringAnnotation).
type Retiring struct {
	Node    string `json:"node"`
	NodeUID string `json:"uid,omitempty"`
	Nonce   string `json:"n,omitempty"`
	// At is the released claim's time: with NodeUID it names a claim
	// made before per-attachment nonces.
	At time.Time `json:"at"`
	// PVs: the claim's PVs (Claim.PVs), where it may still be shown.
	PVs []string `json:"pvs,omitempty"`
}

// RetiringOf names node's claim c once it is released.
func RetiringOf(node string, c Claim) Retiring {
	return Retiring{Node: node, NodeUID: c.NodeUID, Nonce: c.Nonce, At: c.At, PVs: c.PVs}
}

// Retired reports whether node's claim c is one of the retired
// attachments rs.
func Retired(rs []Retiring, node string, c Claim) bool {
	for _, r := range rs {
		if r.Is(node, c) {
			return true
		}
	}
	return false
}

// Is reports whether node's claim c is the released attachment r (a claim
// another PV of the handle still shows until its own release). A new
// attachment of the same node (a new nonce) is not.
func (r Retiring) Is(node string, c Claim) bool {
	if r.Node != node {
		return false
	}
	if r.Nonce != "" || c.Nonce != "" {
		return r.Nonce == c.Nonce
	}
	return r.NodeUID == c.NodeUID && r.At.Equal(c.At)
}

func (r Retiring) same(o Retiring) bool {
	return r.Node == o.Node && r.NodeUID == o.NodeUID && r.Nonce == o.Nonce && r.At.Equal(o.At)
}

// In reports whether rs names the same attachment as r.
func (r Retiring) In(rs []Retiring) bool {
	return slices.ContainsFunc(rs, r.same)
}

// ParseRetiring reads the value of RetiringAnnotation (empty: none).
func ParseRetiring(raw string) ([]Retiring, error) {
	if raw == "" {
		return nil, nil
	}
	var out []Retiring
	if err := json.Unmarshal([]byte(raw), &out); err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrUnreadable, RetiringAnnotation, err)
	}
	return out, nil
}
