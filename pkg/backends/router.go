package backends

import (
	"context"
	"errors"
	"fmt"

	"github.com/srvlab/rds-csi/pkg/nvme"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// ErrUnknownBox: an ID names a box this driver is not configured with.
var ErrUnknownBox = errors.New("no such RDS in the configuration")

// Router sends each call on a volume to the view of its box: what the
// storage-fence protocol is given, so that Commit and Release of a volume
// talk to that volume's box alone.
type Router struct {
	views []*View // the default first
	def   *View
	byBox map[string]*View
}

// NewRouter routes to views (one of them the default box's).
func NewRouter(views ...*View) (*Router, error) {
	r := &Router{byBox: map[string]*View{}}
	for _, v := range views {
		if v.def {
			if r.def != nil {
				return nil, errors.New("backends: two default RDS")
			}
			r.def = v
		}
		if _, dup := r.byBox[v.name]; dup {
			return nil, fmt.Errorf("backends: two RDS named %q", v.name)
		}
		r.byBox[v.name] = v
		r.views = append(r.views, v)
	}
	if r.def == nil {
		return nil, errors.New("backends: no default RDS")
	}
	return r, nil
}

// Views are the boxes' views, the default first.
func (r *Router) Views() []*View { return r.views }

// Default is the default box's view.
func (r *Router) Default() *View { return r.def }

// ByName is the view of the box named name (nil: none).
func (r *Router) ByName(name string) *View { return r.byBox[name] }

// For is the view of the box id names. An ID that names a box not
// configured is ErrUnknownBox: never routed to the default box, whose
// slot of the same name is another volume.
func (r *Router) For(id string) (*View, error) {
	box, _ := SplitID(id)
	if box == "" {
		return r.def, nil
	}
	if v := r.byBox[box]; v != nil && !v.def {
		return v, nil
	}
	return nil, fmt.Errorf("%w: %q names RDS %q, which this driver is not configured with (--rds-config)", ErrUnknownBox, id, box)
}

func (r *Router) GetDisk(ctx context.Context, id string) (*rds.Disk, error) {
	v, err := r.For(id)
	if err != nil {
		return nil, err
	}
	return v.GetDisk(ctx, id)
}

// ListDisks lists every box's disks; a box that fails fails the listing
// (the others' disks are not a listing of the driver's volumes).
func (r *Router) ListDisks(ctx context.Context) ([]rds.Disk, error) {
	var out []rds.Disk
	var errs []error
	for _, v := range r.views {
		d, err := v.ListDisks(ctx)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, d...)
	}
	return out, errors.Join(errs...)
}

func (r *Router) SwapExport(ctx context.Context, id string, from, to rds.ExportState) (rds.ExportState, error) {
	v, err := r.For(id)
	if err != nil {
		return rds.ExportState{}, err
	}
	return v.SwapExport(ctx, id, from, to)
}

func (r *Router) SwapExportAuth(ctx context.Context, id string, from, to rds.ExportState, password rds.ExportPassword) (rds.ExportState, nvme.DHCHAPSecret, error) {
	v, err := r.For(id)
	if err != nil {
		return rds.ExportState{}, nvme.DHCHAPSecret{}, err
	}
	return v.SwapExportAuth(ctx, id, from, to, password)
}

func (r *Router) Retombstone(ctx context.Context, id string, to rds.ExportState) (rds.ExportState, error) {
	v, err := r.For(id)
	if err != nil {
		return rds.ExportState{}, err
	}
	return v.Retombstone(ctx, id, to)
}
