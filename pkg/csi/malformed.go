package csi

import (
	"google.golang.org/grpc/codes"

	"github.com/srvlab/rds-csi/pkg/informers"
)

// refuseMalformed fails a publish or unpublish of volume id closed while
// one of its PVs carries an annotation of the driver's that cannot be
// read (informers.MalformedSet): the claims, which say which nodes hold
// the volume; or, with storage fencing, the record of released
// attachments, which every claim change may write. Deciding without them
// could let a second node write, and committing would write over what
// they recorded. FAILED_PRECONDITION: nothing changes until someone
// fixes the annotation, and the CO retries.
func (s *ControllerServer) refuseMalformed(op, id, node string) error {
	for _, m := range s.pub.Malformed.ForHandle(id) {
		what := "which nodes hold the volume"
		if m.Reason == informers.MalformedRetiring {
			if !s.d.opts.AllowHostFencing() {
				continue // neither read nor written without storage fencing
			}
			what = "which released attachments still wait for their export change"
		}
		return statusf(codes.FailedPrecondition,
			"volume %s: %s to node %q refused: annotation %s of PV %s (resourceVersion %s) cannot be read (%s), so the driver cannot tell %s; "+
				"nothing is changed until the annotation is fixed (kubectl rds check lists it; docs/operations.md, \"Malformed objects\")",
			id, op, node, m.Annotation, m.Name, m.ResourceVersion, m.Error, what)
	}
	return nil
}
