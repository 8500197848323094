//go:build kubelet

package kubelet

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/srvlab/rds-csi/e2e/framework"
)

// What a user meets when the cluster is not what the chart assumes: each
// case ends in an event or a log line that names the fix.

// A node whose kernel has no nvme-tcp (this machine's: no module loaded,
// no /lib/modules to load one from), with the chart as shipped (NVMe/TCP,
// not the lab's loop connector): the node plugin still starts and
// registers, says at start that nvme-tcp is not loaded and how to load it
// at boot, and a pod's volume fails to mount with an event that says the
// same.
func TestNodeWithoutNVMeTCPSaysHowToLoadIt(t *testing.T) {
	parallelLab(t, labShort)
	if _, err := os.Stat("/sys/module/nvme_tcp"); err == nil {
		t.Skip("this kernel has nvme-tcp loaded; the test needs a node without it")
	}
	if _, err := os.Stat("/lib/modules"); err == nil {
		t.Skip("this machine has /lib/modules, from which the node plugin could load nvme-tcp into the shared kernel; the test needs a node without it")
	}
	l := NewLab(t, LabOptions{Nodes: 1, Values: []string{"node.labLoopDataDir="}})
	e := l.Env
	ns := framework.TestNamespace
	node := l.Nodes[0].Name

	const startLine = "the nvme-tcp kernel module is not loaded; load it at boot (list nvme-tcp in /etc/modules-load.d/)"
	if _, err := framework.WaitFor(e.Ctx, e.TL, time.Minute, "the node plugin's start log names nvme-tcp", func(ctx context.Context) (bool, string, error) {
		logs := nodePluginLog(ctx, l, node)
		return strings.Contains(logs, startLine), lastLines(logs, 5), nil
	}); err != nil {
		t.Fatal(err)
	}

	claim := framework.PVC(ns, "data", "rds-nvme-ext4", "64Mi", corev1.ReadWriteOnce, false)
	if _, err := e.Client.CoreV1().PersistentVolumeClaims(ns).Create(e.Ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createPod(t, l, fsPod(ns, "app", "data", false, "exec sleep 100000"))
	const eventText = "load the nvme-tcp kernel module on the node"
	if _, err := framework.WaitFor(e.Ctx, e.TL, 3*time.Minute, "a FailedMount event that names nvme-tcp", podEvent(l, ns, "app", "FailedMount", eventText)); err != nil {
		t.Fatal(err)
	}
}

// nodePluginLog is the log of the driver container of the node plugin on
// node.
func nodePluginLog(ctx context.Context, l *Lab, node string) string {
	pods, err := l.Env.Client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/component=node", FieldSelector: "spec.nodeName=" + node})
	if err != nil || len(pods.Items) == 0 {
		return ""
	}
	b, err := l.Env.Client.CoreV1().Pods(Namespace).GetLogs(pods.Items[0].Name, &corev1.PodLogOptions{Container: "rds-csi-plugin"}).DoRaw(ctx)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// podEvent holds once the pod has an event of reason whose message
// contains text.
func podEvent(l *Lab, ns, pod, reason, text string) framework.Condition {
	return func(ctx context.Context) (bool, string, error) {
		evs, err := l.Env.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
		if err != nil {
			return false, err.Error(), nil
		}
		for _, ev := range evs.Items {
			if ev.Reason == reason && strings.Contains(ev.Message, text) {
				l.Env.TL.Logf("%s/%s: %s: %s", ns, pod, ev.Reason, ev.Message)
				return true, "", nil
			}
		}
		return false, l.events(ctx, ns, pod), nil
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// A node whose kubelet keeps its root elsewhere than /var/lib/kubelet
// (here /var/lib/k0s/kubelet, as k0s has it) and the chart's default
// node.kubeletDir: the node plugin does not start, and its
// kubelet-dir-check container says, in its log and the pod's status,
// which value to set; installed with node.kubeletDir set to the
// kubelet's root, the plugin registers there.
func TestKubeletRootDirElsewhereNamesTheValueToSet(t *testing.T) {
	parallelLab(t, labShort)
	const root = "/var/lib/k0s/kubelet"
	l := NewLab(t, LabOptions{Nodes: 1, NoInstall: true, NodeOptions: framework.RealNodeOptions{KubeletRootDir: root}})
	e := l.Env
	node := l.Nodes[0].Name
	l.InstallChart(t)
	const fix = "set node.kubeletDir (Helm chart)"
	if _, err := framework.WaitFor(e.Ctx, e.TL, 3*time.Minute, "the node plugin's kubelet-dir-check names node.kubeletDir", func(ctx context.Context) (bool, string, error) {
		pods, err := e.Client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=node"})
		if err != nil || len(pods.Items) == 0 {
			return false, "no node plugin pod", nil
		}
		for _, s := range pods.Items[0].Status.InitContainerStatuses {
			for _, st := range []corev1.ContainerState{s.State, s.LastTerminationState} {
				if st.Terminated != nil && strings.Contains(st.Terminated.Message, fix) {
					e.TL.Logf("%s: %s", s.Name, strings.TrimSpace(st.Terminated.Message))
					if !strings.Contains(st.Terminated.Message, "node "+node+": /var/lib/kubelet is not the kubelet's root directory") {
						return false, "", fmt.Errorf("the message names neither the node nor the directory: %q", st.Terminated.Message)
					}
					return true, "", nil
				}
			}
		}
		return false, l.podProblems(ctx), nil
	}); err != nil {
		t.Fatal(err)
	}
	if cn, err := e.Client.StorageV1().CSINodes().Get(e.Ctx, node, metav1.GetOptions{}); err == nil && len(cn.Spec.Drivers) > 0 {
		t.Errorf("the plugin registered on %s through a directory the kubelet does not use: %v", node, cn.Spec.Drivers)
	}

	// The fix the message names.
	l.InstallChart(t, "node.kubeletDir="+root)
	l.WaitDriverReady(t)
}

var kubectlRDSBuild = framework.GoBuild{Name: "kubectl-rds", Pkg: "./cmd/kubectl-rds"}

// A chart value naming a driver image that is not there (a typo in
// image.tag): the kubelet's events name the image it cannot pull, and
// `kubectl rds check` names the value that set it.
func TestMissingImageNamesTheValueThatSetIt(t *testing.T) {
	parallelLab(t, labShort)
	l := NewLab(t, LabOptions{Nodes: 1, NoInstall: true})
	e := l.Env
	const tag = "v0.0.0-not-there"
	l.InstallChart(t, "image.tag="+tag)
	const image = "ghcr.io/srvlab/rds-csi-driver:" + tag
	if _, err := framework.WaitFor(e.Ctx, e.TL, 3*time.Minute, "the kubelet reports it cannot pull "+image, func(ctx context.Context) (bool, string, error) {
		evs, err := e.Client.CoreV1().Events(Namespace).List(ctx, metav1.ListOptions{FieldSelector: "reason=Failed"})
		if err != nil {
			return false, err.Error(), nil
		}
		for _, ev := range evs.Items {
			if strings.Contains(ev.Message, `Failed to pull image "`+image+`"`) {
				e.TL.Logf("%s: %s", ev.InvolvedObject.Name, ev.Message)
				return true, "", nil
			}
		}
		return false, l.podProblems(ctx), nil
	}); err != nil {
		t.Fatal(err)
	}
	bin := kubectlRDSBuild.Path(t, e.TL, e.Root)
	if _, err := framework.WaitFor(e.Ctx, e.TL, 2*time.Minute, "kubectl rds check names image.tag", func(ctx context.Context) (bool, string, error) {
		cmd := exec.CommandContext(ctx, bin, "--kubeconfig", e.CP.Kubeconfig, "check")
		out, _ := cmd.CombinedOutput()
		ok := strings.Contains(string(out), "DriverImageNotPulled pod/"+Namespace+"/") && strings.Contains(string(out), "set image.repository and image.tag (Helm chart)") &&
			strings.Contains(string(out), image)
		if ok {
			e.TL.Logf("kubectl rds check:\n%s", out)
		}
		return ok, string(out), nil
	}); err != nil {
		t.Fatal(err)
	}
}
