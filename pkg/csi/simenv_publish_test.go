package csi

import (
	"context"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/informers"
	"github.com/srvlab/rds-csi/pkg/storagefence"
)

// provisioningController plays external-provisioner's part for tests that
// drive the Controller service directly (csi-sanity): every volume it
// creates gets a PersistentVolume in the (fake) API, and the call returns
// only once the attachment index knows it, as it would long before a
// VolumeAttachment exists in a cluster.
type provisioningController struct {
	*ControllerServer
	t      testing.TB
	client *fake.Clientset
	index  *informers.AttachmentIndex
}

func pvAccessMode(c *csi.VolumeCapability) corev1.PersistentVolumeAccessMode {
	switch c.GetAccessMode().GetMode() {
	case csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER:
		return corev1.ReadWriteMany
	case csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY:
		return corev1.ReadOnlyMany
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER:
		return corev1.ReadWriteOncePod
	}
	return corev1.ReadWriteOnce
}

func (p *provisioningController) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	resp, err := p.ControllerServer.CreateVolume(ctx, req)
	if err != nil {
		return nil, err
	}
	id := resp.Volume.VolumeId
	var modes []corev1.PersistentVolumeAccessMode
	block := false
	for _, c := range req.GetVolumeCapabilities() {
		modes = append(modes, pvAccessMode(c))
		block = block || c.GetBlock() != nil
	}
	pv := testPV(id, id, modes[0], block)
	pv.Spec.AccessModes = modes
	if _, err := p.client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	waitFor(p.t, "the index to know "+id, func() bool { return p.index.Volume(id) != nil })
	return resp, nil
}

func (p *provisioningController) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	resp, err := p.ControllerServer.DeleteVolume(ctx, req)
	if err == nil {
		_ = p.client.CoreV1().PersistentVolumes().Delete(ctx, req.GetVolumeId(), metav1.DeleteOptions{})
		// As CreateVolume waits for the index to know the PV, the index
		// forgets it before the next call: csi-sanity's cleanup unpublishes
		// a volume it deleted a moment ago, which on an index that still
		// lists the deleted PV is ABORTED (retried in a cluster, not by
		// csi-sanity).
		waitFor(p.t, "the index to forget the PV of "+req.GetVolumeId(), func() bool { return indexedPVs(p.index.Volume(req.GetVolumeId())) == 0 })
	}
	return resp, err
}

// enablePublish is cs with ControllerPublish/Unpublish served on the
// attachment index of a fake API holding the named nodes: the controller
// service to register.
func enablePublish(t testing.TB, cs *ControllerServer, nodes ...string) csi.ControllerServer {
	client := newFakeAPI()
	for _, n := range nodes {
		if _, err := client.CoreV1().Nodes().Create(context.Background(), testNode(n), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	index := informers.NewAttachmentIndex()
	live := fencing.NewLiveness(fencing.LivenessConfig{Client: client})
	opts := cs.d.opts
	fence, err := storagefence.New(storagefence.Config{
		StorageFencing: opts.AllowHostFencing(), ExportAuth: opts.ExportAuthOn(), AttachmentKey: opts.AttachmentKey,
		RDS: cs.d.Router(), Store: claims.NewStore(client, DefaultDriverName, opts.AllowHostFencing()), Index: index, Nodes: live,
		IsVolumeID: IsVolumeID, IsVolumeDisk: opts.IsVolumeDisk,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctrl, err := informers.NewController(client, index, informers.Config{DriverName: DefaultDriverName, Policy: fencing.DefaultConfig(), Liveness: live})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { ctrl.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	if !ctrl.WaitForSync(ctx) {
		t.Fatal("informers never synced")
	}
	now := cs.now
	cs = NewControllerServer(cs.d, &Publisher{Index: index, Fence: fence, Nodes: live, Synced: ctrl.Synced, Policy: fencing.DefaultConfig(), CatchUp: testCatchUp})
	cs.now = now
	return &provisioningController{ControllerServer: cs, t: t, client: client, index: index}
}

// ControllerPublishVolume plays the attach/detach controller too: as in a
// cluster, the VolumeAttachment exists before the attacher publishes.
func (p *provisioningController) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	if ident, err := ParseNodeID(req.GetNodeId()); err == nil && isVolumeID(req.GetVolumeId()) {
		va := testVA(req.GetVolumeId(), ident.Name, testClock)
		if _, err := p.client.StorageV1().VolumeAttachments().Create(ctx, va, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, err
		}
	}
	return p.ControllerServer.ControllerPublishVolume(ctx, req)
}

// ControllerUnpublishVolume: the detach deletes the VolumeAttachment first.
func (p *provisioningController) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	if ident, err := ParseNodeID(req.GetNodeId()); err == nil && ident.Name != "" && isVolumeID(req.GetVolumeId()) {
		name := claims.VolumeAttachmentName(req.GetVolumeId(), DefaultDriverName, ident.Name)
		if err := p.client.StorageV1().VolumeAttachments().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return nil, err
		}
	}
	return p.ControllerServer.ControllerUnpublishVolume(ctx, req)
}
