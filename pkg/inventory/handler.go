package inventory

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/srvlab/rds-csi/pkg/rds"
)

// Lister is what the handler needs from the RDS client.
type Lister interface {
	ListDisks(ctx context.Context) ([]rds.Disk, error)
}

// DefaultMaxAge is how long one listing answers every request: the
// endpoint may be reached by anything that reaches the HTTP port, and it
// must not turn requests into a stream of SSH commands.
const DefaultMaxAge = 5 * time.Second

// Handler serves GET Path. Concurrent requests share one listing.
type Handler struct {
	lister     Lister
	volumePath string
	sources    []Source // several boxes (NewBoxesHandler)
	maxAge     time.Duration
	timeout    time.Duration
	now        func() time.Time

	mu   sync.Mutex // one listing at a time; guards last
	last *Inventory
}

// NewHandler returns a Handler listing through l the disks under volumePath.
func NewHandler(l Lister, volumePath string) *Handler {
	return &Handler{lister: l, volumePath: volumePath, maxAge: DefaultMaxAge, timeout: 30 * time.Second, now: time.Now}
}

// Source is one RDS box as the handler lists it: its lister speaks volume
// IDs (backends.View), so each disk's Slot is its ID.
type Source struct {
	Name       string
	Default    bool
	VolumePath string
	Lister     Lister
}

// NewBoxesHandler returns a Handler listing every box, side by side; a
// box that fails is reported as such, and only when every box fails does
// the request fail.
func NewBoxesHandler(sources []Source) *Handler {
	return &Handler{sources: sources, maxAge: DefaultMaxAge, timeout: 30 * time.Second, now: time.Now}
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "read-only: GET only", http.StatusMethodNotAllowed)
		return
	}
	inv, err := h.inventory(r.Context())
	if err != nil {
		klog.FromContext(r.Context()).Info("inventory: listing the RDS disks failed", "err", err.Error())
		http.Error(w, "listing the disks on the RDS failed: "+err.Error()+" (see /readyz)", http.StatusBadGateway)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(inv)
}

func (h *Handler) inventory(ctx context.Context) (*Inventory, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.last != nil && h.now().Sub(h.last.GeneratedAt) < h.maxAge {
		return h.last, nil
	}
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	if h.sources != nil {
		return h.boxes(ctx)
	}
	disks, err := h.lister.ListDisks(ctx)
	if err != nil {
		return nil, err
	}
	inv := Build(disks, h.volumePath, h.now())
	h.last = &inv
	return h.last, nil
}

// boxes lists every box at once.
func (h *Handler) boxes(ctx context.Context) (*Inventory, error) {
	listings := make([]Listing, len(h.sources))
	var wg sync.WaitGroup
	for i, src := range h.sources {
		listings[i] = Listing{Name: src.Name, Default: src.Default, VolumePath: src.VolumePath}
		wg.Add(1)
		go func() {
			defer wg.Done()
			listings[i].Disks, listings[i].Err = src.Lister.ListDisks(ctx)
		}()
	}
	wg.Wait()
	var errs []error
	for _, l := range listings {
		if l.Err != nil {
			errs = append(errs, l.Err)
		}
	}
	if len(errs) == len(listings) {
		return nil, errors.Join(errs...)
	}
	inv := BuildBoxes(listings, h.now())
	h.last = &inv
	return h.last, nil
}
