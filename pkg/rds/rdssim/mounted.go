package rdssim

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// AddMountedImage adds a file disk that is mounted on the RDS, as an
// operator's ISO image or swap file would be, beside the driver's disks:
// /disk print shows it with the M flag and its mount point, so a listing
// of file disks has the legend B, M, t and every exported disk prints
// `B t` (issue 22, item 2). The image is a sparse file of size bytes at
// path, a RouterOS path under the pool ("/storage-pool/iso/a.iso").
func (s *Server) AddMountedImage(slot, path string, size int64) error {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	if slot == "" || size <= 0 {
		return fmt.Errorf("rdssim: a mounted image needs a slot and a size")
	}
	if s.diskBySlot(slot) != nil {
		return fmt.Errorf("rdssim: a disk with slot %q exists", slot)
	}
	rel, err := s.relPath(path)
	if err != nil {
		return fmt.Errorf("rdssim: %w", err)
	}
	hostPath := s.hostPath(rel)
	if _, err := os.Lstat(hostPath); !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("rdssim: %s exists", path)
	}
	if err := s.createBackingFile(hostPath, size, ""); err != nil {
		return fmt.Errorf("rdssim: %w", err)
	}
	s.disks = append(s.disks, &disk{Slot: slot, FilePath: path, Mounted: true})
	if err := saveState(s.dataDir, s.disks); err != nil {
		s.disks = s.disks[:len(s.disks)-1]
		os.Remove(hostPath)
		return err
	}
	return nil
}
