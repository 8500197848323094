package diagnose

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/srvlab/rds-csi/pkg/informers"
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
	if raw == "" {
		return nil, nil
	}
	var entries map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &entries); err != nil {
		return nil, fmt.Errorf("annotation %s is not a JSON object: %w", informers.ClaimsAnnotation, err)
	}
	out := make(map[string]Claim, len(entries))
	for node, v := range entries {
		var c Claim
		var obj struct {
			At  *time.Time `json:"at"`
			UID string     `json:"uid"`
		}
		switch {
		case json.Unmarshal(v, &c.At) == nil:
		case json.Unmarshal(v, &obj) == nil && obj.At != nil:
			c = Claim{At: *obj.At, UID: obj.UID}
		default:
			return nil, fmt.Errorf("annotation %s: the claim of node %q is neither a time nor {\"at\",\"uid\"}: %s", informers.ClaimsAnnotation, node, v)
		}
		out[node] = c
	}
	return out, nil
}
