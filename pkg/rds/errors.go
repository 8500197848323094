package rds

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. The CSI layer maps them to gRPC codes with errors.Is.
var (
	// ErrNotFound: the disk, file or copy source does not exist.
	ErrNotFound = errors.New("not found on RDS")
	// ErrNoSpace: RouterOS answered "not enough space".
	ErrNoSpace = errors.New("not enough space on RDS")
	// ErrAlreadyExists: a disk with the slot or a file with the path exists.
	ErrAlreadyExists = errors.New("already exists on RDS")
	// ErrInvalidArgument: the input failed validation before anything was
	// sent, or RouterOS rejected the command's syntax or a value.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrCommandFailed: RouterOS refused the command for another reason.
	ErrCommandFailed = errors.New("RouterOS command failed")
	// ErrBadOutput: the output could not be parsed.
	ErrBadOutput = errors.New("unparseable RouterOS output")
	// ErrTransient: the transport failed (connection lost, timeout, refused).
	// Only these are retried.
	ErrTransient = errors.New("transient RDS transport failure")
	// ErrOutcomeUnknown: the command was sent, and the transport failed
	// before its reply: it may have run, in part or whole. Wraps
	// ErrTransient; commands that must not run twice are not re-sent.
	ErrOutcomeUnknown = fmt.Errorf("%w: the command was sent, its outcome is unknown", ErrTransient)
	// ErrCopyPending: a copy (/disk add copy-from) was sent and its outcome
	// is unknown: it may still be running on the RDS. The copy's disk
	// appears when it completes; until then it is not ready.
	ErrCopyPending = errors.New("copy on RDS not confirmed complete")
	// ErrAuthRefused: the RDS refused the SSH key (with ErrInvalidArgument:
	// retrying the same key cannot succeed). No command can be run on it.
	ErrAuthRefused = errors.New("RDS refused the SSH key")
	// ErrHostKey: the RDS host key did not match the pinned known_hosts entry.
	ErrHostKey = errors.New("RDS host key verification failed")
	// ErrExportChanged: the disk's export changed under us (another
	// controller replica or an operator); nothing was overwritten. The
	// error names what was found.
	ErrExportChanged = errors.New("the disk's NVMe/TCP export changed concurrently on RDS")
)

// Reached reports whether a command's outcome (nil included) came from a
// session on the RDS: RouterOS answered, even if it refused the command. A
// transport failure, a refused SSH key and a host key other than the
// pinned one did not reach it.
func Reached(err error) bool {
	return !errors.Is(err, ErrTransient) && !errors.Is(err, ErrAuthRefused) && !errors.Is(err, ErrHostKey)
}

// CommandError carries the RouterOS text of a refused command.
type CommandError struct {
	Command string // the command as sent, secrets (an export password) hidden
	Output  string // the first line RouterOS printed
	kind    error
}

func (e *CommandError) Error() string {
	return fmt.Sprintf("%v: %s (command: %s)", e.kind, e.Output, e.Command)
}

func (e *CommandError) Unwrap() error { return e.kind }

// NewCommandError is RouterOS's refusal of command, classified from the
// first line it printed as the client classifies it (a fake RDS answers
// with it what the real one would).
func NewCommandError(command, output string) *CommandError {
	line := strings.TrimSpace(firstLine(output))
	return &CommandError{Command: command, Output: line, kind: errorKind(line)}
}

// RefusedInput: err is RouterOS itself refusing what a command sent as
// bad input (syntax, an unknown property, a value), not this client's own
// validation before sending.
func RefusedInput(err error) bool {
	var ce *CommandError
	return errors.As(err, &ce) && errors.Is(ce.kind, ErrInvalidArgument)
}

// classifyOutput returns a *CommandError when the output of a print
// command starts with a RouterOS error message, nil otherwise. RouterOS
// reports errors as text, not exit status.
func classifyOutput(command, output string) error {
	line := strings.TrimSpace(firstLine(output))
	lower := strings.ToLower(line)
	switch {
	case line == "":
		return nil
	case strings.HasPrefix(lower, "failure:"), strings.HasPrefix(lower, "no such item"), invalidInput(lower):
		return &CommandError{Command: command, Output: line, kind: errorKind(line)}
	}
	return nil
}

// classifySilent classifies the output of a command that prints nothing
// when it succeeds (add, set, remove): any text at all is a refusal, with
// or without the "failure:" prefix ("invalid parameter", "disk is in use").
func classifySilent(command, output string) error {
	line := strings.TrimSpace(firstLine(output))
	if line == "" {
		return nil
	}
	return &CommandError{Command: command, Output: line, kind: errorKind(line)}
}

// errorKind maps a RouterOS error message to a sentinel error.
func errorKind(line string) error {
	lower := strings.ToLower(strings.TrimSpace(line))
	msg, prefixed := strings.CutPrefix(lower, "failure:")
	msg = strings.TrimSpace(msg)
	switch {
	case strings.Contains(msg, "not enough space"):
		return ErrNoSpace
	case strings.Contains(msg, "no such item"), strings.Contains(msg, "not found"):
		return ErrNotFound
	case strings.Contains(msg, "already exist"), strings.Contains(msg, "already have"):
		return ErrAlreadyExists
	case !prefixed && invalidInput(msg):
		return ErrInvalidArgument
	}
	return ErrCommandFailed
}

// invalidInput: RouterOS rejected what we sent (syntax, a value).
func invalidInput(lower string) bool {
	for _, p := range []string{"syntax error", "bad command name", "expected end of command",
		"input does not match", "invalid value", "invalid parameter", "expected "} {
		if strings.HasPrefix(lower, p) {
			return true
		}
	}
	return false
}

func firstLine(s string) string {
	s = strings.TrimLeft(s, "\r\n")
	if i := strings.IndexAny(s, "\r\n"); i >= 0 {
		return s[:i]
	}
	return s
}
