package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/srvlab/rds-csi/e2e/framework"
	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/fencing"
)

// totalSteps: the scenario's eleven steps and "stop everything".
const totalSteps = 12

var (
	snapshotGVR      = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshots"}
	snapshotClassGVR = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotclasses"}
)

// Generous deadlines: the machine may be shared; nothing here is a timing
// assertion, the times are reported.
const (
	waitLong  = 3 * time.Minute
	waitShort = 2 * time.Minute
)

type demo struct {
	p     *printer
	r     *runner
	grace time.Duration
	start time.Time

	rows      []*stepRecord
	numbers   [][2]string    // the key measurements (label, value), printed under the table
	artifacts string         // artifact directory
	pids      map[string]int // every process started, checked after the stop
}

// step runs one step: a header, the object changes as they happen, a
// closing line with the duration and result, and a row for the summary.
// If fn ends with Fatal (or Ctrl-C cancels its waits), the row says so and
// the scenario ends (the deferred recording runs during runtime.Goexit).
func (d *demo) step(title, what string, fn func() string) {
	d.p.header(len(d.rows)+1, totalSteps, title, what)
	d.p.takeTally()
	row := &stepRecord{title: title}
	d.rows = append(d.rows, row)
	failedBefore := d.r.Failed()
	t0 := time.Now()
	finished := false
	defer func() {
		row.took = time.Since(t0)
		row.objects = d.p.takeTally()
		switch {
		case d.r.wasInterrupted() && !finished:
			row.status = "interrupted"
			row.result = "interrupted by Ctrl-C"
		case !finished || d.r.Failed() != failedBefore:
			row.status = "FAILED"
		case row.status == "":
			row.status = "ok"
		}
		style, mark := green, "✔"
		if row.status != "ok" && row.status != "skipped" {
			style, mark = red, "✘"
		}
		d.p.sayShort(style, "   %s %s  %s", mark, fmtDur(row.took), row.result)
	}()
	row.result = fn()
	if strings.HasPrefix(row.result, "skipped") {
		row.status = "skipped"
	}
	finished = true
}

func (d *demo) detail(format string, args ...any) { d.p.sayShort("", "   · "+format, args...) }

func (d *demo) fatalIf(err error) {
	if err != nil {
		d.r.Fatal(err)
	}
}

func (d *demo) waitFor(e *framework.Env, timeout time.Duration, what string, cond framework.Condition) time.Duration {
	took, err := framework.WaitFor(e.Ctx, e.TL, timeout, what, cond)
	d.fatalIf(err)
	return took
}

func (d *demo) scenario() {
	const ns = framework.TestNamespace
	marker := []byte(fmt.Sprintf("written on node-a by the rds-csi demo at %s", time.Now().UTC().Format(time.RFC3339)))

	var e *framework.Env
	d.step("control plane", "etcd, kube-apiserver (RBAC), kube-controller-manager on loopback (hack/controlplane.sh)", func() string {
		e = framework.NewEnv(d.r, framework.EnvOptions{ControlPlane: framework.ControlPlaneOptions{NodeMonitorGracePeriod: d.grace}})
		d.artifacts = e.Dir
		if rel, err := filepath.Rel(e.Root, e.Dir); err == nil {
			d.artifacts = rel
		}
		d.detail("kube-apiserver at %s; kube-controller-manager --node-monitor-grace-period=%s", e.CP.Env["KUBE_APISERVER_URL"], d.grace)
		return "etcd, kube-apiserver, kube-controller-manager ready"
	})
	ctx, c, tl := e.Ctx, e.Client, e.TL

	var sim *framework.Sim
	d.step("RDS simulator", "RouterOS /disk and /file over real SSH; disks are sparse files", func() string {
		sim = e.StartSim(framework.SimOptions{PoolSize: 20 << 30})
		d.detail("ssh admin@%s:%d, key login, host key pinned in a known_hosts file, 20 GiB pool", sim.Host, sim.Port)
		return fmt.Sprintf("SSH on %s:%d", sim.Host, sim.Port)
	})

	snapshots := framework.HaveBinary(e.Root, "csi-snapshotter") && framework.HaveBinary(e.Root, "snapshot-controller")
	if files, _ := filepath.Glob(filepath.Join(framework.SnapshotCRDDir(e.Root), "snapshot.storage.k8s.io_*.yaml")); len(files) == 0 {
		snapshots = false
	}
	d.step("install the driver", "manifests/base RBAC + CSIDriver, driver --mode=controller --storage-fencing=allow-host --out-of-service-taint (manifests/overlays/storage-fencing), csi-provisioner, csi-attacher, csi-snapshotter", func() string {
		if snapshots {
			framework.InstallSnapshotCRDs(ctx, d.r, tl, e.CP)
			d.pids["snapshot-controller"] = framework.StartSnapshotController(d.r, tl, e.CP, e.Dir).Pid()
		}
		framework.DeployFile(ctx, d.r, tl, e.CP, "manifests/overlays/storage-fencing/fencing-rbac.yaml")
		ctrl := e.StartController(sim, framework.ControllerOptions{DriverArgs: []string{"--storage-fencing=allow-host", "--out-of-service-taint"}})
		d.pids["rds-csi-driver"] = ctrl.Driver.Pid()
		d.pids["csi-provisioner"] = ctrl.Provisioner.Pid()
		d.pids["csi-attacher"] = ctrl.Attacher.Pid()
		sidecars := "csi-provisioner, csi-attacher"
		if snapshots {
			d.pids["csi-snapshotter"] = framework.StartSnapshotter(d.r, tl, e.Root, e.Dir, ctrl.Driver, ctrl.Deployment, framework.SidecarOptions{}).Pid()
			sidecars += ", csi-snapshotter"
		}
		d.detail("driver binary %s, pid %d, socket %s", os.Getenv("RDS_CSI_E2E_DRIVER_BIN"), ctrl.Driver.Pid(), ctrl.Driver.Socket)
		d.detail("%s with leader election, as ServiceAccount %s/%s", sidecars, ctrl.Deployment.Namespace, ctrl.Deployment.ServiceAccount)
		return fmt.Sprintf("driver + %d sidecars as %s/%s", strings.Count(sidecars, ",")+1, ctrl.Deployment.Namespace, ctrl.Deployment.ServiceAccount)
	})

	var nodeA, nodeB *framework.FakeKubelet
	d.step("nodes", "two fake kubelets: Node + CSINode (driver registered with node ID <name>) + Lease renewed every 2 s; no container runtime", func() string {
		nodeA = e.NewNode("node-a")
		nodeB = e.NewNode("node-b")
		for _, n := range []string{"node-a", "node-b"} {
			d.waitFor(e, waitShort, n+" Ready", framework.NodeReady(c, n, corev1.ConditionTrue))
		}
		return "node-a and node-b Ready"
	})
	mon, err := framework.WatchAttachments(ctx, c)
	d.fatalIf(err)

	var pvName string
	d.step("provision", "StorageClass rds + PVC e2e/data (1Gi, ReadWriteOnce) → csi-provisioner → CreateVolume → /disk add over SSH", func() string {
		_, err := c.StorageV1().StorageClasses().Create(ctx, framework.StorageClass("rds", nil), metav1.CreateOptions{})
		d.fatalIf(err)
		_, err = c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, framework.PVC(ns, "data", "rds", "1Gi", corev1.ReadWriteOnce, false), metav1.CreateOptions{})
		d.fatalIf(err)
		d.waitFor(e, waitShort, "PVC e2e/data bound", framework.PVCBound(c, ns, "data", &pvName))
		dk, ok := sim.Disk(pvName)
		if !ok {
			d.r.Fatalf("PV %s is bound but the simulator has no disk %s", pvName, pvName)
		}
		d.detail("RDS disk slot=%s file=%s size=%d nvme-tcp-export=%t port=%d nqn=%s (storage fencing: exported to no host until published)", dk.Slot, dk.FilePath, dk.Size, dk.NVMeTCPExport, dk.NVMeTCPPort, dk.NVMeTCPNQN)
		return fmt.Sprintf("%s bound, 1 GiB disk on the RDS", pvName)
	})

	d.step("attach", "pod app-a on node-a → attach/detach controller → VolumeAttachment → csi-attacher → ControllerPublish", func() string {
		_, err := c.CoreV1().Pods(ns).Create(ctx, framework.PodOnNode(ns, "app-a", "node-a", "data"), metav1.CreateOptions{})
		d.fatalIf(err)
		var va storagev1.VolumeAttachment
		d.waitFor(e, waitShort, "volume attached to node-a", framework.VolumeAttached(c, pvName, "node-a", &va))
		pv, err := c.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
		d.fatalIf(err)
		d.detail("publish_context %v", va.Status.AttachmentMetadata)
		d.detail("PV annotation %s=%s (the decision, committed by conditional update)", claims.ClaimsAnnotation, pv.Annotations[claims.ClaimsAnnotation])
		dk, _ := sim.Disk(pvName)
		d.detail("the RDS export now allows node-a's host only: nvme-tcp-export=%t allow-host=%s", dk.NVMeTCPExport, dk.AllowHostName)
		d.fatalIf(writeAt(dk.BackingFile, 1<<20, marker))
		d.detail("node-a writes %q at 1 MiB into the disk (here: its backing file, as NVMe/TCP would)", marker)
		return fmt.Sprintf("%s attached to node-a", va.Name)
	})

	var failedAt time.Time
	d.step("node failure", "node-a's kubelet stops (no more Lease renewals); a replacement pod app-b is created on node-b", func() string {
		failedAt = time.Now()
		nodeA.Fail()
		notReady := d.waitFor(e, d.grace+waitShort, "node-a NotReady (Ready=Unknown)", framework.NodeReady(c, "node-a", corev1.ConditionUnknown))
		_, err := c.CoreV1().Pods(ns).Create(ctx, framework.PodOnNode(ns, "app-b", "node-b", "data"), metav1.CreateOptions{})
		d.fatalIf(err)
		d.waitFor(e, waitShort, "app-b's attach refused (Multi-Attach: the volume is still on node-a)", podEvent(c, ns, "app-b", "FailedAttachVolume", "Multi-Attach"))
		nodes, err := framework.AttachedNodes(ctx, c, pvName)
		d.fatalIf(err)
		if len(nodes) != 1 || nodes[0] != "node-a" {
			d.r.Errorf("volume attached to %v while node-a is only NotReady, want [node-a]", nodes)
		}
		d.numbers = append(d.numbers, [2]string{"node-a silent → NotReady", fmt.Sprintf("%s (node-monitor-grace-period %s)", fmtDur(notReady), d.grace)})
		d.detail("nothing moves yet: NotReady alone may be a network partition with node-a still writing (the driver waits --not-ready-threshold, 20s with storage fencing; the operator is quicker here)")
		return fmt.Sprintf("node-a NotReady after %s; app-b refused (Multi-Attach)", fmtDur(notReady))
	})

	d.step("fenced handoff", "the operator taints node-a node.kubernetes.io/out-of-service (non-graceful node shutdown)", func() string {
		taintAt := time.Now()
		d.fatalIf(nodeA.Taint(ctx, framework.OutOfServiceTaint))
		d.waitFor(e, waitLong, "volume attached to node-b", framework.VolumeAttached(c, pvName, "node-b", nil))
		attachedAt := time.Now()
		d.waitFor(e, waitShort, "no VolumeAttachment left for node-a", framework.NoVolumeAttachment(c, pvName, "node-a"))
		fences, err := c.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "reason=" + fencing.ReasonFenced})
		d.fatalIf(err)
		var fenced []string
		for _, ev := range fences.Items {
			fenced = append(fenced, ev.InvolvedObject.Kind+"/"+ev.InvolvedObject.Name)
		}
		d.detail("the driver fenced node-a's stale attachment at once (%s events on %s)", fencing.ReasonFenced, strings.Join(fenced, ", "))
		dk, _ := sim.Disk(pvName)
		d.detail("the RDS export moved to node-b's host: allow-host=%s", dk.AllowHostName)
		got, err := readAt(dk.BackingFile, 1<<20, len(marker))
		d.fatalIf(err)
		if !bytes.Equal(got, marker) {
			d.r.Errorf("node-b reads %q at 1 MiB, want node-a's %q", got, marker)
		} else {
			d.detail("node-b reads node-a's data: %q", got)
		}
		max := mon.MaxAttached(pvName)
		if max != 1 {
			d.r.Errorf("the ReadWriteOnce volume was attached to %d nodes at once (history %+v)", max, mon.History(pvName))
		}
		gap, ok := mon.Handoff(pvName, "node-a", "node-b")
		gapText := "not seen"
		if ok {
			gapText = fmtDur(gap)
		}
		d.numbers = append(d.numbers,
			[2]string{"out-of-service taint → attached on node-b", fmtDur(attachedAt.Sub(taintAt))},
			[2]string{"node-a silent → attached on node-b", fmtDur(attachedAt.Sub(failedAt))},
			[2]string{"handoff gap (attached to no node)", gapText},
			[2]string{"nodes attached at once, at most", fmt.Sprintf("%d (ReadWriteOnce: must be 1)", max)},
			[2]string{"fence events from the driver", fmt.Sprint(len(fences.Items))})
		return fmt.Sprintf("on node-b %s after the taint; never on 2 nodes", fmtDur(attachedAt.Sub(taintAt)))
	})

	dyn, err := dynamic.NewForConfig(e.CP.Config)
	d.fatalIf(err)
	d.step("snapshot", "VolumeSnapshot e2e/snap → snapshot-controller → csi-snapshotter → CreateSnapshot (a copy on the RDS)", func() string {
		if !snapshots {
			return "skipped: csi-snapshotter or snapshot-controller did not build (see .cache/build/status.tsv)"
		}
		class := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
			"metadata": map[string]any{"name": "rds"}, "driver": framework.DriverName, "deletionPolicy": "Delete",
		}}
		_, err := dyn.Resource(snapshotClassGVR).Create(ctx, class, metav1.CreateOptions{})
		d.fatalIf(err)
		snap := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
			"metadata": map[string]any{"name": "snap", "namespace": ns},
			"spec":     map[string]any{"volumeSnapshotClassName": "rds", "source": map[string]any{"persistentVolumeClaimName": "data"}},
		}}
		_, err = dyn.Resource(snapshotGVR).Namespace(ns).Create(ctx, snap, metav1.CreateOptions{})
		d.fatalIf(err)
		var content string
		d.waitFor(e, waitShort, "VolumeSnapshot e2e/snap readyToUse", func(ctx context.Context) (bool, string, error) {
			u, err := dyn.Resource(snapshotGVR).Namespace(ns).Get(ctx, "snap", metav1.GetOptions{})
			if err != nil {
				return false, err.Error(), nil
			}
			ready, _, _ := unstructured.NestedBool(u.Object, "status", "readyToUse")
			content, _, _ = unstructured.NestedString(u.Object, "status", "boundVolumeSnapshotContentName")
			status, _, _ := unstructured.NestedMap(u.Object, "status")
			return ready, fmt.Sprintf("status %v", status), nil
		})
		copies := snapshotDisks(sim, pvName)
		if len(copies) != 1 {
			d.r.Fatalf("snapshot copies of %s on the simulator: %d, want 1", pvName, len(copies))
		}
		got, err := readAt(copies[0].BackingFile, 1<<20, len(marker))
		d.fatalIf(err)
		if !bytes.Equal(got, marker) {
			d.r.Errorf("snapshot copy holds %q at 1 MiB, want %q", got, marker)
		}
		d.detail("VolumeSnapshotContent %s = RDS disk %s (not exported), holding node-a's data", content, copies[0].FilePath)
		return "ready; the copy on the RDS holds the data"
	})

	d.step("unattended failover", "node-a is repaired (Ready, the operator's taint removed); then node-b dies with app-b and a replacement app-c waits on node-a; nobody acts", func() string {
		d.fatalIf(nodeA.Recover(ctx))
		d.fatalIf(nodeA.Untaint(ctx, framework.OutOfServiceTaint.Key))
		d.waitFor(e, waitShort, "node-a Ready", framework.NodeReady(c, "node-a", corev1.ConditionTrue))
		_, err := c.CoreV1().Pods(ns).Create(ctx, framework.PodOnNode(ns, "app-c", "node-a", "data"), metav1.CreateOptions{})
		d.fatalIf(err)
		d.waitFor(e, waitShort, "app-c's attach refused (Multi-Attach: the volume is on node-b)", podEvent(c, ns, "app-c", "FailedAttachVolume", "Multi-Attach"))
		hostB, err := framework.AttachmentHost(ctx, c, pvName, "node-b")
		d.fatalIf(err)
		failedAt := time.Now()
		nodeB.Fail()
		notReady := d.waitFor(e, d.grace+waitShort, "node-b NotReady (Ready=Unknown)", framework.NodeReady(c, "node-b", corev1.ConditionUnknown))
		cut := d.waitFor(e, waitLong, "node-b's host cut off the RDS (the driver's fence, after --not-ready-threshold)", func(context.Context) (bool, string, error) {
			dk, _ := sim.Disk(pvName)
			return !dk.NVMeTCPExport || dk.AllowHostName != hostB, fmt.Sprintf("nvme-tcp-export=%t allow-host=%s", dk.NVMeTCPExport, dk.AllowHostName), nil
		})
		d.waitFor(e, waitShort, "node-b tainted out of service by the driver", framework.NodeTaint(c, "node-b", corev1.TaintNodeOutOfService, fencing.DriverOutOfServiceValue, true))
		d.waitFor(e, waitLong, "volume attached to node-a", framework.VolumeAttached(c, pvName, "node-a", nil))
		attachedAt := time.Now()
		dk, _ := sim.Disk(pvName)
		hostA, err := framework.AttachmentHost(ctx, c, pvName, "node-a")
		d.fatalIf(err)
		if !dk.NVMeTCPExport || hostA == "" || dk.AllowHostName != hostA {
			d.r.Errorf("after the failover the export is nvme-tcp-export=%t allow-host=%s, want node-a's attachment (%s) only", dk.NVMeTCPExport, dk.AllowHostName, hostA)
		}
		d.detail("the RDS export allows node-a's attachment only: %s", dk.AllowHostName)
		got, err := readAt(dk.BackingFile, 1<<20, len(marker))
		d.fatalIf(err)
		if !bytes.Equal(got, marker) {
			d.r.Errorf("node-a reads %q at 1 MiB after the failover, want %q", got, marker)
		}
		if max := mon.MaxAttached(pvName); max != 1 {
			d.r.Errorf("the ReadWriteOnce volume was attached to %d nodes at once (history %+v)", max, mon.History(pvName))
		}
		total := attachedAt.Sub(failedAt)
		d.numbers = append(d.numbers,
			[2]string{"unattended: node-b silent → NotReady", fmtDur(notReady)},
			[2]string{"unattended: NotReady → node-b cut off the RDS", fmt.Sprintf("%s (--not-ready-threshold 20s)", fmtDur(cut))},
			[2]string{"unattended: node-b silent → attached on node-a", fmt.Sprintf("%s, no operator action", fmtDur(total))})
		return fmt.Sprintf("on node-a %s after node-b went silent; nobody acted", fmtDur(total))
	})

	d.step("cleanup", "delete the pods, the snapshot and the claim → ControllerUnpublish, DeleteSnapshot, DeleteVolume", func() string {
		for _, pod := range []string{"app-a", "app-b", "app-c"} {
			// No kubelet confirms a pod's end: delete as `kubectl delete --force` does.
			if err := framework.ForceDeletePod(ctx, c, ns, pod); err != nil && !apierrors.IsNotFound(err) {
				d.r.Fatal(err)
			}
		}
		d.waitFor(e, waitShort, "volume detached from node-a", framework.NoVolumeAttachment(c, pvName, "node-a"))
		if snapshots {
			d.fatalIf(dyn.Resource(snapshotGVR).Namespace(ns).Delete(ctx, "snap", metav1.DeleteOptions{}))
			d.waitFor(e, waitShort, "snapshot copy removed from the RDS", func(context.Context) (bool, string, error) {
				n := len(snapshotDisks(sim, pvName))
				return n == 0, fmt.Sprintf("%d snapshot copies", n), nil
			})
		}
		d.fatalIf(c.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, "data", metav1.DeleteOptions{}))
		d.waitFor(e, waitShort, "PV "+pvName+" deleted", framework.PVGone(c, pvName))
		if left := sim.Disks(); len(left) != 0 {
			d.r.Errorf("disks left on the RDS: %+v", left)
		}
		return "no VolumeAttachment, PV or disk left"
	})
}

// podEvent holds once an event with reason about the pod has a message
// containing text.
func podEvent(c kubernetes.Interface, ns, pod, reason, text string) framework.Condition {
	return func(ctx context.Context) (bool, string, error) {
		evs, err := c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod + ",reason=" + reason})
		if err != nil {
			return false, err.Error(), nil
		}
		for _, ev := range evs.Items {
			if strings.Contains(ev.Message, text) {
				return true, "", nil
			}
		}
		return false, fmt.Sprintf("%d %s events for pod %s, none mentioning %q", len(evs.Items), reason, pod, text), nil
	}
}

// snapshotDisks are the simulator's disks in the snapshot directory copied
// from volume (the driver names them <snapshot>.src-<volume>.<...>).
func snapshotDisks(sim *framework.Sim, volume string) []diskFile {
	var out []diskFile
	for _, d := range sim.Disks() {
		if strings.HasPrefix(d.FilePath, framework.VolumePath+"/snapshots/") && strings.Contains(d.FilePath, ".src-"+volume+".") {
			out = append(out, diskFile{FilePath: d.FilePath, BackingFile: d.BackingFile})
		}
	}
	return out
}

type diskFile struct{ FilePath, BackingFile string }

func writeAt(path string, off int64, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(data, off); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func readAt(path string, off int64, n int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, off); err != nil {
		return nil, err
	}
	return buf, nil
}
