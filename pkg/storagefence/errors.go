package storagefence

import (
	"errors"
	"fmt"
)

// Outcome is what a failed step means for the caller's answer.
type Outcome int

const (
	// Aborted: the state changed under the step (another replica, a
	// detach, a fence); the request is retried against the new state.
	Aborted Outcome = iota
	// Unavailable: a read or write the step stands on could not be made
	// or confirmed (the API server, the RDS); the request is retried.
	Unavailable
	// Refused: the step cannot succeed as things are configured; the
	// message names what to change.
	Refused
)

// StepError is a step of the protocol that failed, and left nothing that
// lets the node write.
type StepError struct {
	// Step names it for the metrics: "no-attachment", "unconfirmed",
	// "storage", "error", "conflict".
	Step    string
	Outcome Outcome
	Err     error
}

func (e *StepError) Error() string { return e.Err.Error() }
func (e *StepError) Unwrap() error { return e.Err }

func stepErr(step string, o Outcome, format string, args ...any) error {
	return &StepError{Step: step, Outcome: o, Err: fmt.Errorf(format, args...)}
}

// ErrExportTaken: the export allows another live holder (a migration's
// target) that may still have to connect; the requester is not let in.
var ErrExportTaken = errors.New("the export is taken by another holder")

// ErrPasswordRefused: RouterOS refused a swap that sets an export password
// as bad input, as one without export passwords would (docs/routeros.md).
var ErrPasswordRefused = errors.New("the RDS refused the export password (nvme-tcp-server-password), as a RouterOS without export passwords would: check its version and the driver user's policies, or turn --export-auth off (docs/routeros.md)")
