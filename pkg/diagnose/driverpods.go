package diagnose

import (
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
)

// FindingImageNotPulled: a pod of the driver waits for an image its node
// cannot pull (a chart value or kustomize image naming a tag that does
// not exist, a private registry without a pull secret ...).
const FindingImageNotPulled = "DriverImageNotPulled"

// DriverPodsSelector selects the pods of the driver the chart and the
// kustomize base install, in whatever namespace.
const DriverPodsSelector = "app.kubernetes.io/name=rds-csi"

// imageSettings names, per container of the driver's pods, where a user
// sets its image.
var imageSettings = map[string]string{
	"rds-csi-plugin":        "image.repository and image.tag (Helm chart), or the kustomize images: entry for ghcr.io/srvlab/rds-csi-driver",
	"kubelet-dir-check":     "image.repository and image.tag (Helm chart), or the kustomize images: entry for ghcr.io/srvlab/rds-csi-driver",
	"csi-provisioner":       "sidecars.provisioner.image (Helm chart), or the kustomize images: entry for registry.k8s.io/sig-storage/csi-provisioner",
	"csi-attacher":          "sidecars.attacher.image (Helm chart), or the kustomize images: entry for registry.k8s.io/sig-storage/csi-attacher",
	"csi-resizer":           "sidecars.resizer.image (Helm chart), or the kustomize images: entry for registry.k8s.io/sig-storage/csi-resizer",
	"csi-snapshotter":       "sidecars.snapshotter.image (Helm chart), or the kustomize images: entry for registry.k8s.io/sig-storage/csi-snapshotter",
	"liveness-probe":        "sidecars.livenessProbe.image (Helm chart), or the kustomize images: entry for registry.k8s.io/sig-storage/livenessprobe",
	"node-driver-registrar": "sidecars.nodeDriverRegistrar.image (Helm chart), or the kustomize images: entry for registry.k8s.io/sig-storage/csi-node-driver-registrar",
}

// pullFailures are the waiting reasons of a container whose image cannot
// be had.
var pullFailures = map[string]bool{"ErrImagePull": true, "ImagePullBackOff": true, "InvalidImageName": true, "ErrImageNeverPull": true}

// checkDriverPods reports every container of the driver's pods that waits
// for an image it cannot get, with the setting that names that image.
func (c *Cluster) checkDriverPods(add func(kind, object, next, format string, a ...any)) {
	pods := append([]corev1.Pod(nil), c.DriverPods...)
	sort.Slice(pods, func(i, j int) bool { return pods[i].Namespace+"/"+pods[i].Name < pods[j].Namespace+"/"+pods[j].Name })
	for _, p := range pods {
		specs := map[string]string{}
		for _, ct := range append(append([]corev1.Container(nil), p.Spec.InitContainers...), p.Spec.Containers...) {
			specs[ct.Name] = ct.Image
		}
		for _, s := range append(append([]corev1.ContainerStatus(nil), p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
			w := s.State.Waiting
			if w == nil || !pullFailures[w.Reason] {
				continue
			}
			image := specs[s.Name]
			if image == "" {
				image = s.Image
			}
			setting, ok := imageSettings[s.Name]
			if !ok {
				setting = "the image of container " + s.Name
			}
			add(FindingImageNotPulled, "pod/"+p.Namespace+"/"+p.Name,
				fmt.Sprintf("set %s to an image the nodes can pull (or load %s into every node's container runtime), then upgrade the release or re-apply", setting, image),
				"container %s of %s on node %s cannot start: its image %s cannot be pulled (%s: %s)", s.Name, p.Name, orDash(p.Spec.NodeName), image, w.Reason, w.Message)
		}
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
