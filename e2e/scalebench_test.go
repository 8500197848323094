//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/srvlab/rds-csi/e2e/framework"
)

// The controller's start-up at scale, as a benchmark (issue 24): it runs
// only with RDS_CSI_E2E_BENCH=1, as `make bench-scale` sets it. For each
// size in RDS_CSI_E2E_BENCH_SCALES (default "10k 100k") one control plane
// is filled once (the PVs, their attached VolumeAttachments, the Nodes,
// and a few bad objects of each kind in badKinds), then the driver is
// started RDS_CSI_E2E_BENCH_RUNS times (default 3) on each initial sync
// path of RDS_CSI_E2E_BENCH_PATHS (default "watch-list list": as the API
// server offers it, then with KUBE_FEATURE_WatchListClient=false;
// "watch-list-json" streams in JSON instead of protobuf), one
// after the other, the paths taking turns so that the machine's load
// falls on both alike; each start is measured from exec:
//
//   - ready: CSI Probe ready (polled every 100 ms), and the driver's own
//     "attachment index synced" log line (to the microsecond);
//   - the CPU time the driver has used at ready (user and system), and
//     kube-apiserver's from exec to ready: who the start waits on;
//   - the driver's VmRSS and VmHWM at ready and once the index gauges
//     count every good object; kube-apiserver's VmRSS beside them;
//   - the live heap after the first GC that follows indexing (from the
//     GC's goal, go_memstats_next_gc_bytes; see liveHeap), per attached
//     volume;
//   - the initial sync path the driver logged (watch-list or list), and
//     how many LISTs of PVs, VolumeAttachments and Nodes kube-apiserver
//     served meanwhile (0 when the informers streamed);
//   - the objects the driver skipped as unreadable, by kind and reason
//     (rds_csi_malformed_objects), and its "syncing attachment index"
//     errors in the log (a retried object logs one per retry);
//   - the machine's 1-minute load average at the start (the machine is
//     shared: the times scale with it).
//
// The result is a markdown table on stdout (lines starting with "|") and
// in <artifacts>/scale-bench.md; docs/BENCHMARKS.md records it.
func TestScaleStartBench(t *testing.T) {
	if os.Getenv("RDS_CSI_E2E_BENCH") != "1" {
		t.Skip("a measurement: set RDS_CSI_E2E_BENCH=1 (make bench-scale)")
	}
	scales := strings.Fields(os.Getenv("RDS_CSI_E2E_BENCH_SCALES"))
	if len(scales) == 0 {
		scales = []string{"10k", "100k"}
	}
	paths := strings.Fields(os.Getenv("RDS_CSI_E2E_BENCH_PATHS"))
	if len(paths) == 0 {
		paths = []string{syncWatchList, syncList}
	}
	for _, p := range paths {
		if p != syncWatchList && p != syncList && p != syncWatchListJSON {
			t.Fatalf("RDS_CSI_E2E_BENCH_PATHS: unknown path %q (watch-list, list, watch-list-json)", p)
		}
	}
	runs := 3
	if s := os.Getenv("RDS_CSI_E2E_BENCH_RUNS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("RDS_CSI_E2E_BENCH_RUNS=%q: want a count of at least 1", s)
		}
		runs = n
	}
	for _, name := range scales {
		spec, ok := benchScales[name]
		if !ok {
			t.Fatalf("RDS_CSI_E2E_BENCH_SCALES: unknown size %q (known: 1k, 10k, 100k)", name)
		}
		t.Run(name, func(t *testing.T) { benchScaleStart(t, name, spec, paths, runs) })
	}
}

// benchScales are the sizes of issue 24's table.
var benchScales = map[string]framework.ScaleSpec{
	"1k":   {PVs: 1000, Nodes: 100, ClaimEvery: framework.FullScale.ClaimEvery, RWXBlockEvery: framework.FullScale.RWXBlockEvery}, // a smoke run
	"10k":  framework.FullScale,
	"100k": {PVs: 100000, Nodes: 5000, ClaimEvery: framework.FullScale.ClaimEvery, RWXBlockEvery: framework.FullScale.RWXBlockEvery},
}

// The initial sync paths a run asks for.
const (
	syncWatchList = "watch-list" // as the API server offers it
	syncList      = "list"       // KUBE_FEATURE_WatchListClient=false
	// As the API server offers it, in JSON (--kube-api-content-type), the
	// encoding before protobuf became the default.
	syncWatchListJSON = "watch-list-json"
)

// startRun is one driver start.
type startRun struct {
	load                   float64       // 1-minute load average at the start
	path                   string        // the initial sync path the driver logged
	lists                  float64       // LISTs of PVs, VAs and Nodes kube-apiserver served during the start
	probeReady, logReady   time.Duration // exec to Probe ready; to "attachment index synced"
	ready, indexed         framework.ProcMemory
	apiReady, apiIndexed   framework.ProcMemory // kube-apiserver
	cpuReady, apiCPU       time.Duration        // the driver's CPU time at ready; kube-apiserver's from exec to ready
	heapLive, heapInuse    float64
	malformed              map[string]float64 // rds_csi_malformed_objects by kind/reason; nil: no such metric
	syncErrors             int                // "syncing attachment index" errors logged
	indexedVols, indexedVA float64
}

func benchScaleStart(t *testing.T, name string, spec framework.ScaleSpec, paths []string, runs int) {
	e := newScaleEnv(t, "", 10*time.Minute)
	ctx, tl := e.Ctx, e.TL
	sim := e.StartSim(framework.SimOptions{})
	dep := framework.Deploy(ctx, t, tl, e.CP, e.Dir)
	bin := framework.BuildPlainDriver(t, tl, e.Root)
	etcdVersion := etcdServerVersion(ctx, e.CP.Env["ETCD_ENDPOINT"])

	done := tl.Step(fmt.Sprintf("create %d Nodes, %d PVs and %d attached VolumeAttachments", spec.Nodes, spec.PVs, spec.PVs))
	created, err := framework.CreateScaleObjects(ctx, tl, e.CP.Config, spec, 32)
	if err != nil {
		t.Fatal(err)
	}
	done()
	done = tl.Step("create the bad objects")
	bad, err := createBadObjects(ctx, e.CP.Client, spec)
	if err != nil {
		t.Fatal(err)
	}
	done()
	tl.Logf("scale %s: objects created in %s (%d requests), %d bad objects (%s); etcd %s",
		name, created.Total().Round(time.Second), created.Requests, bad.total(), bad, etcdVersion)

	results := map[string][]startRun{}
	for r := 1; r <= runs; r++ {
		for _, path := range paths {
			done := tl.Step(fmt.Sprintf("driver start %d of %d, %s", r, runs, path))
			results[path] = append(results[path], measureStart(t, e, sim, dep, bin, spec, path, r))
			done()
		}
	}
	var table string
	for _, path := range paths {
		table += scaleTable(name, path, spec, bad, etcdVersion, results[path])
	}
	fmt.Print(table)
	if err := os.WriteFile(filepath.Join(e.Dir, "scale-bench.md"), []byte(table), 0o644); err != nil {
		t.Error(err)
	}
	t.Log("\n" + table)
}

// measureStart starts the driver once against the filled API, measures
// it and stops it again.
func measureStart(t *testing.T, e *framework.Env, sim *framework.Sim, dep *framework.Deployment, bin string, spec framework.ScaleSpec, path string, run int) startRun {
	ctx, tl := e.Ctx, e.TL
	port, err := framework.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := "http://127.0.0.1:" + strconv.Itoa(port)
	apiPid := apiserverPid(t, e.CP)
	listsBefore, err := apiserverInformerLists(ctx, e.CP.Client)
	if err != nil {
		t.Fatal(err)
	}
	var out startRun
	out.load = loadAverage()
	// The driver inherits the variable (client-go reads it at start).
	if path == syncList {
		t.Setenv("KUBE_FEATURE_WatchListClient", "false")
	}
	args := []string{"--http-endpoint=127.0.0.1:" + strconv.Itoa(port), "--v=2"}
	if path == syncWatchListJSON {
		args = append(args, "--kube-api-content-type=application/json")
	}
	apiCPU0, err := framework.ReadProcCPU(apiPid)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	d := framework.StartDriver(t, tl, bin, e.Dir, sim, dep, framework.DriverOptions{
		Name:      fmt.Sprintf("rds-csi-driver-%s-%d", path, run),
		ExtraArgs: args,
	})
	out.probeReady = time.Since(t0)
	os.Unsetenv("KUBE_FEATURE_WatchListClient")
	if out.ready, err = framework.ReadProcMemory(d.Pid()); err != nil {
		t.Fatal(err)
	}
	if out.apiReady, err = framework.ReadProcMemory(apiPid); err != nil {
		t.Fatal(err)
	}
	if out.cpuReady, err = framework.ReadProcCPU(d.Pid()); err != nil {
		t.Fatal(err)
	}
	apiCPU1, err := framework.ReadProcCPU(apiPid)
	if err != nil {
		t.Fatal(err)
	}
	out.apiCPU = apiCPU1 - apiCPU0
	// Every good object indexed (the bad ones may or may not count).
	metrics := addr + "/metrics"
	size, err := waitIndexed(ctx, tl, metrics, 2*time.Minute, spec, false)
	if err != nil {
		t.Fatal(err)
	}
	out.indexedVols, out.indexedVA = size.volumes, size.attachments
	indexedAt := time.Now()
	if out.indexed, err = framework.ReadProcMemory(d.Pid()); err != nil {
		t.Fatal(err)
	}
	if out.apiIndexed, err = framework.ReadProcMemory(apiPid); err != nil {
		t.Fatal(err)
	}
	listsAfter, err := apiserverInformerLists(ctx, e.CP.Client)
	if err != nil {
		t.Fatal(err)
	}
	out.lists = listsAfter - listsBefore
	// The runtime forces a GC at least every 2 minutes: the first one
	// after indexing sees the settled live set.
	if _, err := framework.WaitFor(ctx, tl, 150*time.Second, "a GC after indexing", func(ctx context.Context) (bool, string, error) {
		last, err := framework.ScrapeMetric(ctx, metrics, "go_memstats_last_gc_time_seconds")
		if err != nil {
			return false, err.Error(), nil
		}
		return last > float64(indexedAt.UnixNano())/1e9, fmt.Sprintf("last GC at %s", time.Unix(0, int64(last*1e9)).UTC().Format(time.TimeOnly)), nil
	}); err != nil {
		t.Fatal(err)
	}
	fams, err := scrapeMetrics(ctx, metrics)
	if err != nil {
		t.Fatal(err)
	}
	out.heapLive, out.heapInuse = liveHeap(fams), familySum(fams["go_memstats_heap_inuse_bytes"], nil)
	if f := fams["rds_csi_malformed_objects"]; f != nil {
		out.malformed = map[string]float64{}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			out.malformed[labels["kind"]+"/"+labels["reason"]] += m.GetGauge().GetValue()
		}
	}
	if err := d.Stop(15 * time.Second); err != nil {
		t.Error(err)
	}
	log, err := os.ReadFile(d.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	out.path = loggedSyncPath(string(log))
	out.syncErrors = strings.Count(string(log), `"syncing attachment index"`)
	if ts, ok := logInterval(string(log), "attachment index synced"); ok {
		out.logReady = ts
	}
	tl.Logf("run %d (%s): %s, %g LISTs; Probe ready %s, index synced %s; RSS at ready %s (HWM %s), indexed %s (HWM %s); live heap %s; kube-apiserver %s",
		run, path, out.path, out.lists, out.probeReady.Round(time.Millisecond), out.logReady.Round(time.Millisecond),
		framework.MiB(out.ready.RSS), framework.MiB(out.ready.PeakRSS), framework.MiB(out.indexed.RSS), framework.MiB(out.indexed.PeakRSS),
		framework.MiB(int64(out.heapLive)), framework.MiB(out.apiIndexed.RSS))
	return out
}

// loadAverage is the machine's 1-minute load average (0 if unreadable).
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// liveHeap is the heap that survived the last GC, from the goal that GC
// set: goal = live + (live + stacks + globals) * GOGC/100 (Go 1.21+), so
// live = (goal - stacks*GOGC/100) / (1 + GOGC/100); the globals (well
// under 1 MiB here) are left in, so this errs high by half of them.
func liveHeap(fams map[string]*dto.MetricFamily) float64 {
	g := 1.0
	if p := familySum(fams["go_gc_gogc_percent"], nil); p > 0 {
		g = p / 100
	}
	return (familySum(fams["go_memstats_next_gc_bytes"], nil) - familySum(fams["go_memstats_stack_inuse_bytes"], nil)*g) / (1 + g)
}

// familySum adds up the values of a metric family's series whose labels
// match (nil: every series); 0 for a family that is not there.
func familySum(f *dto.MetricFamily, match func(labels map[string]string) bool) float64 {
	if f == nil {
		return 0
	}
	var sum float64
	for _, m := range f.GetMetric() {
		if match != nil {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if !match(labels) {
				continue
			}
		}
		switch {
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		case m.GetUntyped() != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum
}

// apiserverInformerLists is how many LISTs of the resources the driver's
// informers read kube-apiserver has served (apiserver_request_total).
func apiserverInformerLists(ctx context.Context, c kubernetes.Interface) (float64, error) {
	raw, err := c.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return 0, fmt.Errorf("kube-apiserver /metrics: %w", err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		return 0, fmt.Errorf("kube-apiserver /metrics: %w", err)
	}
	return familySum(fams["apiserver_request_total"], func(l map[string]string) bool {
		return l["verb"] == "LIST" && slices.Contains([]string{"persistentvolumes", "volumeattachments", "nodes"}, l["resource"])
	}), nil
}

func apiserverPid(t *testing.T, cp *framework.ControlPlane) int {
	b, err := os.ReadFile(filepath.Join(cp.Dir, "pids", "kube-apiserver.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// etcdServerVersion is what etcd's /version says, or why not.
func etcdServerVersion(ctx context.Context, endpoint string) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint+"/version", nil)
	if err != nil {
		return err.Error()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	var v struct {
		Server string `json:"etcdserver"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return err.Error()
	}
	return v.Server
}

var syncPathRE = regexp.MustCompile(`Informers' initial sync.*\bpath="([^"]+)"`)

// loggedSyncPath is the initial sync path the driver logged (watchlist.go).
func loggedSyncPath(log string) string {
	if m := syncPathRE.FindStringSubmatch(log); m != nil {
		return m[1]
	}
	return "not logged"
}

// logInterval is the time from the process's start line (framework's
// "==== <RFC 3339> start") to the first klog line containing msg.
func logInterval(log, msg string) (time.Duration, bool) {
	var start time.Time
	for line := range strings.Lines(log) {
		if rest, ok := strings.CutPrefix(line, "==== "); ok && start.IsZero() {
			ts, _, _ := strings.Cut(rest, " ")
			if t, err := time.Parse(time.RFC3339Nano, ts); err == nil {
				start = t
			}
			continue
		}
		if start.IsZero() || !strings.Contains(line, msg) || len(line) < 21 {
			continue
		}
		// klog: "I1126 01:02:03.456789 ..." in local time, no year.
		t, err := time.ParseInLocation("0102 15:04:05.000000", line[1:21], time.Local)
		if err != nil {
			continue
		}
		t = t.AddDate(start.In(time.Local).Year(), 0, 0)
		return t.Sub(start), true
	}
	return 0, false
}

// badKinds are the objects at scale the driver must skip, or index as
// what they are, without being held up by them.
var badKinds = []string{"malformed claims annotation", "claims naming no time", "another driver's PV and VA", "VA of a PV that does not exist", "PV without volume attributes"}

// badObjects counts what createBadObjects made, per kind.
type badObjects map[string]int

func (b badObjects) total() int {
	n := 0
	for _, v := range b {
		n += v
	}
	return n
}

func (b badObjects) String() string {
	var parts []string
	for _, k := range badKinds {
		parts = append(parts, fmt.Sprintf("%d %s", b[k], k))
	}
	return strings.Join(parts, ", ")
}

// createBadObjects adds, for each kind of badKinds, one object per 500
// good PVs (at least one): 20 at 10k, 200 at 100k, each kind.
func createBadObjects(ctx context.Context, c kubernetes.Interface, spec framework.ScaleSpec) (badObjects, error) {
	n := max(spec.PVs/500, 1)
	made := badObjects{}
	var mu sync.Mutex
	type job struct {
		kind string
		i    int
	}
	jobs := make(chan job)
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				if err := createBad(ctx, c, spec, j.kind, j.i); err != nil {
					select {
					case errs <- fmt.Errorf("%s %d: %w", j.kind, j.i, err):
					default:
					}
					continue
				}
				mu.Lock()
				made[j.kind]++
				mu.Unlock()
			}
		}()
	}
	for _, kind := range badKinds {
		for i := range n {
			jobs <- job{kind, i}
		}
	}
	close(jobs)
	wg.Wait()
	select {
	case err := <-errs:
		return made, err
	default:
	}
	return made, nil
}

func createBad(ctx context.Context, c kubernetes.Interface, spec framework.ScaleSpec, kind string, i int) error {
	name := fmt.Sprintf("pvc-bad%05x-%d-4e00-8000-%012x", i, slices.Index(badKinds, kind), i)
	node := framework.ScaleNodeName(i % spec.Nodes)
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              "rds-scale",
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: framework.DriverName, VolumeHandle: name, FSType: "ext4",
				VolumeAttributes: map[string]string{"nqn": "nqn.2000-02.com.mikrotik:" + name, "nvmeAddress": "127.0.0.1", "nvmePort": "4420"},
			}},
		},
	}
	attacher, pvName := framework.DriverName, name
	switch kind {
	case "malformed claims annotation":
		pv.Annotations = map[string]string{framework.ScaleClaimsAnnotation: `{"` + node + `": 2024-01-01`}
	case "claims naming no time":
		pv.Annotations = map[string]string{framework.ScaleClaimsAnnotation: `{"` + node + `": "yesterday", "": "2024-01-01T00:00:00Z"}`}
	case "another driver's PV and VA":
		pv.Spec.CSI.Driver, attacher = "other.csi.example.com", "other.csi.example.com"
	case "VA of a PV that does not exist":
		pv = nil
	case "PV without volume attributes":
		pv.Spec.CSI.VolumeAttributes, pv.Spec.CSI.FSType = nil, ""
	}
	if pv != nil {
		if _, err := c.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: "bad-va-" + name[len("pvc-"):]},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: attacher, NodeName: node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: ptr.To(pvName)},
		},
	}
	va, err := c.StorageV1().VolumeAttachments().Create(ctx, va, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	va.Status = storagev1.VolumeAttachmentStatus{Attached: true}
	_, err = c.StorageV1().VolumeAttachments().UpdateStatus(ctx, va, metav1.UpdateOptions{})
	return err
}

// scaleTable is the markdown table of one size's runs: a row per figure,
// a column per run, then the median and the range.
func scaleTable(name, path string, spec framework.ScaleSpec, bad badObjects, etcdVersion string, runs []startRun) string {
	var b strings.Builder
	asked := "as the API server offers it"
	switch path {
	case syncList:
		asked = "KUBE_FEATURE_WatchListClient=false"
	case syncWatchListJSON:
		asked = "as the API server offers it, --kube-api-content-type=application/json"
	}
	fmt.Fprintf(&b, "\n%s, %s: %d PVs with %d attached VolumeAttachments, %d Nodes; %d bad objects (%s); etcd %s\n\n",
		name, asked, spec.PVs, spec.PVs, spec.Nodes, bad.total(), bad, etcdVersion)
	b.WriteString("| figure |")
	for i := range runs {
		fmt.Fprintf(&b, " run %d |", i+1)
	}
	b.WriteString(" median [min–max] |\n|---|")
	for range runs {
		b.WriteString("---|")
	}
	b.WriteString("---|\n")
	row := func(figure string, unit func(float64) string, get func(startRun) float64) {
		fmt.Fprintf(&b, "| %s |", figure)
		vals := make([]float64, len(runs))
		for i, r := range runs {
			vals[i] = get(r)
			fmt.Fprintf(&b, " %s |", unit(vals[i]))
		}
		sort.Float64s(vals)
		fmt.Fprintf(&b, " %s [%s–%s] |\n", unit(median(vals)), unit(vals[0]), unit(vals[len(vals)-1]))
	}
	text := func(figure string, get func(startRun) string) {
		fmt.Fprintf(&b, "| %s |", figure)
		for _, r := range runs {
			fmt.Fprintf(&b, " %s |", get(r))
		}
		b.WriteString(" |\n")
	}
	sec := func(v float64) string { return fmt.Sprintf("%.2f s", v) }
	mib := func(v float64) string { return fmt.Sprintf("%.1f MiB", v/(1<<20)) }
	kb := func(v float64) string { return fmt.Sprintf("%.2f KB", v/1000) }
	count := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	text("initial sync (driver log)", func(r startRun) string { return r.path })
	row("load average (1 min) at the start", func(v float64) string { return fmt.Sprintf("%.1f", v) }, func(r startRun) float64 { return r.load })
	row("LISTs of PVs/VAs/Nodes served meanwhile", count, func(r startRun) float64 { return r.lists })
	row("exec → Probe ready (100 ms polls)", sec, func(r startRun) float64 { return r.probeReady.Seconds() })
	row("exec → \"attachment index synced\" (log)", sec, func(r startRun) float64 { return r.logReady.Seconds() })
	row("driver CPU time at ready (user+system)", sec, func(r startRun) float64 { return r.cpuReady.Seconds() })
	row("kube-apiserver CPU time, exec → ready", sec, func(r startRun) float64 { return r.apiCPU.Seconds() })
	row("driver VmRSS at ready", mib, func(r startRun) float64 { return float64(r.ready.RSS) })
	row("driver VmRSS once indexed", mib, func(r startRun) float64 { return float64(r.indexed.RSS) })
	row("driver VmHWM (peak) once indexed", mib, func(r startRun) float64 { return float64(r.indexed.PeakRSS) })
	row("driver live heap after the next GC", mib, func(r startRun) float64 { return r.heapLive })
	row("live heap per attached volume", kb, func(r startRun) float64 { return r.heapLive / float64(spec.PVs) })
	row("driver Go heap in use (same time)", mib, func(r startRun) float64 { return r.heapInuse })
	row("kube-apiserver VmRSS at the driver's ready", mib, func(r startRun) float64 { return float64(r.apiReady.RSS) })
	row("kube-apiserver VmRSS once indexed", mib, func(r startRun) float64 { return float64(r.apiIndexed.RSS) })
	row("index: volumes", count, func(r startRun) float64 { return r.indexedVols })
	row("index: attachments", count, func(r startRun) float64 { return r.indexedVA })
	text("skipped as unreadable (rds_csi_malformed_objects)", func(r startRun) string {
		if r.malformed == nil {
			return "no such metric"
		}
		var parts []string
		for s, v := range r.malformed {
			parts = append(parts, fmt.Sprintf("%s %g", s, v))
		}
		sort.Strings(parts)
		return strings.Join(parts, ", ")
	})
	row("\"syncing attachment index\" errors (log)", count, func(r startRun) float64 { return float64(r.syncErrors) })
	return b.String()
}

func median(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}
