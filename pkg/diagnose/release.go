package diagnose

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/srvlab/rds-csi/pkg/claims"
)

// ErrRefused: releasing the claim could let two nodes write the volume.
var ErrRefused = errors.New("release refused")

// ErrNothingToRelease: the node has no claim on the PV.
var ErrNothingToRelease = errors.New("nothing to release")

// ReleasePlan is a release that passed the checks: the merge patch that
// removes one node's claim, conditional on the resourceVersion the checks
// saw (the API server refuses it with a Conflict if the PV changed since).
type ReleasePlan struct {
	PV              string
	Node            string
	Claim           ClaimFact
	ResourceVersion string
	Patch           []byte
	Remaining       []string // the nodes whose claims stay
	NodeState       string   // why the node cannot be using the volume, in words
}

// PlanRelease checks that node's claim on the PV may be dropped by hand and
// returns the patch. It refuses while a VolumeAttachment of the PV to that
// node exists (Kubernetes still tracks an attachment there) or while the
// node is Ready (it may be using the volume); a Node re-created since the
// claim (another UID) is not the claiming node.
func PlanRelease(c *Cluster, pvName, node string) (ReleasePlan, error) {
	pv := c.pv(pvName)
	if pv == nil {
		return ReleasePlan{}, fmt.Errorf("PV %s not found: check the name with `kubectl get pv`", pvName)
	}
	if !c.ours(pv) {
		return ReleasePlan{}, fmt.Errorf("%w: PV %s is not a volume of %s", ErrRefused, pvName, c.DriverName)
	}
	atts := c.attachments(pvName)
	facts, err := claimsOf(pv, atts)
	if err != nil {
		return ReleasePlan{}, fmt.Errorf("%w: %w; fix the annotation by hand as docs/attachments.md says", ErrRefused, err)
	}
	plan := ReleasePlan{PV: pvName, Node: node, ResourceVersion: pv.ResourceVersion}
	found := false
	for _, cl := range facts {
		if cl.Node == node {
			plan.Claim, found = cl, true
		} else {
			plan.Remaining = append(plan.Remaining, cl.Node)
		}
	}
	if !found {
		claimedBy := "no node claims it"
		if len(plan.Remaining) > 0 {
			claimedBy = "claimed by " + strings.Join(plan.Remaining, ", ")
		}
		return ReleasePlan{}, fmt.Errorf("%w: node %s has no claim on PV %s (%s)", ErrNothingToRelease, node, pvName, claimedBy)
	}
	for _, a := range atts {
		if a.Node == node {
			return ReleasePlan{}, fmt.Errorf("%w: VolumeAttachment %s of PV %s to %s exists (attached=%v): Kubernetes still tracks the volume there; it detaches it itself once no pod on %s uses it (or the node is marked out-of-service), and the driver then drops the claim",
				ErrRefused, a.Name, pvName, node, a.Attached, node)
		}
	}
	n := c.node(node)
	sameNode := n.Exists && (plan.Claim.UID == "" || plan.Claim.UID == n.UID)
	if sameNode && n.Ready == "True" {
		return ReleasePlan{}, fmt.Errorf("%w: node %s is Ready and may be using PV %s; stop what uses it there, or if the node is really down mark it: kubectl taint node %s %s=nodeshutdown:NoExecute",
			ErrRefused, node, pvName, node, OutOfServiceTaint)
	}
	switch {
	case !n.Exists:
		plan.NodeState = "its Node no longer exists"
	case !sameNode:
		plan.NodeState = "its Node was re-created since the claim (another UID)"
	default:
		plan.NodeState = fmt.Sprintf("it has been NotReady (%s) since %s", n.Ready, n.ReadySince.UTC().Format("2006-01-02T15:04:05Z"))
	}
	var entries map[string]json.RawMessage
	if err := json.Unmarshal([]byte(pv.Annotations[claims.ClaimsAnnotation]), &entries); err != nil {
		return ReleasePlan{}, fmt.Errorf("PV %s: %w", pvName, err)
	}
	delete(entries, node) // the other entries keep their exact encoding
	var value any         // JSON null removes the annotation
	if len(entries) > 0 {
		b, err := json.Marshal(entries)
		if err != nil {
			return ReleasePlan{}, err
		}
		value = string(b)
	}
	plan.Patch, err = json.Marshal(map[string]any{"metadata": map[string]any{
		"resourceVersion": pv.ResourceVersion,
		"annotations":     map[string]any{claims.ClaimsAnnotation: value},
	}})
	return plan, err
}
