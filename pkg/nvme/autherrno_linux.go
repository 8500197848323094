package nvme

import (
	"errors"
	"syscall"
)

// The key errors of Linux's NVMe host authentication (authRefusal);
// syscall has them on Linux only.

func isNoKey(err error) bool { return errors.Is(err, syscall.ENOKEY) }

func isKeyRejected(err error) bool {
	return errors.Is(err, syscall.EKEYREJECTED) || errors.Is(err, syscall.EKEYEXPIRED)
}
