package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

// The informers' initial sync either streams the objects (watch-list:
// one watch with sendInitialEvents, the heap growing with the cache) or
// takes one unpaginated LIST per resource (the whole response decoded
// beside the cache, about twice the live set at the peak). client-go
// (WatchListClient, on by default in the version go.mod pins) tries the
// stream first and falls back to LIST per informer when the API server
// refuses it; kube-apiserver offers it from 1.34 on (WatchList gate) and
// only over an etcd with RequestWatchProgress (3.4.31+, 3.5.13+, 3.6).
// chooseInitialSync asks the server once, before the informers start: a
// refusal turns the gate off so that no informer opens a stream that is
// bound to fail on every relist, and the log says which path the
// informers take. An operator can force LIST with
// KUBE_FEATURE_WatchListClient=false.

// Initial sync paths, as logged.
const (
	syncWatchList = "watch-list"
	syncList      = "list"
	// The probe got no answer either way: client-go decides per informer.
	syncWatchListIfOffered = "watch-list where offered"
)

// watchListProbeTimeout bounds the probe: a server that does not answer
// within it leaves the decision to client-go, which also falls back.
const watchListProbeTimeout = 5 * time.Second

// watchListGates is what chooseInitialSync needs of client-go's feature
// gates (the default implementation, read from KUBE_FEATURE_* variables,
// has Set).
type watchListGates interface {
	Enabled(clientfeatures.Feature) bool
	Set(clientfeatures.Feature, bool) error
}

// chooseInitialSync decides and logs how the informers built on client
// will sync; call it before they start.
func chooseInitialSync(ctx context.Context, client kubernetes.Interface) {
	logger := klog.FromContext(ctx)
	gates, ok := clientfeatures.FeatureGates().(watchListGates)
	if !ok {
		logger.Info("Informers' initial sync: client-go's feature gates were replaced; watch-list as they say",
			"watchListClient", clientfeatures.FeatureGates().Enabled(clientfeatures.WatchListClient))
		return
	}
	path, reason := decideInitialSync(ctx, client, gates)
	logger.Info("Informers' initial sync", "path", path, "reason", reason)
}

// decideInitialSync probes the API server and sets the WatchListClient
// gate to what it offers. It returns the path the informers will take and
// why.
func decideInitialSync(ctx context.Context, client kubernetes.Interface, gates watchListGates) (path, reason string) {
	if !gates.Enabled(clientfeatures.WatchListClient) {
		return syncList, "client-go's WatchListClient gate is off (KUBE_FEATURE_WatchListClient=false)"
	}
	err := probeWatchList(ctx, client)
	switch {
	case err == nil:
		return syncWatchList, "the API server streamed the initial events of a watch"
	case inconclusive(err):
		return syncWatchListIfOffered, fmt.Sprintf("the watch-list probe got no answer (%v); client-go falls back to LIST per informer if the API server refuses the stream", err)
	}
	if serr := gates.Set(clientfeatures.WatchListClient, false); serr != nil {
		return syncWatchListIfOffered, fmt.Sprintf("the API server refused watch-list (%v) but the gate cannot be turned off (%v); client-go falls back to LIST per informer", err, serr)
	}
	return syncList, fmt.Sprintf("the API server refused watch-list: %v (it needs kube-apiserver 1.34+ with the WatchList gate on, over etcd 3.4.31+, 3.5.13+ or 3.6+)", err)
}

// errNoAnswer is a probe that ended without a verdict from the server.
var errNoAnswer = errors.New("the watch ended before its initial events did")

// probeWatchList opens the watch a reflector opens for its initial sync,
// on PersistentVolumes (the controller watches them anyway, so its RBAC
// allows it) with a label no object carries, so that the server streams
// nothing but the end-of-initial-events bookmark. nil: the server streams;
// an API status: it refused.
func probeWatchList(ctx context.Context, client kubernetes.Interface) error {
	ctx, cancel := context.WithTimeout(ctx, watchListProbeTimeout)
	defer cancel()
	w, err := client.CoreV1().PersistentVolumes().Watch(ctx, metav1.ListOptions{
		LabelSelector:        "rds.csi.srvlab.io/watch-list-probe",
		SendInitialEvents:    ptr.To(true),
		ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan,
		AllowWatchBookmarks:  true,
		TimeoutSeconds:       ptr.To(int64(watchListProbeTimeout / time.Second)),
	})
	if err != nil {
		return err
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev, open := <-w.ResultChan():
			if !open {
				return errNoAnswer
			}
			switch ev.Type {
			case watch.Error:
				return apierrors.FromObject(ev.Object)
			case watch.Bookmark:
				if m, err := meta.Accessor(ev.Object); err == nil && m.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true" {
					return nil
				}
			}
		}
	}
}

// inconclusive: the error says nothing about watch-list (no answer, no
// access, an overloaded or unavailable server).
func inconclusive(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return true
	}
	return apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsServiceUnavailable(err)
}
