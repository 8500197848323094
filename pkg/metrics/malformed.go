package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// malformedCollector reports, at each scrape, how many objects the
// attachment index skips as unreadable right now.
type malformedCollector struct {
	desc   *prometheus.Desc
	counts func() map[[2]string]int
}

func (c *malformedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *malformedCollector) Collect(ch chan<- prometheus.Metric) {
	for kr, n := range c.counts() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), kindLabel(kr[0]), label(kr[1]))
	}
}

// kindLabel: an object kind (PersistentVolume) as a label value.
func kindLabel(k string) string {
	if reasonPattern.MatchString(k) {
		return k
	}
	return Other
}

// ReportMalformed exports the objects the attachment index skips because
// it cannot read them (pkg/informers.MalformedSet): the gauge
// rds_csi_malformed_objects{kind,reason}, read from counts (by kind and
// reason, every known pair included) at each scrape, and the counter
// rds_csi_malformed_objects_seen_total{kind,reason}, counted by the
// returned function once per object version found unreadable.
func (m *Metrics) ReportMalformed(counts func() map[[2]string]int) (seen func(kind, reason string)) {
	gauge := &malformedCollector{
		desc: prometheus.NewDesc(Namespace+"_malformed_objects",
			"Objects the attachment index skips, in whole or in part, because an annotation of the driver's on them cannot be read (reason unreadable-claims: the volume is published and unpublished nowhere until it is fixed; unreadable-retiring: with storage fencing the same). kubectl rds check lists them.",
			[]string{"kind", "reason"}, nil),
		counts: counts,
	}
	seenTotal := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "malformed_objects_seen_total",
		Help: "Object versions the attachment index found unreadable (each resourceVersion once; never retried), by kind and reason.",
	}, []string{"kind", "reason"})
	for kr := range counts() {
		seenTotal.WithLabelValues(kindLabel(kr[0]), label(kr[1]))
	}
	m.registry.MustRegister(gauge, seenTotal)
	return func(kind, reason string) { seenTotal.WithLabelValues(kindLabel(kind), label(reason)).Inc() }
}
