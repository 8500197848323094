package main

import (
	"context"
	"fmt"
	"net/http"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/srvlab/rds-csi/pkg/diagnose"
	"github.com/srvlab/rds-csi/pkg/inventory"
)

// snapshotContents is the external-snapshotter's cluster-scoped kind.
var snapshotContents = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotcontents"}

// gatherFor reads what Why needs about a pod, PVC or PV: the namespace's
// pods and claims (to find every user of the volume), the PVs they name,
// every VolumeAttachment and Node, and the inventory.
func gatherFor(ctx context.Context, cl clients, g globalOptions, kind, name string) (*diagnose.Cluster, string, error) {
	c := &diagnose.Cluster{Now: time.Now(), DriverName: g.driver}
	ns := g.namespace
	if kind == diagnose.KindPV {
		pv, err := cl.kube.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil, "", fmt.Errorf("PV %s not found: check the name with `kubectl get pv`", name)
		case err != nil:
			return nil, "", fmt.Errorf("reading PV %s: %w", name, err)
		}
		c.PVs = append(c.PVs, *pv)
		ns = ""
		if pv.Spec.ClaimRef != nil {
			ns = pv.Spec.ClaimRef.Namespace
		}
	}
	if ns != "" {
		pods, err := cl.kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, "", fmt.Errorf("listing the pods of namespace %s: %w", ns, err)
		}
		c.Pods = pods.Items
		pvcs, err := cl.kube.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, "", fmt.Errorf("listing the PVCs of namespace %s: %w", ns, err)
		}
		c.PVCs = pvcs.Items
	}
	if kind != diagnose.KindPV {
		for _, pvc := range c.PVCs {
			if pvc.Spec.VolumeName == "" {
				continue
			}
			pv, err := cl.kube.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				continue // the verdict says the PV is missing
			case err != nil:
				return nil, "", fmt.Errorf("reading PV %s of PVC %s/%s: %w", pvc.Spec.VolumeName, ns, pvc.Name, err)
			}
			c.PVs = append(c.PVs, *pv)
		}
	}
	if err := gatherAttachmentsAndNodes(ctx, cl, c); err != nil {
		return nil, "", err
	}
	gatherInventory(ctx, g, c)
	return c, ns, nil
}

// gatherAll reads everything Check needs.
func gatherAll(ctx context.Context, cl clients, g globalOptions) (*diagnose.Cluster, error) {
	c := &diagnose.Cluster{Now: time.Now(), DriverName: g.driver}
	pvs, err := cl.kube.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing PVs: %w", err)
	}
	c.PVs = pvs.Items
	if err := gatherAttachmentsAndNodes(ctx, cl, c); err != nil {
		return nil, err
	}
	// The driver's own pods, wherever it is installed: a container that
	// cannot pull its image is a finding.
	pods, err := cl.kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: diagnose.DriverPodsSelector})
	if err != nil {
		return nil, fmt.Errorf("listing the driver's pods (%s): %w", diagnose.DriverPodsSelector, err)
	}
	c.DriverPods = pods.Items
	gatherSnapshots(ctx, cl, c)
	gatherInventory(ctx, g, c)
	return c, nil
}

func gatherAttachmentsAndNodes(ctx context.Context, cl clients, c *diagnose.Cluster) error {
	vas, err := cl.kube.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing VolumeAttachments: %w", err)
	}
	c.Attachments = vas.Items
	nodes, err := cl.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing Nodes: %w", err)
	}
	c.Nodes = nodes.Items
	return nil
}

// gatherSnapshots reads the snapshot handles of this driver's
// VolumeSnapshotContents. A cluster without the snapshot API is not an
// error: the snapshot files are then not checked, and the report says so.
func gatherSnapshots(ctx context.Context, cl clients, c *diagnose.Cluster) {
	list, err := cl.dynamic.Resource(snapshotContents).List(ctx, metav1.ListOptions{})
	switch {
	case apierrors.IsNotFound(err):
		c.SnapshotsNote = "the VolumeSnapshotContent API is not installed"
		return
	case err != nil:
		c.SnapshotsNote = fmt.Sprintf("listing VolumeSnapshotContents: %v", err)
		return
	}
	c.SnapshotHandles = map[string]string{}
	for _, item := range list.Items {
		if d, _, _ := unstructured.NestedString(item.Object, "spec", "driver"); d != c.DriverName {
			continue
		}
		h, _, _ := unstructured.NestedString(item.Object, "status", "snapshotHandle")
		if h == "" { // pre-provisioned content: the handle is in the spec
			h, _, _ = unstructured.NestedString(item.Object, "spec", "source", "snapshotHandle")
		}
		if h != "" {
			c.SnapshotHandles[h] = item.GetName()
		}
	}
}

// gatherInventory fetches the RDS inventory when an URL is given; without
// it, or when it fails, the verdicts say the disks were not checked.
func gatherInventory(ctx context.Context, g globalOptions, c *diagnose.Cluster) {
	if g.inventoryURL == "" {
		c.InventoryNote = "no --inventory-url (kubectl -n rds-csi port-forward deploy/rds-csi-controller 8080, then --inventory-url http://localhost:8080/inventory)"
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	// The RDS's own health, from the same controller's /metrics (issue 27).
	if h, err := diagnose.FetchRDSHealth(ctx, http.DefaultClient, diagnose.MetricsURL(g.inventoryURL)); err != nil {
		c.RDSHealthNote = err.Error()
	} else {
		c.RDSHealth = h
	}
	inv, err := inventory.Fetch(ctx, http.DefaultClient, g.inventoryURL)
	if err != nil {
		c.InventoryNote = err.Error()
		return
	}
	c.Inventory = inv
}
