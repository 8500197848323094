package main

import (
	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/informers"
)

// malformedSet is where the index records the PVs it cannot read: each
// problem is counted and evented on its PV once per resourceVersion, and
// the gauge rds_csi_malformed_objects reads the set at each scrape.
func (p *controllerProcess) malformedSet(reporter *fencing.Reporter) *informers.MalformedSet {
	var seen func(kind, reason string)
	set := informers.NewMalformedSet(func(m informers.Malformed) {
		seen(m.Kind, m.Reason)
		claims := m.Reason == informers.MalformedClaims
		reporter.MalformedAnnotation(m.Name, m.Handle, m.Annotation, m.ResourceVersion, m.Error, claims, claims || p.driver.AllowHostFencing())
	})
	seen = p.metrics.ReportMalformed(set.Counts)
	return set
}
