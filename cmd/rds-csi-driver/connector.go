package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/srvlab/rds-csi/pkg/csi"
	"github.com/srvlab/rds-csi/pkg/exportauth"
	"github.com/srvlab/rds-csi/pkg/nvme"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// Node connectors (--node-connector).
const (
	connectorTCP  = "tcp"
	connectorLoop = "loop"
)

// connectorOptions choose how the node service reaches a volume's blocks.
type connectorOptions struct {
	Kind        string
	LoopDataDir string
	NVMeDir     string // the host's /etc/nvme: hostnqn, hostid
	// StateDir: where the node service records the mounts it makes
	// ("": beside a unix --endpoint's socket; stateDir).
	StateDir string
	// CtrlLoss: nvme-tcp's ctrl_loss_tmo, how long a lost connection is
	// reconnected before the device goes.
	CtrlLoss time.Duration
	// FastIOFail: nvme-tcp's fast_io_fail_tmo (0: off, I/O waits for the
	// reconnect up to ctrl_loss_tmo).
	FastIOFail time.Duration
}

// Ranges of the NVMe/TCP timers (docs/node.md says why the defaults).
// ctrl_loss_tmo is bounded both ways: below, it must still outlast short
// outages and several reconnect attempts; above, a fenced or lost
// connection must give up within the hour.
const (
	minCtrlLoss   = 30 * time.Second
	maxCtrlLoss   = time.Hour
	minFastIOFail = time.Second
)

// defaultNVMeDir is where nvme-cli and the distributions keep the host
// identity; the node DaemonSet mounts the host's at the same path.
const defaultNVMeDir = "/etc/nvme"

func (o *connectorOptions) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Kind, "node-connector", connectorTCP, "how the node connects volumes: tcp (NVMe/TCP) or loop (labs: the simulator's files)")
	fs.StringVar(&o.LoopDataDir, "node-loop-data-dir", "", "with --node-connector=loop: the RDS simulator's --data-dir, an absolute path")
	fs.DurationVar(&o.CtrlLoss, "nvme-ctrl-loss-timeout", nvme.DefaultCtrlLossTimeout, "with --node-connector=tcp: how long a lost connection is reconnected (ctrl_loss_tmo)")
	fs.DurationVar(&o.FastIOFail, "nvme-fast-io-fail-timeout", nvme.DefaultFastIOFailTimeout, "with --node-connector=tcp: fail I/O this long after a connection is lost (0: off)")
	fs.StringVar(&o.StateDir, "node-state-dir", "", "where the node records its mounts (default: node-state beside a unix --endpoint)")
	fs.StringVar(&o.NVMeDir, "node-nvme-dir", defaultNVMeDir, "with --node-connector=tcp: the host's NVMe identity directory (hostnqn, hostid)")
}

// validate refuses the loop connector unless it is chosen explicitly with
// what it needs; it is never a fallback for a missing NVMe/TCP.
func (o *connectorOptions) validate(mode string) error {
	switch o.Kind {
	case connectorTCP:
		if o.LoopDataDir != "" {
			return errors.New("invalid configuration: --node-loop-data-dir needs --node-connector=loop")
		}
		if o.NVMeDir == "" {
			return errors.New("invalid configuration: --node-nvme-dir is empty (default " + defaultNVMeDir + ")")
		}
		// A relative directory would be the container's, not the host's
		// /etc/nvme: a new host NQN at every restart.
		if !filepath.IsAbs(o.NVMeDir) {
			return fmt.Errorf("invalid configuration: --node-nvme-dir %q must be an absolute path, the host's NVMe identity directory as mounted into the node plugin (default %s)", o.NVMeDir, defaultNVMeDir)
		}
		if o.CtrlLoss < minCtrlLoss || o.CtrlLoss > maxCtrlLoss {
			return fmt.Errorf("invalid configuration: --nvme-ctrl-loss-timeout=%v is outside %v..%v: shorter gives up on the RDS during a reboot, longer keeps a lost or fenced connection for hours (default %v)", o.CtrlLoss, minCtrlLoss, maxCtrlLoss, nvme.DefaultCtrlLossTimeout)
		}
		switch {
		case o.FastIOFail < 0:
			return errors.New("invalid configuration: --nvme-fast-io-fail-timeout must not be negative (0: off)")
		case o.FastIOFail > 0 && o.FastIOFail < minFastIOFail:
			return fmt.Errorf("invalid configuration: --nvme-fast-io-fail-timeout=%v is shorter than %v; 0 turns it off", o.FastIOFail, minFastIOFail)
		case o.FastIOFail >= o.CtrlLoss:
			return fmt.Errorf("invalid configuration: --nvme-fast-io-fail-timeout=%v must be shorter than --nvme-ctrl-loss-timeout=%v (I/O fails when the connection is given up anyway); 0 turns it off", o.FastIOFail, o.CtrlLoss)
		}
	case connectorLoop:
		if mode == csi.ModeController {
			return errors.New("invalid configuration: --node-connector=loop is for the node service (--mode=node or all)")
		}
		if o.LoopDataDir == "" {
			return errors.New("invalid configuration: --node-connector=loop needs --node-loop-data-dir, the RDS simulator's --data-dir on this machine")
		}
		if o.NVMeDir != defaultNVMeDir {
			return errors.New("invalid configuration: --node-nvme-dir is for --node-connector=tcp; the loop connector presents no host NQN")
		}
		// Every volume's file is resolved in it, and a relative file
		// would make every NodeStage fail.
		if !filepath.IsAbs(o.LoopDataDir) {
			return fmt.Errorf("invalid configuration: --node-loop-data-dir %q must be an absolute path (the RDS simulator's --data-dir, e.g. \"$PWD/%s\")", o.LoopDataDir, filepath.Clean(o.LoopDataDir))
		}
		if fi, err := os.Stat(o.LoopDataDir); err != nil || !fi.IsDir() {
			return fmt.Errorf("invalid configuration: --node-loop-data-dir %s is not a directory (start the RDS simulator with --data-dir first)", o.LoopDataDir)
		}
	default:
		return fmt.Errorf("invalid configuration: --node-connector must be %s or %s, not %q", connectorTCP, connectorLoop, o.Kind)
	}
	return nil
}

// defaultStateDirName is the node state directory beside the socket: in
// the chart the socket's directory is the host's kubelet plugin directory
// of the driver, which persists across restarts of the node plugin.
const defaultStateDirName = "node-state"

// stateDir is where the node service records its mounts: --node-state-dir,
// or node-state beside a unix endpoint's socket; "" with a tcp endpoint.
func (o *connectorOptions) stateDir(endpoint string) string {
	if o.StateDir != "" {
		return o.StateDir
	}
	if network, address, err := csi.ParseEndpoint(endpoint); err == nil && network == "unix" {
		dir, err := filepath.Abs(filepath.Join(filepath.Dir(address), defaultStateDirName))
		if err != nil {
			return ""
		}
		return dir
	}
	return ""
}

// connector builds the node's connector.
func (o *connectorOptions) connector(ctx context.Context, opts csi.Options) (csi.Connector, error) {
	if o.Kind != connectorLoop {
		c, err := nvme.NewTCPConnector(o.tcpConfig(opts.NQNPrefix))
		if err != nil {
			return nil, fmt.Errorf("NVMe/TCP connector: %w", err)
		}
		return c, nil
	}
	klog.FromContext(ctx).Info("WARNING: --node-connector=loop: volumes are loop devices over the RDS simulator's files in this machine's --node-loop-data-dir; for labs and demos only, never for a real RDS",
		"dataDir", o.LoopDataDir)
	return nvme.NewLoopConnector(nvme.LoopConfig{NQNPrefix: opts.NQNPrefix, Resolve: simulatorFile(o.LoopDataDir, opts)})
}

// tcpConfig is the NVMe/TCP connector's configuration from the flags.
func (o *connectorOptions) tcpConfig(nqnPrefix string) nvme.Config {
	fastIOFail := o.FastIOFail
	if fastIOFail == 0 {
		fastIOFail = nvme.HoldIOUntilCtrlLoss // the flag's "off"
	}
	return nvme.Config{NQNPrefix: nqnPrefix, EtcNVMeDir: o.NVMeDir, CtrlLossTimeout: o.CtrlLoss, FastIOFailTimeout: fastIOFail}
}

// simulatorFile maps a volume's NQN to its backing file in the simulator's
// data directory: the disk's RouterOS path /<pool>/<rest> is
// <data-dir>/<rest> there.
func simulatorFile(dataDir string, opts csi.Options) nvme.BackingFileResolver {
	return func(_ context.Context, nqn string) (string, error) {
		id, ok := strings.CutPrefix(nqn, opts.NQNPrefix)
		if !ok || rds.ValidateSlot(id) != nil {
			return "", fmt.Errorf("NQN %s is not one of this driver's volumes", nqn)
		}
		rel, ok := strings.CutPrefix(rds.VolumeFilePath(opts.VolumePath, id), "/"+opts.RDSPool+"/")
		if !ok {
			return "", fmt.Errorf("--rds-volume-path %s is not inside the pool /%s, so the simulator has no file for it", opts.VolumePath, opts.RDSPool)
		}
		return filepath.Join(dataDir, filepath.FromSlash(rel)), nil
	}
}

// nodeServer builds the node service on the chosen connector and settles
// the node ID it registers now, at start: with NVMe/TCP that reads (or
// creates, once) the host NQN, so an unreadable or unwritable
// --node-nvme-dir stops the plugin here with the reason, not at the first
// NodeStage.
func (o *connectorOptions) nodeServer(ctx context.Context, d *csi.Driver, opts csi.Options) (*csi.NodeServer, error) {
	c, err := o.connector(ctx, opts)
	if err != nil {
		return nil, err
	}
	ns := csi.NewNodeServer(d, c, o.stateDir(opts.Endpoint))
	if err := o.nodeKey(ctx, ns, c, opts); err != nil {
		return nil, err
	}
	id, err := ns.NodeID()
	if err != nil {
		if o.Kind == connectorTCP {
			return nil, fmt.Errorf("%w (the node's host NQN is read from %s, the host's /etc/nvme, created there when missing; fix the file or the mount)", err, o.NVMeDir)
		}
		return nil, err
	}
	klog.FromContext(ctx).Info("node identity", "nodeID", id)
	return ns, nil
}

// nodeKeyFile is where the node plugin keeps its node key: beside the
// host's NVMe identity (the host's /etc/nvme, mounted into the node plugin
// only), one per driver name.
func (o *connectorOptions) nodeKeyFile(driver string) string {
	return filepath.Join(o.NVMeDir, driver+".node-key")
}

// nodeKey gives the node service its key when this node can authenticate
// NVMe connects (its kernel has DH-HMAC-CHAP host authentication), so that
// it registers the key in its node ID and the controller seals
// authenticated attachments' secrets to it. A node that cannot registers
// none and refuses authenticated attachments, saying why; that is logged
// here, at start, rather than found out by a connect.
func (o *connectorOptions) nodeKey(ctx context.Context, ns *csi.NodeServer, c csi.Connector, opts csi.Options) error {
	logger := klog.FromContext(ctx)
	why := "the loop connector (labs and demos) does not authenticate"
	if tc, ok := c.(*nvme.TCPConnector); ok {
		why = tc.AuthUnsupported()
	}
	if why != "" {
		ns.SetNodeKey(nil, why)
		logger.Info("NVMe in-band authentication is not available on this node: attachments that authenticate are refused here", "reason", why)
		return nil
	}
	path := o.nodeKeyFile(opts.DriverName)
	k, err := exportauth.LoadOrCreateNodeKey(path)
	if err != nil {
		return fmt.Errorf("node key: %w", err)
	}
	ns.SetNodeKey(k, "")
	if why := ns.AuthUnavailable(); why != "" {
		logger.Info("the node key is not registered: attachments that authenticate are refused here", "reason", why)
		return nil
	}
	logger.Info("NVMe in-band authentication available: the node key is registered in the node ID", "key", k.Public.String(), "file", path)
	return nil
}
