package inventory

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	neturl "net/url"
	"sort"
	"strings"
	"time"

	"github.com/srvlab/rds-csi/pkg/rds"
)

// Path is where the controller serves the inventory on its HTTP endpoint.
const Path = "/inventory"

// Kinds of disk in the inventory (rds.FileKind).
const (
	KindVolume   = rds.FileVolume   // <volume-path>/<slot>.img
	KindSnapshot = rds.FileSnapshot // <volume-path>/snapshots/<slot>.*.img
)

// Inventory is the JSON document served at Path.
type Inventory struct {
	GeneratedAt time.Time `json:"generatedAt"`
	VolumePath  string    `json:"volumePath"`
	Disks       []Disk    `json:"disks"`
	// OtherDisks counts the file-backed disks outside the volume path,
	// which are not this driver's and are not described.
	OtherDisks int `json:"otherDisks"`
	// Boxes: with several RDS boxes, each box's listing (a box that did
	// not answer says why: its disks are not in Disks, which does not
	// mean they are gone). Empty with one box.
	Boxes []Box `json:"boxes,omitempty"`
}

// Box is one RDS box's part of the inventory.
type Box struct {
	Name       string `json:"name"`
	Default    bool   `json:"default,omitempty"`
	VolumePath string `json:"volumePath"`
	Disks      int    `json:"disks"`
	Error      string `json:"error,omitempty"`
}

// BoxOf is the listing of the box a volume ID names ("": the default
// box's), and whether the inventory has boxes at all.
func (inv *Inventory) BoxOf(id string) (Box, bool) {
	name, _, _ := strings.Cut(id, "/")
	if !strings.Contains(id, "/") {
		name = ""
	}
	for _, b := range inv.Boxes {
		if (name == "" && b.Default) || (name != "" && b.Name == name && !b.Default) {
			return b, true
		}
	}
	return Box{}, false
}

// Disk is one of the driver's disks on the RDS.
type Disk struct {
	// Slot is the disk's volume or snapshot ID: its slot on its box,
	// after the box's name and "/" on a box other than the default.
	Slot      string `json:"slot"`
	RDS       string `json:"rds,omitempty"` // its box, with several`
	Kind      string `json:"kind"`
	SizeBytes int64  `json:"sizeBytes"`
	File      string `json:"file"`
	Exported  bool   `json:"exported"`
	Port      int    `json:"port,omitempty"`
	NQN       string `json:"nqn,omitempty"`
	// AllowHost is a fingerprint of the allowed host NQN (HostFingerprint),
	// never the NQN: under storage fencing it is an attachment's fencing
	// token, which this unauthenticated endpoint must not hand out.
	AllowHost string `json:"allowHost,omitempty"`
}

// HostFingerprint is how the inventory shows an allowed host NQN:
// "sha256:" and the first 6 bytes of its SHA-256 in hex ("" stays "": any
// host). Compare a known NQN by fingerprinting it the same way.
func HostFingerprint(nqn string) string {
	if nqn == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(nqn))
	return fmt.Sprintf("sha256:%x", sum[:6])
}

// Build keeps the disks under volumePath and classifies them. Pure.
func Build(disks []rds.Disk, volumePath string, now time.Time) Inventory {
	inv := Inventory{GeneratedAt: now.UTC(), VolumePath: volumePath, Disks: []Disk{}}
	for _, d := range disks {
		kind := rds.FileKind(volumePath, d)
		if kind == "" {
			inv.OtherDisks++
			continue
		}
		inv.Disks = append(inv.Disks, Disk{
			Slot: d.Slot, Kind: kind, SizeBytes: d.Size, File: d.FilePath,
			Exported: d.Exported, Port: d.Port, NQN: d.NQN, AllowHost: HostFingerprint(d.AllowHost),
		})
	}
	sort.Slice(inv.Disks, func(i, j int) bool { return inv.Disks[i].Slot < inv.Disks[j].Slot })
	return inv
}

// Listing is what one box answered (Sources): its disks, with each
// Slot the disk's ID (backends.View), or the failure.
type Listing struct {
	Name       string
	Default    bool
	VolumePath string
	Disks      []rds.Disk
	Err        error
}

// BuildBoxes is Build over several boxes. Pure.
func BuildBoxes(listings []Listing, now time.Time) Inventory {
	inv := Inventory{GeneratedAt: now.UTC(), Disks: []Disk{}}
	for _, l := range listings {
		b := Box{Name: l.Name, Default: l.Default, VolumePath: l.VolumePath}
		if l.Default {
			inv.VolumePath = l.VolumePath
		}
		if l.Err != nil {
			b.Error = l.Err.Error()
			inv.Boxes = append(inv.Boxes, b)
			continue
		}
		for _, d := range l.Disks {
			slot := d.Slot
			if i := strings.Index(slot, "/"); i >= 0 {
				slot = slot[i+1:]
			}
			bare := d
			bare.Slot = slot
			kind := rds.FileKind(l.VolumePath, bare)
			if kind == "" {
				inv.OtherDisks++
				continue
			}
			b.Disks++
			inv.Disks = append(inv.Disks, Disk{
				Slot: d.Slot, RDS: l.Name, Kind: kind, SizeBytes: d.Size, File: d.FilePath,
				Exported: d.Exported, Port: d.Port, NQN: d.NQN, AllowHost: HostFingerprint(d.AllowHost),
			})
		}
		inv.Boxes = append(inv.Boxes, b)
	}
	sort.Slice(inv.Disks, func(i, j int) bool { return inv.Disks[i].Slot < inv.Disks[j].Slot })
	return inv
}

// Find returns the disk in slot, if listed.
func (inv *Inventory) Find(slot string) (Disk, bool) {
	for _, d := range inv.Disks {
		if d.Slot == slot {
			return d, true
		}
	}
	return Disk{}, false
}

// Redacted is raw as an error may show it: a password in the URL's user
// information replaced by "xxxxx", and a URL that does not parse not shown
// at all (it may hold one).
func Redacted(raw string) string {
	u, err := neturl.Parse(raw)
	if err != nil {
		return "(the URL given, which does not parse)"
	}
	return fmt.Sprintf("%q", u.Redacted())
}

// Fetch reads an inventory from url (for example
// http://localhost:8080/inventory through kubectl port-forward).
func Fetch(ctx context.Context, client *http.Client, url string) (*Inventory, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("inventory URL %s: %w", Redacted(url), err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reading the RDS inventory (is `kubectl -n rds-csi port-forward deploy/rds-csi-controller 8080` running?): %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("reading the RDS inventory from %s: %w", Redacted(url), err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("the RDS inventory at %s answered %s: %s", Redacted(url), resp.Status, strings.TrimSpace(string(body)))
	}
	var inv Inventory
	if err := json.Unmarshal(body, &inv); err != nil {
		return nil, fmt.Errorf("the answer of %s is not an inventory: %w", Redacted(url), err)
	}
	return &inv, nil
}
