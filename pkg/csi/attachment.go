package csi

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"

	"github.com/srvlab/rds-csi/pkg/exportauth"
	"github.com/srvlab/rds-csi/pkg/nvme"
)

// PublishContextHostNQN is the publish_context key of the attachment's
// host NQN: NodeStageVolume connects with it (and a host ID derived from
// it). Absent without storage fencing, and for attachments made before
// per-attachment host NQNs: the node then connects with its own.
const PublishContextHostNQN = "hostNQN"

// sealSecret seals an attachment's secret to the node's key
// (exportauth.Seal) with an ephemeral key derived from the attachment key,
// the volume, the host, the node's key and the secret: a repeated publish
// of the same attachment answers the same publish_context, as every
// repeated publish does, and a new secret or node key gives another.
func sealSecret(key []byte, handle, host string, to exportauth.PublicKey, secret nvme.DHCHAPSecret) (string, error) {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("rds-csi seal ephemeral v1\x00" + handle + "\x00" + host + "\x00" + to.String() + "\x00" + secret.Reveal()))
	return exportauth.Seal(secret, to, bytes.NewReader(m.Sum(nil)))
}
