package framework

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// WatchObjects logs every change of PVs, PVCs, VolumeAttachments, Nodes,
// Pods and Events on the timeline until ctx is done. Only the fields a
// storage scenario is about are summarised; a change elsewhere (a Node
// heartbeat, a resync) is not logged.
func WatchObjects(ctx context.Context, tl *Timeline, client kubernetes.Interface) error {
	f := informers.NewSharedInformerFactory(client, 0)
	o := newObjectLog(tl)
	add := func(inf cache.SharedIndexInformer, kind string, summary func(obj any) (string, string)) error {
		_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { k, s := summary(obj); o.changed(kind+" "+k, s) },
			UpdateFunc: func(_, obj any) { k, s := summary(obj); o.changed(kind+" "+k, s) },
			DeleteFunc: func(obj any) {
				if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
					obj = d.Obj
				}
				k, _ := summary(obj)
				o.deleted(kind + " " + k)
			},
		})
		return err
	}
	for _, err := range []error{
		add(f.Core().V1().PersistentVolumeClaims().Informer(), "PVC", func(obj any) (string, string) {
			c := obj.(*corev1.PersistentVolumeClaim)
			capacity := ""
			if q, ok := c.Status.Capacity[corev1.ResourceStorage]; ok {
				capacity = q.String()
			}
			return c.Namespace + "/" + c.Name, joinNonEmpty("phase="+string(c.Status.Phase), kv("volume", c.Spec.VolumeName), kv("capacity", capacity), deleting(c.DeletionTimestamp != nil))
		}),
		add(f.Core().V1().PersistentVolumes().Informer(), "PV", func(obj any) (string, string) {
			pv := obj.(*corev1.PersistentVolume)
			claim, handle := "", ""
			if r := pv.Spec.ClaimRef; r != nil {
				claim = r.Namespace + "/" + r.Name
			}
			if pv.Spec.CSI != nil {
				handle = pv.Spec.CSI.VolumeHandle
			}
			capacity := ""
			if q, ok := pv.Spec.Capacity[corev1.ResourceStorage]; ok {
				capacity = q.String()
			}
			return pv.Name, joinNonEmpty("phase="+string(pv.Status.Phase), kv("claim", claim), kv("handle", handle), kv("capacity", capacity), deleting(pv.DeletionTimestamp != nil))
		}),
		add(f.Storage().V1().VolumeAttachments().Informer(), "VolumeAttachment", func(obj any) (string, string) {
			va := obj.(*storagev1.VolumeAttachment)
			pv := ""
			if va.Spec.Source.PersistentVolumeName != nil {
				pv = *va.Spec.Source.PersistentVolumeName
			}
			s := joinNonEmpty(kv("pv", pv), "node="+va.Spec.NodeName, fmt.Sprintf("attached=%t", va.Status.Attached), deleting(va.DeletionTimestamp != nil))
			if len(va.Status.AttachmentMetadata) > 0 {
				s += " publish_context=" + fmt.Sprint(va.Status.AttachmentMetadata)
			}
			if e := va.Status.AttachError; e != nil {
				s += " attachError=" + quoteShort(e.Message)
			}
			if e := va.Status.DetachError; e != nil {
				s += " detachError=" + quoteShort(e.Message)
			}
			return va.Name, s
		}),
		add(f.Core().V1().Nodes().Informer(), "Node", func(obj any) (string, string) {
			n := obj.(*corev1.Node)
			ready := "Ready=?"
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady {
					ready = "Ready=" + string(c.Status)
				}
			}
			var taints []string
			for _, t := range n.Spec.Taints {
				taints = append(taints, t.Key+":"+string(t.Effect))
			}
			var attached []string
			for _, v := range n.Status.VolumesAttached {
				attached = append(attached, string(v.Name))
			}
			return n.Name, joinNonEmpty(ready, kv("taints", strings.Join(taints, ",")), kv("volumesAttached", strings.Join(attached, ",")), deleting(n.DeletionTimestamp != nil))
		}),
		add(f.Core().V1().Pods().Informer(), "Pod", func(obj any) (string, string) {
			p := obj.(*corev1.Pod)
			return p.Namespace + "/" + p.Name, joinNonEmpty("node="+p.Spec.NodeName, "phase="+string(p.Status.Phase), deleting(p.DeletionTimestamp != nil))
		}),
		add(f.Core().V1().Events().Informer(), "Event", func(obj any) (string, string) {
			e := obj.(*corev1.Event)
			// One line per event occurrence: the count is part of the summary.
			return e.Namespace + "/" + e.Name, fmt.Sprintf("%s %s/%s %s (x%d): %s", e.Type, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Count, quoteShort(e.Message))
		}),
	} {
		if err != nil {
			return err
		}
	}
	f.Start(ctx.Done())
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("timeline: informer for %v did not sync", typ)
		}
	}
	go func() {
		<-ctx.Done()
		f.Shutdown()
	}()
	return nil
}

func kv(k, v string) string {
	if v == "" {
		return ""
	}
	return k + "=" + v
}

func deleting(b bool) string {
	if b {
		return "(deleting)"
	}
	return ""
}

func quoteShort(s string) string {
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return fmt.Sprintf("%q", s)
}
