package framework

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// ScaleSpec is how many objects a scale scenario puts in the API before
// the driver starts.
type ScaleSpec struct {
	PVs   int // PersistentVolumes of this driver
	Nodes int
	// Every PV gets a VolumeAttachment (attached) to node i%Nodes; every
	// ClaimEvery-th PV also carries the driver's claims annotation naming
	// that node (0: none), as PVs published by this driver do, the others
	// as PVs attached before the driver kept claims.
	ClaimEvery int
	// Every RWXBlockEvery-th PV is a raw-block ReadWriteMany volume (0:
	// none), the others filesystem ReadWriteOnce.
	RWXBlockEvery int
}

// FullScale is scenario 7 of issue 7: 10k PVs and VolumeAttachments, 1k
// Nodes.
var FullScale = ScaleSpec{PVs: 10000, Nodes: 1000, ClaimEvery: 4, RWXBlockEvery: 10}

// ScaleFromEnv is FullScale with RDS_CSI_E2E_SCALE=full, else a tenth of
// it (what make test runs).
func ScaleFromEnv() (ScaleSpec, string) {
	if os.Getenv("RDS_CSI_E2E_SCALE") == "full" {
		return FullScale, "full"
	}
	s := FullScale
	s.PVs, s.Nodes = s.PVs/10, s.Nodes/10
	return s, "1/10 (RDS_CSI_E2E_SCALE=full for 10k)"
}

// ScaleClaimsAnnotation is the driver's claims annotation on a PV.
const ScaleClaimsAnnotation = "rds.csi.srvlab.io/claims"

// ScalePVName is the i-th PV's name and volume handle: a pvc-<uuid> name
// the driver accepts as a volume ID.
func ScalePVName(i int) string { return fmt.Sprintf("pvc-%08x-5ca1-4e00-8000-%012x", i, i) }

// ScaleNodeName is the i-th node's name.
func ScaleNodeName(i int) string { return fmt.Sprintf("scale-node-%04d", i) }

// ScaleCreated is how long each kind took to create.
type ScaleCreated struct {
	Nodes, PVs, Attachments time.Duration
	Requests                int64 // API calls made
}

// Total is the whole creation time.
func (s ScaleCreated) Total() time.Duration { return s.Nodes + s.PVs + s.Attachments }

// CreateScaleObjects creates spec's Nodes, PVs and VolumeAttachments (each
// attachment with a create and a status update) through cfg, with workers
// concurrent requests and client-side rate limiting lifted.
func CreateScaleObjects(ctx context.Context, tl *Timeline, cfg *rest.Config, spec ScaleSpec, workers int) (ScaleCreated, error) {
	fast := rest.CopyConfig(cfg)
	fast.QPS, fast.Burst = 1e5, 1e5
	fast.UserAgent = "rds-csi-e2e-scale"
	c, err := kubernetes.NewForConfig(fast)
	if err != nil {
		return ScaleCreated{}, err
	}
	var out ScaleCreated
	var requests atomic.Int64
	step := func(what string, n int, took *time.Duration, create func(ctx context.Context, i int) error) error {
		t0 := time.Now()
		err := parallel(ctx, n, workers, func(ctx context.Context, i int) error {
			return create(ctx, i)
		})
		*took = time.Since(t0)
		if err != nil {
			return fmt.Errorf("creating %s: %w", what, err)
		}
		tl.Logf("created %d %s in %s (%.0f/s, %d workers)", n, what, took.Round(time.Millisecond), float64(n)/took.Seconds(), workers)
		return nil
	}
	now := metav1.Now()
	err = step("Nodes", spec.Nodes, &out.Nodes, func(ctx context.Context, i int) error {
		requests.Add(1)
		_, err := c.CoreV1().Nodes().Create(ctx, scaleNode(ScaleNodeName(i), now), metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return out, err
	}
	err = step("PersistentVolumes", spec.PVs, &out.PVs, func(ctx context.Context, i int) error {
		requests.Add(1)
		_, err := c.CoreV1().PersistentVolumes().Create(ctx, scalePV(spec, i, now.Time), metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return out, err
	}
	err = step("VolumeAttachments (create + attached status)", spec.PVs, &out.Attachments, func(ctx context.Context, i int) error {
		requests.Add(2)
		va, err := c.StorageV1().VolumeAttachments().Create(ctx, scaleVA(spec, i), metav1.CreateOptions{})
		if err != nil {
			return err
		}
		va.Status = storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: map[string]string{
			"nqn": "nqn.2000-02.com.mikrotik:" + ScalePVName(i), "nvmeAddress": "127.0.0.1", "nvmePort": "4420",
		}}
		_, err = c.StorageV1().VolumeAttachments().UpdateStatus(ctx, va, metav1.UpdateOptions{})
		return err
	})
	out.Requests = requests.Load()
	return out, err
}

// parallel runs f(0..n-1) on workers goroutines and returns the first
// error (the remaining items are skipped after it).
func parallel(ctx context.Context, n, workers int, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	items := make(chan int)
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range items {
				if err := f(ctx, i); err != nil {
					once.Do(func() { first = fmt.Errorf("item %d: %w", i, err); cancel() })
				}
			}
		}()
	}
feed:
	for i := range n {
		select {
		case items <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(items)
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		// Only the parent context can have ended here.
		first = ctx.Err()
	}
	return first
}

func scaleNode(name string, now metav1.Time) *corev1.Node {
	// Nodes keep their status on create (a kubelet registers this way).
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: name,
			Labels: map[string]string{
				corev1.LabelHostname: name, corev1.LabelOSStable: "linux", corev1.LabelArchStable: "amd64", TopologyKey: RDSName,
			},
			Annotations: map[string]string{ControllerManagedAttachAnnotation: "true"},
		},
		Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{{
				Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
				Message: "scale node of the rds-csi e2e harness", LastHeartbeatTime: now, LastTransitionTime: now,
			}},
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: name}},
			Capacity:  corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi"), corev1.ResourcePods: resource.MustParse("110")},
			NodeInfo:  corev1.NodeSystemInfo{KubeletVersion: fakeKubeletVersion, OperatingSystem: "linux", Architecture: "amd64"},
		},
	}
}

func scalePV(spec ScaleSpec, i int, now time.Time) *corev1.PersistentVolume {
	name := ScalePVName(i)
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{"pv.kubernetes.io/provisioned-by": DriverName},
		},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("10Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              "rds-scale",
			VolumeMode:                    ptr.To(corev1.PersistentVolumeFilesystem),
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: DriverName, VolumeHandle: name, FSType: "ext4",
				VolumeAttributes: map[string]string{"nqn": "nqn.2000-02.com.mikrotik:" + name, "nvmeAddress": "127.0.0.1", "nvmePort": "4420"},
			}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{RDSName}}},
			}}}},
		},
	}
	if spec.RWXBlockEvery > 0 && i%spec.RWXBlockEvery == 0 {
		pv.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}
		pv.Spec.VolumeMode = ptr.To(corev1.PersistentVolumeBlock)
		pv.Spec.CSI.FSType = ""
	}
	if spec.ClaimEvery > 0 && i%spec.ClaimEvery == 0 {
		b, _ := json.Marshal(map[string]time.Time{ScaleNodeName(i % spec.Nodes): now.UTC().Truncate(time.Second)})
		pv.Annotations[ScaleClaimsAnnotation] = string(b)
	}
	return pv
}

func scaleVA(spec ScaleSpec, i int) *storagev1.VolumeAttachment {
	return &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("scale-va-%05d", i)},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: DriverName,
			NodeName: ScaleNodeName(i % spec.Nodes),
			Source:   storagev1.VolumeAttachmentSource{PersistentVolumeName: ptr.To(ScalePVName(i))},
		},
	}
}

var plainDriver = GoBuild{Name: "rds-csi-driver-plain", Flags: versionFlag, Pkg: "./cmd/rds-csi-driver"}

// BuildPlainDriver builds cmd/rds-csi-driver without the race detector
// (whose shadow memory would swamp an RSS measurement) into .cache/e2e/,
// once per test binary.
func BuildPlainDriver(tb testing.TB, tl *Timeline, root string) string {
	tb.Helper()
	return plainDriver.Path(tb, tl, root)
}

// ProcMemory is a process's resident memory from /proc/<pid>/status.
type ProcMemory struct {
	RSS, PeakRSS int64 // VmRSS, VmHWM in bytes
}

// ReadProcMemory reads VmRSS and VmHWM of pid.
func ReadProcMemory(pid int) (ProcMemory, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ProcMemory{}, err
	}
	defer f.Close()
	var m ProcMemory
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		key, value, ok := strings.Cut(sc.Text(), ":")
		if !ok || (key != "VmRSS" && key != "VmHWM") {
			continue
		}
		fields := strings.Fields(value) // "123456 kB"
		if len(fields) != 2 || fields[1] != "kB" {
			return m, fmt.Errorf("/proc/%d/status: %s: unexpected %q", pid, key, value)
		}
		kb, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return m, err
		}
		if key == "VmRSS" {
			m.RSS = kb << 10
		} else {
			m.PeakRSS = kb << 10
		}
	}
	if err := sc.Err(); err != nil {
		return m, err
	}
	if m.RSS == 0 {
		return m, fmt.Errorf("/proc/%d/status has no VmRSS (a zombie?)", pid)
	}
	return m, nil
}

// ReadProcCPU reads the CPU time pid has used so far (user and system,
// utime and stime of /proc/<pid>/stat, in clock ticks of 1/100 s: USER_HZ
// is 100 on every Linux architecture this runs on).
func ReadProcCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	d, err := parseProcStatCPU(b)
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return d, nil
}

func parseProcStatCPU(b []byte) (time.Duration, error) {
	// The command name (field 2) may hold spaces and parentheses: count
	// from its last ")".
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("no command name in %q", b)
	}
	fields := strings.Fields(string(b[i+1:]))
	if len(fields) < 13 {
		return 0, fmt.Errorf("%d fields after the command name, want 13 or more", len(fields))
	}
	var ticks int64
	for _, f := range fields[11:13] { // fields 14 and 15: utime, stime
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, err
		}
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond, nil
}

// MiB formats bytes as MiB.
func MiB(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
