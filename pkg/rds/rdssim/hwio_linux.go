package rdssim

import (
	"os"
	"syscall"
)

// allocatedBytes is the space a file's blocks take (st_blocks, 512-byte
// units): what a sparse file has had written.
func allocatedBytes(fi os.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}
