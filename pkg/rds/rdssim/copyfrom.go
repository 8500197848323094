package rdssim

import "fmt"

// What `/disk add copy-from=` takes from its source is not confirmed on
// hardware (docs/routeros.md, facts table). RouterOS's CLI manual says of
// add's copy-from that the new item's default property values come from
// the existing item; it says nothing certain about a file disk's data. The
// simulator offers each variant, so that the client is tested under all.

// CopyFromProperties is where a copy's properties that the add does not
// set come from.
type CopyFromProperties string

const (
	// CopyFromInherit: from the source disk, as the manual describes
	// copy-from (export flag, port, NQN, allowed host, password). The
	// default: every test runs against the documented behaviour unless
	// it asks for the other.
	CopyFromInherit CopyFromProperties = "inherit"
	// CopyFromFresh: a new disk's defaults, as if copy-from were absent.
	CopyFromFresh CopyFromProperties = "fresh"
)

// ParseCopyFromProperties parses "inherit" or "fresh" ("" is inherit).
func ParseCopyFromProperties(s string) (CopyFromProperties, error) {
	switch CopyFromProperties(s) {
	case "", CopyFromInherit:
		return CopyFromInherit, nil
	case CopyFromFresh:
		return CopyFromFresh, nil
	}
	return "", fmt.Errorf("copy-from properties %q: want inherit or fresh", s)
}

// CopyFromData is what a copy's backing file holds.
type CopyFromData string

const (
	// CopyFromDataCopy: the source file's content (what the driver
	// assumes, and what snapshots, clones and restores rest on). The
	// default.
	CopyFromDataCopy CopyFromData = "copy"
	// CopyFromDataNone: a file of the right size holding zeros, as a
	// copy-from that copied properties only would leave.
	CopyFromDataNone CopyFromData = "none"
)

// ParseCopyFromData parses "copy" or "none" ("" is copy).
func ParseCopyFromData(s string) (CopyFromData, error) {
	switch CopyFromData(s) {
	case "", CopyFromDataCopy:
		return CopyFromDataCopy, nil
	case CopyFromDataNone:
		return CopyFromDataNone, nil
	}
	return "", fmt.Errorf("copy-from data %q: want copy or none", s)
}

// copyModel is the simulator's copy-from behaviour.
type copyModel struct {
	props CopyFromProperties
	data  CopyFromData
}

func newCopyModel(cfg Config) (copyModel, error) {
	props, err := ParseCopyFromProperties(string(cfg.CopyFromProperties))
	if err != nil {
		return copyModel{}, err
	}
	data, err := ParseCopyFromData(string(cfg.CopyFromData))
	if err != nil {
		return copyModel{}, err
	}
	return copyModel{props: props, data: data}, nil
}

// defaults sets the properties a copy of src starts from, before the
// add's own arguments apply.
func (m copyModel) defaults(d, src *disk) {
	if src == nil || m.props != CopyFromInherit {
		return
	}
	// The password with the allowed host: a copy open to the source's host
	// without it would let that host in unauthenticated.
	d.Export, d.Port, d.NQN, d.AllowHost, d.Password = src.Export, src.Port, src.NQN, src.AllowHost, src.Password
}

// dataSource is the host file whose content a copy gets ("" for none).
func (m copyModel) dataSource(srcPath string) string {
	if m.data == CopyFromDataNone {
		return ""
	}
	return srcPath
}
