package diagnose

import (
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/inventory"
)

// Verdict codes of Why, one per situation an operator meets.
const (
	VerdictAttached          = "Attached"          // on the node that wants it; the volume is not the problem
	VerdictIdle              = "Idle"              // nobody holds it, nobody wants it
	VerdictHeldByHealthyNode = "HeldByHealthyNode" // another Ready node uses it: Multi-Attach, working as meant
	VerdictHolderNotReady    = "HolderNotReady"    // the holder is NotReady: maybe dead, the operator decides
	VerdictFencing           = "Fencing"           // the holder is out of service; Kubernetes is detaching
	VerdictHolderDeleted     = "HolderDeleted"     // the holder's Node is gone; Kubernetes is detaching
	VerdictStaleClaim        = "StaleClaim"        // a claim without a VolumeAttachment, on a node that is not Ready
	VerdictStaleClaimReady   = "StaleClaimOnReadyNode"
	VerdictAttachFailing     = "AttachFailing" // the wanted node's VolumeAttachment reports an error
	VerdictAttaching         = "Attaching"     // asked, no answer yet
	VerdictNoAttachment      = "NoVolumeAttachment"
	VerdictDiskMissing       = "DiskMissing"
	VerdictNotBound          = "ClaimNotBound"
	VerdictMissing           = "NotFound"
	VerdictNotOurs           = "NotThisDriver"
	VerdictClaimsUnreadable  = "ClaimsUnreadable"
	VerdictNoVolumes         = "NoVolumes"
)

// Verdict is the answer in plain words and the one next action.
type Verdict struct {
	Code    string `json:"code"`
	Summary string `json:"summary"`
	Next    string `json:"next"`
}

// Story is the chain Pod → PVC → PV → VolumeAttachments → Nodes → claims →
// disk of one volume, and its verdict.
type Story struct {
	Pod      string `json:"pod,omitempty"` // namespace/name
	WantNode string `json:"wantNode,omitempty"`
	PVC      string `json:"pvc,omitempty"` // namespace/name
	PVCPhase string `json:"pvcPhase,omitempty"`
	PV       string `json:"pv,omitempty"`
	Handle   string `json:"volumeHandle,omitempty"`
	// Box is the RDS box the volume is on, with several (the inventory's).
	Box         string           `json:"rdsBox,omitempty"`
	AccessModes string           `json:"accessModes,omitempty"`
	Users       []string         `json:"users,omitempty"` // pods using the claim, namespace/name@node
	Attachments []AttachmentFact `json:"attachments,omitempty"`
	Nodes       []NodeFact       `json:"nodes,omitempty"`
	Claims      []ClaimFact      `json:"claims,omitempty"`
	Disk        *inventory.Disk  `json:"disk,omitempty"`
	DiskNote    string           `json:"diskNote,omitempty"` // why Disk is nil
	// RDS is the volume's I/O and the array and pool under it, in one
	// sentence, and Load the volume's counters (issue 27); empty when
	// the controller's health was not gathered.
	RDS     string      `json:"rds,omitempty"`
	Load    *VolumeLoad `json:"rdsLoad,omitempty"`
	Verdict Verdict     `json:"verdict"`
}

// Explanation is Why's answer: one story per volume of the target.
type Explanation struct {
	Target  string  `json:"target"`
	Stories []Story `json:"volumes"`
}

// Target kinds of Why.
const (
	KindPod = "pod"
	KindPVC = "pvc"
	KindPV  = "pv"
)

// Why explains the target (a pod or PVC as namespace and name, a PV by
// name) from c.
func Why(c *Cluster, kind, namespace, name string) Explanation {
	switch kind {
	case KindPod:
		ex := Explanation{Target: "pod " + namespace + "/" + name}
		pod := c.pod(namespace, name)
		if pod == nil {
			return ex.only(Story{Pod: namespace + "/" + name, Verdict: Verdict{Code: VerdictMissing,
				Summary: fmt.Sprintf("pod %s/%s does not exist", namespace, name),
				Next:    fmt.Sprintf("kubectl get pods -n %s", namespace)}})
		}
		for _, cn := range claimNames(pod) {
			s := c.storyOfClaim(namespace, cn)
			s.Pod, s.WantNode = namespace+"/"+name, pod.Spec.NodeName
			c.judge(&s)
			if s.Verdict.Code == VerdictNotOurs && len(claimNames(pod)) > 1 {
				continue // another driver's volume beside ours: not our story
			}
			ex.Stories = append(ex.Stories, s)
		}
		if len(ex.Stories) == 0 {
			return ex.only(Story{Pod: namespace + "/" + name, Verdict: Verdict{Code: VerdictNoVolumes,
				Summary: fmt.Sprintf("pod %s/%s mounts no PersistentVolumeClaim of %s", namespace, name, c.DriverName),
				Next:    fmt.Sprintf("kubectl describe pod -n %s %s", namespace, name)}})
		}
		return ex
	case KindPVC:
		s := c.storyOfClaim(namespace, name)
		c.judge(&s)
		return Explanation{Target: "pvc " + namespace + "/" + name, Stories: []Story{s}}
	default:
		s := Story{PV: name}
		if pv := c.pv(name); pv != nil && pv.Spec.ClaimRef != nil {
			s = c.storyOfClaim(pv.Spec.ClaimRef.Namespace, pv.Spec.ClaimRef.Name)
			if s.PV != name { // the claim is bound elsewhere, or gone
				s = Story{PV: name}
			}
		}
		c.judge(&s)
		return Explanation{Target: "pv " + name, Stories: []Story{s}}
	}
}

func (ex Explanation) only(s Story) Explanation {
	ex.Stories = []Story{s}
	return ex
}

// storyOfClaim fills the PVC and PV part of a story; judge does the rest.
func (c *Cluster) storyOfClaim(ns, name string) Story {
	s := Story{PVC: ns + "/" + name}
	pvc := c.pvc(ns, name)
	if pvc == nil {
		return s
	}
	s.PVCPhase = string(pvc.Status.Phase)
	s.PV = pvc.Spec.VolumeName
	for _, p := range c.podsUsing(ns, name) {
		s.Users = append(s.Users, p.Namespace+"/"+p.Name+"@"+p.Spec.NodeName)
	}
	return s
}

// judge gathers the rest of the chain from the PV on and sets the verdict.
func (c *Cluster) judge(s *Story) {
	v := func(code, next, format string, a ...any) {
		s.Verdict = Verdict{Code: code, Summary: fmt.Sprintf(format, a...), Next: next}
	}
	if s.PVC != "" && s.PVCPhase == "" {
		ns, _, _ := strings.Cut(s.PVC, "/")
		v(VerdictMissing, fmt.Sprintf("kubectl get pvc -n %s", ns), "PVC %s does not exist", s.PVC)
		return
	}
	if s.PV == "" {
		ns, name, _ := strings.Cut(s.PVC, "/")
		v(VerdictNotBound, fmt.Sprintf("kubectl describe pvc -n %s %s", ns, name),
			"PVC %s is %s, not bound to a PV yet: provisioning has not finished or failed", s.PVC, s.PVCPhase)
		return
	}
	pv := c.pv(s.PV)
	if pv == nil {
		v(VerdictMissing, "kubectl get pv "+s.PV, "PV %s does not exist", s.PV)
		return
	}
	if !c.ours(pv) {
		v(VerdictNotOurs, "kubectl describe pv "+s.PV, "PV %s is not a volume of %s", s.PV, c.DriverName)
		return
	}
	s.Handle, s.AccessModes = pv.Spec.CSI.VolumeHandle, accessModes(pv)
	s.Attachments = c.attachments(pv.Name)
	facts, err := claimsOf(pv, s.Attachments)
	names := map[string]bool{}
	for _, a := range s.Attachments {
		names[a.Node] = true
	}
	for _, cl := range facts {
		names[cl.Node] = true
	}
	if s.WantNode != "" {
		names[s.WantNode] = true
	}
	for _, n := range sortedKeys(names) {
		s.Nodes = append(s.Nodes, c.node(n))
	}
	s.Claims = facts
	c.diskOf(s)
	if err != nil {
		v(VerdictClaimsUnreadable, unreadableNext(pv, claims.ClaimsAnnotation),
			"the claims annotation of PV %s cannot be read, and the driver refuses every publish and unpublish of it until it is fixed: %v", pv.Name, err)
		return
	}
	if c.Inventory != nil && s.Disk == nil && s.DiskNote == "" {
		v(VerdictDiskMissing, fmt.Sprintf("rdsctl get %s   # on a machine with the driver's key; restore from a VolumeSnapshot if it is gone", s.Handle),
			"the disk %s of PV %s is not on %s (inventory of %s): the volume cannot attach anywhere", s.Handle, pv.Name, onRDS(s.Box), c.Inventory.GeneratedAt.Format("15:04:05Z"))
		return
	}
	c.judgeHolders(s, pv)
	if s.DiskNote != "" {
		s.Verdict.Summary += " (disk on the RDS not checked: " + s.DiskNote + ")"
	}
	c.rdsOf(s)
}

// rdsOf adds the volume's I/O and the RDS's state under it; an attached
// volume (the "my VM is slow" case) gets them in its verdict too.
func (c *Cluster) rdsOf(s *Story) {
	switch {
	case c.RDSHealth != nil:
		s.RDS = c.RDSHealth.volumeSummary(s.PV)
		if l, ok := c.RDSHealth.Volumes[s.PV]; ok && !c.RDSHealth.Stale() {
			s.Load = &l
		}
	case c.RDSHealthNote != "":
		s.RDS = "RDS health not known: " + c.RDSHealthNote
	default:
		return
	}
	if s.Verdict.Code == VerdictAttached {
		s.Verdict.Summary += ". " + s.RDS
	}
}

func (c *Cluster) diskOf(s *Story) {
	if c.Inventory == nil {
		s.DiskNote = c.InventoryNote
		if s.DiskNote == "" {
			s.DiskNote = "no inventory"
		}
		return
	}
	if b, ok := c.Inventory.BoxOf(s.Handle); ok {
		s.Box = b.Name
		if b.Error != "" {
			s.DiskNote = fmt.Sprintf("RDS %s did not answer: %s", b.Name, b.Error)
			return
		}
	}
	if d, ok := c.Inventory.Find(s.Handle); ok {
		s.Disk = &d
	}
}

// holder is a node that holds the volume: it has a claim or an attached
// VolumeAttachment.
type holder struct {
	node  NodeFact
	va    *AttachmentFact
	claim *ClaimFact
}

func (s *Story) holders() []holder {
	nodes := map[string]*holder{}
	get := func(n string) *holder {
		if nodes[n] == nil {
			nodes[n] = &holder{}
			for _, f := range s.Nodes {
				if f.Name == n {
					nodes[n].node = f
				}
			}
		}
		return nodes[n]
	}
	for i := range s.Attachments {
		if a := &s.Attachments[i]; a.Attached {
			get(a.Node).va = a
		}
	}
	for i := range s.Claims {
		get(s.Claims[i].Node).claim = &s.Claims[i]
	}
	var out []holder
	for _, n := range sortedKeys(nodes) {
		out = append(out, *nodes[n])
	}
	return out
}

// describePod is the kubectl command that describes the pod of s that
// runs on node: the story's pod, else the first user there.
func describePod(s *Story, node string) string {
	pod := s.Pod
	if pod == "" {
		for _, u := range s.Users {
			if p, n, _ := strings.Cut(u, "@"); n == node {
				pod = p
				break
			}
		}
	}
	ns, name, ok := strings.Cut(pod, "/")
	if !ok {
		return "kubectl get pods -A --field-selector spec.nodeName=" + node
	}
	return fmt.Sprintf("kubectl describe pod -n %s %s", ns, name)
}

func (c *Cluster) judgeHolders(s *Story, pv *corev1.PersistentVolume) {
	v := func(code, next, format string, a ...any) {
		s.Verdict = Verdict{Code: code, Summary: fmt.Sprintf(format, a...), Next: next}
	}
	holders := s.holders()
	want := s.WantNode
	if want == "" { // a PVC or PV: the node of a pod using it that does not have it
		attached := map[string]bool{}
		for _, h := range holders {
			attached[h.node.Name] = h.va != nil
		}
		for _, u := range s.Users {
			if _, n, _ := strings.Cut(u, "@"); n != "" && !attached[n] {
				want = n
				break
			}
		}
	}
	var others []holder
	for _, h := range holders {
		if h.node.Name == want {
			if h.va != nil {
				v(VerdictAttached, describePod(s, want)+"   # look at the pod's events and the node plugin's log on "+want,
					"PV %s is attached to %s, the node that wants it: the volume does not block the pod", pv.Name, want)
				return
			}
			continue
		}
		others = append(others, h)
	}
	if want == "" {
		switch {
		case len(holders) == 0:
			v(VerdictIdle, "nothing to do", "PV %s is attached nowhere and no pod uses it", pv.Name)
			return
		case len(holders) == 1 && holders[0].va != nil && holders[0].node.Healthy():
			v(VerdictAttached, "nothing to do", "PV %s is attached to %s, which is Ready", pv.Name, holders[0].node.Name)
			return
		}
	}
	limit := 1 // single-node volumes; a raw block RWX volume may be on two (live migration)
	if !singleNode(pv) {
		limit = 2
		if hasMode(pv, corev1.ReadOnlyMany) {
			limit = 1 << 30
		}
	}
	if want != "" && len(others) < limit || want == "" && len(others) <= limit && c.allHealthyAttached(others) {
		c.judgeWanted(s, pv, want)
		return
	}
	// The first holder that needs the operator decides the verdict.
	sort.SliceStable(others, func(i, j int) bool { return rank(others[i]) < rank(others[j]) })
	h := others[0]
	n := h.node
	wantText := ""
	if want != "" {
		wantText = " and " + want + " waits for it"
	}
	gone := !n.Exists || (h.claim != nil && h.claim.UID != "" && h.claim.UID != n.UID)
	switch {
	case h.va == nil && (gone || !n.Healthy() && !n.OutOfService || n.OutOfService):
		why := "has been NotReady for " + Ago(c.Now.Sub(n.ReadySince))
		switch {
		case gone && !n.Exists:
			why = "no longer exists"
		case gone:
			why = "was re-created since (another UID)"
		case n.OutOfService:
			why = "is out of service"
		}
		v(VerdictStaleClaim, fmt.Sprintf("kubectl rds release %s --node %s", pv.Name, n.Name),
			"%s claims PV %s without a VolumeAttachment and %s; the stale claim blocks every other node%s", n.Name, pv.Name, why, wantText)
	case h.va == nil:
		v(VerdictStaleClaimReady, fmt.Sprintf("on %s: nvme list-subsys | grep %s   # if nothing is connected, drain %s; a claim of a Ready node is released by the driver on detach, or by hand (docs/attachments.md)", n.Name, s.Handle, n.Name),
			"%s claims PV %s without a VolumeAttachment, and %s is Ready, so the claim may be in use and is not released from here%s", n.Name, pv.Name, n.Name, wantText)
	case !n.Exists:
		v(VerdictHolderDeleted, fmt.Sprintf("kubectl get volumeattachment %s -w   # Kubernetes detaches it; if it stays, see kube-controller-manager's log", h.va.Name),
			"%s holds PV %s (VolumeAttachment %s) but its Node no longer exists; Kubernetes is detaching it and the driver fences the node%s", n.Name, pv.Name, h.va.Name, wantText)
	case n.OutOfService:
		v(VerdictFencing, fmt.Sprintf("kubectl get volumeattachment %s -w   # the pods on %s are deleted, then the volume detaches", h.va.Name, n.Name),
			"%s holds PV %s and is out of service: Kubernetes is detaching it%s", n.Name, pv.Name, wantText)
	case n.Ready != "True":
		v(VerdictHolderNotReady, fmt.Sprintf("if %s is really down: kubectl taint node %s %s=nodeshutdown:NoExecute", n.Name, n.Name, OutOfServiceTaint),
			"%s holds PV %s and has been NotReady for %s%s", n.Name, pv.Name, Ago(c.Now.Sub(n.ReadySince)), wantText)
	default:
		var users []string
		for _, u := range s.Users {
			if strings.HasSuffix(u, "@"+n.Name) {
				users = append(users, strings.TrimSuffix(u, "@"+n.Name))
			}
		}
		next := fmt.Sprintf("kubectl get pods -A --field-selector spec.nodeName=%s   # find what uses it there; Kubernetes detaches once it stops", n.Name)
		usedBy := ", no pod known to use it there"
		if len(users) > 0 {
			ns, name, _ := strings.Cut(users[0], "/")
			next = fmt.Sprintf("kubectl delete pod -n %s %s   # or scale its workload down; Kubernetes then detaches the volume from %s", ns, name, n.Name)
			usedBy = ", used by pod " + strings.Join(users, ", ")
		}
		v(VerdictHeldByHealthyNode, next,
			"%s holds PV %s (%s) and is Ready%s%s: the volume may be written by one node at a time", n.Name, pv.Name, s.AccessModes, usedBy, wantText)
	}
}

// rank orders the holders that block: the ones the operator can act on
// first.
func rank(h holder) int {
	switch {
	case h.va == nil && !h.node.Healthy():
		return 0 // stale claim
	case h.va != nil && h.node.Exists && h.node.Ready != "True" && !h.node.OutOfService:
		return 1 // NotReady holder
	case h.va != nil && h.node.Healthy():
		return 3
	default:
		return 2
	}
}

func (c *Cluster) allHealthyAttached(hs []holder) bool {
	for _, h := range hs {
		if h.va == nil || !h.node.Healthy() {
			return false
		}
	}
	return true
}

// judgeWanted: nothing blocks the wanted node; say where its attach is.
func (c *Cluster) judgeWanted(s *Story, pv *corev1.PersistentVolume, want string) {
	v := func(code, next, format string, a ...any) {
		s.Verdict = Verdict{Code: code, Summary: fmt.Sprintf(format, a...), Next: next}
	}
	if want == "" {
		v(VerdictAttached, "nothing to do", "PV %s is held by %d nodes, all Ready, as its access modes (%s) allow", pv.Name, len(s.holders()), s.AccessModes)
		return
	}
	for _, a := range s.Attachments {
		if a.Node != want {
			continue
		}
		if a.Error != "" {
			v(VerdictAttachFailing, "kubectl -n rds-csi logs deploy/rds-csi-controller -c rds-csi-driver   # the driver's reason, then the RDS",
				"VolumeAttachment %s of PV %s to %s fails: %s", a.Name, pv.Name, want, a.Error)
			return
		}
		v(VerdictAttaching, "kubectl get volumeattachment "+a.Name+" -w",
			"VolumeAttachment %s of PV %s to %s is not attached yet and reports no error; csi-attacher has not answered", a.Name, pv.Name, want)
		return
	}
	v(VerdictNoAttachment, "kubectl describe pod   # the attach/detach controller says why in the pod's events",
		"no VolumeAttachment of PV %s to %s exists and no other node holds the volume", pv.Name, want)
}

func hasMode(pv *corev1.PersistentVolume, m corev1.PersistentVolumeAccessMode) bool {
	for _, x := range pv.Spec.AccessModes {
		if x == m {
			return true
		}
	}
	return false
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
