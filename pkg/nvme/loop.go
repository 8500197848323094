package nvme

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"k8s.io/klog/v2"
)

// BackingFileResolver maps a volume's NQN to the file that holds its data,
// e.g. the RDS simulator's backing file for the disk exported under nqn.
type BackingFileResolver func(ctx context.Context, nqn string) (string, error)

// LoopConfig configures a LoopConnector.
type LoopConfig struct {
	// NQNPrefix: as Config.NQNPrefix. Required.
	NQNPrefix string
	// Resolve finds a volume's backing file. Required.
	Resolve BackingFileResolver
	// Runner runs losetup. Default ExecRunner.
	Runner Runner
	// PollInterval while waiting for a detach to complete. Default 100ms.
	PollInterval time.Duration
}

// LoopConnector stands in for TCPConnector on machines without NVMe/TCP: a
// volume's "connection" is a loop device over its backing file. Like the
// real connector it keeps no device names: every call asks losetup which loop
// device (if any) is attached to the file, so it is idempotent across
// instances and process restarts.
type LoopConnector struct {
	cfg   LoopConfig
	guard nqnGuard
	locks keyedMutex
}

var _ Connector = (*LoopConnector)(nil)
var _ SizeRefresher = (*LoopConnector)(nil)

// NewLoopConnector validates cfg and fills in defaults.
func NewLoopConnector(cfg LoopConfig) (*LoopConnector, error) {
	guard, err := newNQNGuard(cfg.NQNPrefix)
	if err != nil {
		return nil, err
	}
	if cfg.Resolve == nil {
		return nil, fmt.Errorf("%w: LoopConnector needs a backing file resolver", ErrInvalidArgument)
	}
	if cfg.Runner == nil {
		cfg.Runner = ExecRunner{}
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	return &LoopConnector{cfg: cfg, guard: guard}, nil
}

// Connect attaches the NQN's backing file to a loop device, or returns the
// loop device already attached to it. Address and port are not used; a
// loop device presents no host, so a host NQN is only validated.
func (l *LoopConnector) Connect(ctx context.Context, t Target) (string, error) {
	if err := l.guard.check(t.NQN); err != nil {
		return "", err
	}
	if t.HostNQN != "" {
		if _, err := AttachmentHostIdentity(t.HostNQN); err != nil {
			return "", fmt.Errorf("connecting %s: %w", t.NQN, err)
		}
	}
	unlock, err := l.locks.lock(ctx, t.NQN)
	if err != nil {
		return "", err
	}
	defer unlock()

	file, err := l.backingFile(ctx, t.NQN)
	if err != nil {
		return "", err
	}
	if fi, err := os.Stat(file); err != nil {
		return "", fmt.Errorf("connecting %s: backing file: %w", t.NQN, err)
	} else if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%w: connecting %s: backing file %s is not a regular file", ErrInvalidArgument, t.NQN, file)
	}
	devs, err := l.attached(ctx, file, false)
	if err != nil {
		return "", err
	}
	if len(devs) > 0 {
		return devs[0], nil
	}
	// --nooverlap makes losetup itself reuse an existing attachment, which
	// covers a second process racing us.
	out, err := l.cfg.Runner.Run(ctx, "losetup", "--find", "--show", "--nooverlap", file)
	if err != nil {
		return "", fmt.Errorf("%w: attaching %s for %s: %w", ErrConnectFailed, file, t.NQN, err)
	}
	dev := strings.TrimSpace(string(out))
	if !strings.HasPrefix(dev, "/dev/loop") {
		return "", fmt.Errorf("%w: losetup printed %q for %s", ErrConnectFailed, dev, file)
	}
	klog.FromContext(ctx).Info("attached loop device", "nqn", t.NQN, "file", file, "device", dev)
	return dev, nil
}

// DevicePath returns the loop device attached to the NQN's backing file.
func (l *LoopConnector) DevicePath(ctx context.Context, nqn string) (string, error) {
	if err := validateNQN(nqn); err != nil {
		return "", err
	}
	file, err := l.backingFile(ctx, nqn)
	if err != nil {
		return "", err
	}
	devs, err := l.attached(ctx, file, false)
	if err != nil {
		return "", err
	}
	if len(devs) == 0 {
		return "", fmt.Errorf("%w: no loop device is attached to %s (%s)", ErrNotConnected, file, nqn)
	}
	return devs[0], nil
}

// IsConnected reports whether a loop device is attached to the NQN's
// backing file.
func (l *LoopConnector) IsConnected(ctx context.Context, nqn string) (bool, error) {
	_, err := l.DevicePath(ctx, nqn)
	if errors.Is(err, ErrNotConnected) {
		return false, nil
	}
	return err == nil, err
}

// Disconnect detaches every loop device attached to the NQN's backing file
// (including one whose file has since been deleted) after inUse said no, and
// waits, bounded by ctx, until the kernel has let go of them.
func (l *LoopConnector) Disconnect(ctx context.Context, nqn string, inUse InUseFunc) error {
	if err := l.guard.check(nqn); err != nil {
		return err
	}
	if inUse == nil {
		return fmt.Errorf("%w: disconnecting %s needs an in-use check", ErrInvalidArgument, nqn)
	}
	unlock, err := l.locks.lock(ctx, nqn)
	if err != nil {
		return err
	}
	defer unlock()

	file, err := l.backingFile(ctx, nqn)
	if err != nil {
		return err
	}
	devs, err := l.attached(ctx, file, true)
	if err != nil || len(devs) == 0 {
		return err
	}
	busy, err := inUse(ctx, nqn)
	if err != nil {
		return fmt.Errorf("disconnecting %s: in-use check: %w", nqn, err)
	}
	if busy {
		return fmt.Errorf("%w: %s is still used by a staged volume on this node; unstage it first", ErrInUse, nqn)
	}
	for _, dev := range devs {
		if _, err := l.cfg.Runner.Run(ctx, "losetup", "--detach", dev); err != nil {
			return fmt.Errorf("disconnecting %s: detaching %s: %w", nqn, dev, err)
		}
		klog.FromContext(ctx).Info("detached loop device", "nqn", nqn, "file", file, "device", dev)
	}
	// The kernel defers the detach while anyone (udev, a prober) still has
	// the device open; report success only once it is really gone.
	ticker := time.NewTicker(l.cfg.PollInterval)
	defer ticker.Stop()
	for {
		left, err := l.attached(ctx, file, true)
		if err != nil {
			return err
		}
		if len(left) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("disconnecting %s: %v still attached to %s (held open by another process?): %w", nqn, left, file, ctx.Err())
		case <-ticker.C:
		}
	}
}

// RefreshSize makes the loop device re-read its backing file's size
// (losetup --set-capacity), as the controller's rescan does for NVMe.
func (l *LoopConnector) RefreshSize(ctx context.Context, nqn string) error {
	if err := l.guard.check(nqn); err != nil {
		return err
	}
	dev, err := l.DevicePath(ctx, nqn)
	if err != nil {
		return err
	}
	if _, err := l.cfg.Runner.Run(ctx, "losetup", "--set-capacity", dev); err != nil {
		return fmt.Errorf("refreshing the size of %s (%s): %w", dev, nqn, err)
	}
	return nil
}

func (l *LoopConnector) backingFile(ctx context.Context, nqn string) (string, error) {
	file, err := l.cfg.Resolve(ctx, nqn)
	if err != nil {
		return "", fmt.Errorf("finding the backing file of %s: %w", nqn, err)
	}
	if !filepath.IsAbs(file) {
		return "", fmt.Errorf("%w: backing file %q of %s is not an absolute path", ErrInvalidArgument, file, nqn)
	}
	// losetup records the canonical path.
	if real, err := filepath.EvalSymlinks(file); err == nil {
		file = real
	}
	return filepath.Clean(file), nil
}

type losetupList struct {
	LoopDevices []struct {
		Name     string `json:"name"`
		BackFile string `json:"back-file"`
	} `json:"loopdevices"`
}

// attached lists the loop devices over file, lowest first. losetup matches
// an existing file by device and inode, so a renamed path still matches.
// With deleted set it also returns devices whose file was deleted while
// attached (losetup shows them as "<path> (deleted)").
func (l *LoopConnector) attached(ctx context.Context, file string, deleted bool) ([]string, error) {
	var devs []string
	seen := map[string]bool{}
	add := func(list losetupList, match func(back string) bool) {
		for _, d := range list.LoopDevices {
			if match(d.BackFile) && !seen[d.Name] {
				seen[d.Name] = true
				devs = append(devs, d.Name)
			}
		}
	}
	if _, err := os.Stat(file); err == nil {
		list, err := l.list(ctx, "--associated", file)
		if err != nil {
			return nil, err
		}
		add(list, func(string) bool { return true })
	}
	if deleted {
		list, err := l.list(ctx)
		if err != nil {
			return nil, err
		}
		add(list, func(back string) bool { return back == file+" (deleted)" })
	}
	sort.Slice(devs, func(i, j int) bool {
		if len(devs[i]) != len(devs[j]) {
			return len(devs[i]) < len(devs[j]) // loop2 before loop10
		}
		return devs[i] < devs[j]
	})
	return devs, nil
}

func (l *LoopConnector) list(ctx context.Context, args ...string) (losetupList, error) {
	var list losetupList
	out, err := l.cfg.Runner.Run(ctx, "losetup", append([]string{"--list", "--json", "--output", "NAME,BACK-FILE"}, args...)...)
	if err != nil {
		return list, fmt.Errorf("listing loop devices: %w", err)
	}
	if len(strings.TrimSpace(string(out))) == 0 {
		return list, nil // older losetup prints nothing when there are none
	}
	if err := json.Unmarshal(out, &list); err != nil {
		return list, fmt.Errorf("parsing losetup output: %w", err)
	}
	return list, nil
}
