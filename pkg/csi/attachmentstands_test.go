package csi

import (
	"context"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/srvlab/rds-csi/pkg/fencing"
)

// A VolumeAttachment counts for a publish (and against an unpublish) only
// when it is this driver's, of the volume's PV, on that node: an object
// that merely carries the derived name is not one.
func TestOnlyAMatchingVolumeAttachmentStandsOnAClaim(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(va *storagev1.VolumeAttachment)
	}{
		{"another node", func(va *storagev1.VolumeAttachment) { va.Spec.NodeName = nodeB }},
		{"another driver", func(va *storagev1.VolumeAttachment) { va.Spec.Attacher = "other.csi.example.com" }},
		{"another PV", func(va *storagev1.VolumeAttachment) {
			other := "pv-other"
			va.Spec.Source.PersistentVolumeName = &other
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := newFakeAPI(testNode(nodeA), testNode(nodeB))
			e := newPublishEnv(t, client, nil, fencing.DefaultConfig())
			rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
			id := e.newVolume(client, "pvc-5f000000-0000-4000-8000-000000000603", corev1.ReadWriteOnce, false)
			// A PV of another volume, for the VolumeAttachment that names it.
			if _, err := client.CoreV1().PersistentVolumes().Create(context.Background(), testPV("pv-other", "pvc-5f000000-0000-4000-8000-000000000698", corev1.ReadWriteOnce, false), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			va := testVA(id, nodeA, testClock)
			va.Status.Attached = false // a request: no holder in the index
			tc.change(va)
			if _, err := putVA(context.Background(), client, va); err != nil {
				t.Fatal(err)
			}
			_, err := e.cs.ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: nodeA, VolumeCapability: rwo})
			if status.Code(err) != codes.Aborted {
				t.Fatalf("publish on a VolumeAttachment of %s: %v; want ABORTED", tc.name, err)
			}
			if c := claimsOf(t, client, id); len(c) != 0 {
				t.Fatalf("claims %v written on a VolumeAttachment of %s", c, tc.name)
			}

			// Attached for real, then the VolumeAttachment replaced by such
			// an object: it does not keep the claim from its unpublish.
			if err := client.StorageV1().VolumeAttachments().Delete(context.Background(), va.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the index to see the object gone", func() bool { return len(e.index.Volume(id).Attachments) == 0 })
			if _, err := e.publish(id, nodeA, rwo); err != nil {
				t.Fatal(err)
			}
			e.waitClaims(id, nodeA)
			if err := client.StorageV1().VolumeAttachments().Delete(context.Background(), va.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := putVA(context.Background(), client, va); err != nil {
				t.Fatal(err)
			}
			if _, err := e.cs.ControllerUnpublishVolume(context.Background(), &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: nodeA}); err != nil {
				t.Fatal(err)
			}
			if c := claimsOf(t, client, id); len(c) != 0 {
				t.Fatalf("claims %v kept by a VolumeAttachment of %s", c, tc.name)
			}
		})
	}
}

// A live VolumeAttachment whose PersistentVolume is gone (deleted while
// attached) may still be in use: it keeps its node's claim from a release,
// but a new claim does not stand on it.
func TestAttachmentOfAMissingPVKeepsButDoesNotMakeAClaim(t *testing.T) {
	client := newFakeAPI(testNode(nodeA))
	e := newPublishEnv(t, client, nil, fencing.DefaultConfig())
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := e.newVolume(client, "pvc-5f000000-0000-4000-8000-000000000606", corev1.ReadWriteOnce, false)
	gone := "pv-deleted-606"
	va := testVA(id, nodeA, testClock)
	va.Spec.Source.PersistentVolumeName = &gone
	if _, err := putVA(context.Background(), client, va); err != nil {
		t.Fatal(err)
	}
	_, err := e.cs.ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: nodeA, VolumeCapability: rwo})
	if status.Code(err) != codes.Aborted {
		t.Fatalf("publish on a VolumeAttachment of a missing PV: %v; want ABORTED", err)
	}
	if err := client.StorageV1().VolumeAttachments().Delete(context.Background(), va.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the index to see it gone", func() bool { return len(e.index.Volume(id).Attachments) == 0 })
	if _, err := e.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	cur, err := client.StorageV1().VolumeAttachments().Get(context.Background(), va.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.Source.PersistentVolumeName = &gone
	if _, err := client.StorageV1().VolumeAttachments().Update(context.Background(), cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cs.ControllerUnpublishVolume(context.Background(), &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: nodeA}); err != nil {
		t.Fatal(err)
	}
	if _, held := claimsOf(t, client, id)[nodeA]; !held {
		t.Fatal("a late unpublish released the claim of a live VolumeAttachment whose PV is gone")
	}
}
