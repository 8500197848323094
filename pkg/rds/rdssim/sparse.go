package rdssim

import (
	"bytes"
	"fmt"
	"os"
)

const copyChunk = 1 << 20

// copySparse copies the first size bytes of src into dst at the same
// offsets, writing only non-zero data, so holes stay holes. dst must already
// have its final length (Truncate), which makes every unwritten range a hole.
// The result is an independent file: no extents are shared with src.
func copySparse(dst, src *os.File, size int64) error {
	buf := make([]byte, copyChunk)
	zero := make([]byte, copyChunk)
	return dataSegments(src, size, func(off, end int64) error {
		for off < end {
			n := int(min(int64(len(buf)), end-off))
			if _, err := src.ReadAt(buf[:n], off); err != nil {
				return fmt.Errorf("read %s at %d: %w", src.Name(), off, err)
			}
			if !bytes.Equal(buf[:n], zero[:n]) {
				if _, err := dst.WriteAt(buf[:n], off); err != nil {
					return fmt.Errorf("write %s at %d: %w", dst.Name(), off, err)
				}
			}
			off += int64(n)
		}
		return nil
	})
}
