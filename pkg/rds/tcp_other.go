//go:build !linux

package rds

import (
	"syscall"
	"time"
)

// setUserTimeout is Linux only; elsewhere TCP keepalive alone finds a
// dead peer of an idle connection.
func setUserTimeout(syscall.RawConn, time.Duration) error { return nil }
