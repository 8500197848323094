package rds

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/klog/v2"
)

// cleanupTimeout bounds the best-effort removal of a half-made disk after a
// failed create, which runs even when the caller's context is done.
const cleanupTimeout = 30 * time.Second

// CreateDisk creates an empty file-backed disk of at least req.Size bytes
// and returns it as RouterOS reports it (Size is the real size). Creating a
// disk that already exists with the same file, size and export succeeds, so
// a retried create is idempotent; a different existing disk is
// ErrAlreadyExists. On failure nothing is left behind.
func (c *Client) CreateDisk(ctx context.Context, req CreateDiskRequest) (*Disk, error) {
	size, err := req.validate()
	if err != nil {
		return nil, err
	}
	c.rememberExport(req.Slot, req.Export)
	exportArgs, exportValues := req.Export.args()
	add := func() error {
		_, err := c.exec(ctx, "/disk add type=file file-path=%s file-size="+FormatSize(size)+" slot=%s "+exportArgs,
			append([]string{req.FilePath, req.Slot}, exportValues...)...)
		return err
	}
	if err := c.addReclaiming(ctx, add, req.Slot, req.FilePath, req.OwnsFilePath, 0); err != nil {
		return c.afterFailedAdd(ctx, err, req.Slot, req.FilePath, func(d *Disk) bool {
			return d.Size >= size && sameExport(d, req.Export)
		})
	}
	d, err := c.GetDisk(ctx, req.Slot)
	if err != nil {
		return nil, fmt.Errorf("disk %q created but cannot be read back: %w", req.Slot, err)
	}
	return d, nil
}

// CopyDisk creates a disk whose content is a copy of req.SourceSlot, grown
// to req.Size when that is larger than the source. Idempotent like
// CreateDisk; on failure nothing is left behind. The copy's export is
// req.Export and nothing of the source's (copyExportArgs): never exported
// (nil), closed, or open to any host, with no allowed host. With a nil
// Export its port and NQN are left to RouterOS (the source's, if copy-from
// inherits them); pass a Closed Export to set them too.
func (c *Client) CopyDisk(ctx context.Context, req CopyDiskRequest) (*Disk, error) {
	if err := req.validate(); err != nil {
		return nil, err
	}
	c.rememberExport(req.Slot, req.Export)
	src, err := c.GetDisk(ctx, req.SourceSlot)
	if err != nil {
		return nil, fmt.Errorf("copy source %q: %w", req.SourceSlot, err)
	}
	want := src.Size
	if req.Size > 0 {
		if want, err = RoundUpSize(req.Size); err != nil {
			return nil, err
		}
		if want < src.Size {
			return nil, fmt.Errorf("%w: copy of %q needs at least %d bytes, %d requested", ErrInvalidArgument, req.SourceSlot, src.Size, req.Size)
		}
	}
	exportArgs, exportValues := copyExportArgs(req.Export, !src.Secret.IsZero() || src.SecretUnreadable)
	add := func() error {
		_, err := c.exec(ctx, "/disk add type=file file-path=%s slot=%s copy-from=[find slot=%s] "+exportArgs,
			append([]string{req.FilePath, req.Slot, req.SourceSlot}, exportValues...)...)
		return err
	}
	// A file left at the path may be a copy still running: reclaimed only
	// once it has been quiet for longer than any copy can land late.
	err = c.addReclaiming(ctx, add, req.Slot, req.FilePath, req.OwnsFilePath, c.cfg.CopyTimeout+clockChangeMargin)
	if errors.Is(err, ErrCopyPending) {
		return nil, err
	}
	if errors.Is(err, ErrOutcomeUnknown) {
		// Sent, not confirmed. It is not re-sent and not cleaned up: it
		// may still be copying. Its disk appears only once the copy is
		// complete (assumed, see docs/routeros.md), so a disk means done.
		// The caller's context may be what ended the wait: look with a
		// fresh one.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.CommandTimeout)
		defer cancel()
		d, gerr := c.GetDisk(rctx, req.Slot)
		switch {
		case gerr == nil && d.FilePath == req.FilePath && sameExport(d, req.Export):
			return c.growCopy(ctx, d, want)
		case gerr == nil || errors.Is(gerr, ErrNotFound):
			return nil, fmt.Errorf("%w: copy %q of %q: %v", ErrCopyPending, req.Slot, req.SourceSlot, err)
		}
		return nil, fmt.Errorf("%w; reading the copy back: %v", err, gerr)
	}
	if err != nil {
		d, err := c.afterFailedAdd(ctx, err, req.Slot, req.FilePath, func(d *Disk) bool { return sameExport(d, req.Export) })
		if err != nil {
			return nil, err
		}
		return c.growCopy(ctx, d, want)
	}
	d, err := c.GetDisk(ctx, req.Slot)
	if err != nil {
		return nil, fmt.Errorf("copy %q created but cannot be read back: %w", req.Slot, err)
	}
	return c.growCopy(ctx, d, want)
}

// copyExportArgs renders the export properties of a copy, the allowed host
// included. RouterOS's CLI manual says add's copy-from takes the new
// item's default property values from the existing item, so a property the
// add leaves out may be the source's: a copy of a volume open to a node
// would be open to that node (docs/routeros.md, facts table). With
// clearPassword (the source prints a secret: it has a password) the
// password goes too (`nvme-tcp-server-password=""`, syntax assumed): a
// copy that kept its source's would hand whoever opens it the source's
// secret. Without, the property is not sent: that RouterOS takes it on
// add is assumed, and a copy of a disk without a password has none to
// inherit.
func copyExportArgs(e *Export, clearPassword bool) (string, []string) {
	args, values := e.args()
	args, values = args+" nvme-tcp-server-allow-host-name=%s", append(values, "")
	if clearPassword {
		args, values = args+" nvme-tcp-server-password=%s", append(values, "")
	}
	return args, values
}

func (c *Client) growCopy(ctx context.Context, d *Disk, want int64) (*Disk, error) {
	if d.Size >= want {
		return d, nil
	}
	grown, err := c.grow(ctx, d.Slot, want)
	if err != nil {
		c.cleanup(ctx, d.Slot, d.FilePath)
		return nil, fmt.Errorf("growing copy %q to %d bytes: %w", d.Slot, want, err)
	}
	return grown, nil
}

// clockChangeMargin allows for a change of the RDS's clock (daylight
// saving) between a file's last-modified and the clock read beside it.
const clockChangeMargin = time.Hour

// addReclaiming runs add. When it fails because the file exists, the
// caller owns the path (derived from the slot), and neither a disk in the
// slot nor any disk on the file exists, the file is debris of an earlier
// attempt whose cleanup failed: it is removed and add runs once more.
// With quiet > 0 (a copy, which may still be running and writing the file
// while its disk is not listed yet) the file must also not have changed
// for quiet by the RDS's own clock; a younger one is ErrCopyPending, and
// one whose age cannot be read is never removed.
func (c *Client) addReclaiming(ctx context.Context, add func() error, slot, path string, owns bool, quiet time.Duration) error {
	err := add()
	if err == nil || !owns || !errors.Is(err, ErrAlreadyExists) {
		return err
	}
	if _, gerr := c.GetDisk(ctx, slot); !errors.Is(gerr, ErrNotFound) {
		return err // a disk is in the slot: afterFailedAdd decides
	}
	if users, uerr := c.disksUsingFile(ctx, path); uerr != nil || users > 0 {
		return err
	}
	if quiet > 0 {
		switch qerr := c.quietFor(ctx, path, quiet); {
		case errors.Is(qerr, ErrCopyPending):
			return fmt.Errorf("disk %q: the file %s has no disk: %w", slot, path, qerr)
		case qerr != nil:
			return fmt.Errorf("%w; the file %s has no disk, but %v", err, path, qerr)
		}
	}
	if rerr := c.RemoveFile(ctx, path); rerr != nil {
		return fmt.Errorf("%w; removing the orphaned file %s: %v", err, path, rerr)
	}
	klog.FromContext(ctx).Info("removed an orphaned backing file left by an earlier attempt", "slot", slot, "path", path)
	return add()
}

// quietFor returns nil when the file at path has not changed for at
// least quiet by the RDS's clock; ErrCopyPending while it is younger (a
// copy may still be writing it); another error, never nil, when its age
// cannot be read.
func (c *Client) quietFor(ctx context.Context, path string, quiet time.Duration) error {
	f, err := c.GetFile(ctx, path)
	if err != nil {
		return fmt.Errorf("reading its age: %w", err)
	}
	if f.Modified.IsZero() {
		return fmt.Errorf("its last-modified time is not printed or not readable, so a copy still writing it cannot be ruled out; it is not removed")
	}
	now, err := c.Clock(ctx)
	if err != nil {
		return fmt.Errorf("reading the RDS's clock to judge its age: %w", err)
	}
	if age := now.Sub(f.Modified); age < quiet {
		return fmt.Errorf("%w: last modified %s ago by the RDS's clock (%s), it may be a copy still running; it is taken for the debris of a failed copy, and removed, once it has not changed for %s",
			ErrCopyPending, age.Round(time.Second), f.Modified.Format(time.DateTime), quiet)
	}
	return nil
}

// afterFailedAdd decides what a failed /disk add means. A disk that already
// exists and matches is the success of an earlier attempt whose reply was
// lost; a mismatch is a conflict; anything else is cleaned up.
func (c *Client) afterFailedAdd(ctx context.Context, addErr error, slot, path string, matches func(*Disk) bool) (*Disk, error) {
	if errors.Is(addErr, ErrAlreadyExists) {
		d, err := c.GetDisk(ctx, slot)
		if err != nil {
			// The file exists without a disk: not ours to remove.
			return nil, addErr
		}
		if d.FilePath == path && matches(d) {
			return d, nil
		}
		return nil, fmt.Errorf("%w: disk %q exists with file %s, size %d", ErrAlreadyExists, slot, d.FilePath, d.Size)
	}
	if !errors.Is(addErr, ErrInvalidArgument) {
		c.cleanup(ctx, slot, path)
	}
	return nil, addErr
}

func sameExport(d *Disk, e *Export) bool {
	switch {
	case e == nil:
		return !d.Exported
	case e.Closed:
		return d.Port == e.Port && d.NQN == e.NQN
	}
	return d.Exported && d.Port == e.Port && d.NQN == e.NQN
}

// cleanup removes what a failed add may have created: the disk, if it uses
// path, and the file at path, if no disk uses it. Best effort, logged.
func (c *Client) cleanup(ctx context.Context, slot, path string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	logger := klog.FromContext(ctx)
	if d, err := c.GetDisk(cctx, slot); err == nil {
		if d.FilePath != path {
			return
		}
		if _, err := c.exec(cctx, "/disk remove [find slot=%s]", slot); err != nil {
			logger.Error(err, "cleanup after failed create: removing disk", "slot", slot)
			return
		}
	} else if !errors.Is(err, ErrNotFound) {
		logger.Error(err, "cleanup after failed create: reading disk", "slot", slot)
		return
	}
	if users, err := c.disksUsingFile(cctx, path); err != nil || users > 0 {
		return
	}
	if _, err := c.exec(cctx, "/file remove [find name=%s]", fileName(path)); err != nil {
		logger.Error(err, "cleanup after failed create: removing file", "path", path)
	}
}

// disksUsingFile counts the disks on path, and the listing entries it
// could not read that may be on it (their text holds the path).
func (c *Client) disksUsingFile(ctx context.Context, path string) (int, error) {
	l, err := c.ListDisksReport(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, d := range l.Disks {
		if d.FilePath == path {
			n++
		}
	}
	for _, s := range l.Skipped {
		if s.mayUseFile(path) {
			n++
		}
	}
	return n, nil
}

// GetDisk returns the disk in slot, or ErrNotFound.
func (c *Client) GetDisk(ctx context.Context, slot string) (*Disk, error) {
	if err := ValidateSlot(slot); err != nil {
		return nil, err
	}
	entries, err := c.printDetail(ctx, "/disk print detail where slot=%s", slot)
	if err != nil {
		return nil, err
	}
	disks, err := disksFromEntries(entries)
	if err != nil {
		return nil, err
	}
	switch len(disks) {
	case 0:
		return nil, fmt.Errorf("%w: disk %q", ErrNotFound, slot)
	case 1:
		if disks[0].Slot != slot {
			return nil, fmt.Errorf("%w: asked for disk %q, got %q", ErrBadOutput, slot, disks[0].Slot)
		}
		// A closed export may not print its port, NQN and allowed host.
		if err := c.resolveHidden(ctx, &disks[0]); err != nil {
			return nil, err
		}
		return &disks[0], nil
	default:
		return nil, fmt.Errorf("%w: %d disks in slot %q", ErrBadOutput, len(disks), slot)
	}
}

// ListDisks returns every file-backed disk, sorted by slot, so that callers
// can paginate with a stable order. Entries it cannot read are skipped
// (ListDisksReport).
func (c *Client) ListDisks(ctx context.Context) ([]Disk, error) {
	l, err := c.ListDisksReport(ctx)
	if err != nil {
		return nil, err
	}
	return l.Disks, nil
}

// ResizeDisk grows a disk to at least size bytes and returns it. A disk that
// is already as large is returned unchanged; disks never shrink.
func (c *Client) ResizeDisk(ctx context.Context, slot string, size int64) (*Disk, error) {
	want, err := RoundUpSize(size)
	if err != nil {
		return nil, err
	}
	d, err := c.GetDisk(ctx, slot)
	if err != nil {
		return nil, err
	}
	if d.Size >= want {
		return d, nil
	}
	return c.grow(ctx, slot, want)
}

// grow sets an existing disk's size to want (a Granularity multiple) and
// reads back the real size.
func (c *Client) grow(ctx context.Context, slot string, want int64) (*Disk, error) {
	if _, err := c.exec(ctx, "/disk set [find slot=%s] file-size="+FormatSize(want), slot); err != nil {
		return nil, err
	}
	d, err := c.GetDisk(ctx, slot)
	if err != nil {
		return nil, err
	}
	if d.Size < want {
		return nil, fmt.Errorf("%w: disk %q is %d bytes after resize to %d", ErrCommandFailed, slot, d.Size, want)
	}
	return d, nil
}

// DeleteDisk removes the disk in slot and its backing file. filePath is the
// file the caller expects the disk to use; it is removed even when the disk
// is already gone, so a delete interrupted between the two steps completes
// on retry. Deleting what does not exist succeeds.
func (c *Client) DeleteDisk(ctx context.Context, slot, filePath string) error {
	if err := ValidateSlot(slot); err != nil {
		return err
	}
	if err := ValidateFilePath(filePath); err != nil {
		return err
	}
	d, err := c.GetDisk(ctx, slot)
	switch {
	case errors.Is(err, ErrNotFound):
	case err != nil:
		return err
	default:
		if d.FilePath != filePath {
			return fmt.Errorf("%w: disk %q uses %s, not %s; refusing to delete", ErrInvalidArgument, slot, d.FilePath, filePath)
		}
		if _, err := c.exec(ctx, "/disk remove [find slot=%s]", slot); err != nil {
			return err
		}
	}
	return c.RemoveFile(ctx, filePath)
}

// RemoveFile removes the file at an absolute path; a missing file is
// success. It does not check whether a disk uses the file.
func (c *Client) RemoveFile(ctx context.Context, path string) error {
	if err := ValidateFilePath(path); err != nil {
		return err
	}
	_, err := c.exec(ctx, "/file remove [find name=%s]", fileName(path))
	return err
}

// FilesWithPrefix lists the files whose absolute path starts with prefix
// (e.g. every file of one snapshot: ".../snapshots/<id>."), found with a
// `~` condition and checked exactly here.
func (c *Client) FilesWithPrefix(ctx context.Context, prefix string) ([]File, error) {
	if err := ValidateFilePath(strings.TrimSuffix(prefix, ".")); err != nil {
		return nil, err
	}
	entries, err := c.printDetail(ctx, "/file print detail where name~%s", "^"+fileName(prefix))
	if err != nil {
		return nil, err
	}
	var files []File
	for _, e := range entries {
		f, err := fileFromEntry(e)
		if err != nil {
			return nil, err
		}
		if strings.HasPrefix("/"+f.Name, prefix) {
			files = append(files, *f)
		}
	}
	return files, nil
}

// DiskUsingFile reports whether any disk has path as its file.
func (c *Client) DiskUsingFile(ctx context.Context, path string) (bool, error) {
	n, err := c.disksUsingFile(ctx, path)
	return n > 0, err
}

// GetFile returns the /file entry for an absolute path, or ErrNotFound.
func (c *Client) GetFile(ctx context.Context, path string) (*File, error) {
	if err := ValidateFilePath(path); err != nil {
		return nil, err
	}
	entries, err := c.printDetail(ctx, "/file print detail where name=%s", fileName(path))
	if err != nil {
		return nil, err
	}
	if len(entries) == 0 {
		return nil, fmt.Errorf("%w: file %s", ErrNotFound, path)
	}
	return fileFromEntry(entries[0])
}

func fileFromEntry(e Entry) (*File, error) {
	v := e.Values
	f := &File{Name: v["name"], Type: v["type"], Modified: parseLastModified(v["last-modified"])}
	if s, ok := v["size"]; ok {
		var err error
		if f.Size, err = ParseSize(s); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// Capacity returns the total and free bytes of the pool mounted at pool.
func (c *Client) Capacity(ctx context.Context, pool string) (Capacity, error) {
	if err := ValidatePoolName(pool); err != nil {
		return Capacity{}, err
	}
	entries, err := c.printDetail(ctx, "/disk print detail where mount-point=%s", pool)
	if err != nil {
		return Capacity{}, err
	}
	return capacityFromEntries(pool, entries)
}

// Probe runs /system resource print: the RDS answers and is RouterOS.
func (c *Client) Probe(ctx context.Context) (*SystemInfo, error) {
	out, err := c.run(ctx, "/system resource print")
	if err != nil {
		return nil, err
	}
	raw, err := ParseResource(out)
	if err != nil {
		return nil, err
	}
	return &SystemInfo{Version: raw["version"], BoardName: raw["board-name"], Uptime: raw["uptime"], Raw: raw}, nil
}

// SetAllowedHost restricts the disk's NVMe/TCP export to one host NQN, or
// lifts the restriction when hostNQN is empty. The semantics of RouterOS'
// nvme-tcp-server-allow-host-name are not verified on hardware; callers keep
// storage-level fencing built on it behind a flag.
func (c *Client) SetAllowedHost(ctx context.Context, slot, hostNQN string) error {
	if hostNQN != "" {
		if err := ValidateNQN(hostNQN); err != nil {
			return err
		}
	}
	// set on [find] silently does nothing for a missing disk.
	if _, err := c.GetDisk(ctx, slot); err != nil {
		return err
	}
	if _, err := c.exec(ctx, "/disk set [find slot=%s] nvme-tcp-server-allow-host-name=%s", slot, hostNQN); err != nil {
		return err
	}
	// A closed export may not print the host: the read-back confirms it.
	c.rememberHost(slot, hostNQN)
	d, err := c.GetDisk(ctx, slot)
	if err != nil {
		return err
	}
	if d.AllowHost != hostNQN {
		return fmt.Errorf("%w: disk %q allows %q after setting %q", ErrCommandFailed, slot, d.AllowHost, hostNQN)
	}
	return nil
}
