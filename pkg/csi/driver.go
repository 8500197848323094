package csi

import (
	"context"
	"errors"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/srvlab/rds-csi/pkg/backends"
)

// RDS is what the controller needs from the RouterOS client: one box's
// client, as pkg/backends defines it (every box's client is one).
type RDS = backends.RDS

// ReadinessCheck reports why the driver cannot serve yet (nil: ready).
type ReadinessCheck func(ctx context.Context) error

// Driver holds what the CSI services share. It is built once in main.
type Driver struct {
	opts      Options
	boxes     []*rdsBox // the default first
	byName    map[string]*rdsBox
	router    *backends.Router // nil on a node
	readiness []ReadinessCheck
}

// NewDriver returns a driver for validated options serving the one RDS
// of the --rds-* flags through client (nil in node mode). Probe passes
// once the RDS answers and every check of ready passes (for example: the
// attachment index's informers have synced).
func NewDriver(opts Options, client RDS, ready ...ReadinessCheck) *Driver {
	d, err := NewDriverBoxes(opts, []Box{{Backend: opts.DefaultBackend(), RDS: client}}, ready...)
	if err != nil {
		panic(err) // one box, the default: cannot fail
	}
	return d
}

// NewDriverBoxes returns a driver serving boxes, the default (the RDS of
// the --rds-* flags) first, each through its own client (nil in node
// mode). Probe passes once one of the boxes answers (a box that is down
// fails only its own volumes' calls) and every check of ready passes.
func NewDriverBoxes(opts Options, boxes []Box, ready ...ReadinessCheck) (*Driver, error) {
	bs, byName, err := newBoxes(boxes)
	if err != nil {
		return nil, err
	}
	d := &Driver{opts: opts, boxes: bs, byName: byName}
	if bs[0].view != nil {
		views := make([]*backends.View, len(bs))
		for i, b := range bs {
			if b.view == nil {
				return nil, fmt.Errorf("csi: RDS %s has no client", b.Name)
			}
			views[i] = b.view
		}
		if d.router, err = backends.NewRouter(views...); err != nil {
			return nil, err
		}
		d.readiness = append(d.readiness, d.anyBoxAnswers)
	}
	d.readiness = append(d.readiness, ready...)
	return d, nil
}

// anyBoxAnswers probes every box at once and passes as soon as one
// answers, without waiting on the others.
func (d *Driver) anyBoxAnswers(ctx context.Context) error {
	if len(d.boxes) == 1 {
		_, err := d.boxes[0].view.Probe(ctx)
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(d.boxes))
	for _, b := range d.boxes {
		go func() {
			_, err := b.view.Probe(ctx)
			errs <- err
		}()
	}
	var all []error
	for range d.boxes {
		err := <-errs
		if err == nil {
			return nil
		}
		all = append(all, err)
	}
	return fmt.Errorf("no RDS answers: %w", errors.Join(all...))
}

// Router sends each call on a volume to its box's client: what the
// storage-fence protocol is given (nil on a node).
func (d *Driver) Router() *backends.Router { return d.router }

// Ready runs every readiness check.
func (d *Driver) Ready(ctx context.Context) error {
	for _, c := range d.readiness {
		if err := c(ctx); err != nil {
			return err
		}
	}
	return nil
}

// TopologyKey is the topology segment naming the default RDS: the one a
// volume of the default box requires, and every node that reaches it
// reports (backends.DefaultKey).
func (d *Driver) TopologyKey() string { return backends.DefaultKey(d.opts.DriverName) }

func (d *Driver) controllerEnabled() bool { return d.opts.Mode != ModeNode }

// topology is where a volume of b is accessible from: the nodes that reach b.
func (d *Driver) topology(b *rdsBox) *csi.Topology {
	return &csi.Topology{Segments: backends.Accessible(d.opts.DriverName, &b.Backend)}
}

// nodeTopology is what node reports: every box it reaches.
func (d *Driver) nodeTopology(node string) *csi.Topology {
	return &csi.Topology{Segments: backends.Segments(d.opts.DriverName, d.Backends(), node)}
}
