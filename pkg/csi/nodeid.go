package csi

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/srvlab/rds-csi/pkg/rds"
)

// The CSI node ID this driver's node plugin registers is the Kubernetes
// node name. Node plugins from before per-attachment host NQNs registered
// the name followed by "/" and the node's NVMe host NQN:
//
//	worker-1/nqn.2014-08.org.nvmexpress:uuid:0f6c…
//
// and the controller still parses that form (a node name cannot contain
// '/', so the split is unambiguous): it tells an older node plugin, which
// connects with that NQN, from one that connects with the attachment's
// own (publish_context), and it is the NQN an attachment made before
// per-attachment NQNs connected with. It reached the controller through
// NodeGetInfo → node-driver-registrar → kubelet → CSINode → external-
// attacher → ControllerPublishVolume's node_id.
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
