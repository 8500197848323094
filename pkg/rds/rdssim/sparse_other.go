//go:build !linux

package rdssim

import "os"

// dataSegments treats the whole file as data; copySparse still skips
// writing zero blocks, so the copy stays sparse.
func dataSegments(f *os.File, size int64, fn func(off, end int64) error) error {
	if size == 0 {
		return nil
	}
	return fn(0, size)
}
