package diagnose

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A driver pod whose image cannot be pulled is a finding that names the
// chart value (or kustomize image) to fix; a running pod, or one waiting
// for another reason, is none.
func TestCheckNamesTheSettingOfAnImageThatCannotBePulled(t *testing.T) {
	waiting := func(name, reason string) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: name, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: "not found"}}}
	}
	node := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "rds-csi", Name: "rds-csi-node-x1"},
		Spec: corev1.PodSpec{NodeName: "worker-1",
			InitContainers: []corev1.Container{{Name: "kubelet-dir-check", Image: "ghcr.io/srvlab/rds-csi-driver:v9.9.9"}},
			Containers: []corev1.Container{
				{Name: "rds-csi-plugin", Image: "ghcr.io/srvlab/rds-csi-driver:v9.9.9"},
				{Name: "node-driver-registrar", Image: "registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.17.0"},
			}},
		Status: corev1.PodStatus{
			InitContainerStatuses: []corev1.ContainerStatus{waiting("kubelet-dir-check", "ImagePullBackOff")},
			ContainerStatuses:     []corev1.ContainerStatus{waiting("rds-csi-plugin", "PodInitializing"), waiting("node-driver-registrar", "PodInitializing")},
		},
	}
	ctrl := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "rds-csi", Name: "rds-csi-controller-1"},
		Spec: corev1.PodSpec{NodeName: "worker-2", Containers: []corev1.Container{
			{Name: "rds-csi-plugin", Image: "ghcr.io/srvlab/rds-csi-driver:v0.1.0"},
			{Name: "csi-provisioner", Image: "registry.k8s.io/sig-storage/csi-provisioner:v0.0.0-typo"},
		}},
		Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{
			{Name: "rds-csi-plugin", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}},
			waiting("csi-provisioner", "ErrImagePull"),
		}},
	}
	r := Check(&Cluster{Now: time.Now(), DriverName: "rds.csi.srvlab.io", DriverPods: []corev1.Pod{node, ctrl}})
	if r.OK || r.Counts[FindingImageNotPulled] != 2 {
		t.Fatalf("OK %v, %d %s findings, want 2: %+v", r.OK, r.Counts[FindingImageNotPulled], FindingImageNotPulled, r.Findings)
	}
	want := map[string][]string{
		"pod/rds-csi/rds-csi-controller-1": {"csi-provisioner", "sidecars.provisioner.image", "registry.k8s.io/sig-storage/csi-provisioner:v0.0.0-typo"},
		"pod/rds-csi/rds-csi-node-x1":      {"kubelet-dir-check", "worker-1", "image.repository and image.tag", "ghcr.io/srvlab/rds-csi-driver:v9.9.9"},
	}
	for _, f := range r.Findings {
		for _, s := range want[f.Object] {
			if !strings.Contains(f.Message+" "+f.Next, s) {
				t.Errorf("%s: %q / next %q does not name %q", f.Object, f.Message, f.Next, s)
			}
		}
		delete(want, f.Object)
	}
	if len(want) > 0 {
		t.Errorf("no finding for %v", want)
	}
}
