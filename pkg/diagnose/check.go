package diagnose

import (
	"fmt"
	"sort"
	"strings"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/inventory"
)

// Finding kinds of Check.
const (
	FindingMultiHeld        = "SingleNodeVolumeHeldTwice"
	FindingClaimWithoutVA   = "ClaimWithoutVolumeAttachment"
	FindingVAToMissingNode  = "VolumeAttachmentToMissingNode"
	FindingOrphanDisk       = "DiskWithoutPV"
	FindingMissingDisk      = "PVWithoutDisk"
	FindingOrphanSnapshot   = "SnapshotWithoutContent"
	FindingClaimsUnreadable = "ClaimsUnreadable"
	// The record of released attachments (storage fencing) cannot be read.
	FindingRetiringUnreadable = "RetiringRecordUnreadable"
	FindingExportMismatch     = "ExportClaimMismatch"
	// The RDS's own health (issue 27), from the controller's /metrics.
	FindingArrayDegraded = "RDSArrayDegraded"
	FindingDriveFailing  = "RDSDriveFailing"
	FindingDriveHot      = "RDSDriveHot"
	FindingPoolFilling   = "RDSPoolFilling"
	// FindingImageNotPulled (driverpods.go): a driver pod's image cannot
	// be pulled.
)

// Finding is one thing wrong, with the object it is about and the next
// step.
type Finding struct {
	Kind    string `json:"kind"`
	Object  string `json:"object"`
	Message string `json:"message"`
	Next    string `json:"next"`
}

// Report is Check's answer. OK means nothing is wrong; Skipped lists the
// parts that could not be checked (they do not make the report fail).
type Report struct {
	OK       bool           `json:"ok"`
	Counts   map[string]int `json:"counts"` // per finding kind, every kind present
	Findings []Finding      `json:"findings"`
	Skipped  []string       `json:"skipped,omitempty"`
	Checked  CheckedCounts  `json:"checked"`
}

// CheckedCounts says how much was looked at.
type CheckedCounts struct {
	PVs         int `json:"pvs"`
	Attachments int `json:"volumeAttachments"`
	Nodes       int `json:"nodes"`
	Disks       int `json:"disks"`
	Snapshots   int `json:"snapshotContents"`
}

// Check audits every volume of the driver in c.
func Check(c *Cluster) Report {
	r := Report{Counts: map[string]int{}, Findings: []Finding{}}
	for _, k := range []string{FindingMultiHeld, FindingClaimWithoutVA, FindingVAToMissingNode, FindingOrphanDisk, FindingMissingDisk, FindingOrphanSnapshot, FindingClaimsUnreadable, FindingRetiringUnreadable, FindingExportMismatch,
		FindingArrayDegraded, FindingDriveFailing, FindingDriveHot, FindingPoolFilling, FindingImageNotPulled} {
		r.Counts[k] = 0
	}
	add := func(kind, object, next, format string, a ...any) {
		r.Findings = append(r.Findings, Finding{Kind: kind, Object: object, Message: fmt.Sprintf(format, a...), Next: next})
		r.Counts[kind]++
	}
	handles := map[string]string{} // volume handle -> PV
	claimed := map[string][]ClaimFact{}
	// Handles with a PV whose claims cannot be read: who holds them is
	// not known, so their export is not judged against the claims.
	unreadable := map[string]bool{}
	for i := range c.PVs {
		pv := &c.PVs[i]
		if !c.ours(pv) {
			continue
		}
		r.Checked.PVs++
		handles[pv.Spec.CSI.VolumeHandle] = pv.Name
		atts := c.attachments(pv.Name)
		facts, err := claimsOf(pv, atts)
		claimed[pv.Spec.CSI.VolumeHandle] = append(claimed[pv.Spec.CSI.VolumeHandle], facts...)
		if err != nil {
			unreadable[pv.Spec.CSI.VolumeHandle] = true
			add(FindingClaimsUnreadable, "pv/"+pv.Name, unreadableNext(pv, claims.ClaimsAnnotation),
				"%v: the driver cannot tell which nodes hold volume %s, skips the PV and refuses every publish and unpublish of it until the annotation is fixed; %s",
				err, pv.Spec.CSI.VolumeHandle, attachedWhere(atts))
		}
		if err := unreadableRetiring(pv); err != nil {
			add(FindingRetiringUnreadable, "pv/"+pv.Name, unreadableNext(pv, claims.RetiringAnnotation),
				"PV %s: %v: with storage fencing the driver refuses every publish and unpublish of volume %s until it is fixed, and cannot finish the export changes after the releases it recorded (the leader's reconcile still brings the export in line with the claims)",
				pv.Name, err, pv.Spec.CSI.VolumeHandle)
		}
		for _, cl := range facts {
			if cl.Attachment == "" {
				add(FindingClaimWithoutVA, "pv/"+pv.Name, "kubectl rds why pv "+pv.Name,
					"%s claims PV %s (since %s) but has no VolumeAttachment for it", cl.Node, pv.Name, cl.At.UTC().Format("2006-01-02T15:04:05Z"))
			}
		}
		if singleNode(pv) {
			var held []string
			story := Story{Attachments: atts, Claims: facts}
			for _, n := range atts {
				story.Nodes = append(story.Nodes, c.node(n.Node))
			}
			for _, cl := range facts {
				story.Nodes = append(story.Nodes, c.node(cl.Node))
			}
			for _, h := range story.holders() {
				// A fenced holder (deleted, out of service) keeps its
				// VolumeAttachment until Kubernetes detaches it; it no
				// longer writes.
				if h.claim == nil && (!h.node.Exists || h.node.OutOfService) {
					continue
				}
				held = append(held, h.node.Name)
			}
			if len(held) > 1 {
				add(FindingMultiHeld, "pv/"+pv.Name, "kubectl rds why pv "+pv.Name,
					"single-node PV %s (%s) is held by %d nodes: %s", pv.Name, accessModes(pv), len(held), strings.Join(held, ", "))
			}
		}
	}
	for i := range c.Attachments {
		va := &c.Attachments[i]
		if va.Spec.Attacher != c.DriverName {
			continue
		}
		r.Checked.Attachments++
		if !c.node(va.Spec.NodeName).Exists {
			pv := ""
			if va.Spec.Source.PersistentVolumeName != nil {
				pv = *va.Spec.Source.PersistentVolumeName
			}
			add(FindingVAToMissingNode, "volumeattachment/"+va.Name, "kubectl get volumeattachment "+va.Name+" -o yaml   # the attach/detach controller should delete it; see kube-controller-manager's log",
				"VolumeAttachment %s (PV %s, attached=%v) names node %s, which does not exist", va.Name, pv, va.Status.Attached, va.Spec.NodeName)
		}
	}
	r.Checked.Nodes = len(c.Nodes)
	if c.Inventory == nil {
		r.Skipped = append(r.Skipped, "disks on the RDS: "+nonEmpty(c.InventoryNote, "no inventory"))
	} else {
		r.Checked.Disks = len(c.Inventory.Disks)
		slots := map[string]inventory.Disk{}
		for _, d := range c.Inventory.Disks {
			slots[d.Slot] = d
			switch {
			case d.Kind == inventory.KindVolume && handles[d.Slot] == "":
				add(FindingOrphanDisk, "disk/"+d.Slot, "rdsctl delete "+d.Slot+"   # after checking nobody needs its data; or re-create a PV for it",
					"disk %s (%d bytes, %s) on %s has no PV", d.Slot, d.SizeBytes, d.File, onRDS(d.RDS))
			case d.Kind == inventory.KindSnapshot && c.SnapshotHandles != nil && c.SnapshotHandles[d.Slot] == "":
				add(FindingOrphanSnapshot, "disk/"+d.Slot, "rdsctl delete "+d.Slot+"   # after checking nobody needs it",
					"snapshot %s (%s) on %s has no VolumeSnapshotContent", d.Slot, d.File, onRDS(d.RDS))
			}
		}
		for _, b := range c.Inventory.Boxes {
			if b.Error != "" {
				r.Skipped = append(r.Skipped, fmt.Sprintf("disks on RDS %s: not listed: %s", b.Name, b.Error))
			}
		}
		for _, h := range sortedKeys(handles) {
			d, ok := slots[h]
			if b, boxed := c.Inventory.BoxOf(h); boxed && b.Error != "" {
				continue // its box did not answer: not checked, not missing
			}
			if !ok || d.Kind != inventory.KindVolume {
				add(FindingMissingDisk, "pv/"+handles[h], "kubectl rds why pv "+handles[h],
					"PV %s has no disk %s on %s", handles[h], h, onRDS(boxName(c.Inventory, h)))
				continue
			}
			if unreadable[h] {
				continue
			}
			if why := c.exportMismatch(d, handles[h], claimed[h]); why != "" {
				add(FindingExportMismatch, "pv/"+handles[h], "kubectl get events -A --field-selector reason=ExportClaimMismatch   # the controller's reconcile fixes it within --export-reconcile-period; if it persists, see its log",
					"volume %s: %s", h, why)
			}
		}
	}
	c.checkRDSHealth(&r, add)
	c.checkDriverPods(add)
	if c.SnapshotHandles == nil {
		r.Skipped = append(r.Skipped, "snapshot files: "+nonEmpty(c.SnapshotsNote, "VolumeSnapshotContents not read"))
	} else {
		r.Checked.Snapshots = len(c.SnapshotHandles)
	}
	sort.SliceStable(r.Findings, func(i, j int) bool {
		if r.Findings[i].Kind != r.Findings[j].Kind {
			return r.Findings[i].Kind < r.Findings[j].Kind
		}
		return r.Findings[i].Object < r.Findings[j].Object
	})
	r.OK = len(r.Findings) == 0
	return r
}

// exportMismatch says how a disk's export disagrees with its volume's
// claims under storage fencing ("" when it agrees, or when the disk is not
// managed by storage fencing: open to any host, as without it). A
// claimed volume must be open, to the host NQN the attacher recorded for
// one of the claiming nodes' attachments (VolumeAttachment
// status.attachmentMetadata hostNQN) when one is recorded; an unclaimed
// volume must be closed.
func (c *Cluster) exportMismatch(d inventory.Disk, pv string, facts []ClaimFact) string {
	if d.Exported && d.AllowHost == "" {
		return "" // not under storage fencing (or a claim from before it)
	}
	if len(facts) == 0 {
		if d.Exported {
			return fmt.Sprintf("no node claims it, but its export on the RDS is open to %s", d.AllowHost)
		}
		return ""
	}
	var nodes, recorded []string
	for _, cl := range facts {
		nodes = append(nodes, cl.Node)
		for i := range c.Attachments {
			va := &c.Attachments[i]
			if va.Spec.Attacher != c.DriverName || va.Spec.NodeName != cl.Node || va.Spec.Source.PersistentVolumeName == nil ||
				*va.Spec.Source.PersistentVolumeName != pv || !va.Status.Attached || va.DeletionTimestamp != nil {
				continue
			}
			if h := va.Status.AttachmentMetadata["hostNQN"]; h != "" {
				recorded = append(recorded, inventory.HostFingerprint(h))
			}
		}
	}
	if !d.Exported {
		return fmt.Sprintf("claimed by %s, but its export on the RDS is closed: the holder cannot connect", strings.Join(nodes, ", "))
	}
	if len(recorded) == 0 {
		return ""
	}
	for _, h := range recorded {
		if h == d.AllowHost {
			return ""
		}
	}
	return fmt.Sprintf("claimed by %s, but its export on the RDS allows %s, not the host NQN of any of their attachments", strings.Join(nodes, ", "), d.AllowHost)
}

func nonEmpty(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// checkRDSHealth reports what the controller's poll of the RDS says is
// wrong with the RDS itself, by the thresholds of the alerts
// (docs/operations.md says what to do). Health not gathered is not
// checked, silently; health that could not be read, or is stale, is
// skipped with why.
func (c *Cluster) checkRDSHealth(r *Report, add func(kind, object, next, format string, a ...any)) {
	h := c.RDSHealth
	switch {
	case h == nil && c.RDSHealthNote != "":
		r.Skipped = append(r.Skipped, "RDS health: "+c.RDSHealthNote)
		return
	case h == nil:
		return
	case h.note() != "":
		r.Skipped = append(r.Skipped, "RDS health: "+h.note())
		return
	}
	const doc = "   # docs/operations.md, "
	if n := h.FailedPolls["stats"]; n > 0 {
		r.Skipped = append(r.Skipped, fmt.Sprintf("RDS drives' S.M.A.R.T. values (hot, critical warning) and volume I/O: the last %.0f poll(s) of /disk print stats detail failed (the controller's log has RouterOS's answer; docs/operations.md, \"Poll failing\")", n))
	}
	for _, a := range h.Arrays {
		if a.Degraded {
			add(FindingArrayDegraded, "rds/"+a.Name, "replace the failed or missing drive (kubectl rds check -o json names it)"+doc+"\"Array degraded\"",
				"RAID array %s on the RDS is degraded: %d member(s) failed, %d missing; one more failure may lose every volume on it", a.Name, a.Failed, a.Missing)
		}
	}
	for _, d := range h.Drives {
		switch {
		case d.Failed:
			add(FindingDriveFailing, "rds/"+d.Name, "replace drive "+d.Name+doc+"\"Drive failing\"",
				"drive %s is marked failed in array %s", d.Name, d.Array)
		case d.CriticalWarning != nil && *d.CriticalWarning > 0:
			add(FindingDriveFailing, "rds/"+d.Name, "plan the replacement of drive "+d.Name+doc+"\"Drive failing\"",
				"drive %s reports S.M.A.R.T. critical warning %.0f", d.Name, *d.CriticalWarning)
		}
		if d.TemperatureC != nil && *d.TemperatureC >= HotDriveCelsius {
			add(FindingDriveHot, "rds/"+d.Name, "check the RDS's fans and airflow"+doc+"\"Drive hot\"",
				"drive %s is at %.0f °C", d.Name, *d.TemperatureC)
		}
	}
	if p := h.Pool; p != nil && p.Used() > PoolFillingUsed {
		add(FindingPoolFilling, "rds/"+p.Name, "delete snapshots and volumes no longer needed, or grow the pool"+doc+"\"Pool filling\"",
			"pool %s is %.1f%% full (%.0f of %.0f bytes free)", p.Name, 100*p.Used(), p.FreeBytes, p.SizeBytes)
	}
}

// onRDS names the box a disk is on in a message: "the RDS" with one box,
// "RDS <name>" with several.
func onRDS(box string) string {
	if box == "" {
		return "the RDS"
	}
	return "RDS " + box
}

// boxName is the name of the box a volume ID names, with several boxes
// ("" with one).
func boxName(inv *inventory.Inventory, id string) string {
	if b, ok := inv.BoxOf(id); ok {
		return b.Name
	}
	return ""
}
