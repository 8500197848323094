package claims

// PVRef names one PersistentVolume of a volume handle and the
// resourceVersion the index read it at.
type PVRef struct {
	Name            string
	ResourceVersion string
	// Claims are this PV's own claims at ResourceVersion (shared with
	// the entry, never modified): a commit writes each PV its own claims
	// plus the change, never a claim that only another PV still shows.
	Claims Set
	// Retiring is this PV's RetiringAnnotation at ResourceVersion.
	Retiring []Retiring
}
