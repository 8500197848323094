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
	// ErrHostKey: the RDS host key did not match the pinned known_hosts entry.
	ErrHostKey = errors.New("RDS host key verification failed")
)

// CommandError carries the RouterOS text of a refused command.
type CommandError struct {
	Command string // the command as sent (contains no secrets)
	Output  string // the first line RouterOS printed
	kind    error
}

func (e *CommandError) Error() string {
	return fmt.Sprintf("%v: %s (command: %s)", e.kind, e.Output, e.Command)
}

func (e *CommandError) Unwrap() error { return e.kind }

// classifyOutput returns a *CommandError when the output is a RouterOS error
// message, nil otherwise. RouterOS reports errors as text, not exit status.
func classifyOutput(command, output string) error {
	line := strings.TrimSpace(firstLine(output))
	if line == "" {
		return nil
	}
	lower := strings.ToLower(line)
	var kind error
	switch {
	case strings.HasPrefix(lower, "failure:"):
		msg := strings.TrimSpace(lower[len("failure:"):])
		switch {
		case strings.Contains(msg, "not enough space"):
			kind = ErrNoSpace
		case strings.Contains(msg, "no such item"), strings.Contains(msg, "not found"):
			kind = ErrNotFound
		case strings.Contains(msg, "already exist"), strings.Contains(msg, "already have"):
			kind = ErrAlreadyExists
		default:
			kind = ErrCommandFailed
		}
	case strings.HasPrefix(lower, "syntax error"),
		strings.HasPrefix(lower, "bad command name"),
		strings.HasPrefix(lower, "expected end of command"),
		strings.HasPrefix(lower, "input does not match"),
		strings.HasPrefix(lower, "invalid value"),
		strings.HasPrefix(lower, "expected "):
		kind = ErrInvalidArgument
	case strings.HasPrefix(lower, "no such item"):
		kind = ErrNotFound
	default:
		return nil
	}
	return &CommandError{Command: command, Output: line, kind: kind}
}

func firstLine(s string) string {
	s = strings.TrimLeft(s, "\r\n")
	if i := strings.IndexAny(s, "\r\n"); i >= 0 {
		return s[:i]
	}
	return s
}
