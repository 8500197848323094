package rdssim

import (
	"errors"
	"os"
	"syscall"
)

// lseek(2) whence values for hole detection (Linux).
const (
	seekData = 3
	seekHole = 4
)

// dataSegments calls fn for each range of f below size that may hold data,
// skipping holes with SEEK_DATA/SEEK_HOLE. On a file system without hole
// support the whole range is one segment.
func dataSegments(f *os.File, size int64, fn func(off, end int64) error) error {
	off := int64(0)
	for off < size {
		data, err := f.Seek(off, seekData)
		if err != nil {
			if errors.Is(err, syscall.ENXIO) {
				return nil // only a hole up to the end of the file
			}
			if errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.EOPNOTSUPP) {
				return fn(off, size)
			}
			return err
		}
		if data >= size {
			return nil
		}
		hole, err := f.Seek(data, seekHole)
		if err != nil {
			return err
		}
		hole = min(hole, size)
		if err := fn(data, hole); err != nil {
			return err
		}
		off = hole
	}
	return nil
}
