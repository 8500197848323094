//go:build kubelet

package kubelet

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/srvlab/rds-csi/e2e/framework"
)

// A filesystem volume in a pod, through the kubelet's own calls, with the
// chart as installed: it grows while mounted (the kubelet's
// NodeExpandVolume), the kubelet reports its use in its metrics
// (NodeGetVolumeStats), a pod's fsGroup owns it, and a read-only mount
// refuses writes.
func TestFilesystemVolumesThroughTheKubelet(t *testing.T) {
	parallelLab(t, labShort)
	l := NewLab(t, LabOptions{Nodes: 1})
	e := l.Env
	ns := framework.TestNamespace
	node := l.Nodes[0]
	// A class of the user's, for xfs: growing a mounted ext4 needs
	// CAP_SYS_RESOURCE, which some sandboxes (these machines') take from
	// every process; xfs grows with CAP_SYS_ADMIN.
	fs := "xfs"
	if framework.HaveCapabilityInBoundingSet(24) {
		fs = "ext4"
	}
	class := framework.StorageClass("lab-"+fs, map[string]string{"csi.storage.k8s.io/fstype": fs})
	if _, err := e.Client.StorageV1().StorageClasses().Create(e.Ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	claim := framework.PVC(ns, "data", class.Name, "512Mi", corev1.ReadWriteOnce, false)
	if _, err := e.Client.CoreV1().PersistentVolumeClaims(ns).Create(e.Ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const gid = 4321
	pod := fsPod(ns, "app", "data", false, "touch /data/by-app && exec sleep 100000")
	pod.Spec.SecurityContext = &corev1.PodSecurityContext{
		RunAsUser: ptrTo(int64(1000)), RunAsGroup: ptrTo(int64(1000)), FSGroup: ptrTo(int64(gid)),
	}
	createPod(t, l, pod)
	l.WaitPodReady(t, ns, "app", 5*time.Minute)
	pv := boundPV(t, l, ns, "data")

	t.Run("fsGroup owns the volume: a non-root user writes, new files get the group", func(t *testing.T) {
		out, err := l.Exec(ns, "app", "sh", "-c", "id -u; stat -c '%g %A' /data; stat -c %g /data/by-app")
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		f := strings.Fields(out)
		if len(f) != 4 || f[0] != "1000" || f[1] != strconv.Itoa(gid) || f[3] != strconv.Itoa(gid) || !strings.Contains(f[2], "s") {
			t.Errorf("uid, the volume root's group and mode, a new file's group: %q; want 1000, %d with setgid, %d", out, gid, gid)
		}
	})

	t.Run("kubelet_volume_stats in the kubelet's metrics follow a write", func(t *testing.T) {
		// The kubelet samples volumes every volumeStatsAggPeriod (5 s here).
		before := waitVolumeStat(t, l, node, "kubelet_volume_stats_used_bytes", "data", "the kubelet reports the claim's use", func(float64) bool { return true })
		if _, err := l.Exec(ns, "app", "sh", "-c", "dd if=/dev/zero of=/data/fill bs=1M count=64 conv=fsync 2>/dev/null"); err != nil {
			t.Fatal(err)
		}
		waitVolumeStat(t, l, node, "kubelet_volume_stats_used_bytes", "data", "kubelet_volume_stats_used_bytes grows by the 64 MiB written",
			func(v float64) bool { return v >= before+60<<20 })
		for _, m := range []string{"kubelet_volume_stats_capacity_bytes", "kubelet_volume_stats_available_bytes", "kubelet_volume_stats_inodes", "kubelet_volume_stats_inodes_used"} {
			waitVolumeStat(t, l, node, m, "data", m+" reported", func(v float64) bool { return v > 0 })
		}
	})

	t.Run("online expansion: the kubelet's NodeExpandVolume grows the mounted filesystem", func(t *testing.T) {
		before := dfBytes(t, l, ns, "app")
		patch := []byte(`{"spec":{"resources":{"requests":{"storage":"1536Mi"}}}}`)
		if _, err := e.Client.CoreV1().PersistentVolumeClaims(ns).Patch(e.Ctx, "data", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		want := resource.MustParse("1536Mi")
		if _, err := framework.WaitFor(e.Ctx, e.TL, 3*time.Minute, "the claim's capacity 1536Mi with no resize pending", func(ctx context.Context) (bool, string, error) {
			c, err := e.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
			if err != nil {
				return false, err.Error(), nil
			}
			got := c.Status.Capacity[corev1.ResourceStorage]
			return got.Cmp(want) >= 0 && len(c.Status.Conditions) == 0,
				fmt.Sprintf("capacity %s, conditions %v; events %s", got.String(), c.Status.Conditions, l.events(ctx, ns, "app")), nil
		}); err != nil {
			t.Fatal(err)
		}
		after := dfBytes(t, l, ns, "app")
		if after <= before || after < want.Value()*9/10 {
			t.Errorf("the pod's filesystem has %d bytes after growing to %s, %d before", after, want.String(), before)
		}
		if _, err := l.Exec(ns, "app", "ls", "/data/fill"); err != nil {
			t.Errorf("the data written before the expansion: %v", err)
		}
		waitVolumeStat(t, l, node, "kubelet_volume_stats_capacity_bytes", "data", "kubelet_volume_stats_capacity_bytes follows the expansion",
			func(v float64) bool { return v >= float64(want.Value())*0.9 })
	})

	t.Run("a read-only mount refuses writes and reads the data", func(t *testing.T) {
		deletePod(t, l, ns, "app")
		ro := fsPod(ns, "reader", "data", true, "exec sleep 100000")
		createPod(t, l, ro)
		l.WaitPodReady(t, ns, "reader", 5*time.Minute)
		if out, err := l.Exec(ns, "reader", "sh", "-c", "echo x > /data/new"); err == nil || !strings.Contains(out, "Read-only file system") {
			t.Errorf("a write on the read-only mount: %v %q, want Read-only file system", err, out)
		}
		if out, err := l.Exec(ns, "reader", "ls", "/data/by-app", "/data/fill"); err != nil {
			t.Errorf("reading the volume read-only: %v %s", err, out)
		}
		deletePod(t, l, ns, "reader")
	})
	_ = pv
}

// fsPod is a busybox pod with claim mounted at /data (read-only through
// the pod's volume source when readOnly), running script.
func fsPod(ns, name, claim string, readOnly bool, script string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptrTo(int64(5)),
			Containers: []corev1.Container{{
				Name: "app", Image: busybox, Command: []string{"sh", "-c", script},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim, ReadOnly: readOnly}}}},
		},
	}
}

// dfBytes is the size of the filesystem at /data in a pod.
func dfBytes(t *testing.T, l *Lab, ns, pod string) int64 {
	t.Helper()
	out, err := l.Exec(ns, pod, "sh", "-c", "stat -f -c '%b %S' /data")
	if err != nil {
		t.Fatalf("stat -f in %s: %v %s", pod, err, out)
	}
	var blocks, size int64
	if _, err := fmt.Sscan(out, &blocks, &size); err != nil {
		t.Fatalf("stat -f: %q: %v", out, err)
	}
	return blocks * size
}

// volumeStat is a kubelet_volume_stats_* sample of a claim in the test
// namespace, from the kubelet's /metrics as Prometheus scrapes it: HTTPS
// to the node's address, port 10250, with a client certificate the
// kubelet authenticates and authorizes (nodes/metrics); ok is false while
// the kubelet has none.
func volumeStat(ctx context.Context, l *Lab, node *framework.RealNode, metric, claim string) (v float64, ok bool, err error) {
	b, err := kubeletMetrics(ctx, l, node)
	if err != nil {
		return 0, false, err
	}
	re := regexp.MustCompile(`(?m)^` + metric + `\{([^}]*)\} (\S+)$`)
	for _, m := range re.FindAllStringSubmatch(b, -1) {
		if strings.Contains(m[1], `namespace="`+framework.TestNamespace+`"`) && strings.Contains(m[1], `persistentvolumeclaim="`+claim+`"`) {
			v, err := strconv.ParseFloat(m[2], 64)
			return v, err == nil, err
		}
	}
	return 0, false, nil
}

// kubeletMetrics is the kubelet's /metrics, fetched from inside the node's
// network namespace with the admin's client certificate.
func kubeletMetrics(ctx context.Context, l *Lab, node *framework.RealNode) (string, error) {
	env := l.Env.CP.Env
	cert, err := tls.LoadX509KeyPair(env["KUBE_ADMIN_CERT"], env["KUBE_ADMIN_KEY"])
	if err != nil {
		return "", err
	}
	ca, err := os.ReadFile(env["KUBE_CA_FILE"])
	if err != nil {
		return "", err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool},
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return framework.DialInNetns(ctx, node.NetNS(), addr)
		},
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+net.JoinHostPort(node.IP, "10250")+"/metrics", nil)
	if err != nil {
		return "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", fmt.Errorf("the kubelet's metrics on %s: %w", node.Name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("the kubelet's metrics on %s: %s: %s", node.Name, resp.Status, body)
	}
	return string(body), err
}

// waitVolumeStat waits until the kubelet reports metric for claim and
// cond holds for its value.
func waitVolumeStat(t *testing.T, l *Lab, node *framework.RealNode, metric, claim, what string, cond func(float64) bool) float64 {
	t.Helper()
	var v float64
	if _, err := framework.WaitFor(l.Env.Ctx, l.Env.TL, 2*time.Minute, what, func(ctx context.Context) (bool, string, error) {
		got, ok, err := volumeStat(ctx, l, node, metric, claim)
		if err != nil {
			return false, err.Error(), nil
		}
		if !ok {
			return false, "no " + metric + " for " + claim + " yet", nil
		}
		v = got
		return cond(got), fmt.Sprintf("%s = %.0f", metric, got), nil
	}); err != nil {
		t.Fatal(err)
	}
	return v
}
