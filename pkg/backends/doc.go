// Package backends is the list of RDS boxes one driver serves, and the
// rules that tie a volume to its box: the configuration (the box of the
// --rds-* flags, the default, and the boxes of --rds-config), its
// validation, the volume ID scheme (an ID names its box; an ID without a
// box is the default box's, as every ID made before there were several),
// the topology segments of a box, and the per-box view of an RDS client
// that speaks volume IDs.
//
// It never lets a volume ID reach the wrong box: an ID whose box is not
// configured is an error, never the default box's; and it never lets one
// box's failure reach another's calls (each box has its own client,
// connections and timeouts; nothing here waits on two boxes in one call).
package backends
