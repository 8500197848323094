//go:build !linux

package rdssim

import "os"

// allocatedBytes falls back on the file's length where st_blocks is not
// at hand.
func allocatedBytes(fi os.FileInfo) int64 { return fi.Size() }
