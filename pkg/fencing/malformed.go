package fencing

import (
	corev1 "k8s.io/api/core/v1"
)

// ReasonMalformedAnnotation: an annotation of the driver's on a PV cannot
// be read (a Warning event on the PV, once per resourceVersion).
const ReasonMalformedAnnotation = "MalformedAnnotation"

// MalformedAnnotation reports that annotation on PV pv (volume handle)
// cannot be read in resourceVersion rv: the index skips it until a version
// that reads (claims: the PV's claims are the unreadable ones), and the
// volume's publishes and unpublishes fail closed (blocking).
func (r *Reporter) MalformedAnnotation(pv, handle, annotation, rv, why string, claims, blocking bool) {
	var effect string
	switch {
	case claims:
		effect = "the attachment index keeps the PV's last readable claims, and every publish and unpublish of the volume is refused (FAILED_PRECONDITION) until it is fixed"
	case blocking:
		effect = "every publish and unpublish of the volume is refused (FAILED_PRECONDITION) until it is fixed, since storage fencing writes it"
	default:
		effect = "without storage fencing nothing reads or writes it, so nothing is refused"
	}
	r.event(VolumeRef{PV: pv, Handle: handle}, corev1.EventTypeWarning, ReasonMalformedAnnotation,
		"annotation %s of PV %s (resourceVersion %s) cannot be read: %s; %s. "+
			"kubectl rds check lists it; docs/operations.md (\"Malformed objects\") says how to fix it",
		annotation, pv, rv, why, effect)
}
