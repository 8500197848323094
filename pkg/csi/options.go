package csi

import (
	"errors"
	"flag"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/srvlab/rds-csi/pkg/backends"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// Modes of the driver binary.
const (
	ModeController = "controller"
	ModeNode       = "node"
	ModeAll        = "all"
)

// DefaultDriverName is the CSI driver name registered with Kubernetes.
const DefaultDriverName = "rds.csi.srvlab.io"

// Options are the driver's settings, filled from flags. Secrets are never
// options: the SSH key and known_hosts are files mounted from a Secret.
type Options struct {
	Mode       string
	Endpoint   string
	DriverName string
	NodeID     string

	RDSAddress                  string
	RDSPort                     int
	RDSUser                     string
	RDSKeyFile                  string
	RDSKnownHostsFile           string
	RDSInsecureSkipHostKeyCheck bool
	RDSLoginOptions             string // RouterOS console login options; see rds.Config
	RDSPool                     string // mount point of the pool (capacity)
	VolumePath                  string // directory of backing files on the RDS
	// RDSName names the RDS in topology (volumes' accessible_topology and
	// the nodes' segments); a Kubernetes label value. Defaults to
	// RDSAddress when that is a valid label value.
	RDSName string

	// RDSConfigFile lists the RDS boxes besides the one of these flags
	// (pkg/backends; "": none).
	RDSConfigFile string

	NVMeAddress string // NVMe/TCP target address; defaults to RDSAddress
	NVMePort    int
	NQNPrefix   string

	MaxVolumesPerNode int64

	// StorageFencing: StorageFencingOff, or StorageFencingAllowHost (each
	// export open only to the host NQN of the node that holds the volume;
	// docs/attachments.md, "Storage fencing").
	StorageFencing string
	// AttachmentKey derives each attachment's host NQN under storage
	// fencing (LoadAttachmentKey; never logged). Required with allow-host
	// in controller mode.
	AttachmentKey []byte
	// AttachmentKeyFile: where AttachmentKey is read from ("" derives it
	// from RDSKeyFile).
	AttachmentKeyFile string
	// ExportAuth: ExportAuthOff, or ExportAuthDHCHAP (needs
	// StorageFencingAllowHost): every attachment's export also gets a
	// password of its own, derived from AttachmentKey, and the node is
	// handed the secret RouterOS makes of it, sealed to the node's key
	// (docs/attachments.md, "Authenticated attachments").
	ExportAuth string

	// CopyFromData says whether RouterOS's /disk add copy-from copies a
	// disk's data on this RDS: CopyFromDataSupported (assumed, not
	// confirmed on hardware; `rdsctl selftest --data` measures it) or
	// CopyFromDataUnsupported, which refuses snapshots, clones and
	// restores with FAILED_PRECONDITION instead of handing out an empty
	// copy (docs/volumes-and-snapshots.md).
	CopyFromData string

	// ShutdownGrace bounds how long in-flight RPCs may run after SIGTERM.
	ShutdownGrace time.Duration
}

// Storage fencing modes (--storage-fencing).
const (
	StorageFencingOff       = "off"
	StorageFencingAllowHost = "allow-host"
)

// Export authentication modes (--export-auth).
const (
	ExportAuthOff    = "off"
	ExportAuthDHCHAP = "dhchap"
)

// ExportAuthOn: attachments authenticate (--export-auth=dhchap).
func (o *Options) ExportAuthOn() bool { return o.ExportAuth == ExportAuthDHCHAP }

// What /disk add copy-from does with a disk's data (--copy-from-data).
const (
	CopyFromDataSupported   = "supported"
	CopyFromDataUnsupported = "unsupported"
)

// maxVolumePathLength keeps the longest snapshot file path
// (<path>/snapshots/<snap-id>.src-<volume-id>.t-<19 digits>.img, 123
// characters after the path) within RouterOS' 255.
const maxVolumePathLength = 132

// labelValuePattern is a Kubernetes label value (topology segments are
// node labels).
var labelValuePattern = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)

// AddFlags registers the options on fs with their defaults.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Mode, "mode", ModeAll, "what to run: controller, node or all")
	fs.StringVar(&o.Endpoint, "endpoint", "unix:///csi/csi.sock", "CSI endpoint, unix:///path or tcp://host:port")
	fs.StringVar(&o.DriverName, "driver-name", DefaultDriverName, "CSI driver name")
	fs.StringVar(&o.NodeID, "node-id", "", "this node's Kubernetes name (node and all modes)")
	fs.StringVar(&o.RDSAddress, "rds-address", "", "RDS management address (SSH), a host name or IP address")
	fs.IntVar(&o.RDSPort, "rds-port", 22, "RDS SSH port")
	fs.StringVar(&o.RDSUser, "rds-user", "admin", "RDS SSH user")
	fs.StringVar(&o.RDSKeyFile, "rds-key-file", "/etc/rds-csi/ssh/id_ed25519", "SSH private key file, mounted from a Secret (not its .pub)")
	fs.StringVar(&o.RDSKnownHostsFile, "rds-known-hosts-file", "/etc/rds-csi/ssh/known_hosts", "known_hosts file pinning the RDS host key, mounted from a Secret")
	fs.BoolVar(&o.RDSInsecureSkipHostKeyCheck, "rds-insecure-skip-host-key-check", false, "accept any RDS host key (labs only)")
	fs.StringVar(&o.RDSLoginOptions, "rds-login-options", rds.DefaultLoginOptions, "RouterOS console login options sent after '+' in the user name; none: none")
	fs.StringVar(&o.RDSPool, "rds-pool", "storage-pool", "mount point of the RDS storage pool")
	fs.StringVar(&o.VolumePath, "rds-volume-path", rds.DefaultVolumePath, "directory of the volumes' backing files on the RDS")
	fs.StringVar(&o.RDSName, "rds-name", "", "name of the RDS in volume topology, a label value (default: --rds-address)")
	fs.StringVar(&o.RDSConfigFile, "rds-config", "", "YAML file listing more RDS boxes besides the default one of the --rds-* flags")
	fs.StringVar(&o.NVMeAddress, "nvme-address", "", "NVMe/TCP address nodes connect to (default: --rds-address)")
	fs.IntVar(&o.NVMePort, "nvme-port", 4420, "NVMe/TCP port of exported volumes")
	fs.StringVar(&o.NQNPrefix, "nqn-prefix", "nqn.2000-02.com.mikrotik:", "NQN prefix of this driver's volumes; the volume ID follows it")
	fs.Int64Var(&o.MaxVolumesPerNode, "max-volumes-per-node", 0, "volumes a node may attach (0: no limit)")
	fs.StringVar(&o.StorageFencing, "storage-fencing", StorageFencingOff, "off, or allow-host: each export open only to the host that holds the volume")
	fs.StringVar(&o.CopyFromData, "copy-from-data", CopyFromDataSupported, "whether copy-from copies a disk's data on this RDS: supported or unsupported")
	fs.StringVar(&o.AttachmentKeyFile, "attachment-key-file", "", "with storage fencing: the secret attachment NQNs are derived from (default: from --rds-key-file)")
	fs.StringVar(&o.ExportAuth, "export-auth", ExportAuthOff, "off, or dhchap: each attachment's export gets its own password (needs storage fencing)")
	fs.DurationVar(&o.ShutdownGrace, "shutdown-grace", 30*time.Second, "how long in-flight RPCs may finish after SIGTERM")
}

// Validate checks the options for the selected mode and returns one error
// naming every problem, so a misconfigured pod says what to fix in one line.
func (o *Options) Validate() error {
	var errs []string
	add := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	switch o.Mode {
	case ModeController, ModeNode, ModeAll:
	default:
		add("--mode must be controller, node or all, not %q", o.Mode)
	}
	if _, _, err := ParseEndpoint(o.Endpoint); err != nil {
		add("--endpoint: %v", err)
	}
	if o.DriverName == "" {
		add("--driver-name is empty")
	}
	if o.Mode != ModeController && o.NodeID == "" {
		add("--node-id is required in %s mode", o.Mode)
	}
	switch o.StorageFencing {
	case "", StorageFencingOff, StorageFencingAllowHost: // "": off
	default:
		add("--storage-fencing must be %s or %s, not %q", StorageFencingOff, StorageFencingAllowHost, o.StorageFencing)
	}
	switch o.ExportAuth {
	case "", ExportAuthOff: // "": off
	case ExportAuthDHCHAP:
		if o.StorageFencing != StorageFencingAllowHost {
			add("--export-auth=%s needs --storage-fencing=%s: the password is set with the allowed host of each attachment's export, and without storage fencing an export has none", ExportAuthDHCHAP, StorageFencingAllowHost)
		}
	default:
		add("--export-auth must be %s or %s, not %q", ExportAuthOff, ExportAuthDHCHAP, o.ExportAuth)
	}
	switch o.CopyFromData {
	case "", CopyFromDataSupported, CopyFromDataUnsupported: // "": supported
	default:
		add("--copy-from-data must be %s or %s, not %q", CopyFromDataSupported, CopyFromDataUnsupported, o.CopyFromData)
	}
	if o.Mode != ModeNode {
		if o.RDSAddress == "" {
			add("--rds-address is required in %s mode", o.Mode)
		}
		if o.RDSKeyFile == "" {
			add("--rds-key-file is required")
		}
		if o.RDSKnownHostsFile == "" && !o.RDSInsecureSkipHostKeyCheck {
			add("--rds-known-hosts-file is required (or --rds-insecure-skip-host-key-check for labs)")
		}
		if err := rds.ValidatePoolName(o.RDSPool); err != nil {
			add("--rds-pool: %v", err)
		}
		if o.RDSLoginOptions != "" {
			if err := rds.ValidateLoginOptions(o.RDSLoginOptions); err != nil {
				add("--rds-login-options: %v", err)
			}
		}
		if err := rds.ValidateFilePath(o.VolumePath); err != nil {
			add("--rds-volume-path: %v", err)
		} else if len(o.VolumePath) > maxVolumePathLength {
			add("--rds-volume-path must be at most %d characters, so that snapshot file names fit RouterOS' 255", maxVolumePathLength)
		} else if o.VolumePath == "/"+o.RDSPool {
			add("--rds-volume-path must be a directory inside the pool, not the pool itself")
		}
	}
	// Controller and node must name the RDS alike: volumes' topology and
	// the node's segment are matched by it.
	switch {
	case o.RDSName != "":
		if !labelValuePattern.MatchString(o.RDSName) {
			add("--rds-name %q must be a Kubernetes label value (1-63 of A-Z a-z 0-9 - _ . starting and ending alphanumeric)", o.RDSName)
		}
	case o.RDSAddress != "" && !labelValuePattern.MatchString(o.RDSAddress):
		add("--rds-name is required: --rds-address %q is not a Kubernetes label value, so it cannot name the RDS in topology", o.RDSAddress)
	case o.Mode == ModeNode && o.RDSAddress == "":
		add("--rds-name (or --rds-address) is required in node mode: it names the RDS in the node's topology, as on the controller")
	}
	if o.ShutdownGrace < 0 {
		add("--shutdown-grace must not be negative")
	}
	if err := rds.ValidatePort(o.NVMePort); err != nil {
		add("--nvme-port: %v", err)
	}
	if !strings.HasPrefix(o.NQNPrefix, "nqn.") || rds.ValidateNQN(o.NQNPrefix+"x") != nil {
		add("--nqn-prefix %q does not form valid NQNs", o.NQNPrefix)
	}
	if o.MaxVolumesPerNode < 0 {
		add("--max-volumes-per-node must not be negative")
	}
	if len(errs) > 0 {
		return errors.New("invalid configuration: " + strings.Join(errs, "; "))
	}
	if o.NVMeAddress == "" {
		o.NVMeAddress = o.RDSAddress
	}
	if o.RDSName == "" {
		o.RDSName = o.RDSAddress
	}
	return nil
}

// DefaultBackend is the box of the --rds-* flags: the default box.
func (o *Options) DefaultBackend() backends.Backend {
	name, nvme := o.RDSName, o.NVMeAddress
	if name == "" {
		name = o.RDSAddress
	}
	if nvme == "" {
		nvme = o.RDSAddress
	}
	return backends.Backend{
		Name: name, Default: true, Address: o.RDSAddress, Port: o.RDSPort, User: o.RDSUser,
		KeyFile: o.RDSKeyFile, KnownHostsFile: o.RDSKnownHostsFile, InsecureSkipHostKeyCheck: o.RDSInsecureSkipHostKeyCheck,
		LoginOptions: o.RDSLoginOptions, Pool: o.RDSPool, VolumePath: o.VolumePath, NVMeAddress: nvme, NVMePort: o.NVMePort,
	}
}

// RDSConfig is the SSH client configuration the options describe.
func (o *Options) RDSConfig() rds.Config {
	return rds.Config{
		Address:                  o.RDSAddress,
		Port:                     o.RDSPort,
		User:                     o.RDSUser,
		KeyFile:                  o.RDSKeyFile,
		KnownHostsFile:           o.RDSKnownHostsFile,
		InsecureSkipHostKeyCheck: o.RDSInsecureSkipHostKeyCheck,
		LoginOptions:             o.RDSLoginOptions,
	}
}

// AllowHostFencing reports whether storage fencing is allow-host.
func (o *Options) AllowHostFencing() bool { return o.StorageFencing == StorageFencingAllowHost }
