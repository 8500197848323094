//go:build kubelet

package kubelet

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/srvlab/rds-csi/e2e/framework"
)

// The storage e2e suite for external drivers (k8s.io/kubernetes'
// test/e2e/storage/external), as drivers users trust prove themselves:
// e2e.test built at the control plane's version, with the driver
// definition testdata/storage-testdriver.yaml, against the driver as the
// chart installs it on real kubelets. It runs under the ginkgo CLI (which
// spreads the specs over processes), writes a JUnit report, and this test
// fails for every spec the report says failed.

// storageSuiteFocus selects this driver's specs.
const storageSuiteFocus = `External.Storage \[Driver: rds\.csi\.srvlab\.io\]`

// storageSuiteSkip is a part of the suite the run leaves out, and why.
type storageSuiteSkip struct{ pattern, why string }

// storageSuiteSkips are the specs the run leaves out, each with the
// reason. Everything else of this driver's specs runs; specs for
// capabilities the definition does not claim, or patterns an external
// driver definition has no volumes for, skip themselves (the report and
// summary.txt name their reasons).
var storageSuiteSkips = []storageSuiteSkip{
	{`\[Feature:Windows\]|\(ntfs\)`, "Windows nodes and NTFS: the nodes are Linux"},
	{`\[Disruptive\]`, "they stop and start a node's kubelet through SSH to the node (test/e2e/storage/utils KubeletCommand); the lab's nodes have no SSH server. TestPodDeletedWhileItsNodeIsDown is this repository's version of their main case"},
	{`\[Feature:SELinux\]`, "needs SELinux on the nodes; this kernel runs without it"},
	{`\[Feature:VolumeAttributesClass\]`, "the driver has no ModifyVolume (VolumeAttributesClass)"},
	{`\[Feature:volumegroupsnapshot\]|VolumeGroupSnapshot`, "the driver has no group snapshots"},
	{`\[Feature:snapshotmetadata\]|SnapshotMetadata`, "the driver has no SnapshotMetadata service"},
	{`\[Serial\]`, "stress, scale and preemption specs that need the cluster to themselves for many minutes (volume-stress, snapshottable-stress, volume-lifecycle-performance, pvc-deletion-performance, volumeLimits, read-write-once-pod preemption, any volume data source): more than CI's 2 cores and 90 minutes leave beside the rest of make test"},
	// [Slow] specs run for xfs (its patterns are all tagged [Slow]) but
	// for multiVolume: xfs's volumes, exec and expansion specs.
	{`\[Testpattern: (Dynamic PV \((default fs|ext4|block volmode|filesystem volmode)\)|Dynamic Snapshot|Ephemeral Snapshot|Generic Ephemeral-volume|Pre-provisioned|Inline-volume|CSI Ephemeral)[^\]]*\].*\[Slow\]`,
		"49 specs of 1-5 minutes each (multiVolume, volumeIO, slow subPath and volumeMode cases, pvc data source in parallel): over half an hour more on these 2 cores; run them with " + storageSuiteSkipEnv + " (e2e/README.md)"},
	{`\(xfs\)\].*multiVolume`, "xfs's multiVolume specs, as the other patterns' (above)"},
	{`volumeMode should not mount / map unused volumes in a pod`, "it reads the node's kubelet directory through /proc/1 of the node (test/e2e/storage/utils HostExec: nsenter --mount=/rootfs/proc/1/ns/mnt); the lab's nodes share the machine's PID namespace, where PID 1 is the machine's init and sees none of a node's mounts"},
}

// storageSuiteMachineSkips are skips for what this machine cannot do.
func storageSuiteMachineSkips() []storageSuiteSkip {
	var out []storageSuiteSkip
	if !framework.HaveCapabilityInBoundingSet(24) { // CAP_SYS_RESOURCE
		out = append(out, storageSuiteSkip{
			`\((default fs|ext4)\)[^\]]*\] (volume-expand (Verify if offline PVC expansion works|should resize volume when PVC is edited)|ephemeral should support expansion of pvcs|provisioning should provision correct filesystem size when restoring snapshot to larger size pvc)`,
			"growing a mounted ext4 (NodeExpandVolume online and after an offline expansion, NodeStageVolume after a restore into a larger size) needs CAP_SYS_RESOURCE (EXT4_IOC_RESIZE_FS), which the sandbox these machines run in drops from every process, privileged containers included; the same specs run for raw block and xfs, TestFilesystemVolumesThroughTheKubelet grows a mounted xfs, and pkg/csi's node tests grow ext4 where the capability exists",
		})
	}
	return out
}

// storageSuiteExtraSkip and storageSuiteFocusEnv let a person run other
// parts of the suite by hand.
const (
	storageSuiteFocusEnv = "RDS_CSI_STORAGE_SUITE_FOCUS" // replaces the focus (regular expression)
	storageSuiteSkipEnv  = "RDS_CSI_STORAGE_SUITE_SKIP"  // replaces the skips (regular expression; "" runs everything focused)
	storageSuiteProcsEnv = "RDS_CSI_STORAGE_SUITE_PROCS" // ginkgo's --procs
)

func TestStorageSuiteOnRealKubelets(t *testing.T) {
	parallelLab(t, labLong)
	l := NewLab(t, LabOptions{NoInstall: true})
	e := l.Env
	framework.InstallSnapshotCRDs(e.Ctx, t, e.TL, e.CP)
	framework.StartSnapshotController(t, e.TL, e.CP, e.Dir)
	l.InstallChart(t, "volumeSnapshotClass.create=true")
	l.WaitDriverReady(t)

	ginkgo := filepath.Join(l.Tier.Bin, "ginkgo")
	e2eTest := filepath.Join(l.Tier.Bin, "e2e.test")
	for _, b := range []string{ginkgo, e2eTest} {
		if _, err := os.Stat(b); err != nil {
			t.Fatalf("%v: hack/build-kubelet-tier.sh builds it (ONLY=\"e2e.test ginkgo\")", err)
		}
	}
	focus := storageSuiteFocus
	if f := os.Getenv(storageSuiteFocusEnv); f != "" {
		focus = f
	}
	var skips []string
	for _, s := range append(storageSuiteSkips, storageSuiteMachineSkips()...) {
		skips = append(skips, s.pattern)
		e.TL.Logf("storage suite: skipping %s: %s", s.pattern, s.why)
	}
	skip := strings.Join(skips, "|")
	if s, ok := os.LookupEnv(storageSuiteSkipEnv); ok {
		skip = s
	}
	procs := 4
	if p, err := strconv.Atoi(os.Getenv(storageSuiteProcsEnv)); err == nil && p > 0 {
		procs = p
	}
	out := filepath.Join(e.Dir, "storage-suite")
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	report := filepath.Join(out, "junit.xml")
	args := []string{
		"--procs=" + strconv.Itoa(procs), "--focus=" + focus, "--no-color", "--timeout=60m",
		"--junit-report=junit.xml", "--output-dir=" + out, "--poll-progress-after=5m",
	}
	if skip != "" {
		args = append(args, "--skip="+skip)
	}
	args = append(args, e2eTest, "--",
		"--kubeconfig="+e.CP.Kubeconfig,
		"--provider=skeleton",
		"--repo-root="+e.Root,
		"--storage.testdriver="+filepath.Join(e.Root, "e2e", "kubelet", "testdata", "storage-testdriver.yaml"),
		"--kubectl-path="+l.Kubectl,
		"--node-os-distro=debian",
		"--report-dir="+filepath.Join(out, "report"),
		"--dump-logs-on-failure=true",
	)
	logPath := filepath.Join(out, "ginkgo.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	done := e.TL.Step(fmt.Sprintf("Kubernetes' storage suite for external drivers (%d processes, log %s)", procs, logPath))
	cmd := exec.CommandContext(e.Ctx, ginkgo, args...)
	cmd.Dir = out
	cmd.Stdout, cmd.Stderr = logf, logf
	t0 := time.Now()
	runErr := cmd.Run()
	done()
	elapsed := time.Since(t0)

	cases, err := framework.ReadJUnit(report)
	if err != nil {
		t.Fatalf("the suite wrote no usable report (%v; ginkgo: %v); see %s", err, runErr, logPath)
	}
	sum := framework.SummarizeJUnit(cases)
	var b strings.Builder
	fmt.Fprintf(&b, "Kubernetes' storage e2e suite (e2e.test %s) on real kubelets: %d passed, %d failed, %d skipped themselves, %d not selected, in %s (%d processes)\n",
		kubeVersion(t, l), sum.Passed, sum.Failed, sum.Skipped, sum.Filtered, elapsed.Round(time.Second), procs)
	fmt.Fprintf(&b, "focus: %s\nskip: %s\n", focus, skip)
	for _, c := range cases {
		if c.Status != "skipped" && c.Spec() {
			fmt.Fprintf(&b, "%-8s %6.1fs  %s\n", c.Status, c.Duration.Seconds(), c.Name)
		}
	}
	b.WriteString("skipped by the suite itself:\n")
	for _, r := range framework.SkipReasons(cases) {
		fmt.Fprintf(&b, "  %s\n", r)
	}
	if err := os.WriteFile(filepath.Join(out, "summary.txt"), []byte(b.String()), 0o644); err != nil {
		t.Error(err)
	}
	t.Log(b.String())

	for _, c := range cases {
		if c.Failed() {
			t.Errorf("storage suite: %s %s: %s\n%s", c.Status, c.Name, c.Message, firstLines(c.Detail, 15))
		}
	}
	if sum.Failed == 0 && runErr != nil {
		t.Errorf("ginkgo failed (%v) but its report lists no failure; see %s", runErr, logPath)
	}
	if focus == storageSuiteFocus && skip == strings.Join(skips, "|") {
		checkClaimsExercised(t, cases)
	}
}

// claimEvidence: for each capability the definition claims, specs of
// which at least one must pass, so that a claim the suite stopped
// exercising (a spec that skips itself, a changed name) is noticed.
var claimEvidence = map[string]string{
	"persistence":         `\(default fs\)\] volumes should store data`,
	"block":               `\(block volmode\)\] volumes should store data`,
	"xfs":                 `\(xfs\)\].*volumes should store data`,
	"exec":                `volumes should allow exec of files on the volume`,
	"fsGroup":             `fsgroupchangepolicy`,
	"snapshotDataSource":  `provisioning should provision storage with snapshot data source`,
	"pvcDataSource":       `provisioning should provision storage with pvc data source`,
	"multipods":           `ephemeral should support two pods which have the same volume definition`,
	"controllerExpansion": `volume-expand Verify if offline PVC expansion works`,
	"onlineExpansion":     `volume-expand should resize volume when PVC is edited while pod is using it`,
	"topology":            `topology should provision a volume and schedule a pod with AllowedTopologies`,
	"readWriteOncePod":    `read-write-once-pod should block a second pod`,
	"capReadOnlyMany":     `\(ROX mode\)`,
	"multiplePVsSameID":   `should mount multiple PV pointing to the same storage on the same node`,
	"mount options":       `provisioning should provision storage with mount options`,
}

func checkClaimsExercised(t *testing.T, cases []framework.JUnitCase) {
	t.Helper()
	for claim, pattern := range claimEvidence {
		re := regexp.MustCompile(pattern)
		passed := 0
		for _, c := range cases {
			if c.Status == "passed" && re.MatchString(c.Name) {
				passed++
			}
		}
		if passed == 0 {
			t.Errorf("the definition claims %s, but no spec matching %q passed", claim, pattern)
		}
	}
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = append(lines[:n], "...")
	}
	return strings.Join(lines, "\n")
}

// kubeVersion is the kube-apiserver's version.
func kubeVersion(t *testing.T, l *Lab) string {
	v, err := l.Env.Client.Discovery().ServerVersion()
	if err != nil {
		t.Logf("server version: %v", err)
		return "?"
	}
	return v.GitVersion
}
