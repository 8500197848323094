package rds

import (
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strings"
	"unicode/utf8"
)

// Patterns for every value that is ever placed into a RouterOS command. They
// are deliberately narrow: nothing that RouterOS treats specially inside or
// outside quotes (`"`, `\`, `$`, `;`, `[`, `]`, `{`, `}`, whitespace, control
// characters) can match them.
var (
	slotPattern      = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?$`)
	pathPartPattern  = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]*$`)
	nqnPattern       = regexp.MustCompile(`^nqn\.[0-9]{4}-[0-9]{2}\.[A-Za-z0-9.-]+(:[A-Za-z0-9._:-]+)?$`)
	poolNamePattern  = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$`)
	hostNamePattern  = regexp.MustCompile(`^([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?$`)
	maxHostName      = 253
	digits           = regexp.MustCompile(`^[0-9]+$`)
	maxPathLength    = 255
	maxNQNLength     = 223 // NVMe base specification limit
	maxPortNumber    = 65535
	minimumPortValue = 1
)

// ValidateSlot checks a disk slot (the driver uses volume and snapshot IDs as
// slots): 1-64 characters of lower-case letters, digits and inner hyphens.
func ValidateSlot(slot string) error {
	if !slotPattern.MatchString(slot) {
		return fmt.Errorf("%w: slot %q must be 1-64 characters of a-z, 0-9 and inner '-'", ErrInvalidArgument, slot)
	}
	return nil
}

// ValidateFilePath checks an absolute RouterOS file path such as
// /storage-pool/k8s/pvc-1.img: slash-separated segments of letters, digits,
// '.', '_' and '-', no empty, "." or ".." segments.
func ValidateFilePath(path string) error {
	if len(path) == 0 || len(path) > maxPathLength || path[0] != '/' {
		return fmt.Errorf("%w: file path %q must be absolute and at most %d characters", ErrInvalidArgument, path, maxPathLength)
	}
	for _, part := range strings.Split(path[1:], "/") {
		if !pathPartPattern.MatchString(part) || part == "." || part == ".." {
			return fmt.Errorf("%w: file path %q has an invalid segment %q", ErrInvalidArgument, path, part)
		}
	}
	return nil
}

// ValidateNQN checks an NVMe qualified name.
func ValidateNQN(nqn string) error {
	if len(nqn) > maxNQNLength || !nqnPattern.MatchString(nqn) {
		return fmt.Errorf("%w: NQN %q is not a valid NVMe qualified name", ErrInvalidArgument, nqn)
	}
	return nil
}

// ValidatePoolName checks the mount point name of the storage pool.
func ValidatePoolName(name string) error {
	if !poolNamePattern.MatchString(name) {
		return fmt.Errorf("%w: pool name %q must be 1-64 characters of letters, digits, '.', '_' and '-'", ErrInvalidArgument, name)
	}
	return nil
}

// ValidatePort checks a TCP port number.
func ValidatePort(port int) error {
	if port < minimumPortValue || port > maxPortNumber {
		return fmt.Errorf("%w: port %d out of range 1-65535", ErrInvalidArgument, port)
	}
	return nil
}

// ValidateHost checks the address of the RDS or of its NVMe/TCP target as
// the driver and rdsctl take it: a host name or an IP address alone (an
// IPv6 address without brackets), the port being a setting of its own.
// "10.0.0.1:22" would otherwise be dialled as "[10.0.0.1:22]:22" and fail
// as a name lookup far from the setting.
func ValidateHost(host string) error {
	if _, err := netip.ParseAddr(host); err == nil {
		return nil
	}
	if h, port, err := net.SplitHostPort(host); err == nil && digits.MatchString(port) {
		return fmt.Errorf("%w: address %q has a port (%s): give the host alone (%s), the port has a setting of its own", ErrInvalidArgument, host, port, h)
	}
	if a, ok := strings.CutPrefix(host, "["); ok {
		if a, ok = strings.CutSuffix(a, "]"); ok {
			if _, err := netip.ParseAddr(a); err == nil {
				return fmt.Errorf("%w: address %q: give an IPv6 address without brackets (%s)", ErrInvalidArgument, host, a)
			}
		}
	}
	if len(host) > maxHostName || !hostNamePattern.MatchString(host) {
		return fmt.Errorf("%w: address %q is not a host name or an IP address", ErrInvalidArgument, host)
	}
	return nil
}

// quote wraps an already-validated value in RouterOS double quotes. A
// character that validation should have rejected is an error, never part of
// a command: reaching it is a bug, and a bug must not become a command.
func quote(v string) (string, error) {
	if strings.ContainsAny(v, "\"\\$;[]{}\r\n\t`") || !utf8.ValidString(v) {
		return "", fmt.Errorf("%w: unvalidated value %q must not reach a RouterOS command", ErrInvalidArgument, v)
	}
	return `"` + v + `"`, nil
}

// command renders format with each value quoted (format has one %s per
// value; everything else in it is fixed text or already rendered numbers).
func command(format string, values ...string) (string, error) {
	args := make([]any, len(values))
	for i, v := range values {
		q, err := quote(v)
		if err != nil {
			return "", err
		}
		args[i] = q
	}
	return fmt.Sprintf(format, args...), nil
}
