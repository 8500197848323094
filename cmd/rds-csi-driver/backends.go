package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/crypto/ssh"
	"k8s.io/klog/v2"

	"github.com/srvlab/rds-csi/pkg/backends"
	"github.com/srvlab/rds-csi/pkg/csi"
	"github.com/srvlab/rds-csi/pkg/informers"
	"github.com/srvlab/rds-csi/pkg/inventory"
	"github.com/srvlab/rds-csi/pkg/metrics"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// loadBoxes is every RDS box this process serves: the one of the --rds-*
// flags (the default), then those of --rds-config, validated for what the
// process does with them. A file that cannot be read is a fileError (exit
// status 1); a list that is wrong names its entry (a usage error, 2).
func loadBoxes(opts csi.Options, commandTimeout time.Duration) ([]backends.Backend, error) {
	def := opts.DefaultBackend()
	def.CommandTimeout = commandTimeout
	boxes := []backends.Backend{def}
	if opts.RDSConfigFile != "" {
		text, err := os.ReadFile(opts.RDSConfigFile)
		if err != nil {
			return nil, fileError{fmt.Errorf("--rds-config: %w", err)}
		}
		if boxes, err = backends.Parse(opts.RDSConfigFile, text, def); err != nil {
			return nil, fmt.Errorf("invalid configuration: %w", err)
		}
	}
	purpose := backends.ForController
	if opts.Mode == csi.ModeNode {
		purpose = backends.ForNode
	}
	if err := backends.Validate(boxes, purpose); err != nil {
		return nil, fmt.Errorf("invalid configuration: %w", err)
	}
	if purpose == backends.ForController && len(boxes) > 1 {
		if err := backends.DistinctHostKeys(boxes, pinnedKeys); err != nil {
			return nil, fmt.Errorf("invalid configuration: %w", err)
		}
	}
	return boxes, nil
}

// pinnedKeys are the fingerprints of the host keys b's known_hosts pins
// for it. An unreadable file is the box's client's to report.
func pinnedKeys(b *backends.Backend) ([]string, error) {
	keys, err := rds.PinnedHostKeys(b.KnownHostsFile, b.Address, b.Port)
	if err != nil {
		return nil, nil
	}
	fps := make([]string, len(keys))
	for i, k := range keys {
		fps[i] = ssh.FingerprintSHA256(k)
	}
	return fps, nil
}

// fileError: a file a flag names could not be read.
type fileError struct{ error }

func (e fileError) Unwrap() error { return e.error }

// rdsBoxes are the controller's boxes, each with its own RouterOS client
// (its own SSH connection, sessions, timeouts and retries) and its own
// health: nothing of one box waits on another.
type rdsBoxes struct {
	cfgs    []backends.Backend
	clients []*rds.Client
	health  []*backends.Health
}

// newRDSBoxes makes each box's client; every command it runs is measured
// under the box's name and feeds its health.
func newRDSBoxes(cfgs []backends.Backend, m *metrics.Metrics) (*rdsBoxes, error) {
	r := &rdsBoxes{cfgs: cfgs}
	for _, b := range cfgs {
		h := backends.NewHealth(b.Name)
		cfg := b.RDSConfig()
		name := b.Name
		m.AddRDS(name)
		cfg.Observer = func(rec rds.CommandRecord) {
			m.ObserveRDSCommand(name, rec.Command, rec.Duration, rec.Err)
			if errors.Is(rec.Err, context.Canceled) {
				return // its caller gave up: nothing learnt of the box
			}
			m.SetRDSConnected(name, rds.Reached(rec.Err))
			if rec.Err == nil {
				h.Answered() // a failure is the probe's to judge (backends.Health)
			}
		}
		c, err := rds.NewClient(cfg)
		if err != nil {
			r.Close()
			if len(cfgs) == 1 {
				return nil, fmt.Errorf("RDS client: %w", err)
			}
			return nil, fmt.Errorf("RDS client of %s: %w", describeBox(b), err)
		}
		m.CountUnreadableEntries(name, c.SkippedEntries)
		r.clients = append(r.clients, c)
		r.health = append(r.health, h)
	}
	return r, nil
}

func describeBox(b backends.Backend) string {
	if b.Default {
		return fmt.Sprintf("RDS %s (the --rds-* flags)", b.Name)
	}
	return fmt.Sprintf("RDS %s (--rds-config)", b.Name)
}

// Close closes every client.
func (r *rdsBoxes) Close() {
	for _, c := range r.clients {
		c.Close()
	}
}

// csiBoxes are the boxes as the CSI services take them.
func (r *rdsBoxes) csiBoxes() []csi.Box {
	out := make([]csi.Box, len(r.cfgs))
	for i := range r.cfgs {
		out[i] = csi.Box{Backend: r.cfgs[i], RDS: r.clients[i]}
		if len(r.cfgs) > 1 {
			out[i].Health = r.health[i].Err
		}
	}
	return out
}

// views are the boxes' clients speaking volume IDs.
func (r *rdsBoxes) views() []*backends.View {
	out := make([]*backends.View, len(r.cfgs))
	for i := range r.cfgs {
		out[i] = backends.NewView(&r.cfgs[i], r.clients[i])
	}
	return out
}

// probeAny passes once one box answers /system resource print; the
// boxes are asked side by side, so a hung one delays nothing.
func (r *rdsBoxes) probeAny(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(r.clients))
	for i, c := range r.clients {
		go func() {
			_, err := c.Probe(ctx)
			if err != nil && len(r.clients) > 1 {
				err = fmt.Errorf("RDS %s: %w", r.cfgs[i].Name, err)
			}
			errs <- err
		}()
	}
	var all []error
	for range r.clients {
		err := <-errs
		if err == nil {
			return nil
		}
		all = append(all, err)
	}
	return errors.Join(all...)
}

// boxProbeInterval paces each box's own health probe (with several
// boxes): how soon a box that went down is passed over by provisioning
// without a command waiting on it first, and how soon one that came back
// is used again.
const boxProbeInterval = 10 * time.Second

// runHealth probes each box on its own until ctx is done (several boxes
// only: with one there is nothing to pass over).
func (r *rdsBoxes) runHealth(ctx context.Context) {
	if len(r.cfgs) < 2 {
		<-ctx.Done()
		return
	}
	done := make(chan struct{})
	for i, c := range r.clients {
		timeout := min(boxProbeInterval, r.cfgs[i].CommandTimeout)
		if timeout <= 0 {
			timeout = boxProbeInterval
		}
		go func() {
			defer func() { done <- struct{}{} }()
			r.health[i].Run(ctx, func(ctx context.Context) error { _, err := c.Probe(ctx); return err }, boxProbeInterval, timeout)
		}()
	}
	for range r.clients {
		<-done
	}
	klog.FromContext(ctx).V(2).Info("RDS health probes stopped")
}

// boxIndex is the attachment index as one box's export reconcile reads
// it: the volumes of that box alone retire there.
type boxIndex struct {
	*informers.AttachmentIndex
	owns func(string) bool
}

func (b boxIndex) Retiring() []*informers.Volume {
	var out []*informers.Volume
	for _, v := range b.AttachmentIndex.Retiring() {
		if b.owns(v.Handle) {
			out = append(out, v)
		}
	}
	return out
}

// clientless is the box of opts without a client: a controller that never
// talks to an RDS (storage fencing off, as in tests of the index).
func clientless(opts csi.Options) *rdsBoxes {
	return &rdsBoxes{cfgs: []backends.Backend{opts.DefaultBackend()}, clients: []*rds.Client{nil}, health: []*backends.Health{backends.NewHealth(opts.RDSName)}}
}

// inventory is the /inventory handler: the default box's disks as
// before with one box, every box's (each disk under its ID, a box that
// does not answer named as such) with several.
func (r *rdsBoxes) inventory(volumePath string) *inventory.Handler {
	if len(r.cfgs) == 1 {
		return inventory.NewHandler(r.clients[0], volumePath)
	}
	var sources []inventory.Source
	for i, v := range r.views() {
		sources = append(sources, inventory.Source{Name: r.cfgs[i].Name, Default: r.cfgs[i].Default, VolumePath: r.cfgs[i].VolumePath, Lister: v})
	}
	return inventory.NewBoxesHandler(sources)
}
