package claims

import (
	"context"
	"crypto/sha256"
	"fmt"
	"slices"

	storagev1 "k8s.io/api/storage/v1"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// VolumeAttachmentName is the name Kubernetes gives the VolumeAttachment of
// a CSI volume handle on a node (the attach/detach controller and the
// kubelet derive it the same way), so whether one exists is one GET.
func VolumeAttachmentName(handle, driver, node string) string {
	return fmt.Sprintf("csi-%x", sha256.Sum256([]byte(handle+driver+node)))
}

// LiveAttachment reads from the API server whether a VolumeAttachment of
// handle on node exists and is not being deleted: what a claim must stand
// on (a publish from a replica that woke up after the attachment was
// detached must not leave a claim behind). pvs are the handle's
// PersistentVolumes the caller knows (readAttachment); one whose
// PersistentVolume is gone does not count.
func (c *Store) LiveAttachment(ctx context.Context, handle, node string, pvs []string) (bool, error) {
	va, pvGone, err := c.readAttachment(ctx, handle, node, pvs)
	return va != nil && !pvGone && va.DeletionTimestamp == nil, err
}

// KeepsClaim reads from the API server whether a VolumeAttachment of
// handle on node exists and is not being deleted, its PersistentVolume
// gone or not: a release for an unpublish leaves node's claim to it (the
// unpublish is a late one of an earlier attachment). pvs as for
// LiveAttachment.
func (c *Store) KeepsClaim(ctx context.Context, handle, node string, pvs []string) (bool, error) {
	va, _, err := c.readAttachment(ctx, handle, node, pvs)
	return va != nil && va.DeletionTimestamp == nil, err
}

// readAttachment reads the VolumeAttachment of handle on node from the API
// server; nil when there is none. An object under that name counts only
// when it is one: this driver's, on node, of a PersistentVolume of handle
// (one of pvs, the PVs the caller knows of the handle, or one read live
// and found to be of the handle); anything else (a hand-made object, a
// name reused) is none. pvGone: its PersistentVolume does not exist (any
// more): it may still be attached, so it keeps a claim from a release,
// but nothing new stands on it.
func (c *Store) readAttachment(ctx context.Context, handle, node string, pvs []string) (va *storagev1.VolumeAttachment, pvGone bool, err error) {
	va, err = c.client.StorageV1().VolumeAttachments().Get(ctx, VolumeAttachmentName(handle, c.driver, node), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("reading the VolumeAttachment of volume %s on node %s: %w", handle, node, err)
	}
	pv := va.Spec.Source.PersistentVolumeName
	if va.Spec.Attacher != c.driver || va.Spec.NodeName != node || pv == nil || *pv == "" {
		return nil, false, nil
	}
	if slices.Contains(pvs, *pv) {
		return va, false, nil
	}
	// A PV the caller does not know (yet): its handle tells.
	p, err := c.client.CoreV1().PersistentVolumes().Get(ctx, *pv, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return va, true, nil
	case err != nil:
		return nil, false, fmt.Errorf("reading PV %s of the VolumeAttachment of volume %s on node %s: %w", *pv, handle, node, err)
	case p.Spec.CSI == nil || p.Spec.CSI.Driver != c.driver || p.Spec.CSI.VolumeHandle != handle:
		return nil, false, nil
	}
	return va, false, nil
}

// AttachmentExists reads from the API server whether a VolumeAttachment of
// handle on node exists, being deleted or not (until its detach completes
// the node may still use the volume). pvs as for LiveAttachment.
func (c *Store) AttachmentExists(ctx context.Context, handle, node string, pvs []string) (bool, error) {
	va, pvGone, err := c.readAttachment(ctx, handle, node, pvs)
	return va != nil && !pvGone, err
}
