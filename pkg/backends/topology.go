package backends

import "strings"

// Topology: where a volume is accessible from, and what a node reaches.
//
//   - topology.<driver>/rds=<name of the default box>: every node that
//     reaches the default box reports it, and every volume of the default
//     box requires it (as before there were several boxes, so that the
//     volumes made then, whose PVs require it, keep their nodes, and a
//     volume made now still schedules after a downgrade);
//   - topology.<driver>/rds.<name>=true, with more than one box: every
//     node reports it for each box it reaches (the default included), and
//     every volume of a box other than the default requires it.
//
// A StorageClass's allowedTopologies may name boxes with either key.
const (
	boxKeyPrefix = "rds."
	// BoxKeyValue is the value of a node's rds.<name> label.
	BoxKeyValue = "true"
)

// DefaultKey is topology.<driver>/rds.
func DefaultKey(driver string) string { return "topology." + driver + "/rds" }

// BoxKey is topology.<driver>/rds.<name>.
func BoxKey(driver, name string) string { return "topology." + driver + "/" + boxKeyPrefix + name }

// Segments are the topology segments a node reports for the boxes it
// reaches (node, its name), boxes being the configuration (default first).
func Segments(driver string, boxes []Backend, node string) map[string]string {
	seg := map[string]string{}
	for i := range boxes {
		b := &boxes[i]
		if !b.Reaches(node) {
			continue
		}
		if b.Default {
			seg[DefaultKey(driver)] = b.Name
		}
		if len(boxes) > 1 {
			seg[BoxKey(driver, b.Name)] = BoxKeyValue
		}
	}
	return seg
}

// Accessible is the segment a volume on b requires of its nodes.
func Accessible(driver string, b *Backend) map[string]string {
	if b.Default {
		return map[string]string{DefaultKey(driver): b.Name}
	}
	return map[string]string{BoxKey(driver, b.Name): BoxKeyValue}
}

// NamedIn lists the names of the boxes a segment names (a segment is a
// set of nodes: every key must hold on them, so a volume on any box it
// names is accessible from all of them). Keys of other drivers, zones and
// the like name no box.
func NamedIn(driver string, segment map[string]string) []string {
	var names []string
	def, prefix := DefaultKey(driver), "topology."+driver+"/"+boxKeyPrefix
	for k, v := range segment {
		switch {
		case k == def:
			names = append(names, v)
		case strings.HasPrefix(k, prefix) && v == BoxKeyValue:
			names = append(names, strings.TrimPrefix(k, prefix))
		}
	}
	return names
}
