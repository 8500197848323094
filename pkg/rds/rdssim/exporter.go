package rdssim

import (
	"fmt"
	"slices"
)

// Export is one disk as an NVMe/TCP target should present it: the disk's
// `nvme-tcp-export=yes` settings and its backing file.
type Export struct {
	NQN       string // nvme-tcp-server-nqn
	Port      int    // nvme-tcp-server-port
	AllowHost string // nvme-tcp-server-allow-host-name; "" allows any host
	File      string // the backing file on the host
	Size      int64  // the backing file's length; a change is revalidated
}

// Exporter makes real NVMe/TCP targets follow the disk table. The server
// calls Reconcile with every exported disk after each command that changed
// the table and once at start-up; the exporter creates, changes and removes
// its own targets to match, and never touches anything it did not create.
// NvmetExporter (the kernel's nvmet over configfs) implements it.
type Exporter interface {
	Reconcile(want []Export) error
}

// wantedExports lists the disks with nvme-tcp-export=yes and an NQN, in
// table order. Called with stateMu held.
func (s *Server) wantedExports() []Export {
	var out []Export
	for _, d := range s.disks {
		if !d.Export || d.NQN == "" {
			continue
		}
		rel, err := s.relPath(d.FilePath)
		if err != nil {
			continue
		}
		out = append(out, Export{NQN: d.NQN, Port: d.Port, AllowHost: d.AllowHost, File: s.hostPath(rel), Size: s.fileSize(d)})
	}
	return out
}

// syncExports hands the wanted exports to the exporter when they differ
// from what it last applied. Called with stateMu held; a failure is
// reported to the client as a refusal of the command, and the next command
// tries again.
func (s *Server) syncExports() error {
	if s.exporter == nil {
		return nil
	}
	want := s.wantedExports()
	if s.exportsApplied && slices.Equal(want, s.lastExports) {
		return nil
	}
	s.exportsApplied = false
	if err := s.exporter.Reconcile(want); err != nil {
		return fmt.Errorf("nvme-tcp export: %w", err)
	}
	s.lastExports, s.exportsApplied = want, true
	return nil
}
