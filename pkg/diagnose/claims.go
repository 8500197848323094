package diagnose

import (
	"time"

	"github.com/srvlab/rds-csi/pkg/claims"
)

// Claim is one node's entry in the PV's claims annotation.
type Claim struct {
	At  time.Time
	UID string // the Node's UID when the claim was made; empty in older claims
}

// ParseClaims decodes the claims annotation tolerantly: a node's value is
// either the time of its claim ("2026-11-23T08:00:00Z") or an object
// ({"at": "...", "uid": "..."}). Anything else is an error: an unreadable
// claim is never read as no claim.
func ParseClaims(raw string) (map[string]Claim, error) {
	claims, err := claims.ParseClaims(raw)
	if err != nil {
		return nil, err
	}
	var out map[string]Claim
	for node, c := range claims {
		if out == nil {
			out = make(map[string]Claim, len(claims))
		}
		out[node] = Claim{At: c.At, UID: c.NodeUID}
	}
	return out, nil
}
