package diagnose

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/srvlab/rds-csi/pkg/inventory"
)

// RDSHealth is the RDS's own health and load as the controller replica
// that polls it reports on /metrics (issue 27, docs/operations.md). Values
// RouterOS did not print are nil.
type RDSHealth struct {
	// Polling: the replica that answered polls the RDS (it leads). A
	// replica that does not poll reports nothing else.
	Polling bool `json:"polling"`
	// StalenessSeconds: since the last good poll.
	StalenessSeconds float64 `json:"stalenessSeconds"`
	IntervalSeconds  float64 `json:"intervalSeconds"`
	// FailedPolls: by part (disks, stats, pool_traffic), the polls in a
	// row in which it failed; 0 since it last succeeded.
	FailedPolls map[string]float64    `json:"failedPolls,omitempty"`
	Arrays      []ArrayHealth         `json:"arrays,omitempty"`
	Drives      []DriveHealth         `json:"drives,omitempty"`
	Pool        *PoolHealth           `json:"pool,omitempty"`
	Volumes     map[string]VolumeLoad `json:"-"` // by PV name
}

// ArrayHealth is one RAID array.
type ArrayHealth struct {
	Name     string `json:"name"`
	Degraded bool   `json:"degraded"`
	Failed   int    `json:"failedMembers"`
	Missing  int    `json:"missingMembers"`
}

// DriveHealth is one drive.
type DriveHealth struct {
	Name            string   `json:"name"`
	Array           string   `json:"array,omitempty"`
	Failed          bool     `json:"failed"`
	TemperatureC    *float64 `json:"temperatureCelsius,omitempty"`
	PercentageUsed  *float64 `json:"percentageUsed,omitempty"`
	CriticalWarning *float64 `json:"criticalWarning,omitempty"`
}

// PoolHealth is the pool.
type PoolHealth struct {
	Name                string   `json:"name"`
	SizeBytes           float64  `json:"sizeBytes"`
	FreeBytes           float64  `json:"freeBytes"`
	ReadOpsPerSecond    *float64 `json:"readOpsPerSecond,omitempty"`
	WriteOpsPerSecond   *float64 `json:"writeOpsPerSecond,omitempty"`
	ReadBytesPerSecond  *float64 `json:"readBytesPerSecond,omitempty"`
	WriteBytesPerSecond *float64 `json:"writeBytesPerSecond,omitempty"`
	InFlight            *float64 `json:"inFlightOps,omitempty"`
}

// Used is the pool's used fraction (0 for a pool of no size).
func (p PoolHealth) Used() float64 {
	if p.SizeBytes <= 0 {
		return 0
	}
	return 1 - p.FreeBytes/p.SizeBytes
}

// VolumeLoad is one volume's I/O as the RDS counts it.
type VolumeLoad struct {
	ReadOps       *float64 `json:"readOps,omitempty"`
	WriteOps      *float64 `json:"writeOps,omitempty"`
	ReadBytes     *float64 `json:"readBytes,omitempty"`
	WriteBytes    *float64 `json:"writeBytes,omitempty"`
	InFlight      *float64 `json:"inFlightOps,omitempty"`
	ActiveSeconds *float64 `json:"activeSeconds,omitempty"`
	WaitSeconds   *float64 `json:"waitSeconds,omitempty"`
	IOErrors      *float64 `json:"ioErrors,omitempty"`
}

// Thresholds of the findings and verdict notes, the alerts' own
// (manifests/monitoring/prometheusrule.yaml).
const (
	HotDriveCelsius   = 70
	PoolFillingUsed   = 0.85
	DeepQueueInFlight = 16
)

// ParseRDSHealth reads the rds_csi_rds_* health families of a /metrics
// exposition (Prometheus text format).
func ParseRDSHealth(r io.Reader) (*RDSHealth, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("reading the controller's metrics: %w", err)
	}
	h := &RDSHealth{Volumes: map[string]VolumeLoad{}}
	arrays, drives := map[string]*ArrayHealth{}, map[string]*DriveHealth{}
	array := func(name string) *ArrayHealth {
		if arrays[name] == nil {
			arrays[name] = &ArrayHealth{Name: name}
		}
		return arrays[name]
	}
	drive := func(name string) *DriveHealth {
		if drives[name] == nil {
			drives[name] = &DriveHealth{Name: name}
		}
		return drives[name]
	}
	pool := func(name string) *PoolHealth {
		if h.Pool == nil {
			h.Pool = &PoolHealth{Name: name}
		}
		return h.Pool
	}
	volume := func(pv string, set func(*VolumeLoad)) {
		v := h.Volumes[pv]
		set(&v)
		h.Volumes[pv] = v
	}
	for name, f := range families {
		if !strings.HasPrefix(name, "rds_csi_rds_") {
			continue
		}
		for _, m := range f.GetMetric() {
			v := value(m)
			if math.IsNaN(v) {
				continue
			}
			p := &v
			l := labels(m)
			switch name {
			case "rds_csi_rds_health_polling":
				h.Polling = v == 1
			case "rds_csi_rds_health_staleness_seconds":
				h.StalenessSeconds = v
			case "rds_csi_rds_health_poll_interval_seconds":
				h.IntervalSeconds = v
			case "rds_csi_rds_health_part_failed_polls":
				if h.FailedPolls == nil {
					h.FailedPolls = map[string]float64{}
				}
				h.FailedPolls[l["part"]] = v
			case "rds_csi_rds_array_degraded":
				array(l["array"]).Degraded = v == 1
			case "rds_csi_rds_array_failed_members":
				array(l["array"]).Failed = int(v)
			case "rds_csi_rds_array_missing_members":
				array(l["array"]).Missing = int(v)
			case "rds_csi_rds_drive_failed":
				d := drive(l["drive"])
				d.Failed, d.Array = v == 1, l["array"]
			case "rds_csi_rds_drive_temperature_celsius":
				drive(l["drive"]).TemperatureC = p
			case "rds_csi_rds_drive_percentage_used":
				drive(l["drive"]).PercentageUsed = p
			case "rds_csi_rds_drive_critical_warning":
				drive(l["drive"]).CriticalWarning = p
			case "rds_csi_rds_pool_size_bytes":
				pool(l["pool"]).SizeBytes = v
			case "rds_csi_rds_pool_free_bytes":
				pool(l["pool"]).FreeBytes = v
			default:
				if f, ok := poolRates[name]; ok {
					*f(pool(l["pool"])) = p
				}
				if f, ok := volumeValues[name]; ok {
					volume(l["pv"], func(x *VolumeLoad) { *f(x) = p })
				}
			}
		}
	}
	for _, a := range arrays {
		h.Arrays = append(h.Arrays, *a)
	}
	sort.Slice(h.Arrays, func(i, j int) bool { return h.Arrays[i].Name < h.Arrays[j].Name })
	for _, d := range drives {
		h.Drives = append(h.Drives, *d)
	}
	sort.Slice(h.Drives, func(i, j int) bool { return h.Drives[i].Name < h.Drives[j].Name })
	return h, nil
}

// poolRates and volumeValues are the optional values by family.
var (
	poolRates = map[string]func(*PoolHealth) **float64{
		"rds_csi_rds_pool_read_ops_per_second":    func(p *PoolHealth) **float64 { return &p.ReadOpsPerSecond },
		"rds_csi_rds_pool_write_ops_per_second":   func(p *PoolHealth) **float64 { return &p.WriteOpsPerSecond },
		"rds_csi_rds_pool_read_bytes_per_second":  func(p *PoolHealth) **float64 { return &p.ReadBytesPerSecond },
		"rds_csi_rds_pool_write_bytes_per_second": func(p *PoolHealth) **float64 { return &p.WriteBytesPerSecond },
		"rds_csi_rds_pool_in_flight_ops":          func(p *PoolHealth) **float64 { return &p.InFlight },
	}
	volumeValues = map[string]func(*VolumeLoad) **float64{
		"rds_csi_rds_volume_read_ops_total":       func(v *VolumeLoad) **float64 { return &v.ReadOps },
		"rds_csi_rds_volume_write_ops_total":      func(v *VolumeLoad) **float64 { return &v.WriteOps },
		"rds_csi_rds_volume_read_bytes_total":     func(v *VolumeLoad) **float64 { return &v.ReadBytes },
		"rds_csi_rds_volume_write_bytes_total":    func(v *VolumeLoad) **float64 { return &v.WriteBytes },
		"rds_csi_rds_volume_in_flight_ops":        func(v *VolumeLoad) **float64 { return &v.InFlight },
		"rds_csi_rds_volume_active_seconds_total": func(v *VolumeLoad) **float64 { return &v.ActiveSeconds },
		"rds_csi_rds_volume_wait_seconds_total":   func(v *VolumeLoad) **float64 { return &v.WaitSeconds },
		"rds_csi_rds_volume_io_errors_total":      func(v *VolumeLoad) **float64 { return &v.IOErrors },
	}
)

func value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	return math.NaN()
}

func labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// MetricsURL is the controller's /metrics beside the inventory URL it
// serves (http://host:8080/inventory: http://host:8080/metrics).
func MetricsURL(inventoryURL string) string {
	base := inventoryURL
	if i := strings.LastIndex(base, "/"); i > len("http://") {
		base = base[:i]
	}
	return base + "/metrics"
}

// FetchRDSHealth reads the RDS health from a controller's /metrics.
func FetchRDSHealth(ctx context.Context, client *http.Client, metricsURL string) (*RDSHealth, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, metricsURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetching %s: %w", inventory.Redacted(metricsURL), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetching %s: %s", inventory.Redacted(metricsURL), resp.Status)
	}
	return ParseRDSHealth(io.LimitReader(resp.Body, 64<<20))
}

// Stale: the controller's last good poll is older than three intervals
// (it then reports no RDS values), or it does not poll at all.
func (h *RDSHealth) Stale() bool {
	return !h.Polling || (h.IntervalSeconds > 0 && h.StalenessSeconds > 3*h.IntervalSeconds)
}

// note says why the health cannot be trusted, "" when it can.
func (h *RDSHealth) note() string {
	switch {
	case !h.Polling:
		return "the controller replica that answered does not poll the RDS (it is not the leader, or --rds-health-interval=0): port-forward to the leader (kubectl -n rds-csi get lease)"
	case h.Stale():
		return fmt.Sprintf("the controller's last good poll of the RDS is %.0fs old: its polls fail (see its log)", h.StalenessSeconds)
	}
	return ""
}

// volumeSummary is one sentence on a volume's I/O and the RDS under it,
// for Why's verdict.
func (h *RDSHealth) volumeSummary(pv string) string {
	if n := h.note(); n != "" {
		return "RDS health not known: " + n
	}
	var parts []string
	for _, a := range h.Arrays {
		if a.Degraded {
			parts = append(parts, fmt.Sprintf("array %s is DEGRADED (%d failed, %d missing: slower while it rebuilds, and one more failure may lose it)", a.Name, a.Failed, a.Missing))
		}
	}
	if len(parts) == 0 && len(h.Arrays) > 0 {
		parts = append(parts, "arrays healthy")
	}
	if p := h.Pool; p != nil {
		s := fmt.Sprintf("pool %s %.0f%% full", p.Name, 100*p.Used())
		if p.ReadOpsPerSecond != nil && p.WriteOpsPerSecond != nil {
			s += fmt.Sprintf(", %.0f reads/s and %.0f writes/s", *p.ReadOpsPerSecond, *p.WriteOpsPerSecond)
		}
		if p.InFlight != nil {
			s += fmt.Sprintf(", %.0f in flight", *p.InFlight)
		}
		parts = append(parts, s)
	}
	if v, ok := h.Volumes[pv]; ok {
		s := "this volume:"
		if v.InFlight != nil {
			s += fmt.Sprintf(" %.0f operations in flight", *v.InFlight)
			if *v.InFlight > DeepQueueInFlight {
				s += " (a DEEP queue: the array cannot keep up with it)"
			}
			s += ","
		}
		if v.ReadOps != nil && v.WriteOps != nil {
			s += fmt.Sprintf(" %.0f reads and %.0f writes so far", *v.ReadOps, *v.WriteOps)
		} else {
			s += " no counters from the RDS"
		}
		parts = append(parts, s)
	} else {
		parts = append(parts, "no I/O series for this volume in that poll (the volume is newer than the poll, its PV is not known to the controller, or the RDS printed no counters)")
	}
	return "RDS (" + fmt.Sprintf("%.0fs ago", h.StalenessSeconds) + "): " + strings.Join(parts, "; ")
}
