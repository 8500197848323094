package main

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// testGates is client-go's WatchListClient gate, alone.
type testGates struct{ watchList bool }

func (g *testGates) Enabled(f clientfeatures.Feature) bool {
	if f != clientfeatures.WatchListClient {
		panic("unexpected feature " + string(f))
	}
	return g.watchList
}

func (g *testGates) Set(f clientfeatures.Feature, v bool) error {
	if f != clientfeatures.WatchListClient {
		return errors.New("unexpected feature " + string(f))
	}
	g.watchList = v
	return nil
}

// The API server's answers to the probe, as kube-apiserver gives them.
func initialEventsEnd() watch.Event {
	return watch.Event{Type: watch.Bookmark, Object: &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{
		ResourceVersion: "42", Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"},
	}}}
}

// kube-apiserver 1.34+ over an etcd without RequestWatchProgress (the
// cacher's error watcher).
func storageRefusal() watch.Event {
	return watch.Event{Type: watch.Error, Object: &metav1.Status{
		Status: metav1.StatusFailure, Code: http.StatusInternalServerError, Reason: metav1.StatusReasonInternalError,
		Message: "a watch stream was requested by the client but the required storage feature RequestWatchProgress is disabled",
	}}
}

func TestDecideInitialSync(t *testing.T) {
	pvs := schema.GroupResource{Resource: "persistentvolumes"}
	cases := []struct {
		name       string
		gateOn     bool
		events     []watch.Event // streamed, then the watch closes
		keepOpen   bool          // the watch stays open after events
		watchErr   error         // Watch itself fails
		wantPath   string
		wantGateOn bool
		wantProbe  bool
		wantReason string
	}{
		{name: "the server streams", gateOn: true, events: []watch.Event{initialEventsEnd()}, keepOpen: true,
			wantPath: syncWatchList, wantGateOn: true, wantProbe: true},
		{name: "a bookmark without the annotation is not the end of the initial events", gateOn: true,
			events:   []watch.Event{{Type: watch.Bookmark, Object: &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "7"}}}},
			wantPath: syncWatchListIfOffered, wantGateOn: true, wantProbe: true, wantReason: "no answer"},
		{name: "etcd without RequestWatchProgress", gateOn: true, events: []watch.Event{storageRefusal()},
			wantPath: syncList, wantGateOn: false, wantProbe: true, wantReason: "RequestWatchProgress"},
		{name: "an older kube-apiserver refuses the options", gateOn: true,
			watchErr: apierrors.NewBadRequest("sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"),
			wantPath: syncList, wantGateOn: false, wantProbe: true, wantReason: "WatchList feature gate"},
		{name: "no RBAC: says nothing about watch-list", gateOn: true,
			watchErr: apierrors.NewForbidden(pvs, "", errors.New("no watch")),
			wantPath: syncWatchListIfOffered, wantGateOn: true, wantProbe: true},
		{name: "an unreachable server says nothing either", gateOn: true,
			watchErr: errors.New("dial tcp 127.0.0.1:6443: connect: connection refused"),
			wantPath: syncWatchListIfOffered, wantGateOn: true, wantProbe: true},
		{name: "the watch closes without a word", gateOn: true,
			wantPath: syncWatchListIfOffered, wantGateOn: true, wantProbe: true},
		{name: "KUBE_FEATURE_WatchListClient=false: no probe", gateOn: false,
			wantPath: syncList, wantGateOn: false, wantProbe: false, wantReason: "KUBE_FEATURE_WatchListClient=false"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			var opts []metav1.ListOptions
			client.PrependWatchReactor("persistentvolumes", func(a k8stesting.Action) (bool, watch.Interface, error) {
				opts = append(opts, a.(k8stesting.WatchActionImpl).ListOptions)
				if tc.watchErr != nil {
					return true, nil, tc.watchErr
				}
				w := watch.NewFakeWithChanSize(len(tc.events)+1, false)
				for _, ev := range tc.events {
					w.Action(ev.Type, ev.Object)
				}
				if !tc.keepOpen {
					w.Stop()
				}
				return true, w, nil
			})
			gates := &testGates{watchList: tc.gateOn}
			path, reason := decideInitialSync(context.Background(), client, gates)
			if path != tc.wantPath {
				t.Errorf("path %q (%s), want %q", path, reason, tc.wantPath)
			}
			if gates.watchList != tc.wantGateOn {
				t.Errorf("WatchListClient gate %v after the decision, want %v", gates.watchList, tc.wantGateOn)
			}
			if !strings.Contains(reason, tc.wantReason) {
				t.Errorf("reason %q does not say %q", reason, tc.wantReason)
			}
			if got := len(opts) > 0; got != tc.wantProbe {
				t.Fatalf("probed: %v, want %v", got, tc.wantProbe)
			}
			if !tc.wantProbe {
				return
			}
			// The probe asks what a reflector's initial sync asks.
			o := opts[0]
			if o.SendInitialEvents == nil || !*o.SendInitialEvents || !o.AllowWatchBookmarks ||
				o.ResourceVersionMatch != metav1.ResourceVersionMatchNotOlderThan || o.LabelSelector == "" {
				t.Errorf("probe options %+v are not a watch-list request for no objects", o)
			}
		})
	}
}

// The process-wide gate the informers read is the one decideInitialSync
// sets: the default implementation has Set.
func TestClientGoGatesCanBeSet(t *testing.T) {
	if _, ok := clientfeatures.FeatureGates().(watchListGates); !ok {
		t.Fatalf("client-go's default feature gates (%T) have no Set: the LIST fallback could not turn watch-list off", clientfeatures.FeatureGates())
	}
}
