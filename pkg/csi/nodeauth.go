package csi

import (
	"errors"

	"google.golang.org/grpc/codes"

	"github.com/srvlab/rds-csi/pkg/exportauth"
	"github.com/srvlab/rds-csi/pkg/nvme"
)

// publish_context keys of an authenticated attachment (docs/attachments.md):
// PublishContextAuth names the scheme, PublishContextSecret carries the
// attachment's DH-HMAC-CHAP secret sealed to the node's key (exportauth).
// The scheme is said apart from the secret so that a node plugin can tell
// "authenticate, but the secret is missing" from "no authentication".
const (
	PublishContextAuth   = "auth"
	PublishContextSecret = "dhchapSecret"
	// AuthDHCHAP: NVMe in-band authentication, DH-HMAC-CHAP, the host
	// proving its secret to the RDS (unidirectional).
	AuthDHCHAP = "dhchap"
)

// nodeAuth is what the node plugin can do about authenticated attachments.
type nodeAuth struct {
	key *exportauth.NodeKey // nil: this node cannot authenticate
	why string              // with key nil: why not, for errors and logs
}

// SetNodeKey gives the node plugin its key; with k nil, why says why this
// node cannot authenticate NVMe connects (its kernel, its connector), and
// authenticated attachments are then refused with that reason. A key that
// does not fit in the node ID (a node name over 141 bytes) is not
// registered either. Call it before the node registers.
func (s *NodeServer) SetNodeKey(k *exportauth.NodeKey, why string) {
	if k != nil {
		if _, err := FormatNodeID(s.d.opts.NodeID, k.Public.String()); err != nil {
			k, why = nil, err.Error()
		}
	}
	s.auth = nodeAuth{key: k, why: why}
}

// AuthUnavailable is why this node cannot authenticate, or "".
func (s *NodeServer) AuthUnavailable() string {
	if s.auth.key != nil {
		return ""
	}
	if s.auth.why == "" {
		return "the node plugin was started without a node key"
	}
	return s.auth.why
}

// attachmentSecret is the DH-HMAC-CHAP secret NodeStageVolume connects
// with: none for an attachment without authentication, else the one
// sealed to this node's key in publish_context. Everything wrong is said
// here, before anything reaches the kernel, and nothing says the secret.
func (s *NodeServer) attachmentSecret(id string, pc map[string]string) (nvme.DHCHAPSecret, error) {
	scheme, hasScheme := pc[PublishContextAuth]
	sealed, hasSecret := pc[PublishContextSecret]
	switch {
	case !hasScheme && !hasSecret:
		return nvme.DHCHAPSecret{}, nil
	case !hasScheme:
		return nvme.DHCHAPSecret{}, statusf(codes.InvalidArgument, "volume %s: publish_context has %s but no %s; ControllerPublishVolume sets both, so check that the controller and the node plugin run the same release", id, PublishContextSecret, PublishContextAuth)
	case scheme != AuthDHCHAP:
		return nvme.DHCHAPSecret{}, statusf(codes.InvalidArgument, "volume %s: publish_context %s=%q is not a scheme this node plugin knows (%s): upgrade the node plugin to the controller's release", id, PublishContextAuth, scheme, AuthDHCHAP)
	case !hasSecret || sealed == "":
		return nvme.DHCHAPSecret{}, statusf(codes.InvalidArgument, "volume %s: the attachment authenticates (%s=%s) but publish_context carries no %s; the controller must publish it again", id, PublishContextAuth, scheme, PublishContextSecret)
	}
	if s.auth.key == nil {
		return nvme.DHCHAPSecret{}, statusf(codes.FailedPrecondition, "volume %s needs NVMe in-band authentication (DH-HMAC-CHAP) and this node cannot do it: %s", id, s.AuthUnavailable())
	}
	secret, err := s.auth.key.Open(sealed)
	if err != nil {
		code := codes.InvalidArgument
		if errors.Is(err, exportauth.ErrWrongKey) {
			// A new publish (to the key the node registers now) fixes it,
			// not the caller's input.
			code = codes.FailedPrecondition
		}
		return nvme.DHCHAPSecret{}, statusf(code, "volume %s: publish_context %s: %v", id, PublishContextSecret, err)
	}
	return secret, nil
}

// nodeIDSuffix is what follows the node name in the node ID: the node key
// when the node can authenticate.
func (a nodeAuth) nodeIDSuffix() string {
	if a.key == nil {
		return ""
	}
	return a.key.Public.String()
}
