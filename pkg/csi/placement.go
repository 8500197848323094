package csi

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/srvlab/rds-csi/pkg/backends"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// Placement: which box a new volume goes to.
//
// The boxes a request allows are those that every constraint allows: the
// StorageClass's pin (parameter rds), the box of the content source (a
// copy never crosses boxes), and the requisite topology (a box named in
// one of its segments; any box without one). They are ranked by the
// preferred segments (the first naming a box ranks it), and a box that is
// down (Box.Health) is passed over without being asked. An earlier
// attempt's volume is looked for on every box allowed; a new one goes to
// the best-ranked box with room, the one with the most free space among
// equals.

// sentTo remembers, by volume slot, the box a CreateDisk or CopyDisk was
// sent to until a CreateVolume of that slot answers with the volume. The
// command may have landed with its answer lost, or land up to its timeout
// late: a retry that went to another box (the first one down or slow, the
// preferred segments rotated) would make the slot on two boxes and leave
// the first box's disk behind. It lives in this process alone: after a
// restart a retry is placed afresh.
type sentTo struct {
	mu  sync.Mutex
	box map[string]string
}

func (t *sentTo) record(slot, box string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.box == nil {
		t.box = map[string]string{}
	}
	t.box[slot] = box
}

func (t *sentTo) forget(slot string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.box, slot)
}

// narrow keeps, of the candidates, the box an earlier attempt at slot was
// sent to, if it is one of them (down or not: then the retry waits for
// it); all of them otherwise.
func (t *sentTo) narrow(slot string, cands []candidate) []candidate {
	t.mu.Lock()
	box, ok := t.box[slot]
	t.mu.Unlock()
	if !ok {
		return cands
	}
	for _, c := range cands {
		if c.b.Name == box {
			return []candidate{c}
		}
	}
	return cands
}

// candidate is a box a new volume may go to, with its rank (lower first).
type candidate struct {
	b    *rdsBox
	rank int
}

// candidates lists the boxes a CreateVolume request allows, ranked; an
// error when none (with the gRPC code the cause calls for).
func (s *ControllerServer) candidates(name string, req *csi.CreateVolumeRequest, src *rdsBox) ([]candidate, error) {
	allowed := s.d.boxes
	var why []string
	if pin := req.GetParameters()[ParameterRDS]; pin != "" {
		b := s.d.boxNamed(pin)
		if b == nil {
			return nil, statusf(codes.InvalidArgument, "volume %q: the StorageClass pins RDS %q (parameter %s), which this driver is not configured with (it has %s)", name, pin, ParameterRDS, s.boxNames())
		}
		allowed, why = []*rdsBox{b}, append(why, fmt.Sprintf("the StorageClass pins RDS %s", pin))
	}
	if src != nil {
		if !slices.Contains(allowed, src) {
			return nil, statusf(codes.InvalidArgument, "volume %q: its content source is on RDS %s, but %s; a copy is made only on its source's RDS (copying across RDS is refused): use a StorageClass that allows RDS %s", name, src.Name, strings.Join(why, " and "), src.Name)
		}
		allowed, why = []*rdsBox{src}, append(why, fmt.Sprintf("its content source is on RDS %s", src.Name))
	}
	topo := req.GetAccessibilityRequirements()
	if len(topo.GetRequisite()) == 0 {
		out := make([]candidate, len(allowed))
		for i, b := range allowed {
			out[i] = candidate{b: b}
		}
		return out, nil
	}
	reached := map[string]bool{}
	for _, t := range topo.GetRequisite() {
		for _, n := range backends.NamedIn(s.d.opts.DriverName, t.GetSegments()) {
			reached[n] = true
		}
	}
	rank := map[string]int{}
	for i, t := range topo.GetPreferred() {
		for _, n := range backends.NamedIn(s.d.opts.DriverName, t.GetSegments()) {
			if _, seen := rank[n]; !seen {
				rank[n] = i
			}
		}
	}
	var out []candidate
	for _, b := range allowed {
		if !reached[b.Name] {
			continue
		}
		r, ok := rank[b.Name]
		if !ok {
			r = len(topo.GetPreferred())
		}
		out = append(out, candidate{b: b, rank: r})
	}
	if len(out) == 0 {
		names := make([]string, len(allowed))
		for i, b := range allowed {
			names[i] = b.Name
		}
		return nil, statusf(codes.ResourceExhausted, "volume %q: the request requires topology %v, which reaches none of RDS %s (%s); check the StorageClass's allowedTopologies and parameters, and the nodes' %s labels",
			name, topo.GetRequisite(), strings.Join(names, ", "), orAll(why), backends.DefaultKey(s.d.opts.DriverName)+"*")
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].rank < out[j].rank })
	return out, nil
}

func orAll(why []string) string {
	if len(why) == 0 {
		return "every RDS of this driver"
	}
	return strings.Join(why, " and ")
}

func (s *ControllerServer) boxNames() string {
	names := make([]string, len(s.d.boxes))
	for i, b := range s.d.boxes {
		names[i] = b.Name
	}
	return strings.Join(names, ", ")
}

// look is what one box said about a volume slot: the disk of an earlier
// attempt (or none), its free space when asked, or its failure.
type look struct {
	c    candidate
	disk *rds.Disk
	free int64
	err  error
}

// lookAround asks each candidate that is up, all at once, for the
// volume's disk (an earlier attempt's) and, with more than one, its free
// space. A box that is down is not asked; one that fails is left out of
// the placement. Nothing here waits on a box longer than its own
// command timeout, and a down box not at all.
func (s *ControllerServer) lookAround(ctx context.Context, cands []candidate, slot string) ([]look, []error) {
	looks := make([]look, len(cands))
	var down []error
	done := make(chan struct{}, len(cands))
	asked := 0
	for i, c := range cands {
		looks[i].c = c
		if err := c.b.up(); err != nil {
			looks[i].err = fmt.Errorf("RDS %s is down (%w); passed over", c.b.Name, err)
			down = append(down, looks[i].err)
			continue
		}
		asked++
		go func() {
			defer func() { done <- struct{}{} }()
			l := &looks[i]
			d, err := c.b.view.GetDisk(ctx, c.b.id(slot))
			switch {
			case err == nil:
				l.disk = d
				return
			case !errors.Is(err, rds.ErrNotFound):
				l.err = fmt.Errorf("looking for the volume on RDS %s: %w", c.b.Name, err)
				return
			}
			if len(cands) > 1 {
				cp, err := c.b.view.Capacity(ctx, c.b.Pool)
				if err != nil {
					l.err = fmt.Errorf("reading the free space of RDS %s: %w", c.b.Name, err)
					return
				}
				l.free = max(cp.Free, 0)
			}
		}()
	}
	for range asked {
		<-done
	}
	return looks, down
}

// place picks the box a new volume of size bytes goes to from what the
// candidates said, or returns the disk an earlier attempt made.
func place(name string, looks []look, size int64) (*rdsBox, *rds.Disk, error) {
	var errs []error
	var best *look
	for i := range looks {
		l := &looks[i]
		switch {
		case l.disk != nil:
			return l.c.b, l.disk, nil
		case l.err != nil:
			errs = append(errs, l.err)
		case len(looks) > 1 && l.free < size:
			errs = append(errs, fmt.Errorf("RDS %s has %d bytes free", l.c.b.Name, l.free))
		case best == nil || l.c.rank < best.c.rank || (l.c.rank == best.c.rank && l.free > best.free):
			best = l
		}
	}
	if best != nil {
		return best.c.b, nil, nil
	}
	err := errors.Join(errs...)
	for _, l := range looks {
		if l.err != nil && !errors.Is(l.err, rds.ErrNoSpace) {
			// A box that failed may have had room: the CO retries.
			return nil, nil, fmt.Errorf("volume %q: no RDS the request allows could take it: %w", name, withTransient(err))
		}
	}
	return nil, nil, fmt.Errorf("volume %q (%d bytes): no RDS the request allows has room: %w", name, size, errors.Join(rds.ErrNoSpace, err))
}

// withTransient marks err as a failure to reach an RDS (UNAVAILABLE)
// unless it already says what it is.
func withTransient(err error) error {
	if errors.Is(err, rds.ErrTransient) || errors.Is(err, rds.ErrHostKey) {
		return err
	}
	return errors.Join(rds.ErrTransient, err)
}

// GetCapacity answers for the boxes a request allows: those a segment of
// its accessible_topology names (every box without one), the pin of its
// parameters; a box that is down counts for nothing. The available
// capacity is their free space together, the largest volume the largest
// one box can take.
func (s *ControllerServer) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	if err := checkParameters(req.GetParameters()); err != nil {
		return nil, statusf(codes.InvalidArgument, "GetCapacity: %v", err)
	}
	for _, c := range req.GetVolumeCapabilities() {
		if checkCapability(c) != nil {
			return &csi.GetCapacityResponse{AvailableCapacity: 0}, nil
		}
	}
	boxes := s.d.boxes
	if t := req.GetAccessibleTopology(); t != nil {
		named := backends.NamedIn(s.d.opts.DriverName, t.GetSegments())
		boxes = slices.DeleteFunc(slices.Clone(boxes), func(b *rdsBox) bool { return !slices.Contains(named, b.Name) })
	}
	if pin := req.GetParameters()[ParameterRDS]; pin != "" {
		boxes = slices.DeleteFunc(slices.Clone(boxes), func(b *rdsBox) bool { return b.Name != pin })
	}
	type answer struct {
		free int64
		err  error
	}
	answers := make([]answer, len(boxes))
	done := make(chan struct{}, len(boxes))
	asked := 0
	for i, b := range boxes {
		if len(s.d.boxes) > 1 && b.up() != nil {
			continue // down: nothing goes there now
		}
		asked++
		go func() {
			defer func() { done <- struct{}{} }()
			c, err := b.view.Capacity(ctx, b.Pool)
			if err != nil {
				answers[i].err = fmt.Errorf("reading the capacity of pool %s on RDS %s: %w", b.Pool, b.Name, err)
				return
			}
			answers[i].free = max(c.Free, 0)
		}()
	}
	for range asked {
		<-done
	}
	var total, largest int64
	var errs []error
	for _, a := range answers {
		if a.err != nil {
			errs = append(errs, a.err)
			continue
		}
		total += a.free
		largest = max(largest, a.free)
	}
	if len(errs) > 0 && (len(errs) == asked || len(s.d.boxes) == 1) {
		// No box answered: the capacity is not known, not zero.
		return nil, errors.Join(errs...)
	}
	return &csi.GetCapacityResponse{
		AvailableCapacity: total,
		MaximumVolumeSize: wrapperspb.Int64(largest / rds.Granularity * rds.Granularity),
	}, nil
}
