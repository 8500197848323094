package diagnose

import (
	"strings"

	"github.com/srvlab/rds-csi/pkg/claims"
	corev1 "k8s.io/api/core/v1"
)

// malformedDoc is where the operator reads what to do about an annotation
// of the driver's that cannot be read.
const malformedDoc = `docs/operations.md, "Malformed objects"`

// unreadableNext is the next step for PV pv whose annotation cannot be
// read: restore it, or remove it once nothing uses the volume.
func unreadableNext(pv *corev1.PersistentVolume, annotation string) string {
	return "restore the annotation's last good value, or once no node uses the volume (kubectl rds why pv " + pv.Name + ") remove it: kubectl annotate pv " +
		pv.Name + " " + annotation + "-   # " + malformedDoc
}

// attachedWhere says where a PV's VolumeAttachments are, for a message
// about a PV whose claims cannot be read.
func attachedWhere(atts []AttachmentFact) string {
	if len(atts) == 0 {
		return "no VolumeAttachment names it"
	}
	var nodes []string
	for _, a := range atts {
		s := a.Node
		switch {
		case a.Deleting:
			s += " (detaching)"
		case a.Attached:
			s += " (attached)"
		default:
			s += " (attaching)"
		}
		nodes = append(nodes, s)
	}
	return "VolumeAttachments name " + strings.Join(nodes, ", ")
}

// unreadableRetiring is the error reading a PV's record of released
// attachments, if any.
func unreadableRetiring(pv *corev1.PersistentVolume) error {
	_, err := claims.ParseRetiring(pv.Annotations[claims.RetiringAnnotation])
	return err
}
