package backends

import (
	"strings"
)

// IDSeparator joins a box's name and a slot in a volume or snapshot ID of
// a box other than the default: "rack-b/pvc-<uuid>". Neither a name (a
// label value) nor a slot (rds.ValidateSlot) can contain it.
const IDSeparator = "/"

// JoinID is the ID of slot on the box named box: the slot alone on the
// default box (as every ID made before there were several boxes), the
// box's name, IDSeparator and the slot on any other.
func JoinID(box string, def bool, slot string) string {
	if def {
		return slot
	}
	return box + IDSeparator + slot
}

// SplitID returns the box an ID names ("": the default box) and the slot
// it is on that box. It checks neither part, but an ID that starts with
// the separator ("/pvc-1") names the separator itself, a box no box can
// be: never the default, whose "pvc-1" would otherwise go by two IDs
// (and two sets of claims, kept by ID).
func SplitID(id string) (box, slot string) {
	if b, s, ok := strings.Cut(id, IDSeparator); ok {
		if b == "" {
			return IDSeparator, s
		}
		return b, s
	}
	return "", id
}

// ValidIDBox reports whether box may appear in an ID: "" (the default
// box) or a name a box can have.
func ValidIDBox(box string) bool {
	return box == "" || (labelValue.MatchString(box) && len(box) <= MaxNameLength)
}
