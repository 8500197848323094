package rds

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/srvlab/rds-csi/pkg/nvme"
)

// Disk is a file-backed RouterOS disk as the driver sees it.
type Disk struct {
	Slot      string
	Type      string
	FilePath  string
	Size      int64 // exact bytes (from size=, else the rounded file-size=)
	Exported  bool  // nvme-tcp-export=yes
	Port      int   // nvme-tcp-server-port, 0 when absent
	NQN       string
	AllowHost string // nvme-tcp-server-allow-host-name
	Flags     string
	// Secret is nvme-tcp-server-secret: the DH-HMAC-CHAP key the allowed
	// host must present, which RouterOS is assumed to derive from the
	// export's password (docs/routeros.md); zero when none is printed. Its
	// type never prints the key (%v of a Disk is safe to log).
	Secret nvme.DHCHAPSecret
	// SecretUnreadable: a secret was printed in a form this client does
	// not know; Secret is then zero and must not be taken for "none".
	SecretUnreadable bool
	// AllowHostUnknown: the export is closed and RouterOS printed no
	// allowed host (a listing), and none the client could confirm
	// (GetDisk, hidden.go); AllowHost "" then means unknown, not any
	// host. Port and NQN are 0 and "" when they were not printed and not
	// confirmed either.
	AllowHostUnknown bool
}

// Export describes the NVMe/TCP export of a disk.
type Export struct {
	Port int
	NQN  string
	// Closed creates the disk with nvme-tcp-export=no but with its port
	// and NQN set: exported to no host until SetExportHost opens it (the
	// driver's storage fencing). A Closed request matches an existing disk
	// with the same port and NQN whether it is exported or not, and
	// whatever its allowed host: a retried create must not undo a publish
	// that happened since.
	Closed bool
}

func (e *Export) validate() error {
	if e == nil {
		return nil
	}
	if err := ValidatePort(e.Port); err != nil {
		return err
	}
	return ValidateNQN(e.NQN)
}

// args renders the export arguments of /disk add: fixed text with a %s
// for each returned value (see command).
func (e *Export) args() (string, []string) {
	if e == nil {
		return "nvme-tcp-export=no", nil
	}
	if e.Closed {
		return fmt.Sprintf("nvme-tcp-export=no nvme-tcp-server-port=%d nvme-tcp-server-nqn=%%s", e.Port), []string{e.NQN}
	}
	return fmt.Sprintf("nvme-tcp-export=yes nvme-tcp-server-port=%d nvme-tcp-server-nqn=%%s", e.Port), []string{e.NQN}
}

// CreateDiskRequest asks for a new, empty, file-backed disk.
type CreateDiskRequest struct {
	Slot     string
	FilePath string  // absolute RouterOS path of the backing file
	Size     int64   // requested bytes; rounded up to Granularity, never down
	Export   *Export // nil: not exported
	// OwnsFilePath: FilePath is derived from Slot, so a file there that no
	// disk uses is debris of an earlier attempt at this same disk (its
	// /disk add ran and the cleanup failed): it is removed and the add
	// retried, instead of refusing with ErrAlreadyExists for ever.
	OwnsFilePath bool
}

func (r CreateDiskRequest) validate() (int64, error) {
	if err := ValidateSlot(r.Slot); err != nil {
		return 0, err
	}
	if err := ValidateFilePath(r.FilePath); err != nil {
		return 0, err
	}
	if err := r.Export.validate(); err != nil {
		return 0, err
	}
	return RoundUpSize(r.Size)
}

// CopyDiskRequest asks for a new disk whose content is a copy of SourceSlot
// (snapshot, clone, restore). Size 0 keeps the source's size; a larger size
// grows the copy; a smaller one is refused.
type CopyDiskRequest struct {
	Slot       string
	FilePath   string
	SourceSlot string
	Size       int64
	Export     *Export
	// OwnsFilePath: FilePath is derived from Slot (a clone's or restore's
	// volume file), so a file there that no disk uses is debris of an
	// earlier copy of this same disk whose clean-up failed, or a copy of
	// it still running (its disk appears only once it is done). The file
	// is taken for debris, removed and the copy sent again, only once the
	// RDS's clock says it has not changed for longer than any copy can
	// still land (CopyTimeout and an hour for a clock change); until then
	// the copy is ErrCopyPending. Never a file a disk uses.
	OwnsFilePath bool
}

func (r CopyDiskRequest) validate() error {
	if err := ValidateSlot(r.Slot); err != nil {
		return err
	}
	if err := ValidateSlot(r.SourceSlot); err != nil {
		return err
	}
	if r.Slot == r.SourceSlot {
		return fmt.Errorf("%w: copy of %q onto itself", ErrInvalidArgument, r.Slot)
	}
	if err := ValidateFilePath(r.FilePath); err != nil {
		return err
	}
	if r.Size < 0 {
		return fmt.Errorf("%w: size %d must not be negative", ErrInvalidArgument, r.Size)
	}
	return r.Export.validate()
}

// Capacity of the storage pool.
type Capacity struct {
	Total int64
	Free  int64
}

// SystemInfo is what /system resource print says about the RDS.
type SystemInfo struct {
	Version   string
	BoardName string
	Uptime    string
	Raw       map[string]string
}

// File is a /file entry.
type File struct {
	Name string // without leading slash
	Type string
	Size int64 // display-rounded by RouterOS
	// Modified is last-modified, the RDS's local wall-clock time read as
	// if it were UTC (compare it with Clock only); zero when not printed
	// or unreadable.
	Modified time.Time
}

func diskFromEntry(e Entry) (Disk, error) {
	v := e.Values
	d := Disk{
		Slot:      v["slot"],
		Type:      v["type"],
		FilePath:  v["file-path"],
		Exported:  v["nvme-tcp-export"] == "yes",
		NQN:       v["nvme-tcp-server-nqn"],
		AllowHost: v["nvme-tcp-server-allow-host-name"],
		Flags:     e.Flags,
	}
	if d.Slot == "" {
		return Disk{}, fmt.Errorf("%w: disk entry %d has no slot", ErrBadOutput, e.Number)
	}
	if raw := v["nvme-tcp-server-secret"]; raw != "" {
		sec, err := nvme.ParseDHCHAPSecret(raw)
		d.Secret, d.SecretUnreadable = sec, err != nil
	}
	// A closed export may not print its allowed host: unknown, not "".
	if _, ok := v["nvme-tcp-server-allow-host-name"]; !ok && !d.Exported {
		d.AllowHostUnknown = true
	}
	sizeText, ok := v["size"]
	if !ok {
		sizeText, ok = v["file-size"]
	}
	if ok {
		n, err := ParseSize(sizeText)
		if err != nil {
			return Disk{}, fmt.Errorf("disk %q: %w", d.Slot, err)
		}
		d.Size = n
	}
	if p, ok := v["nvme-tcp-server-port"]; ok && p != "" {
		n, err := strconv.Atoi(p)
		if err != nil {
			return Disk{}, fmt.Errorf("%w: disk %q port %q", ErrBadOutput, d.Slot, p)
		}
		d.Port = n
	}
	return d, nil
}

func disksFromOutput(out string) ([]Disk, error) {
	entries, err := ParsePrintDetail(out)
	if err != nil {
		return nil, err
	}
	return disksFromEntries(entries)
}

func disksFromEntries(entries []Entry) ([]Disk, error) {
	l := disksFromListing(Listing{Entries: entries})
	if len(l.Skipped) > 0 {
		return nil, l.Skipped[0].Err
	}
	return l.Disks, nil
}

// DiskListing is a listing of disks: the disks read, sorted by slot, and
// the entries that could not be read as disks (skipped, not fatal: one
// disk of a kind the parser does not know must not hide the driver's).
type DiskListing struct {
	Disks   []Disk
	Skipped []SkippedEntry
}

func disksFromListing(l Listing) DiskListing {
	dl := DiskListing{Disks: make([]Disk, 0, len(l.Entries)), Skipped: l.Skipped}
	for _, e := range l.Entries {
		d, err := diskFromEntry(e)
		if err != nil {
			dl.Skipped = append(dl.Skipped, SkippedEntry{Number: e.Number, Text: entryText(e), Err: err})
			continue
		}
		dl.Disks = append(dl.Disks, d)
	}
	sort.Slice(dl.Disks, func(i, j int) bool { return dl.Disks[i].Slot < dl.Disks[j].Slot })
	return dl
}

// entryText renders a parsed entry for the record of a skipped one.
func entryText(e Entry) string {
	keys := make([]string, 0, len(e.Values))
	for k := range e.Values {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "%d %s", e.Number, e.Flags)
	for _, k := range keys {
		v := e.Values[k]
		if sensitiveProperty(k) {
			v = hiddenValue
		}
		fmt.Fprintf(&b, " %s=%q", k, v)
	}
	return b.String()
}

// sensitiveProperties are the /disk properties that carry an export's
// authentication (the password, and the secret RouterOS makes of it, which
// is what a host presents to connect), on the server side and the
// initiator side. Their values are never logged.
var sensitiveProperties = []string{"nvme-tcp-server-secret", "nvme-tcp-server-password", "nvme-tcp-secret", "nvme-tcp-password"}

func sensitiveProperty(key string) bool { return slices.Contains(sensitiveProperties, key) }

// loggableText is a skipped entry's text as it may be logged: without
// any value of a sensitive property. An entry's text is either rendered
// from its values (entryText: those are hidden already) or RouterOS's
// raw lines, which may wrap a secret over two lines: then, with the
// blanks and line breaks RouterOS may have put in taken out, any trace
// of one not hidden (a sensitive property's name, a DH-HMAC-CHAP key's
// prefix) withholds the whole text.
func loggableText(text string) string {
	if holdsSecret(text) {
		return "(withheld: it holds an export's password or secret)"
	}
	return truncateTo(text, 300)
}

// holdsSecret: text, with the blanks and line breaks RouterOS may have
// put in taken out, shows a trace of a sensitive value that is not
// hidden (a sensitive property's name, a DH-HMAC-CHAP key's prefix).
func holdsSecret(text string) bool {
	squeezed := strings.ToLower(strings.Join(strings.Fields(text), ""))
	for _, k := range sensitiveProperties {
		squeezed = strings.ReplaceAll(squeezed, k+`="`+hiddenValue+`"`, "")
	}
	for _, mark := range append([]string{"dhhc-"}, sensitiveProperties...) {
		if strings.Contains(squeezed, mark) {
			return true
		}
	}
	return false
}

// hideSensitiveOutput is a print's output as the command observer may
// see it: each sensitive property's quoted value (wrapped over lines or
// not) replaced by "<hidden>". Output that still shows a trace of one (an
// unquoted value, which a wrap may continue on the next line; a name split
// by a wrap) is withheld whole.
func hideSensitiveOutput(out string) string {
	for _, k := range sensitiveProperties {
		var b strings.Builder
		rest := out
		for {
			i := strings.Index(rest, k+`="`)
			if i < 0 {
				b.WriteString(rest)
				break
			}
			b.WriteString(rest[:i] + k + `="` + hiddenValue + `"`)
			rest = rest[i+len(k)+2:]
			end := strings.IndexByte(rest, '"')
			if end < 0 {
				end = len(rest) - 1
			}
			rest = rest[end+1:]
		}
		out = b.String()
	}
	if holdsSecret(out) {
		return "(output withheld: it holds an export's password or secret)\n"
	}
	return out
}

// mayUseFile reports whether a skipped entry may be a disk on path: its
// text, with the line breaks and blanks RouterOS may have put into the
// path taken out, holds the path. Conservative: a file that an entry we
// could not read may use is never taken for debris.
func (s SkippedEntry) mayUseFile(path string) bool {
	squeeze := func(t string) string {
		return strings.Map(func(r rune) rune {
			if r == ' ' || r == '\t' || r == '\r' || r == '\n' {
				return -1
			}
			return r
		}, t)
	}
	return strings.Contains(squeeze(s.Text), squeeze(path))
}

func capacityFromOutput(pool, out string) (Capacity, error) {
	entries, err := ParsePrintDetail(out)
	if err != nil {
		return Capacity{}, err
	}
	return capacityFromEntries(pool, entries)
}

func capacityFromEntries(pool string, entries []Entry) (Capacity, error) {
	if len(entries) == 0 {
		return Capacity{}, fmt.Errorf("%w: no disk is mounted at %q", ErrNotFound, pool)
	}
	if len(entries) > 1 {
		return Capacity{}, fmt.Errorf("%w: %d disks are mounted at %q", ErrBadOutput, len(entries), pool)
	}
	var c Capacity
	for key, dst := range map[string]*int64{"size": &c.Total, "free": &c.Free} {
		text, ok := entries[0].Values[key]
		if !ok {
			return Capacity{}, fmt.Errorf("%w: pool %q has no %s=", ErrBadOutput, pool, key)
		}
		n, err := ParseSize(text)
		if err != nil {
			return Capacity{}, fmt.Errorf("pool %q %s: %w", pool, key, err)
		}
		*dst = n
	}
	return c, nil
}

// fileName turns a disk's file-path into a /file name (no leading slash).
func fileName(path string) string { return strings.TrimPrefix(path, "/") }

// ListDisksReport lists every file-backed disk, sorted by slot, and the
// entries of the listing it could not read. Each skipped entry is logged
// (a warning naming its number and why) and counted in SkippedEntries; it
// never fails the listing, so one foreign disk of a shape the parser does
// not know (a RAID member, a mounted image) cannot hide the driver's own.
func (c *Client) ListDisksReport(ctx context.Context) (DiskListing, error) {
	l, err := c.printListing(ctx, "/disk print detail where type=file")
	if err != nil {
		return DiskListing{}, err
	}
	dl := disksFromListing(l)
	if n := len(dl.Skipped); n > 0 {
		c.skipped.Add(int64(n))
		logger := klog.FromContext(ctx)
		for _, s := range dl.Skipped {
			logger.Info("WARNING: skipped a /disk entry the driver cannot read; the other disks are listed", "entry", s.Number, "reason", s.Err.Error(), "text", loggableText(s.Text))
		}
	}
	return dl, nil
}

// SkippedEntries is how many listing entries this client has skipped as
// unreadable since it was made (rds_csi_rds_unreadable_entries_total;
// each is also logged).
func (c *Client) SkippedEntries() int64 { return c.skipped.Load() }
