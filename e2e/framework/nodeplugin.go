package framework

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/srvlab/rds-csi/pkg/flagonce"
	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// NodePluginNamespace is manifests/base's namespace, where the node
// plugin's ServiceAccount and its Lease live.
const NodePluginNamespace = "rds-csi"

// NodePlugin is the driver's node service as the node DaemonSet's pod
// runs it on one node: --mode=node with the loop connector (a loop device
// over the simulator's backing file stands in for the NVMe/TCP connect;
// the stage, mkfs, mount and publish code is the real one), on a unix
// socket of its own. The test plays the kubelet: it calls NodeStage and
// NodePublish with a VolumeAttachment's publish_context.
type NodePlugin struct {
	*Process
	Node     string
	Socket   string
	Endpoint string
	Bin      string
	opts     NodePluginOptions
}

// NodePluginOptions configure StartNodePlugin.
type NodePluginOptions struct {
	Bin  string // the driver binary (a release's, or BuildDriver's)
	Node string
	// Kubeconfig, when set, runs the node plugin's own Lease (--node-lease
	// in NodePluginNamespace) with it: NodePluginKubeconfig's.
	Kubeconfig    string
	LeaseDuration time.Duration // --node-lease-duration; 0: the default
	ExtraArgs     []string
}

// StartNodePlugin runs a node plugin for opts.Node against sim's pool
// and waits until it answers Probe. It is stopped (SIGTERM) in
// tb.Cleanup, or earlier with Stop, as a rolling update stops the pod.
// The loop connector needs root at NodeStage, not at start.
func StartNodePlugin(tb testing.TB, tl *Timeline, dir string, sim *Sim, opts NodePluginOptions) *NodePlugin {
	tb.Helper()
	name := "rds-csi-node-" + opts.Node
	socket := filepath.Join(SocketDir(tb), fmt.Sprintf("%s-%d.sock", name, time.Now().UnixNano()%1e6))
	if err := checkSocketPath(socket); err != nil {
		tb.Fatalf("%s: %v", name, err)
	}
	args := []string{
		"--mode=node",
		"--endpoint=unix://" + socket,
		"--driver-name=" + DriverName,
		"--node-id=" + opts.Node,
		"--node-connector=loop",
		"--node-loop-data-dir=" + sim.PoolDir,
		"--rds-pool=" + rdssim.DefaultPoolName,
		"--rds-volume-path=" + VolumePath,
		"--rds-name=" + RDSName,
		"--shutdown-grace=5s",
		"--v=4",
	}
	if opts.Kubeconfig != "" {
		args = append(args, "--kubeconfig="+opts.Kubeconfig, "--node-lease", "--node-lease-namespace="+NodePluginNamespace)
		if opts.LeaseDuration > 0 {
			args = append(args, "--node-lease-duration="+opts.LeaseDuration.String())
		}
	}
	args = flagonce.Replace(args, opts.ExtraArgs)
	p := StartProcess(tb, tl, name, filepath.Join(dir, name+".log"), opts.Bin, args...)
	np := &NodePlugin{Process: p, Node: opts.Node, Socket: socket, Endpoint: "unix://" + socket, Bin: opts.Bin, opts: opts}
	d := &Driver{Process: p, Socket: socket, Endpoint: np.Endpoint}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := d.WaitReady(ctx); err != nil {
		tb.Fatalf("%s not ready: %v\n%s", name, err, tail(p.LogPath, 30))
	}
	tl.Logf("%s ready on %s (%s)", name, np.Endpoint, opts.Bin)
	return np
}

// Replace stops the plugin (SIGTERM, as the DaemonSet's rolling update
// stops its pod) and starts bin in its place with the same options.
func (np *NodePlugin) Replace(tb testing.TB, tl *Timeline, dir string, sim *Sim, bin string) *NodePlugin {
	tb.Helper()
	if err := np.Stop(15 * time.Second); err != nil {
		tb.Fatal(err)
	}
	opts := np.opts
	opts.Bin = bin
	return StartNodePlugin(tb, tl, dir, sim, opts)
}

// Clients dials the plugin's Identity and Node services; close the
// connection when done.
func (np *NodePlugin) Clients() (csipb.IdentityClient, csipb.NodeClient, *grpc.ClientConn, error) {
	conn, err := grpc.NewClient(np.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, nil, err
	}
	return csipb.NewIdentityClient(conn), csipb.NewNodeClient(conn), conn, nil
}

// NodePluginKubeconfig writes a kubeconfig of the node plugin's
// ServiceAccount (manifests/base/node-rbac.yaml) on node, as the kubelet
// gives it to the DaemonSet's pod there: a token bound to a pod on that
// node (created here, tolerating every taint like the DaemonSet's, never
// run: there is no kubelet), which the Lease admission policy reads the
// node from. The file holds a bearer token: it is removed in tb.Cleanup.
func NodePluginKubeconfig(ctx context.Context, tb testing.TB, cp *ControlPlane, dir, node string) string {
	tb.Helper()
	tok, err := NodePluginToken(ctx, cp, node, false)
	if err != nil {
		tb.Fatal(err)
	}
	path := filepath.Join(dir, "node-"+node+".kubeconfig")
	tb.Cleanup(func() { _ = os.Remove(path) })
	if err := writeTokenKubeconfig(path, cp, "system:serviceaccount:"+NodePluginNamespace+":rds-csi-node", tok); err != nil {
		tb.Fatal(err)
	}
	return path
}

// NodePluginToken is a token of the node plugin's ServiceAccount bound to
// a pod on node (see NodePluginKubeconfig), or, unbound, bound to nothing
// (it names no node).
func NodePluginToken(ctx context.Context, cp *ControlPlane, node string, unbound bool) (string, error) {
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}}
	if !unbound {
		pod, err := cp.Client.CoreV1().Pods(NodePluginNamespace).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "rds-csi-node-" + node, Namespace: NodePluginNamespace},
			Spec: corev1.PodSpec{
				NodeName: node, ServiceAccountName: "rds-csi-node", AutomountServiceAccountToken: ptr.To(false),
				Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
				Containers:  []corev1.Container{{Name: "rds-csi-plugin", Image: "registry.invalid/rds-csi-e2e/never-pulled:0"}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			return "", fmt.Errorf("the node plugin's pod on %s: %w", node, err)
		}
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	tok, err := cp.Client.CoreV1().ServiceAccounts(NodePluginNamespace).CreateToken(ctx, "rds-csi-node", req, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token of the node plugin on %s: %w", node, err)
	}
	return tok.Status.Token, nil
}
