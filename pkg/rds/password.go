package rds

import (
	"fmt"
	"regexp"
)

// ExportPassword is a value for a disk's nvme-tcp-server-password (NVMe
// in-band authentication, docs/routeros.md "The export password"). Its
// type never prints it: %v, %s and %+v show "<hidden>", so a struct that
// holds one is safe to log (the value sits behind a pointer: fmt prints an
// unexported field by reflection, without String, and a pointer there as
// an address). Only the command that sets it (SwapExportAuth)
// reads the value, and that command is never logged, observed or put into
// an error as sent (Client.runHiding).
type ExportPassword struct{ p *string }

// passwordPattern: letters and digits only, so no character RouterOS
// treats specially can reach a command, and 16 to 64 of them: long enough
// to carry 80 bits or more, short enough for any field. What RouterOS
// itself accepts is not known (assumed, docs/routeros.md).
var passwordPattern = regexp.MustCompile(`^[A-Za-z0-9]{16,64}$`)

// NewExportPassword checks v (16-64 letters and digits). The error never
// contains v.
func NewExportPassword(v string) (ExportPassword, error) {
	if !passwordPattern.MatchString(v) {
		return ExportPassword{}, fmt.Errorf("%w: an export password must be 16-64 letters and digits (a %d-character value was given; it is not shown)", ErrInvalidArgument, len(v))
	}
	return ExportPassword{p: &v}, nil
}

// IsZero: no password (SwapExportAuth then clears the export's).
func (p ExportPassword) IsZero() bool { return p.v() == "" }

// v is the password's value, for the command that sets it only.
func (p ExportPassword) v() string {
	if p.p == nil {
		return ""
	}
	return *p.p
}

// Equal compares two passwords.
func (p ExportPassword) Equal(o ExportPassword) bool { return p.v() == o.v() }

// String never shows the password.
func (p ExportPassword) String() string {
	if p.IsZero() {
		return "<none>"
	}
	return "<hidden>"
}

// GoString never shows the password.
func (p ExportPassword) GoString() string { return p.String() }

// hiddenValue replaces a secret wherever a command leaves text behind.
const hiddenValue = "<hidden>"
