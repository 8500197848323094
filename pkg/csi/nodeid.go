package csi

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/srvlab/rds-csi/pkg/rds"
)

// The CSI node ID this driver registers is the Kubernetes node name,
// followed by "/" and the node's NVMe host NQN when the node has one:
//
//	worker-1/nqn.2014-08.org.nvmexpress:uuid:0f6c…
//
// It reaches the controller through the path Kubernetes already has:
// NodeGetInfo → node-driver-registrar → kubelet → CSINode (which only that
// node's kubelet may write, under NodeRestriction) → external-attacher →
// ControllerPublishVolume's node_id. So the controller learns the host NQN
// it must allow on the RDS in the very request, with no API call and no
// extra RBAC for the node plugin; a node name cannot contain '/', so the
// split is unambiguous. A bare node name (node plugins before storage
// fencing, or the loop connector) is still accepted: it has no host NQN.
const nodeIDSeparator = "/"

// MaxNodeIDLength is the longest node ID the driver registers: Kubernetes
// refuses a CSINode whose driver nodeID is longer than 192 bytes (older
// releases 128; the CSI spec allows 256).
const MaxNodeIDLength = 192

// NodeIdentity is a parsed node ID.
type NodeIdentity struct {
	Name    string // the Kubernetes node name
	HostNQN string // "" when the node registered none
}

// FormatNodeID builds the node ID a node registers.
func FormatNodeID(name, hostNQN string) (string, error) {
	id := name
	if hostNQN != "" {
		id = name + nodeIDSeparator + hostNQN
	}
	if _, err := ParseNodeID(id); err != nil {
		return "", err
	}
	if len(id) > MaxNodeIDLength {
		return "", fmt.Errorf("node ID %q is %d bytes, more than the %d Kubernetes accepts in a CSINode: use a shorter host NQN in /etc/nvme/hostnqn (the uuid form is 68 bytes)", id, len(id), MaxNodeIDLength)
	}
	return id, nil
}

// ParseNodeID splits a node ID into node name and host NQN, refusing
// anything this driver's node plugin cannot have registered.
func ParseNodeID(id string) (NodeIdentity, error) {
	name, nqn, hasNQN := strings.Cut(id, nodeIDSeparator)
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return NodeIdentity{}, fmt.Errorf("node ID %q: %q is not a Kubernetes node name: %s", id, name, strings.Join(errs, "; "))
	}
	if hasNQN {
		if err := rds.ValidateNQN(nqn); err != nil {
			return NodeIdentity{}, fmt.Errorf("node ID %q: %w", id, err)
		}
	}
	return NodeIdentity{Name: name, HostNQN: nqn}, nil
}
