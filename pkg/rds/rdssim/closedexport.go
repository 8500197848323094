package rdssim

// ClosedExportProps is whether /disk print shows a disk's NVMe/TCP server
// properties (nvme-tcp-server-port, -nqn, -allow-host-name) while its
// export is off. On RDS2216 hardware every disk printed with
// nvme-tcp-export=no (RAID arrays and members) showed none of them, and
// only the exported disk did; whether a closed file disk prints them is
// not known (docs/routeros.md), so the simulator offers both. Either way
// where/find conditions see the properties, as RouterOS evaluates a
// condition on the property itself.
type ClosedExportProps string

const (
	// ClosedExportShown prints them whatever the export (the default).
	ClosedExportShown ClosedExportProps = "shown"
	// ClosedExportHidden leaves them out while nvme-tcp-export=no, as the
	// RAID disks of the RDS2216 captures print.
	ClosedExportHidden ClosedExportProps = "hidden"
)

// ParseClosedExportProps parses "shown" or "hidden" ("" is shown).
func ParseClosedExportProps(s string) (ClosedExportProps, error) {
	return parseChoice("closed export properties", s, ClosedExportShown, ClosedExportHidden)
}
