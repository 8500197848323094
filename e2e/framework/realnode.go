package framework

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A real node of the kubelet tier: a kubelet and a containerd built from
// their Go modules (hack/build-kubelet-tier.sh), runc and the CNI plugins
// from Debian's packages, in a mount and a network namespace of the node's
// own, its processes under a cgroup of its own. Several run on one machine
// side by side:
//
//   - the mount namespace holds the node's own /var/lib/kubelet (a bind of
//     its state directory), /run (tmpfs: containerd's socket and state,
//     the pods' network namespaces), and overlays on /etc, /var/lib,
//     /var/log and /usr, so that what the node and its pods create there
//     (/etc/nvme, /lib/modules, pod logs) stays the node's; / is shared
//     inside the namespace (mount propagation of the node plugin's
//     Bidirectional kubelet directory) and private to the host;
//   - the network namespace has only loopback, with the node's address
//     (NodeIP), the kubernetes Service's address and the RDS's address on
//     it, and the CNI bridge of the node's pods: the kubelet and the pods
//     reach the API server and the RDS simulator through listeners there
//     (netns.go), the API server reaches the kubelet through its egress
//     proxy; no address of the host's network is used;
//   - the kernel settings the kubelet insists on (vm.overcommit_memory,
//     kernel.panic, ...) are files of the node bound over /proc/sys in its
//     mount namespace: the host's stay as they are;
//   - the cgroup /rdsnodes-<random>-<name> (cgroup v1 here: hybrid mode, so the
//     kubelet runs with failCgroupV1: false) holds the node's daemons
//     (node/) and its pods (the kubelet's cgroupRoot): PowerLoss freezes
//     and kills the whole tree at once.

// KubeletTier is what hack/build-kubelet-tier.sh built.
type KubeletTier struct {
	Bin       string   // .cache/bin: kubelet, kube-scheduler, containerd, ctr, e2e.test
	DebRoot   string   // .cache/kubelet-tier/root: runc, CNI plugins, busybox
	Images    []string // OCI archives to import into every node
	PauseRef  string   // the sandbox image
	ImageRefs map[string]string
}

// KubeletTierComponents are what the tier's tests need of
// hack/build-kubelet-tier.sh (e2e.test and ginkgo: the storage suite's).
const KubeletTierComponents = "kubelet kube-scheduler containerd debs images e2e.test ginkgo"

var (
	tierOnce sync.Once
	tierErr  error
)

// EnsureKubeletTier runs hack/build-kubelet-tier.sh once per test binary
// (it finds what is built and only checks) and returns what it built.
// extraImages (e.g. the driver's image from `make image`) are imported too.
func EnsureKubeletTier(tb testing.TB, root string, extraImages ...string) *KubeletTier {
	tb.Helper()
	tierOnce.Do(func() {
		if os.Getenv("RDS_CSI_E2E_BUILD") == "0" {
			return
		}
		cmd := exec.Command("bash", filepath.Join(root, "hack", "build-kubelet-tier.sh"))
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "ONLY="+KubeletTierComponents)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			tierErr = fmt.Errorf("hack/build-kubelet-tier.sh: %w", err)
		}
	})
	if tierErr != nil {
		tb.Fatal(tierErr)
	}
	cache := filepath.Dir(BinDir(root))
	t := &KubeletTier{Bin: BinDir(root), DebRoot: filepath.Join(cache, "kubelet-tier", "root"), ImageRefs: map[string]string{}}
	for _, b := range []string{"kubelet", "kube-scheduler", "containerd", "containerd-shim-runc-v2", "ctr"} {
		if !HaveBinary(root, b) {
			tb.Fatalf("no %s in %s: run hack/build-kubelet-tier.sh (make e2e-kubelet)", b, t.Bin)
		}
	}
	idx := filepath.Join(cache, "kubelet-tier", "images", "images.tsv")
	f, err := os.Open(idx)
	if err != nil {
		tb.Fatalf("%v: run hack/build-kubelet-tier.sh (make e2e-kubelet)", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.Split(sc.Text(), "\t")
		if len(parts) < 2 {
			continue
		}
		t.Images = append(t.Images, filepath.Join(filepath.Dir(idx), parts[0]))
		t.ImageRefs[strings.TrimSuffix(parts[0], ".tar")] = parts[1]
		if parts[0] == "pause.tar" {
			t.PauseRef = parts[1]
		}
	}
	if t.PauseRef == "" {
		tb.Fatalf("%s lists no pause image", idx)
	}
	for _, img := range extraImages {
		if _, err := os.Stat(img); err != nil {
			tb.Fatalf("image archive %s: %v", img, err)
		}
		t.Images = append(t.Images, img)
	}
	return t
}

// Runtime is the OCI runtime Debian's package installed into DebRoot.
func (t *KubeletTier) Runtime() string { return filepath.Join(t.DebRoot, "usr", "sbin", "runc") }

// RuntimeBinary is what containerd runs as its runc: runc itself, or,
// where no process may lower an OOM score (no CAP_SYS_RESOURCE in the
// capability bounding set, as in the sandbox these machines run in),
// hack/tools/cmd/lab-runc, which keeps the kubelet's negative scores at
// the caller's own before it runs runc ($LAB_RUNC).
func (t *KubeletTier) RuntimeBinary() string {
	if canLowerOOMScore() {
		return t.Runtime()
	}
	return filepath.Join(filepath.Dir(t.DebRoot), "bin", "lab-runc")
}

// canLowerOOMScore says whether CAP_SYS_RESOURCE is in this process's
// bounding set (what lowering oom_score_adj needs).
func canLowerOOMScore() bool { return HaveCapabilityInBoundingSet(24) }

// HaveCapabilityInBoundingSet says whether capability number c (e.g. 24,
// CAP_SYS_RESOURCE) is in this process's bounding set, and so can be had
// by anything it starts, privileged containers included.
func HaveCapabilityInBoundingSet(c uint) bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapBnd:"); ok {
			bits, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && bits&(1<<c) != 0
		}
	}
	return false
}

// RealNodeOptions configure a node.
type RealNodeOptions struct {
	// Index numbers the node from 1: its address 10.201.0.<Index>, its
	// pods' subnet 10.88.<Index>.0/24.
	Index int
	// KubeletRootDir is the kubelet's --root-dir inside the node; default
	// /var/lib/kubelet.
	KubeletRootDir string
	// NodeLeaseDurationSeconds is the kubelet's nodeLeaseDurationSeconds
	// (default 40, the kubelet's own).
	NodeLeaseDurationSeconds int
	// Labels are the kubelet's --node-labels.
	Labels map[string]string
}

// The addresses every node has on its loopback.
const (
	ServiceAPIAddress = "10.0.0.1"   // the kubernetes Service (hack/controlplane.sh's SERVICE_IP)
	LabRDSAddress     = "10.203.0.1" // the RDS simulator as the nodes and pods reach it
)

// RealNode is one running node.
type RealNode struct {
	Name    string
	IP      string
	Dir     string // the node's state (a temporary directory)
	LogDir  string // its logs (in the artifact directory)
	Cgroup  string // rdsnodes-<random>-<name>
	RootDir string // the kubelet's root directory inside the node

	tier        *KubeletTier
	holder      *Process
	containerd  *Process
	kubelet     *Process
	kubeletArgs []string
	path        string
	fwds        []*Forwarder
	cluster     *KubeletCluster
	dead        bool
}

// NetNS is the node's network namespace.
func (n *RealNode) NetNS() string { return fmt.Sprintf("/proc/%d/ns/net", n.holder.Pid()) }

// Path is p (a path inside the node's mount namespace) as the host reaches it.
func (n *RealNode) Path(p string) string {
	return filepath.Join(fmt.Sprintf("/proc/%d/root", n.holder.Pid()), p)
}

// KubeletCluster is a control plane with a scheduler and real nodes.
type KubeletCluster struct {
	Env       *Env
	Tier      *KubeletTier
	Egress    *EgressProxy
	Scheduler *Process
	Sim       *Sim // the RDS the nodes reach at LabRDSAddress, when set
	stateDir  string
	mu        sync.Mutex
	nodes     []*RealNode
	after     []func()
}

// AfterNodes runs f in the test's cleanup once every node has ended (to
// clear what the nodes leave in the shared kernel, such as loop devices).
func (c *KubeletCluster) AfterNodes(f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.after = append(c.after, f)
}

// kubeletControlPlane are the API server flags the kubelet tier needs:
// the Node authorizer and NodeRestriction (as a cluster has them), the
// client certificate kube-apiserver presents to kubelets (exec, logs),
// and the egress selector that routes its connections to nodes into
// their network namespaces.
func kubeletControlPlane(egressConfig string) ControlPlaneOptions {
	return ControlPlaneOptions{
		ExtraAPIServerArgs: "--enable-admission-plugins=NodeRestriction --egress-selector-config-file=" + egressConfig,
		AuthorizationMode:  "Node,RBAC",
		KubeletClientCert:  true,
	}
}

// NewKubeletEnv is NewEnv for the kubelet tier: a control plane the
// kubelets can use, kube-scheduler, and no nodes yet (AddNode).
func NewKubeletEnv(t testing.TB, tier *KubeletTier, opts EnvOptions) *KubeletCluster {
	t.Helper()
	sock := SocketDir(t)
	eg, err := StartEgressProxy(filepath.Join(sock, "egress.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eg.Close)
	cfg := filepath.Join(sock, "egress.yaml")
	if err := os.WriteFile(cfg, []byte(EgressSelectorConfig(eg.Socket)), 0o644); err != nil {
		t.Fatal(err)
	}
	cp := kubeletControlPlane(cfg)
	cp.NodeMonitorGracePeriod = opts.ControlPlane.NodeMonitorGracePeriod
	cp.ExtraKCMArgs = opts.ControlPlane.ExtraKCMArgs
	if a := opts.ControlPlane.ExtraAPIServerArgs; a != "" {
		cp.ExtraAPIServerArgs += " " + a
	}
	opts.ControlPlane = cp
	e := NewEnv(t, opts)
	state, err := os.MkdirTemp("", "rdscsi-rdsnodes-")
	if err != nil {
		t.Fatal(err)
	}
	c := &KubeletCluster{Env: e, Tier: tier, Egress: eg, stateDir: state}
	t.Cleanup(func() {
		c.mu.Lock()
		nodes := append([]*RealNode(nil), c.nodes...)
		c.mu.Unlock()
		for _, n := range nodes {
			n.cleanup(t)
		}
		c.mu.Lock()
		after := c.after
		c.mu.Unlock()
		for _, f := range after {
			f()
		}
		if err := os.RemoveAll(state); err != nil {
			t.Errorf("removing the nodes' state: %v", err)
		}
	})
	c.startScheduler(t)
	return c
}

func (c *KubeletCluster) startScheduler(t testing.TB) {
	e := c.Env
	kc := filepath.Join(e.CP.Dir, "kube-scheduler.kubeconfig")
	if err := writeKubeconfig(kc, e.CP.Env["KUBE_APISERVER_URL"], e.CP.Env["KUBE_CA_FILE"], e.CP.Env["KUBE_ADMIN_CERT"], e.CP.Env["KUBE_ADMIN_KEY"]); err != nil {
		t.Fatal(err)
	}
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	c.Scheduler = StartProcess(t, e.TL, "kube-scheduler", filepath.Join(e.Dir, "kube-scheduler.log"),
		filepath.Join(c.Tier.Bin, "kube-scheduler"), "--kubeconfig="+kc, "--authentication-kubeconfig="+kc,
		"--authorization-kubeconfig="+kc, "--leader-elect=false", "--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(port), "--v=2")
}

// writeKubeconfig writes a kubeconfig with a client certificate.
func writeKubeconfig(path, server, ca, cert, key string) error {
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster: {server: %q, certificate-authority: %q}
users:
- name: u
  user: {client-certificate: %q, client-key: %q}
contexts:
- name: e2e
  context: {cluster: e2e, user: u}
current-context: e2e
`, server, ca, cert, key)
	return os.WriteFile(path, []byte(cfg), 0o600)
}

// signClientCert writes a key and a certificate for cn in orgs, signed by
// the control plane's CA, into dir as <name>.crt and <name>.key.
func signClientCert(pki, dir, name, cn string, orgs []string, serverIPs []net.IP) (certFile, keyFile string, err error) {
	caPEM, err := os.ReadFile(filepath.Join(pki, "ca.crt"))
	if err != nil {
		return "", "", err
	}
	caKeyPEM, err := os.ReadFile(filepath.Join(pki, "ca.key"))
	if err != nil {
		return "", "", err
	}
	cb, _ := pem.Decode(caPEM)
	kb, _ := pem.Decode(caKeyPEM)
	if cb == nil || kb == nil {
		return "", "", errors.New("unreadable CA in " + pki)
	}
	caCert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return "", "", err
	}
	var caKey any
	if caKey, err = x509.ParsePKCS8PrivateKey(kb.Bytes); err != nil {
		if caKey, err = x509.ParsePKCS1PrivateKey(kb.Bytes); err != nil {
			return "", "", fmt.Errorf("CA key: %w", err)
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		IPAddresses:  serverIPs,
	}
	if len(serverIPs) > 0 {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return "", "", err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return "", "", err
	}
	return certFile, keyFile, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600)
}

// kernelTunables are the kernel settings the kubelet checks and sets at
// start (its container manager's setupKernelTunables), with the values it
// wants. They are not namespaced; each node gets a file of its own with
// that value bound over the /proc/sys entry in its mount namespace.
var kernelTunables = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// cgroupHierarchies are the cgroup v1 hierarchies (and the unified one of
// hybrid mode) a node's daemons join.
func cgroupHierarchies() []string {
	var out []string
	entries, _ := os.ReadDir("/sys/fs/cgroup")
	for _, e := range entries {
		p := filepath.Join("/sys/fs/cgroup", e.Name())
		if _, err := os.Stat(filepath.Join(p, "cgroup.procs")); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// AddNode starts a node and waits until it is Ready.
func (c *KubeletCluster) AddNode(t testing.TB, name string, opts RealNodeOptions) *RealNode {
	t.Helper()
	e := c.Env
	if opts.Index < 1 || opts.Index > 250 {
		t.Fatalf("node %s: Index %d, want 1-250", name, opts.Index)
	}
	if opts.KubeletRootDir == "" {
		opts.KubeletRootDir = "/var/lib/kubelet"
	}
	done := e.TL.Step("start real node " + name + " (containerd, kubelet)")
	n := &RealNode{
		Name: name, IP: fmt.Sprintf("10.201.0.%d", opts.Index), Dir: filepath.Join(c.stateDir, name),
		LogDir: filepath.Join(e.Dir, "node-"+name), Cgroup: strings.TrimPrefix(filepath.Base(c.stateDir), "rdscsi-") + "-" + name, RootDir: opts.KubeletRootDir,
		tier: c.Tier, cluster: c,
	}
	for _, d := range []string{n.Dir, n.LogDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	c.mu.Lock()
	c.nodes = append(c.nodes, n)
	c.mu.Unlock()

	// The node's cgroup, in every hierarchy; its daemons in node/.
	var procs []string
	for _, h := range cgroupHierarchies() {
		for _, sub := range []string{n.Cgroup, filepath.Join(n.Cgroup, "node")} {
			p := filepath.Join(h, sub)
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			if filepath.Base(h) == "cpuset" {
				for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
					v, _ := os.ReadFile(filepath.Join(filepath.Dir(p), f))
					_ = os.WriteFile(filepath.Join(p, f), v, 0o644)
				}
			}
		}
		procs = append(procs, filepath.Join(h, n.Cgroup, "node", "cgroup.procs"))
	}

	// Files of the node: certificates, configurations, the sysctl stand-ins.
	pki := filepath.Join(n.Dir, "pki")
	if err := os.MkdirAll(pki, 0o700); err != nil {
		t.Fatal(err)
	}
	cert, key, err := signClientCert(filepath.Join(e.CP.Dir, "pki"), pki, "kubelet", "system:node:"+name, []string{"system:nodes"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	srvCert, srvKey, err := signClientCert(filepath.Join(e.CP.Dir, "pki"), pki, "kubelet-serving", "system:node:"+name, []string{"system:nodes"}, []net.IP{net.ParseIP(n.IP)})
	if err != nil {
		t.Fatal(err)
	}
	ca := e.CP.Env["KUBE_CA_FILE"]
	kubeconfig := filepath.Join(n.Dir, "kubelet.kubeconfig")
	if err := writeKubeconfig(kubeconfig, "https://"+ServiceAPIAddress+":443", ca, cert, key); err != nil {
		t.Fatal(err)
	}
	sysctl := filepath.Join(n.Dir, "sysctl")
	var binds strings.Builder
	for k, v := range kernelTunables {
		f := filepath.Join(sysctl, strings.ReplaceAll(k, "/", "."))
		if err := os.MkdirAll(sysctl, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&binds, "mount --bind %q /proc/sys/%s\n", f, k)
	}
	cniDir := filepath.Join(n.Dir, "cni")
	if err := os.MkdirAll(cniDir, 0o755); err != nil {
		t.Fatal(err)
	}
	cni := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "rds-lab", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.%d.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}}
]}`, opts.Index)
	if err := os.WriteFile(filepath.Join(cniDir, "10-rds-lab.conflist"), []byte(cni), 0o644); err != nil {
		t.Fatal(err)
	}
	ctrdRoot := filepath.Join(n.Dir, "containerd")
	ctrdConf := filepath.Join(n.Dir, "containerd.toml")
	if err := os.WriteFile(ctrdConf, []byte(containerdConfig(ctrdRoot, c.Tier, cniDir)), 0o644); err != nil {
		t.Fatal(err)
	}
	kcfg := filepath.Join(n.Dir, "kubelet.yaml")
	if err := os.WriteFile(kcfg, []byte(kubeletConfig(n, ca, srvCert, srvKey, opts)), 0o644); err != nil {
		t.Fatal(err)
	}

	// The namespaces, held by a shell that sets them up and then sleeps.
	setup := nodeSetupScript(n, procs, binds.String())
	ready := filepath.Join(n.Dir, "ready")
	n.holder = StartProcess(t, e.TL, name+" namespaces", filepath.Join(n.LogDir, "setup.log"),
		"unshare", "--mount", "--net", "--propagation", "private", "--", "bash", "-c", setup, "setup", ready)
	if _, err := WaitFor(e.Ctx, e.TL, 30*time.Second, name+": namespaces set up", func(context.Context) (bool, string, error) {
		if n.holder.Exited() {
			return false, "", fmt.Errorf("the node's setup exited: %v\n%s", n.holder.ExitErr(), tail(n.holder.LogPath, 20))
		}
		_, err := os.Stat(ready)
		return err == nil, "", nil
	}); err != nil {
		t.Fatal(err)
	}

	// Across the namespace boundary: the API server and the RDS.
	api := e.CP.Env["KUBE_APISERVER_URL"]
	apiAddr := strings.TrimPrefix(api, "https://")
	n.forward(t, net.JoinHostPort(ServiceAPIAddress, "443"), apiAddr)
	if c.Sim != nil {
		n.forward(t, net.JoinHostPort(LabRDSAddress, strconv.Itoa(c.Sim.Port)), net.JoinHostPort(c.Sim.Host, strconv.Itoa(c.Sim.Port)))
	}
	// kube-apiserver asks for a node by its name first (Hostname address).
	c.Egress.Route(n.Name, n.IP, n.NetNS())

	// containerd, then the images, then the kubelet.
	path := c.Tier.Bin + ":" + filepath.Dir(c.Tier.Runtime()) + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	n.containerd = n.startIn(t, "containerd", path, filepath.Join(c.Tier.Bin, "containerd"), "--config", ctrdConf)
	if rb := c.Tier.RuntimeBinary(); rb != c.Tier.Runtime() {
		e.TL.Logf("%s: no CAP_SYS_RESOURCE here: containerd runs runc through %s (OOM scores kept at the caller's)", name, rb)
	}
	sock := n.Path("/run/containerd/containerd.sock")
	if _, err := WaitFor(e.Ctx, e.TL, 60*time.Second, name+": containerd serving", func(context.Context) (bool, string, error) {
		if n.containerd.Exited() {
			return false, "", fmt.Errorf("containerd exited: %v\n%s", n.containerd.ExitErr(), tail(n.containerd.LogPath, 30))
		}
		_, err := os.Stat(sock)
		return err == nil, "", nil
	}); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	for _, img := range c.Tier.Images {
		if out, err := n.Exec(e.Ctx, filepath.Join(c.Tier.Bin, "ctr"), "--address", "/run/containerd/containerd.sock",
			"--namespace", "k8s.io", "images", "import", "--platform", "linux/amd64", img); err != nil {
			t.Fatalf("%s: ctr images import %s: %v\n%s", name, img, err, out)
		}
	}
	e.TL.Logf("%s: imported %d images in %s", name, len(c.Tier.Images), time.Since(t0).Round(time.Millisecond))
	args := []string{"--config=" + kcfg, "--kubeconfig=" + kubeconfig, "--hostname-override=" + name,
		"--node-ip=" + n.IP, "--root-dir=" + n.RootDir, "--v=2"}
	if len(opts.Labels) > 0 {
		var l []string
		for k, v := range opts.Labels {
			l = append(l, k+"="+v)
		}
		args = append(args, "--node-labels="+strings.Join(l, ","))
	}
	n.kubeletArgs, n.path = args, path
	n.StartKubelet(t)
	done()
	return n
}

// StartKubelet starts the node's kubelet (again, after StopKubelet) and
// waits until the Node is Ready.
func (n *RealNode) StartKubelet(t testing.TB) {
	t.Helper()
	e := n.cluster.Env
	n.kubelet = n.startIn(t, "kubelet", n.path, filepath.Join(n.tier.Bin, "kubelet"), n.kubeletArgs...)
	if _, err := WaitFor(e.Ctx, e.TL, 120*time.Second, n.Name+": Node Ready", func(ctx context.Context) (bool, string, error) {
		if n.kubelet.Exited() {
			return false, "", fmt.Errorf("the kubelet exited: %v\n%s", n.kubelet.ExitErr(), tail(n.kubelet.LogPath, 40))
		}
		return NodeReady(e.Client, n.Name, corev1.ConditionTrue)(ctx)
	}); err != nil {
		t.Fatal(err)
	}
}

// StopKubelet kills the node's kubelet alone (SIGKILL, as a crash or
// `systemctl kill` would): containerd and the running containers stay,
// the Node's Lease is no longer renewed.
func (n *RealNode) StopKubelet(t testing.TB) {
	t.Helper()
	n.cluster.Env.TL.Logf("%s: kubelet stopped", n.Name)
	n.kubelet.Kill()
}

// forward listens on listen inside the node and splices to hostAddr.
func (n *RealNode) forward(t testing.TB, listen, hostAddr string) {
	l, err := ListenInNetns(n.NetNS(), listen)
	if err != nil {
		t.Fatalf("%s: listen on %s: %v", n.Name, listen, err)
	}
	n.fwds = append(n.fwds, Forward(l, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", hostAddr)
	}))
}

// startIn runs a daemon of the node inside its namespaces and cgroup.
func (n *RealNode) startIn(t testing.TB, what, path, bin string, args ...string) *Process {
	t.Helper()
	nsArgs := append([]string{"--target", strconv.Itoa(n.holder.Pid()), "--mount", "--net", "--",
		"env", "PATH=" + path, "LAB_RUNC=" + n.tier.Runtime(), bin}, args...)
	return StartProcess(t, n.cluster.Env.TL, n.Name+" "+what, filepath.Join(n.LogDir, what+".log"), "nsenter", nsArgs...)
}

// Exec runs a command inside the node's namespaces and returns its output.
func (n *RealNode) Exec(ctx context.Context, bin string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--target", strconv.Itoa(n.holder.Pid()), "--mount", "--net", "--", bin}, args...)...)
	return cmd.CombinedOutput()
}

func nodeSetupScript(n *RealNode, procs []string, sysctlBinds string) string {
	var b strings.Builder
	b.WriteString("set -euo pipefail\nready=$1\n")
	for _, p := range procs {
		fmt.Fprintf(&b, "echo $$ > %q\n", p)
	}
	d := n.Dir
	fmt.Fprintf(&b, `
mkdir -p %[1]q/etc.upper %[1]q/etc.work %[1]q/varlib.upper %[1]q/varlib.work %[1]q/varlog.upper %[1]q/varlog.work %[1]q/usr.upper %[1]q/usr.work %[1]q/kubelet
mount -t overlay overlay -o lowerdir=/etc,upperdir=%[1]q/etc.upper,workdir=%[1]q/etc.work /etc
mount -t overlay overlay -o lowerdir=/var/lib,upperdir=%[1]q/varlib.upper,workdir=%[1]q/varlib.work /var/lib
mount -t overlay overlay -o lowerdir=/var/log,upperdir=%[1]q/varlog.upper,workdir=%[1]q/varlog.work /var/log
mount -t overlay overlay -o lowerdir=/usr,upperdir=%[1]q/usr.upper,workdir=%[1]q/usr.work /usr
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -p %[2]q
mount --bind %[1]q/kubelet %[2]q
%[3]s
mount --make-rshared /
ip link set lo up
ip addr add %[4]s/32 dev lo
ip addr add %[5]s/32 dev lo
ip addr add %[6]s/32 dev lo
touch "$ready"
exec sleep infinity
`, d, n.RootDir, sysctlBinds, n.IP, ServiceAPIAddress, LabRDSAddress)
	return b.String()
}

func containerdConfig(root string, tier *KubeletTier, cniDir string) string {
	return fmt.Sprintf(`version = 3
root = %q
state = "/run/containerd"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing", "io.containerd.nri.v1.nri"]

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = %q
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%q]
    conf_dir = %q

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %q
`, root, tier.RuntimeBinary(), filepath.Join(tier.DebRoot, "usr", "lib", "cni"), cniDir, tier.PauseRef)
}

func kubeletConfig(n *RealNode, ca, cert, key string, opts RealNodeOptions) string {
	lease := opts.NodeLeaseDurationSeconds
	if lease == 0 {
		lease = 40
	}
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine kind runs cgroup v1 (hybrid mode); Kubernetes 1.35+ kubelets
# refuse it unless told (KEP-5573).
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /%s
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
address: %s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: %q
tlsPrivateKeyFile: %q
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %q}
authorization:
  mode: Webhook
resolvConf: ""
failSwapOn: false
nodeLeaseDurationSeconds: %d
volumeStatsAggPeriod: 5s
# Images come from archives imported into containerd, never from a
# registry: none may be collected.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%%
  imagefs.available: 1%%
serializeImagePulls: false
`, n.Cgroup, n.IP, cert, key, ca, lease)
}

// PowerLoss ends the node at once, as a power cut: every process of it
// (kubelet, containerd, the shims, every container) is frozen and killed
// together through its cgroup, and its connections to the API server and
// the RDS are cut. Its Lease is no longer renewed. What it had mounted goes
// with its namespaces; the loop devices it had attached stay, as a dead
// host's connections stay open on the target until they time out.
func (n *RealNode) PowerLoss(t testing.TB) {
	t.Helper()
	n.cluster.Env.TL.Logf("%s: power loss", n.Name)
	n.killAll(t)
	n.cluster.Env.TL.Logf("%s: every process of the node is gone", n.Name)
}

func (n *RealNode) killAll(t testing.TB) {
	if n.dead {
		return
	}
	n.dead = true
	n.cluster.Egress.Route(n.Name, n.IP, "")
	freezer := filepath.Join("/sys/fs/cgroup/freezer", n.Cgroup)
	if err := os.WriteFile(filepath.Join(freezer, "freezer.state"), []byte("FROZEN"), 0o644); err != nil {
		t.Errorf("%s: freezing: %v", n.Name, err)
	}
	for _, f := range n.fwds {
		f.Close()
	}
	for i := 0; i < 100; i++ {
		pids := cgroupTasks(freezer)
		if len(pids) == 0 {
			break
		}
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		_ = os.WriteFile(filepath.Join(freezer, "freezer.state"), []byte("THAWED"), 0o644)
		time.Sleep(50 * time.Millisecond)
	}
	if pids := cgroupTasks(freezer); len(pids) > 0 {
		t.Errorf("%s: processes %v survived the power loss", n.Name, pids)
	}
	for _, p := range []*Process{n.kubelet, n.containerd, n.holder} {
		if p != nil {
			p.Kill()
		}
	}
}

// cgroupTasks lists the processes in a cgroup v1 directory and below.
func cgroupTasks(dir string) []int {
	var pids []int
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		b, _ := os.ReadFile(p)
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids
}

// cleanup ends the node and removes its cgroups (deepest first).
func (n *RealNode) cleanup(t testing.TB) {
	n.killAll(t)
	for _, h := range cgroupHierarchies() {
		var dirs []string
		_ = filepath.WalkDir(filepath.Join(h, n.Cgroup), func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			_ = os.Remove(dirs[i])
		}
	}
}

// Nodes lists the cluster's nodes.
func (c *KubeletCluster) Nodes() []*RealNode {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*RealNode(nil), c.nodes...)
}

// nodeObject is a convenience for tests: the Node as the API has it.
func (n *RealNode) nodeObject(ctx context.Context) (*corev1.Node, error) {
	return n.cluster.Env.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
}

// MountInfo is the node's mount table (its mount namespace's
// /proc/<pid>/mountinfo).
func (n *RealNode) MountInfo() (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", n.holder.Pid()))
	return string(b), err
}
