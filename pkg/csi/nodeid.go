package csi

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/srvlab/rds-csi/pkg/exportauth"
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
//
// A node plugin whose kernel can authenticate NVMe connects registers its
// node key (exportauth) the same way, in place of the NQN:
//
//	worker-1/x25519:Hn3…
//
// and the controller seals every authenticated attachment's secret to it.
// An NQN starts with "nqn.", a key with "x25519:", so the two never mix up.
const nodeIDSeparator = "/"

// MaxNodeIDLength is the longest node ID the driver registers: Kubernetes
// refuses a CSINode whose driver nodeID is longer than 192 bytes (older
// releases 128; the CSI spec allows 256).
const MaxNodeIDLength = 192

// NodeIdentity is a parsed node ID.
type NodeIdentity struct {
	Name    string // the Kubernetes node name
	HostNQN string // "" when the node registered none
	// Key is the node plugin's node key; nil when the node registered none
	// (its kernel cannot authenticate, or a plugin from before
	// authenticated attachments).
	Key *exportauth.PublicKey
}

// FormatNodeID builds the node ID a node registers: the name, and after it
// either a host NQN (the form of node plugins before per-attachment NQNs)
// or a node key's String, or nothing.
func FormatNodeID(name, suffix string) (string, error) {
	id := name
	if suffix != "" {
		id = name + nodeIDSeparator + suffix
	}
	if _, err := ParseNodeID(id); err != nil {
		return "", err
	}
	if len(id) > MaxNodeIDLength {
		return "", fmt.Errorf("node ID %q is %d bytes, more than the %d Kubernetes accepts in a CSINode: use a shorter host NQN in /etc/nvme/hostnqn (the uuid form is 68 bytes), or a node name of at most %d bytes with a node key", id, len(id), MaxNodeIDLength, MaxNodeIDLength-len(nodeIDSeparator)-len(exportauth.PublicKey{}.String()))
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
	if hasNQN && strings.HasPrefix(nqn, exportauth.PublicKeyPrefix) {
		k, err := exportauth.ParsePublicKey(nqn)
		if err != nil {
			return NodeIdentity{}, fmt.Errorf("node ID %q: %w", id, err)
		}
		return NodeIdentity{Name: name, Key: &k}, nil
	}
	if hasNQN {
		if err := rds.ValidateNQN(nqn); err != nil {
			return NodeIdentity{}, fmt.Errorf("node ID %q: %w", id, err)
		}
	}
	return NodeIdentity{Name: name, HostNQN: nqn}, nil
}
