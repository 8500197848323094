package rdssim

import "os"

// WriteDisk writes p at offset off of the disk in slot, as a node
// connected to its NVMe/TCP export would, and syncs it.
func (s *Server) WriteDisk(slot string, off int64, p []byte) error {
	path, err := s.BackingFile(slot)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(p, off); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// ReadDisk reads n bytes at offset off of the disk in slot.
func (s *Server) ReadDisk(slot string, off int64, n int) ([]byte, error) {
	path, err := s.BackingFile(slot)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, off); err != nil {
		return nil, err
	}
	return buf, nil
}
