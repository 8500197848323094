package rdssim

// ExportChange is one change of a disk's export made by a command: its
// nvme-tcp-export and nvme-tcp-server-allow-host-name after the command,
// a disk that appeared with them, or a disk removed.
type ExportChange struct {
	Seq       int // the command's Seq in the command log
	Slot      string
	Export    bool
	AllowHost string
	Removed   bool
}

// maxExportLog bounds ExportLog; older entries are dropped.
const maxExportLog = 10000

// exportState is what ExportLog records of a disk.
type exportState struct {
	export    bool
	allowHost string
}

// exportStates maps every disk's slot to its export state. Called with
// stateMu held.
func (s *Server) exportStates() map[string]exportState {
	out := make(map[string]exportState, len(s.disks))
	for _, d := range s.disks {
		out[d.Slot] = exportState{export: d.Export, allowHost: d.AllowHost}
	}
	return out
}

// exportStatesWithout is exportStates as it was before d was added (a
// copy's disk appears only when the copy is done). Called with stateMu
// held.
func (s *Server) exportStatesWithout(d *disk) map[string]exportState {
	out := s.exportStates()
	delete(out, d.Slot)
	return out
}

// noteExportChanges records, for command seq, every disk whose export
// state differs from before. Called with stateMu held.
func (s *Server) noteExportChanges(seq int, before map[string]exportState) {
	seen := make(map[string]bool, len(s.disks))
	for _, d := range s.disks {
		seen[d.Slot] = true
		if b, ok := before[d.Slot]; !ok || b != (exportState{export: d.Export, allowHost: d.AllowHost}) {
			s.recordExport(ExportChange{Seq: seq, Slot: d.Slot, Export: d.Export, AllowHost: d.AllowHost})
		}
	}
	for slot := range before {
		if !seen[slot] {
			s.recordExport(ExportChange{Seq: seq, Slot: slot, Removed: true})
		}
	}
}

func (s *Server) recordExport(c ExportChange) {
	if len(s.exportLog) >= maxExportLog {
		s.exportLog = append(s.exportLog[:0], s.exportLog[len(s.exportLog)-maxExportLog/2:]...)
	}
	s.exportLog = append(s.exportLog, c)
}

// ExportLog is every change of a disk's export (nvme-tcp-export, allowed
// host, the disk's coming and going) in the order the commands that made
// them ran, with their sequence numbers: which command, if any, opened,
// moved or closed an export. A command that changed nothing (a /disk set
// whose [find ...] matched no disk) has no entry. The last 5000-10000
// changes are kept.
func (s *Server) ExportLog() []ExportChange {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	return append([]ExportChange(nil), s.exportLog...)
}
