package framework

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// StorageClass of the driver with Immediate binding and Delete reclaim.
func StorageClass(name string, params map[string]string) *storagev1.StorageClass {
	return &storagev1.StorageClass{
		ObjectMeta:           metav1.ObjectMeta{Name: name},
		Provisioner:          DriverName,
		Parameters:           params,
		ReclaimPolicy:        ptr.To(corev1.PersistentVolumeReclaimDelete),
		VolumeBindingMode:    ptr.To(storagev1.VolumeBindingImmediate),
		AllowVolumeExpansion: ptr.To(true),
	}
}

// PVC is a claim on storageClass of size (a quantity such as "1Gi").
func PVC(ns, name, storageClass, size string, mode corev1.PersistentVolumeAccessMode, block bool) *corev1.PersistentVolumeClaim {
	c := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{mode},
			StorageClassName: ptr.To(storageClass),
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}},
		},
	}
	if block {
		c.Spec.VolumeMode = ptr.To(corev1.PersistentVolumeBlock)
	}
	return c
}

// PodOnNode is a pod bound to node directly (there is no scheduler) that
// uses claim. With no kubelet it never runs; the attach/detach controller
// only needs it to exist, unfinished, on the node. It keeps the default
// termination grace period: as on a dead node, nothing confirms its
// termination, so a deleted (or evicted) pod stays Terminating until it is
// force-deleted (ForceDeletePod) or the pod GC removes it (out-of-service
// taint on a NotReady node, deleted node).
func PodOnNode(ns, name, node, claim string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{
			NodeName: node,
			Containers: []corev1.Container{{
				Name: "app", Image: "registry.invalid/rds-csi-e2e/never-pulled:0",
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
			}},
			Volumes: []corev1.Volume{{
				Name:         "data",
				VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}},
			}},
			// No tolerations beyond the defaults the API server adds:
			// node-failure scenarios rely on taint-based eviction.
		},
	}
}

// ForceDeletePod deletes a pod with grace period 0, as an operator's
// `kubectl delete --force` does: the API object goes at once, without a
// kubelet's confirmation.
func ForceDeletePod(ctx context.Context, c kubernetes.Interface, ns, name string) error {
	return c.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
}
