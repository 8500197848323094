package backends

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path"
	"regexp"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/srvlab/rds-csi/pkg/rds"
)

// Backend is one RDS box: where the controller reaches it over SSH and
// with which identity, where its volumes live, where nodes connect to
// them, its own limits, and which nodes reach it.
type Backend struct {
	// Name names the box in volume IDs, topology, metrics and messages: a
	// Kubernetes label value.
	Name string
	// Default: the box of the --rds-* flags. Volume IDs without a box
	// name are its (every ID made before there were several boxes).
	Default bool

	Address                  string
	Port                     int
	User                     string
	KeyFile                  string
	KnownHostsFile           string
	InsecureSkipHostKeyCheck bool
	LoginOptions             string

	Pool       string // mount point of the storage pool (capacity)
	VolumePath string // directory of the volumes' backing files

	NVMeAddress string // NVMe/TCP target; default Address
	NVMePort    int

	// CommandTimeout bounds one attempt of one command on this box;
	// MaxSessions its concurrent SSH sessions (0: the client's default).
	CommandTimeout time.Duration
	MaxSessions    int

	// Nodes are the node names (path.Match patterns) that reach this
	// box over NVMe/TCP; empty: every node.
	Nodes []string
}

// RDSConfig is the SSH client configuration of the box.
func (b *Backend) RDSConfig() rds.Config {
	return rds.Config{
		Address: b.Address, Port: b.Port, User: b.User, KeyFile: b.KeyFile,
		KnownHostsFile: b.KnownHostsFile, InsecureSkipHostKeyCheck: b.InsecureSkipHostKeyCheck,
		LoginOptions: b.LoginOptions, CommandTimeout: b.CommandTimeout, MaxSessions: b.MaxSessions,
	}
}

// Reaches reports whether node reaches the box (Nodes).
func (b *Backend) Reaches(node string) bool {
	if len(b.Nodes) == 0 {
		return true
	}
	for _, p := range b.Nodes {
		if ok, _ := path.Match(p, node); ok {
			return true
		}
	}
	return false
}

// file is the --rds-config file: the boxes besides the default one.
type file struct {
	RDS []entry `json:"rds"`
}

// entry is one box of the file. A setting left out takes the default
// box's (the --rds-* flags), except the name and the address.
type entry struct {
	Name                     string           `json:"name"`
	Address                  string           `json:"address"`
	Port                     int              `json:"port,omitempty"`
	User                     string           `json:"user,omitempty"`
	KeyFile                  string           `json:"keyFile,omitempty"`
	KnownHostsFile           string           `json:"knownHostsFile,omitempty"`
	InsecureSkipHostKeyCheck bool             `json:"insecureSkipHostKeyCheck,omitempty"`
	Pool                     string           `json:"pool,omitempty"`
	VolumePath               string           `json:"volumePath,omitempty"`
	NVMeAddress              string           `json:"nvmeAddress,omitempty"`
	NVMePort                 int              `json:"nvmePort,omitempty"`
	CommandTimeout           *metav1.Duration `json:"commandTimeout,omitempty"`
	MaxSessions              int              `json:"maxSessions,omitempty"`
	Nodes                    []string         `json:"nodes,omitempty"`
}

// Load reads the --rds-config file at name and returns every box: def
// (the box of the flags, the default) first, then the file's, in its
// order. An empty file, or one with an empty list, leaves def alone. The
// boxes are not validated (Validate).
func Load(name string, def Backend) ([]Backend, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("--rds-config: %w", err)
	}
	return Parse(name, b, def)
}

// Parse is Load of text read from name (which only names it in errors).
// Unknown keys are refused, so that a misspelt setting is not silently
// left at the default box's value.
func Parse(name string, text []byte, def Backend) ([]Backend, error) {
	def.Default = true
	var f file
	if err := yaml.UnmarshalStrict(text, &f); err != nil {
		return nil, fmt.Errorf("--rds-config %s: %v (want a list under rds:, each with name, address and the settings that differ from the --rds-* flags; docs/deploy.md)", name, err)
	}
	out := []Backend{def}
	for _, e := range f.RDS {
		b := Backend{
			Name: e.Name, Address: e.Address, Port: or(e.Port, 22), User: or(e.User, def.User),
			KeyFile: or(e.KeyFile, def.KeyFile), KnownHostsFile: e.KnownHostsFile,
			InsecureSkipHostKeyCheck: e.InsecureSkipHostKeyCheck, LoginOptions: def.LoginOptions,
			Pool: or(e.Pool, def.Pool), VolumePath: or(e.VolumePath, def.VolumePath),
			NVMeAddress: or(e.NVMeAddress, e.Address), NVMePort: or(e.NVMePort, def.NVMePort),
			CommandTimeout: def.CommandTimeout, MaxSessions: or(e.MaxSessions, def.MaxSessions),
			Nodes: e.Nodes,
		}
		// The default box's known_hosts may pin this box too; an
		// insecure box says so itself.
		if b.KnownHostsFile == "" && !b.InsecureSkipHostKeyCheck {
			b.KnownHostsFile = def.KnownHostsFile
		}
		if e.CommandTimeout != nil {
			b.CommandTimeout = e.CommandTimeout.Duration
		}
		out = append(out, b)
	}
	return out, nil
}

func or[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// labelValue is a Kubernetes label value, non-empty.
var labelValue = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)

// MaxNameLength is the longest box name when there are several: the name
// is part of the node label rds.<name> (a label name, at most 63).
const MaxNameLength = 63 - len(boxKeyPrefix)

// Limits of a box's own settings.
const (
	MinCommandTimeout  = time.Second
	MaxCommandTimeout  = 10 * time.Minute
	MaxSessionsLimit   = 64
	maxVolumePathChars = 132 // snapshot file names within RouterOS' 255 (pkg/csi)
)

// Purpose says what a process needs of the boxes: the controller logs in
// to every box; a node plugin only names them in its topology.
type Purpose int

const (
	ForController Purpose = iota
	ForNode
)

// Validate checks the boxes (Load's result, the default first) and
// returns one error naming every problem and the entry it is in: a name
// that is not a label value, two boxes of one name, two boxes at one SSH
// address or one NVMe/TCP target, a box without a pinned host key, a bad
// address, port, pool, volume path, limit or node pattern.
func Validate(boxes []Backend, p Purpose) error {
	var problems []string
	add := func(b *Backend, i int, format string, a ...any) {
		problems = append(problems, entryName(b, i)+": "+fmt.Sprintf(format, a...))
	}
	names := map[string]int{}
	ssh := map[string]int{}
	nvme := map[string]int{}
	for i := range boxes {
		b := &boxes[i]
		switch {
		case b.Name == "":
			add(b, i, "a name is required (a label value that names the RDS in volume IDs, topology and metrics)")
		case !labelValue.MatchString(b.Name):
			add(b, i, "name %q is not a Kubernetes label value (1-63 of A-Z a-z 0-9 - _ . starting and ending alphanumeric)", b.Name)
		case len(boxes) > 1 && len(b.Name) > MaxNameLength:
			add(b, i, "name %q is %d characters; with several RDS at most %d (nodes are labelled %s<name>)", b.Name, len(b.Name), MaxNameLength, boxKeyPrefix)
		}
		if j, dup := names[strings.ToLower(b.Name)]; dup && b.Name != "" {
			add(b, i, "name %q is taken by %s already (names are compared without case)", b.Name, entryName(&boxes[j], j))
		} else {
			names[strings.ToLower(b.Name)] = i
		}
		for _, pat := range b.Nodes {
			if _, err := path.Match(pat, ""); err != nil || pat == "" {
				add(b, i, "nodes: %q is not a node name pattern (path.Match: * ? [a-z])", pat)
			}
		}
		if p == ForNode {
			continue
		}
		if err := rds.ValidateHost(b.Address); b.Address == "" {
			add(b, i, "an address is required (the RDS's SSH address, a host name or IP address)")
		} else if err != nil {
			add(b, i, "address: %v", err)
		}
		if err := rds.ValidatePort(b.Port); err != nil {
			add(b, i, "port: %v", err)
		}
		if b.User == "" {
			add(b, i, "a user is required")
		}
		if b.KeyFile == "" {
			add(b, i, "an SSH key file is required (keyFile, mounted from the box's Secret)")
		}
		if b.KnownHostsFile == "" && !b.InsecureSkipHostKeyCheck {
			add(b, i, "no pinned host key: give knownHostsFile, a known_hosts file with the RDS's host key (or insecureSkipHostKeyCheck: true, labs only)")
		}
		if err := rds.ValidatePoolName(b.Pool); err != nil {
			add(b, i, "pool: %v", err)
		}
		switch err := rds.ValidateFilePath(b.VolumePath); {
		case err != nil:
			add(b, i, "volumePath: %v", err)
		case len(b.VolumePath) > maxVolumePathChars:
			add(b, i, "volumePath must be at most %d characters, so that snapshot file names fit RouterOS' 255", maxVolumePathChars)
		case b.VolumePath == "/"+b.Pool:
			add(b, i, "volumePath must be a directory inside the pool, not the pool itself")
		}
		if err := rds.ValidateHost(b.NVMeAddress); err != nil && b.NVMeAddress != "" {
			add(b, i, "nvmeAddress: %v", err)
		}
		if err := rds.ValidatePort(b.NVMePort); err != nil {
			add(b, i, "nvmePort: %v", err)
		}
		if b.CommandTimeout != 0 && (b.CommandTimeout < MinCommandTimeout || b.CommandTimeout > MaxCommandTimeout) {
			add(b, i, "commandTimeout %s is outside %s..%s", b.CommandTimeout, MinCommandTimeout, MaxCommandTimeout)
		}
		if b.MaxSessions < 0 || b.MaxSessions > MaxSessionsLimit {
			add(b, i, "maxSessions %d is outside 1..%d", b.MaxSessions, MaxSessionsLimit)
		}
		if b.Address != "" {
			k := endpoint(b.Address, b.Port)
			if j, dup := ssh[k]; dup {
				add(b, i, "SSH address %s is %s's already: two entries would be one RDS under two names", k, entryName(&boxes[j], j))
			} else {
				ssh[k] = i
			}
		}
		if a := or(b.NVMeAddress, b.Address); a != "" {
			k := endpoint(a, b.NVMePort)
			if j, dup := nvme[k]; dup {
				add(b, i, "NVMe/TCP target %s is %s's already: nodes could not tell their volumes apart", k, entryName(&boxes[j], j))
			} else {
				nvme[k] = i
			}
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// DistinctHostKeys refuses boxes that pin one host key (keys lists the
// fingerprints of the keys a box's known_hosts pins for it): they are one
// RDS under two names (an address and a host name of it, two ports of one
// gateway): each of its disks would go by two IDs, whose claims are kept
// apart, and its free space would count twice. A box that skips the
// host key check pins none. The error names every pair.
func DistinctHostKeys(boxes []Backend, keys func(*Backend) ([]string, error)) error {
	var problems []string
	seen := map[string]int{}
	for i := range boxes {
		b := &boxes[i]
		if b.InsecureSkipHostKeyCheck || b.KnownHostsFile == "" {
			continue
		}
		fps, err := keys(b)
		if err != nil {
			problems = append(problems, entryName(b, i)+": "+err.Error())
			continue
		}
		for _, fp := range fps {
			if j, dup := seen[fp]; dup && j != i {
				problems = append(problems, fmt.Sprintf("%s: its pinned host key %s is pinned for %s too: two entries would be one RDS under two names", entryName(b, i), fp, entryName(&boxes[j], j)))
				break
			}
			seen[fp] = i
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// entryName names a box for messages: the flags' box, or the file's
// entry by position and name.
func entryName(b *Backend, i int) string {
	if b.Default {
		return fmt.Sprintf("the RDS of the --rds-* flags (%q)", b.Name)
	}
	if b.Name == "" {
		return fmt.Sprintf("--rds-config rds[%d]", i-1)
	}
	return fmt.Sprintf("--rds-config rds[%d] (%q)", i-1, b.Name)
}

// endpoint is host:port with the host in one spelling: an IP address in
// its canonical form, a name in lower case without a final dot.
func endpoint(host string, port int) string {
	if a, err := netip.ParseAddr(host); err == nil {
		host = a.Unmap().String()
	} else {
		host = strings.TrimSuffix(strings.ToLower(host), ".")
	}
	if strings.Contains(host, ":") {
		return fmt.Sprintf("[%s]:%d", host, port)
	}
	return fmt.Sprintf("%s:%d", host, port)
}
