package main

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/csi"
	"github.com/srvlab/rds-csi/pkg/fencing"
)

// TestMalformedPVCountedAndEvented: the controller process counts a PV
// whose claims annotation cannot be read (gauge and counter), puts a
// Warning event on it naming the annotation, and stops counting it once
// the annotation is fixed.
func TestMalformedPVCountedAndEvented(t *testing.T) {
	bad := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-bad", ResourceVersion: "5",
			Annotations: map[string]string{claims.ClaimsAnnotation: `{"node-a": 2024-01-01`}},
		Spec: corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{
			CSI: &corev1.CSIPersistentVolumeSource{Driver: csi.DefaultDriverName, VolumeHandle: "vol-bad"}}},
	}
	client := fake.NewClientset(bad)
	r := startReplica(t, client, "controller-0")
	waitUntil(t, "the malformed PV counted", func() bool {
		return counter(t, r.m, "rds_csi_malformed_objects") == 1 && counter(t, r.m, "rds_csi_malformed_objects_seen_total") == 1
	})
	var event *corev1.Event
	waitUntil(t, "a Warning event on the PV", func() bool {
		evs, err := client.CoreV1().Events("").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for i := range evs.Items {
			if e := &evs.Items[i]; e.Reason == fencing.ReasonMalformedAnnotation && e.InvolvedObject.Name == "pv-bad" {
				event = e
				return true
			}
		}
		return false
	})
	if event.Type != corev1.EventTypeWarning || !strings.Contains(event.Message, claims.ClaimsAnnotation) || !strings.Contains(event.Message, "kubectl rds check") {
		t.Errorf("event: %s %q", event.Type, event.Message)
	}

	fixed := bad.DeepCopy()
	fixed.ResourceVersion = "6"
	fixed.Annotations[claims.ClaimsAnnotation] = `{"node-a":"2026-11-22T12:00:00Z"}`
	if _, err := client.CoreV1().PersistentVolumes().Update(context.Background(), fixed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the fixed PV no longer counted", func() bool { return counter(t, r.m, "rds_csi_malformed_objects") == 0 })
	if n := counter(t, r.m, "rds_csi_malformed_objects_seen_total"); n != 1 {
		t.Errorf("seen_total = %v after the fix, want 1", n)
	}
}
