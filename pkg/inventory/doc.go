// Package inventory is the controller's read-only view of its disks on the
// RDS, served as JSON on the controller's HTTP endpoint (GET /inventory), so
// that an operator's tools (kubectl rds) can see the RDS side of a volume
// without the driver's SSH key.
//
// It lists only the disks whose backing files are under the driver's volume
// path (volumes and snapshots); other disks on the RDS are counted, not
// shown. It must never change anything on the RDS, never expose a
// credential (key, known_hosts, user), and never let a caller choose the
// RouterOS command: every request runs the same fixed listing, at most once
// per cache period however often it is asked.
package inventory
