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
	// Secret is the DH-HMAC-CHAP key the allowed host must present
	// (nvme-tcp-server-secret, derived from the password); "" is none.
	Secret string
	File   string // the backing file on the host
	Size   int64  // the backing file's length; a change is revalidated
	// DropOnHostChange: a change of AllowHost drops the connections
	// already established (Config.AllowHostChange drop); otherwise they
	// are kept, as Linux nvmet keeps them.
	DropOnHostChange bool
}

// AllowHostChange is what a change of a disk's
// nvme-tcp-server-allow-host-name does to the NVMe/TCP connections already
// established to its export. RouterOS' behaviour is not known
// (docs/routeros.md); the simulator offers both, so that the driver is
// tested under each.
type AllowHostChange string

const (
	// AllowHostChangeKeep keeps established connections, even those of a
	// host no longer allowed: the host is checked at connect only. What
	// Linux nvmet does, and the cautious assumption. The default.
	AllowHostChangeKeep AllowHostChange = "keep"
	// AllowHostChangeDrop drops every established connection when the set
	// of allowed hosts changes (the nvmet backend takes the subsystem off
	// its port and links it again); only allowed hosts reconnect.
	AllowHostChangeDrop AllowHostChange = "drop"
)

// ParseAllowHostChange parses "keep" or "drop" ("" is keep).
func ParseAllowHostChange(s string) (AllowHostChange, error) {
	switch AllowHostChange(s) {
	case "", AllowHostChangeKeep:
		return AllowHostChangeKeep, nil
	case AllowHostChangeDrop:
		return AllowHostChangeDrop, nil
	}
	return "", fmt.Errorf("allow-host change %q: want keep or drop", s)
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
		out = append(out, Export{NQN: d.NQN, Port: d.Port, AllowHost: d.AllowHost, Secret: serverSecret(d.Password), File: s.hostPath(rel), Size: s.fileSize(d),
			DropOnHostChange: s.hostChange == AllowHostChangeDrop})
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

// exportKey is what a connection to a disk's export depends on: while it
// stays the same, established connections live on.
type exportKey struct {
	nqn       string
	port      int
	allowHost string
}

// exportKeys maps the slot of every exported disk to its exportKey. Called
// with stateMu held.
func (s *Server) exportKeys() map[string]exportKey {
	out := map[string]exportKey{}
	for _, d := range s.disks {
		if d.Export && d.NQN != "" {
			out[d.Slot] = exportKey{nqn: d.NQN, port: d.Port, allowHost: d.AllowHost}
		}
	}
	return out
}

// noteDrops counts, per slot, the changes since before that drop the
// established connections of an export: export off or disk removed, NQN or
// port changed, and with AllowHostChangeDrop the allowed host changed. It
// models the exporter without one (the none backend) and agrees with
// NvmetExporter. Called with stateMu held.
func (s *Server) noteDrops(before map[string]exportKey) {
	after := s.exportKeys()
	for slot, b := range before {
		a, ok := after[slot]
		if !ok || a.nqn != b.nqn || a.port != b.port ||
			(a.allowHost != b.allowHost && s.hostChange == AllowHostChangeDrop) {
			s.drops[slot]++
		}
	}
}

// ConnectionDrops is how many times the established NVMe/TCP connections
// to the export of the disk in slot were dropped (by the nvmet backend) or,
// without one, would have been: export off, disk removed, NQN or port
// changed, and with Config.AllowHostChange drop a change of its allowed
// host. The count outlives the disk.
func (s *Server) ConnectionDrops(slot string) int {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	return s.drops[slot]
}
