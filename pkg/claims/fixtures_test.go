package claims

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The fixtures the claims tests share.

const driver = "rds.csi.srvlab.io"

// pv is a PersistentVolume of this driver holding the claims annotation
// held ("": none).
func pv(name, handle string, mode corev1.PersistentVolumeAccessMode, held string) *corev1.PersistentVolume {
	p := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1", Annotations: map[string]string{"other": "x"}},
		Spec: corev1.PersistentVolumeSpec{
			AccessModes:            []corev1.PersistentVolumeAccessMode{mode},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: handle}},
			ClaimRef:               &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: "ns", Name: "claim-" + name},
		},
	}
	if held != "" {
		p.Annotations[ClaimsAnnotation] = held
	}
	return p
}

// always is a release condition that always holds.
func always(context.Context, Claim) (bool, error) { return true, nil }
