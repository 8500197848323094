package framework

import (
	"context"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
)

// KubeletCadence is how a fake kubelet keeps its node alive.
type KubeletCadence struct {
	// Renew: how often the Lease in kube-node-lease is renewed; Duration
	// its leaseDurationSeconds, which the driver reads as the kubelet's
	// cadence: a real kubelet renews every quarter of it
	// (nodeLeaseRenewIntervalFraction), so Renew must be Duration/4, in
	// whole seconds.
	Renew, Duration time.Duration
	// Status: how often the kubelet looks at its Node's Ready condition
	// and posts it True again when the API says otherwise (after
	// kube-controller-manager marked it Unknown during an API server
	// outage), as a real kubelet's status sync does; 0: never.
	Status time.Duration
}

// FastCadence: renewals much more often than kube-controller-manager's
// --node-monitor-grace-period (20s by default in hack/controlplane.sh), so
// a healthy node never looks late. The harness's default.
var FastCadence = KubeletCadence{Renew: 2 * time.Second, Duration: 8 * time.Second}

// KubeletDefaultCadence is a real kubelet's with its defaults: the Lease
// renewed every 10 s (a quarter of its 40 s duration), the status synced
// every 10 s (--node-status-update-frequency). Detection measured against
// it does not flatter itself.
var KubeletDefaultCadence = KubeletCadence{Renew: 10 * time.Second, Duration: 40 * time.Second, Status: 10 * time.Second}

// KubeletFastHeartbeatCadence is a real kubelet an operator opted into a
// faster heartbeat (nodeLeaseDurationSeconds: 10, so a renewal every
// 2.5 s; the status sync keeps its default 10 s), for the driver's opt-in
// faster failover (--heartbeat-threshold below 20s).
var KubeletFastHeartbeatCadence = KubeletCadence{Renew: 2500 * time.Millisecond, Duration: 10 * time.Second, Status: 10 * time.Second}

// check: the cadence is one a kubelet can have.
func (c KubeletCadence) check() error {
	if c.Duration%time.Second != 0 || c.Duration <= 0 || c.Renew != c.Duration/4 {
		return fmt.Errorf("kubelet cadence %+v: a kubelet renews its Lease every quarter of its duration (whole seconds)", c)
	}
	return nil
}

// ControllerManagedAttachAnnotation makes the attach/detach controller of
// kube-controller-manager (not a kubelet) attach volumes to the node.
const ControllerManagedAttachAnnotation = "volumes.kubernetes.io/controller-managed-attach-detach"

// TopologyKey is the node label and CSINode topology key of the driver.
const TopologyKey = "topology." + DriverName + "/rds"

// fakeKubeletVersion is what the fake kubelets report: the control plane's
// version (KUBE_VERSION in hack/build-controlplane.sh).
const fakeKubeletVersion = "v1.36.3"

// FakeKubelet stands in for a node's kubelet and node-driver-registrar: it
// owns a Node (Ready, controller-managed attach/detach, the driver's
// topology label), its CSINode (driver registered with node ID = node
// name), and its Lease in kube-node-lease, which a goroutine renews until
// Fail is called.
type FakeKubelet struct {
	Name string
	// nodeID: what its CSI plugin registers (SetNodeID); "" is Name.
	nodeID  string
	client  kubernetes.Interface
	tl      *Timeline
	cadence KubeletCadence
	renewed chan time.Time // each renewal's time, when someone listens (RenewedAt)
	// topologyKeys its plugin registers (RegisterTopology); nil: TopologyKey.
	topologyKeys []string

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// NewNode registers a node and starts renewing its Lease. The renewals
// stop with Fail or when ctx ends.
// Its CSINode's node ID is the node name, as the node plugin registers it.
func NewNode(ctx context.Context, tl *Timeline, client kubernetes.Interface, name string) (*FakeKubelet, error) {
	return NewNodeWith(ctx, tl, client, name, FastCadence)
}

// NewNodeWith is NewNode with the kubelet's cadence.
func NewNodeWith(ctx context.Context, tl *Timeline, client kubernetes.Interface, name string, cadence KubeletCadence) (*FakeKubelet, error) {
	if err := cadence.check(); err != nil {
		return nil, err
	}
	nodeID := name
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{ControllerManagedAttachAnnotation: "true", nodeIDAnnotation: nodeIDs(name)},
			Labels: map[string]string{
				corev1.LabelHostname:   name,
				corev1.LabelOSStable:   "linux",
				corev1.LabelArchStable: "amd64",
				TopologyKey:            RDSName,
			},
		},
	}
	created, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create node %s: %w", name, err)
	}
	now := metav1.Now()
	status := corev1.NodeStatus{
		Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			Message: "fake kubelet of the rds-csi e2e harness", LastHeartbeatTime: now, LastTransitionTime: now,
		}},
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: name}, {Type: corev1.NodeInternalIP, Address: "127.0.0.1"}},
		Capacity: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi"), corev1.ResourcePods: resource.MustParse("110"),
		},
		Allocatable: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi"), corev1.ResourcePods: resource.MustParse("110"),
		},
		NodeInfo: corev1.NodeSystemInfo{KubeletVersion: fakeKubeletVersion, OperatingSystem: "linux", Architecture: "amd64"},
	}
	// kube-controller-manager may change the new Node first (the not-ready
	// taint): post the status on the fresh object, as a kubelet retries.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Status = status
		_, err = client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("node %s status: %w", name, err)
	}
	_, err = client.StorageV1().CSINodes().Create(ctx, &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{
			Name: name,
			// As the kubelet does: the CSINode goes away with its Node.
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: name, UID: created.UID}},
		},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{
			Name: DriverName, NodeID: nodeID, TopologyKeys: []string{TopologyKey},
		}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create csinode %s: %w", name, err)
	}
	k := &FakeKubelet{Name: name, client: client, tl: tl, cadence: cadence, renewed: make(chan time.Time)}
	if err := k.renew(ctx); err != nil {
		return nil, err
	}
	k.start(ctx)
	tl.Logf("fake kubelet %s registered (Node, CSINode, Lease of %s renewed every %s, Ready re-posted every %s)", name, cadence.Duration, cadence.Renew, cadence.Status)
	return k, nil
}

func (k *FakeKubelet) start(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	k.mu.Lock()
	k.cancel, k.done = cancel, done
	k.mu.Unlock()
	go func() {
		defer close(done)
		t := time.NewTicker(k.cadence.Renew)
		defer t.Stop()
		var status <-chan time.Time
		if k.cadence.Status > 0 {
			st := time.NewTicker(k.cadence.Status)
			defer st.Stop()
			status = st.C
		}
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := k.renew(ctx); err != nil && ctx.Err() == nil {
					k.tl.Logf("fake kubelet %s: lease renewal failed: %v", k.Name, err)
				}
			case <-status:
				if err := k.postReady(ctx, false); err != nil && ctx.Err() == nil {
					k.tl.Logf("fake kubelet %s: status sync failed: %v", k.Name, err)
				}
			}
		}
	}()
}

// renew creates or renews the node's Lease, as the kubelet does.
func (k *FakeKubelet) renew(ctx context.Context) error {
	leases := k.client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	l, err := leases.Get(ctx, k.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: k.Name},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       ptr.To(k.Name),
				LeaseDurationSeconds: ptr.To(int32(k.cadence.Duration.Seconds())),
				RenewTime:            &now,
			},
		}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	l.Spec.RenewTime = &now
	if _, err = leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		return err
	}
	select {
	case k.renewed <- now.Time:
	default:
	}
	return nil
}

// NextRenewal waits for the kubelet's next Lease renewal and returns when
// it was made.
func (k *FakeKubelet) NextRenewal(ctx context.Context) (time.Time, error) {
	select {
	case at := <-k.renewed:
		return at, nil
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	}
}

// Fail stops the Lease renewals, as when the node's kubelet or the whole
// node dies: kube-controller-manager marks it NotReady (Unknown) after its
// grace period. The Node object stays.
func (k *FakeKubelet) Fail() {
	k.mu.Lock()
	cancel, done := k.cancel, k.done
	k.cancel, k.done = nil, nil
	k.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
	k.tl.Logf("fake kubelet %s: failed (lease renewals stopped)", k.Name)
}

// Recover marks the node Ready again and resumes the Lease renewals, as a
// kubelet coming back does.
func (k *FakeKubelet) Recover(ctx context.Context) error {
	k.mu.Lock()
	running := k.cancel != nil
	k.mu.Unlock()
	if running {
		return nil
	}
	if err := k.postReady(ctx, true); err != nil {
		return err
	}
	if err := k.renew(ctx); err != nil {
		return err
	}
	k.start(ctx)
	k.tl.Logf("fake kubelet %s: recovered", k.Name)
	return nil
}

// nodeIDAnnotation: the kubelet's record on the Node of each registered
// CSI driver's node ID (pkg/volume/csi/nodeinfomanager).
const nodeIDAnnotation = "csi.volume.kubernetes.io/nodeid"

func nodeIDs(nodeID string) string { return `{"` + DriverName + `":"` + nodeID + `"}` }

// DeregisterPlugin does what the kubelet does when the node's CSI plugin
// goes away (its DaemonSet pod stopped in a rollout, or crashed):
// UninstallCSIDriver drops the driver from the CSINode and its node ID
// from the Node's annotation. The kubelet itself, and its Lease renewals,
// go on.
func (k *FakeKubelet) DeregisterPlugin(ctx context.Context) error {
	if err := k.setPlugin(ctx, false); err != nil {
		return err
	}
	k.tl.Logf("node %s: CSI plugin deregistered (CSINode driver and node ID annotation removed; kubelet running)", k.Name)
	return nil
}

// SetNodeID registers the plugin again with node ID id (for example the
// node name and a node key, "name/x25519:...", as a node plugin that can
// authenticate NVMe connects registers).
func (k *FakeKubelet) SetNodeID(ctx context.Context, id string) error {
	k.mu.Lock()
	k.nodeID = id
	k.mu.Unlock()
	// A CSINode driver's node ID is immutable: the kubelet drops the entry
	// and adds it again, as on a plugin's re-registration.
	if err := k.setPlugin(ctx, false); err != nil {
		return err
	}
	if err := k.setPlugin(ctx, true); err != nil {
		return err
	}
	k.tl.Logf("node %s: CSI plugin registered with node ID %s", k.Name, id)
	return nil
}

func (k *FakeKubelet) id() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.nodeID == "" {
		return k.Name
	}
	return k.nodeID
}

// RegisterPlugin is the plugin's registration again (node-driver-
// registrar), as after a restart.
func (k *FakeKubelet) RegisterPlugin(ctx context.Context) error {
	if err := k.setPlugin(ctx, true); err != nil {
		return err
	}
	k.tl.Logf("node %s: CSI plugin registered again", k.Name)
	return nil
}

func (k *FakeKubelet) setPlugin(ctx context.Context, on bool) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cn, err := k.client.StorageV1().CSINodes().Get(ctx, k.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cn.Spec.Drivers = nil
		if on {
			keys := []string{TopologyKey}
			if k.topologyKeys != nil {
				keys = k.topologyKeys
			}
			cn.Spec.Drivers = []storagev1.CSINodeDriver{{Name: DriverName, NodeID: k.id(), TopologyKeys: keys}}
		}
		_, err = k.client.StorageV1().CSINodes().Update(ctx, cn, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("node %s: CSINode: %w", k.Name, err)
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := k.client.CoreV1().Nodes().Get(ctx, k.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if on {
			if n.Annotations == nil {
				n.Annotations = map[string]string{}
			}
			n.Annotations[nodeIDAnnotation] = nodeIDs(k.id())
		} else {
			delete(n.Annotations, nodeIDAnnotation)
		}
		_, err = k.client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("node %s: node ID annotation: %w", k.Name, err)
	}
	return nil
}

// Cadence is the kubelet's cadence.
func (k *FakeKubelet) Cadence() KubeletCadence { return k.cadence }

// postReady posts the Node's Ready condition True, when it is not (or
// always, as a heartbeat, when force).
func (k *FakeKubelet) postReady(ctx context.Context, force bool) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := k.client.CoreV1().Nodes().Get(ctx, k.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		changed := force
		for i := range n.Status.Conditions {
			if c := &n.Status.Conditions[i]; c.Type == corev1.NodeReady {
				if c.Status != corev1.ConditionTrue {
					c.LastTransitionTime = now
					changed = true
					k.tl.Logf("fake kubelet %s: the API says Ready=%s; posting Ready again", k.Name, c.Status)
				}
				c.Status, c.Reason, c.LastHeartbeatTime = corev1.ConditionTrue, "KubeletReady", now
			}
		}
		if !changed {
			return nil
		}
		_, err = k.client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
}

// Delete stops the kubelet and deletes the Node object (its CSINode goes
// with it through the owner reference).
func (k *FakeKubelet) Delete(ctx context.Context) error {
	k.Fail()
	return k.client.CoreV1().Nodes().Delete(ctx, k.Name, metav1.DeleteOptions{})
}

// Taint adds a taint to the node (e.g. node.kubernetes.io/out-of-service).
func (k *FakeKubelet) Taint(ctx context.Context, t corev1.Taint) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := k.client.CoreV1().Nodes().Get(ctx, k.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Spec.Taints = append(n.Spec.Taints, t)
		_, err = k.client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err == nil {
		k.tl.Logf("node %s tainted %s=%s:%s", k.Name, t.Key, t.Value, t.Effect)
	}
	return err
}

// Untaint removes the node's taints with key, as an operator does once
// the node is repaired.
func (k *FakeKubelet) Untaint(ctx context.Context, key string) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := k.client.CoreV1().Nodes().Get(ctx, k.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		kept := n.Spec.Taints[:0:0]
		for _, t := range n.Spec.Taints {
			if t.Key != key {
				kept = append(kept, t)
			}
		}
		n.Spec.Taints = kept
		_, err = k.client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err == nil {
		k.tl.Logf("node %s: taint %s removed", k.Name, key)
	}
	return err
}

// OutOfServiceTaint is the taint an operator puts on a node known to be
// down, which lets the attach/detach controller detach its volumes at once.
var OutOfServiceTaint = corev1.Taint{Key: corev1.TaintNodeOutOfService, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute}
