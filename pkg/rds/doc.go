// Package rds is the RouterOS-over-SSH client for MikroTik ROSE Data Server.
//
// It builds RouterOS CLI commands from validated inputs, runs them over one
// long-lived SSH connection, and parses the `print detail` output back into
// typed values. The command/output contract is docs/routeros.md.
//
// It must never send a value that did not pass validation (IDs, paths, NQNs
// and host names are matched against strict patterns before a command is
// built), never round a requested size down, and never retry an operation
// that RouterOS refused (not enough space, no such item, bad argument): only
// transport failures are retried.
//
// Storage fencing (export.go): SetExportHost and CloseExport change a disk's
// allowed host only with sets conditioned on the state read before them, so
// that they never overwrite a change made meanwhile by another controller
// replica or an operator (ErrExportChanged), and they never open an export
// to a host nobody asked for, even part way.
package rds
