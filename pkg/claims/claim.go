package claims

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// ClaimsAnnotation on a PersistentVolume records the nodes this driver has
// published the volume to, as a JSON map of node name to Claim:
//
//	{"node-a":{"at":"2026-11-22T10:00:00Z","uid":"5f0c…","cap":"mount/SINGLE_NODE_WRITER","gen":2}}
//
// Every change is a merge patch carrying the resourceVersion the change was
// computed from, which the API server enforces like a conditional update:
// two controller replicas deciding at once cannot both commit. A value that
// is a plain time (written by earlier versions) reads as a claim without
// UID.
const ClaimsAnnotation = "rds.csi.srvlab.io/claims"

// ErrUnreadable: an annotation of the driver's cannot be parsed. Parsing
// the same object again gives the same error, so it is not retried: the
// object is skipped, counted and reported until a new version of it is
// readable (pkg/informers MalformedSet). Never read as "nothing recorded".
var ErrUnreadable = errors.New("unreadable annotation")

// ErrConflict: the PV changed since the decision was made; the caller
// decides again on the fresh state, or answers ABORTED.
var ErrConflict = errors.New("the volume's claims changed concurrently")

// Claim is one node's committed hold on a volume.
type Claim struct {
	// At is when the node first claimed the volume (one-second resolution).
	At time.Time `json:"at"`
	// NodeUID is the UID of the Node object the volume was published to,
	// read live from the API server when the claim was made. A Node of the
	// same name with another UID is another incarnation: this claim is
	// stale. Empty for claims written before UIDs were recorded.
	NodeUID string `json:"uid,omitempty"`
	// Capability and ReadOnly are what the volume was published with; a
	// repeated publish asking for something else is ALREADY_EXISTS.
	Capability string `json:"cap,omitempty"`
	ReadOnly   bool   `json:"ro,omitempty"`
	// Gen counts the publishes answered on this claim. Every publish
	// success writes the claim (bumping Gen), so that no success is ever
	// answered on a claim that a concurrent release may be dropping.
	Gen int64 `json:"gen,omitempty"`
	// HostNQN is the NVMe host NQN the node registered (from its CSI node
	// ID) when storage fencing allowed it on the RDS; what a fence of this
	// claim must cut off there. Empty without storage fencing.
	HostNQN string `json:"nqn,omitempty"`
	// Nonce identifies the attachment (storage fencing): set when the
	// claim is made, kept by every repeated publish. The attachment's own
	// host NQN is derived from it with a key only the controller holds
	// (pkg/csi), so the annotation does not reveal it. Empty for claims
	// made before per-attachment host NQNs: those allow HostNQN.
	Nonce string `json:"n,omitempty"`
	// Auth: the attachment was made with authenticated exports on
	// (pkg/csi, --export-auth): its export gets a password, so a publish
	// of it answers the secret or fails, never success without one.
	// False for attachments made before the mode was on, which keep
	// working unauthenticated until they move.
	Auth bool `json:"auth,omitempty"`
	// PVs: every PersistentVolume of the handle the claim was committed
	// to, when there are several (a Retained volume's PV re-created): a
	// release on a replica whose index has not seen one of them yet
	// releases it there too. Empty with one PV.
	PVs []string `json:"pvs,omitempty"`
}

// UnmarshalJSON accepts a claim object or, as earlier versions wrote, a
// bare RFC 3339 time.
func (c *Claim) UnmarshalJSON(b []byte) error {
	var at time.Time
	if err := json.Unmarshal(b, &at); err == nil {
		*c = Claim{At: at}
		return nil
	}
	type plain Claim
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return fmt.Errorf("a claim is an RFC 3339 time or an object with its time (\"at\"), not %s", b)
	}
	if p.At.IsZero() {
		return fmt.Errorf("a claim without its time (\"at\"): %s", b)
	}
	*c = Claim(p)
	return nil
}

// decodeClaims reads the annotation. An unreadable annotation is an error:
// the caller must not treat a corrupted claim as no claim.
func decodeClaims(annotations map[string]string) (map[string]Claim, error) {
	return ParseClaims(annotations[ClaimsAnnotation])
}

// ParseClaims reads the value of the claims annotation (empty: no claims).
// The one decoder of claims, for the driver and for the tools and tests
// that inspect what it committed.
func ParseClaims(raw string) (map[string]Claim, error) {
	if raw == "" {
		return nil, nil
	}
	var m map[string]Claim
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrUnreadable, ClaimsAnnotation, err)
	}
	return m, nil
}

// DecodeClaims reads the claims annotation of a PersistentVolume.
func DecodeClaims(pv *corev1.PersistentVolume) (map[string]Claim, error) {
	return decodeClaims(pv.Annotations)
}
