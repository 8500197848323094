package rds

import (
	"syscall"
	"time"
)

// tcpUserTimeout is TCP_USER_TIMEOUT of <linux/tcp.h> (not in package
// syscall).
const tcpUserTimeout = 0x12

// setUserTimeout bounds how long data sent on the socket may stay
// unacknowledged before the kernel drops the connection: TCP keepalive
// probes only an idle connection, and a dead peer with our command
// unacknowledged would otherwise hold it for the kernel's retransmission
// limit (about 15 minutes).
func setUserTimeout(c syscall.RawConn, d time.Duration) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, tcpUserTimeout, int(d.Milliseconds()))
	})
	if err != nil {
		return err
	}
	return serr
}
