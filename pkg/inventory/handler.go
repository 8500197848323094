package inventory

import (
	"context"
	"encoding/json"
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
	disks, err := h.lister.ListDisks(ctx)
	if err != nil {
		return nil, err
	}
	inv := Build(disks, h.volumePath, h.now())
	h.last = &inv
	return h.last, nil
}
