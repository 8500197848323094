package csi

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	goruntime "runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/exportauth"
	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/informers"
	"github.com/srvlab/rds-csi/pkg/nvme"
	"github.com/srvlab/rds-csi/pkg/rds"
	"github.com/srvlab/rds-csi/pkg/storagefence"
)

// The publish model check (issue 10). Two controller replicas share one
// API server (newFakeAPI: resourceVersions enforced on PV writes). Each
// replica's index is fed by the harness, one queue of API events per
// watch stream (VolumeAttachments, PersistentVolumes, Nodes), and a
// seeded random schedule decides at every step what each stream of each
// replica delivers: everything, a prefix, or nothing (paused), so the
// streams of one replica lag and reorder against each other and against
// the other replica's. Meanwhile the harness plays the attach/detach
// controller and external-attacher (moving between replicas at random),
// replays late unpublishes, deletes, re-creates and taints nodes,
// re-creates and deletes PVs that share a handle, fails API calls before
// or after they take effect, and moves the leadership.
//
// The checker reads what the replicas answered, not what the API ended
// up holding: a node holds a volume from a publish success until the
// attacher's unpublish of that attachment succeeds. A hold is void once
// its node incarnation is deleted or tainted out of service (the one
// thing that allows fencing it). After every step: no single-node volume
// has two live holds, no multi-writer volume three. At the end the
// schedule heals, every attachment is detached, and every volume must
// then be publishable again (nothing stuck).
//
// With storage fencing (the second run) RDS commands also land late: a
// SwapExport may be answered to its caller as a timeout (rds.Client's
// "outcome unknown" error, sometimes after rds.Client re-sent it and the
// copy landed) while the command stays in flight, to land, a compare-and-
// swap on the state at that moment, at a random moment up to
// maxLateSteps steps later (in another operation's RDS call, or at the
// end of a step), or never. The leader (now and then a former leader)
// runs its reconcile (Fence.Reconcile). The checker follows the RDS at every change of
// an export (exportChanged): which nodes may be connected (a node told it
// may write, until the RDS drops connections or it unstages; a dropped
// kernel reconnects whenever the export allows its host again) and which
// attachments are retired (their claim gone and the operation that
// released it complete, or the export changed since). Checked: a node
// told it may write holds a live claim whose attachment the export lets
// in (backed, connect); no single-node volume has two possible writers on
// the RDS, no multi-writer volume three, at any moment; a retired
// attachment is never let in again, nor left connected; a claim never
// comes back with a released nonce; after a reconcile on a caught-up
// index with nothing in flight, and after the heal (every command in
// flight landed or lost, then the leader's reconcile), every export is
// open to its live claims' attachment alone, or closed with no claim.
// With --export-auth=dhchap too (the third run) nodes register node keys
// and connect with the secret they open; the host NQN is taken as
// copyable, so the secret decides who reconnects, and no export may carry
// a retired attachment's secret (the secret is part of the token).
// Findings it made are regression tests in model_scenarios_test.go.

var (
	gvrPV   = schema.GroupVersionResource{Version: "v1", Resource: "persistentvolumes"}
	gvrNode = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}
	gvrVA   = schema.GroupVersionResource{Group: "storage.k8s.io", Version: "v1", Resource: "volumeattachments"}
	streams = []schema.GroupVersionResource{gvrVA, gvrPV, gvrNode}
)

type modelReplica struct {
	name  string
	index *informers.AttachmentIndex
	ctrl  *informers.Controller
	feed  *informers.Feed
	cs    *ControllerServer
	fence *storagefence.Fence
	// boxFences: with boxes, the protocol on each box alone, for the
	// reconcile (as the controller runs it: a stalled box fails its pass
	// only).
	boxFences []*storagefence.Fence
	pending   map[string][]watch.Event // by resource
	// pausedUntil: the step until which a stream delivers nothing.
	pausedUntil map[string]int
	// fault applies to this replica's next API call: "fail" (the call
	// never reaches the server) or "lose" (it takes effect, the answer is
	// lost), as a hung call that times out does either way.
	fault string
}

type modelVolume struct {
	id    string
	multi bool
	pvs   []string // every PV of the handle in the API, oldest first
	next  int      // suffix of the next re-created PV
}

type modelHold struct {
	node, uid string
	since     int // step
}

type model struct {
	t *testing.T
	// fenced: the replicas run --storage-fencing=allow-host (nodes
	// register <name>/<host NQN>, fences cut the host off the RDS) and the
	// checker also follows the RDS: which nodes may be connected to each
	// volume (see connect/exportChanged).
	fenced bool
	// auth: --export-auth=dhchap too (fenced only). Every node registers a
	// node key and connects with the secret it opens from publish_context.
	// The host NQN is then taken as copyable (it travels in clear): a node
	// that knows a secret can present any host NQN, so a node reconnects
	// whenever the export's secret is its own, whatever the allowed host,
	// and an export must never carry the secret of a retired attachment.
	auth     bool
	nodeKeys map[string]*exportauth.NodeKey
	// connSecret: volume/node -> the secret a node connected with;
	// secretOf: volume -> host -> the secret its attachment was given.
	connSecret map[string]nvme.DHCHAPSecret
	secretOf   map[string]map[string]nvme.DHCHAPSecret
	// onFail, when set, gets a failure instead of the test (the negative
	// control), and the model's goroutine ends.
	onFail   func(msg string)
	rds      *fakeRDS
	conns    map[string]map[string]bool // volume -> nodes possibly connected
	connHost map[string]string          // volume/node -> host NQN it connected with
	// answeredCtx: VolumeAttachment -> publish_context of its last publish
	// success, which the attacher records with attached=true.
	answeredCtx map[string]map[string]string
	// Late RDS commands (fenced): a SwapExport may be answered as a
	// timeout while its command stays in flight, to land (or be lost) at
	// a random moment up to maxLateSteps steps later (delaySwap, landDue).
	// lateOff stops new ones (heal).
	lateOff bool
	// The attachments' lives, by host NQN (fenced): claimed is each
	// volume's live claims' hosts (host -> node), followed on every PV
	// write (trackClaims); a host whose claim is gone is released, and
	// retired once the operation that released it completed (endOp: an
	// unpublish or publish answered OK, a fence settled) or the export
	// changed since without letting it in (exportChanged). From then on
	// the export must never allow it again, and it must not be connected:
	// "no write from a retired attachment can land after its retirement
	// completed" (docs/attachments.md).
	claimed  map[string]map[string]string
	released map[string]map[string]int // volume -> host -> step released
	retired  map[string]map[string]int // volume -> host -> step retired
	// violation: the first one found inside an operation (violate).
	violation string
	// landing: the late command landing now (landOrLose), if any;
	// landingABA: the state it matches had been left since it was sent.
	landing    *lateSwap
	landingABA bool
	// op: the operation running that may release claims ("publish",
	// "unpublish", "fence"), and the hosts it released (volume/host): once
	// it completes successfully, they are retired (endOp).
	op         string
	opNode     string // the node a publish is for
	opReleased []string
	// replacedOwn: hosts whose claims a publish of the same node (another
	// incarnation) replaced (finding 7).
	replacedOwn map[string]bool
	// boxes: two RDS boxes (publish_model_boxes_test.go): the default and
	// rack-b, each through its own view of the one fake RDS; rack-b
	// stalls until stalledUntil (every read fails, every export change
	// times out and lands late).
	boxes        bool
	stalledUntil int
	seed         int64
	rng          *rand.Rand
	ctx          context.Context
	api          *fake.Clientset
	watches      map[string]watch.Interface
	replicas     []*modelReplica
	leader       int
	nodes        []string
	uid          map[string]string // node -> current UID; "" while deleted
	oos          map[string]bool
	incarn       map[string]int
	vols         []*modelVolume
	holds        map[string][]modelHold // volume -> live holds
	// late: unpublish requests answered before, replayed later.
	late []struct{ vol, node string }
	// toAttach: attachments published but not yet marked attached=true by
	// the attacher; that status update comes some steps later.
	toAttach []toAttach
	vaSeq    int // VolumeAttachment UIDs
	history  []string
	step     int
	stats    map[string]int
}

func newModel(t *testing.T, seed int64, fenced bool) *model {
	return newModelWith(t, seed, fenced, false, nil)
}

// newModelWith is newModel with --export-auth=dhchap (auth, fenced only)
// and rdsFake changed by mod before the replicas start.
func newModelWith(t *testing.T, seed int64, fenced, auth bool, mod func(*fakeRDS)) *model {
	return newModelConfig(t, seed, modelConfig{fenced: fenced, auth: auth, mod: mod})
}

// modelConfig is what a model runs with.
type modelConfig struct {
	fenced, auth bool
	mod          func(*fakeRDS)
	// boxes: the volumes on two RDS boxes, one of which stalls.
	boxes bool
}

func newModelConfig(t *testing.T, seed int64, cfg modelConfig) *model {
	fenced, auth, mod := cfg.fenced, cfg.auth, cfg.mod
	m := &model{t: t, seed: seed, rng: rand.New(rand.NewSource(seed)), ctx: context.Background(), fenced: fenced, auth: auth && fenced, boxes: cfg.boxes,
		nodeKeys: map[string]*exportauth.NodeKey{}, connSecret: map[string]nvme.DHCHAPSecret{}, secretOf: map[string]map[string]nvme.DHCHAPSecret{},
		conns: map[string]map[string]bool{}, connHost: map[string]string{}, answeredCtx: map[string]map[string]string{},
		claimed: map[string]map[string]string{}, released: map[string]map[string]int{}, retired: map[string]map[string]int{},
		replacedOwn: map[string]bool{},
		watches:     map[string]watch.Interface{}, nodes: []string{"n0", "n1", "n2"},
		uid: map[string]string{}, oos: map[string]bool{}, incarn: map[string]int{},
		holds: map[string][]modelHold{}, stats: map[string]int{}}
	var objs []runtime.Object
	for _, n := range m.nodes {
		objs = append(objs, m.newNode(n))
	}
	m.api = newPlainFakeAPI(objs...)
	for _, gvr := range streams {
		w, err := m.api.Tracker().Watch(gvr, "")
		if err != nil {
			t.Fatal(err)
		}
		m.watches[gvr.Resource] = w
	}
	rdsFake := newFakeRDS(1 << 40)
	if mod != nil {
		mod(rdsFake)
	}
	m.rds = rdsFake
	for _, n := range m.nodes {
		k, err := exportauth.NewNodeKey(rand.New(rand.NewSource(seed + int64(len(n)*1000+int(n[1])))))
		if err != nil {
			t.Fatal(err)
		}
		m.nodeKeys[n] = k
	}
	if fenced {
		rdsFake.delaySwap = m.delaySwap
		rdsFake.atCall = func(string) { m.landDue(false) }
		rdsFake.onChange = m.exportChanged
	}
	opts := testOptions()
	if fenced {
		opts = allowHostOptions()
	}
	if m.auth {
		opts = exportAuthOptions()
	}
	clk := clocktesting.NewFakeClock(publishNow)
	for i := 0; i < 2; i++ {
		r := &modelReplica{name: fmt.Sprintf("r%d", i), index: informers.NewAttachmentIndex(), pending: map[string][]watch.Event{}, pausedUntil: map[string]int{}}
		client := m.replicaClient(r)
		policy := fencing.DefaultConfig()
		idx := i
		live := fencing.NewLiveness(fencing.LivenessConfig{Clock: clk, Policy: policy, Client: client})
		driver := NewDriver(opts, rdsFake)
		var fenceRDS storagefence.RDS = rdsFake
		isDisk := opts.IsVolumeDisk
		if m.boxes {
			driver = m.boxesDriver(opts)
			fenceRDS, isDisk = driver.Router(), driver.IsVolumeDisk
		}
		fenceCfg := storagefence.Config{
			StorageFencing: opts.AllowHostFencing(), ExportAuth: opts.ExportAuthOn(), AttachmentKey: opts.AttachmentKey,
			RDS: fenceRDS, Store: claims.NewStore(client, DefaultDriverName, opts.AllowHostFencing()), Index: r.index, Nodes: live,
			IsVolumeID: IsVolumeID, IsVolumeDisk: isDisk,
		}
		fence, err := storagefence.New(fenceCfg)
		if err != nil {
			t.Fatal(err)
		}
		r.fence = fence
		if m.boxes {
			r.boxFences = m.boxFences(driver, fenceCfg, r.index)
		}
		fencer := storagefence.NewNodeFencer(storagefence.NodeFencerConfig{Fence: fence, Nodes: live, Policy: policy,
			IsLeader: func() bool { return m.leader == idx }, Now: clk.Now})
		r.ctrl, r.feed = informers.NewFedController(r.index, informers.Config{DriverName: DefaultDriverName, Policy: policy,
			Reactor: &modelFencer{m: m, NodeFencer: fencer}, Clock: clk, Liveness: live})
		r.cs = NewControllerServer(driver, &Publisher{
			Index: r.index, Fence: fence, Nodes: live, Synced: r.ctrl.Synced, Policy: policy, Clock: clk,
			// The index moves only when the schedule delivers: a publish
			// that conflicted must not wait for it in real time.
			CatchUp: time.Nanosecond})
		m.replicas = append(m.replicas, r)
	}
	// Initial state: the nodes, and volumes each with one PV; every
	// replica starts in step with the API.
	for i := 0; i < 4; i++ {
		multi := i >= 3
		id := fmt.Sprintf("pvc-0a1b2c3d-0000-4000-8000-%012d", 500+i)
		var params map[string]string
		if m.boxes && i >= 2 {
			params = map[string]string{ParameterRDS: modelBoxB}
		}
		resp, err := m.replicas[0].cs.CreateVolume(m.ctx, &csi.CreateVolumeRequest{Name: id, Parameters: params, VolumeCapabilities: []*csi.VolumeCapability{m.capability(multi)}})
		if err != nil {
			t.Fatal(err)
		}
		id = resp.GetVolume().GetVolumeId()
		v := &modelVolume{id: id, multi: multi}
		m.vols = append(m.vols, v)
		m.createPV(v)
	}
	m.collect()
	for _, r := range m.replicas {
		m.deliver(r, 1<<30)
	}
	return m
}

func (m *model) newNode(name string) *corev1.Node {
	m.incarn[name]++
	n := testNode(name)
	n.UID = types.UID(fmt.Sprintf("uid-%s-%d", name, m.incarn[name]))
	m.uid[name] = string(n.UID)
	return n
}

// nodeID is what a node's plugin registers: the node name (and its node
// key, with auth).
func (m *model) nodeID(node string) string {
	if m.auth {
		return node + "/" + m.nodeKeys[node].Public.String()
	}
	return node
}

func modelNQN(node string) string {
	return "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000" + node[1:] + "0"
}

// exportState is the RDS side of a volume, for the history.
func (m *model) exportState(v *modelVolume) string {
	if !m.fenced {
		return ""
	}
	d, _ := m.rds.disk(m.fakeSlot(v.id))
	host := "-"
	if d.Exported {
		host = "any"
		if d.AllowHost != "" {
			host = d.AllowHost[len(d.AllowHost)-4:]
		}
	}
	m.rds.mu.Lock()
	drops := m.rds.drops[m.fakeSlot(v.id)]
	m.rds.mu.Unlock()
	var claims []string
	for _, pv := range v.pvs {
		for n, c := range claimsOf(m.t, m.api, pv) {
			claims = append(claims, pv[len(pv)-2:]+"/"+n+":"+m.rds.hostLabel(v.id, n, c))
		}
	}
	sort.Strings(claims)
	return fmt.Sprintf(" [export %s, drops %d, conns %v, claims %v]", host, drops, keys(m.conns[v.id]), claims)
}

// hostLabel is the last four characters of the host NQN claim c of node
// on handle allows, as exportState prints allowed hosts.
func (f *fakeRDS) hostLabel(handle, node string, c claims.Claim) string {
	h := storagefence.HostNQN(allowHostOptions().AttachmentKey, handle, node, c)
	if len(h) < 4 {
		return "any"
	}
	return h[len(h)-4:]
}

// exportChanged follows the RDS (f.mu held): every change of a volume's
// export, whenever it lands. Turning it off drops every connection. A
// dropped connection's kernel keeps reconnecting (ctrl_loss_tmo) with the
// host NQN it connected with, a fenced node's too, since it may still be
// running: it is back whenever the export allows that host, checked at
// every change, so that an export open to a host for a moment only is
// seen. Then the export must not allow a retired attachment, and a
// single-node volume must not have two possible writers (checked here,
// not only after the step: a drop within the step would hide it).
func (m *model) exportChanged(slot string, before, after rds.Disk) {
	slot = m.idOfSlot(slot)
	v := m.volume(slot)
	if before.Exported && !after.Exported {
		delete(m.conns, slot)
	}
	if after.Exported {
		if at, ok := m.retired[slot][after.AllowHost]; ok {
			m.violate("volume %s: the RDS export was opened to host %s, an attachment retired at step %d: a fenced or detached attachment is let in again", slot, after.AllowHost, at)
		}
		if m.auth && !after.Secret.IsZero() {
			for h, at := range m.retired[slot] {
				if sec, ok := m.secretOf[slot][h]; ok && sec.Equal(after.Secret) {
					m.violate("volume %s: the RDS export (allowing %s) takes the secret of attachment %s, retired at step %d: whoever holds that secret can present the new host NQN and write", slot, after.AllowHost, h, at)
				}
			}
		}
		for _, node := range m.nodes {
			host, ok := m.connHost[slot+"/"+node]
			if !ok || m.conns[slot][node] || !m.admits(slot, node, host, after) {
				continue
			}
			if m.conns[slot] == nil {
				m.conns[slot] = map[string]bool{}
			}
			m.conns[slot][node] = true
			m.stats["reconnect"]++
			m.logf("RDS: %s's kernel reconnects to %s as %s", node, slot[len(slot)-3:], host[len(host)-4:])
		}
		if limit := m.limit(v); len(m.conns[slot]) > limit {
			m.violate("volume %s may be written by %d nodes at once on the RDS (its export now allows %s): %v", slot, len(m.conns[slot]), after.AllowHost, keys(m.conns[slot]))
		}
	}
	for h := range m.released[slot] {
		if after.Exported && after.AllowHost == h {
			continue // let in again before its retirement completed: the retirement's last change undoes it
		}
		if m.retired[slot] == nil {
			m.retired[slot] = map[string]int{}
		}
		m.retired[slot][h] = m.step
		delete(m.released[slot], h)
	}
}

// admits: the export after lets node's kernel in again, reconnecting as
// host. With auth and a secret on the export, the secret decides and the
// host NQN does not (anyone can present any NQN); otherwise the host.
func (m *model) admits(slot, node, host string, after rds.Disk) bool {
	if m.auth && !after.Secret.IsZero() {
		sec, ok := m.connSecret[slot+"/"+node]
		return ok && sec.Equal(after.Secret)
	}
	return after.AllowHost == host || after.AllowHost == ""
}

// delaySwap decides (f.mu held) whether a SwapExport is answered as a
// timeout while its command stays in flight, and when it lands: at a
// random moment of step due (an RDS call of another operation, or the
// step's end), or never.
func (m *model) delaySwap(s *lateSwap) (timedOut bool) {
	if m.stalls(m.idOfSlot(s.slot)) {
		return m.stalledSwap(s)
	}
	if m.lateOff || m.rng.Intn(lateOneIn) != 0 {
		return false
	}
	s.due = m.step + m.rng.Intn(maxLateSteps+1)
	s.lost = m.rng.Intn(5) == 0
	m.stats["rds swap timed out"]++
	m.logf("RDS: swap #%d of %s %s -> %s times out; in flight until step %d (lost: %t)", s.id, s.slot[len(s.slot)-3:], stateLabel(s.from), stateLabel(s.to), s.due, s.lost)
	return true
}

// Findings of the model check, fixed, each a regression test in
// model_scenarios_test.go: 1, 3 and 5 in dd90a1e; 6, 7 and 8 after it (a
// claim is reused only when every PV shows it; replacing the node's own
// earlier attachment drops connections; Settle treats the released claim
// as gone on every PV); 4 (a late command let a retired attachment in
// again, its open state having come back: ABA) by parking the export at
// a fresh host before any move between hosts and by rds.Client no longer
// re-sending a swap whose outcome is unknown; 2 (a migration's source cut
// by a fence that did not complete was told it may write, trusting its
// VolumeAttachment's status) by refusing the older holder's repeated
// publish while the export allows the newer.

// Late commands: about one SwapExport in lateOneIn times out, and lands
// up to maxLateSteps steps later.
const (
	lateOneIn    = 6
	maxLateSteps = 25
)

// landDue lands (or loses) the commands in flight whose step has come
// (f.mu held): each at a random RDS call within its step, at the latest at
// its end (end).
func (m *model) landDue(end bool) {
	for _, s := range m.rds.inFlight {
		if m.step < s.due || (!end && m.rng.Intn(2) == 0) {
			continue
		}
		m.landOrLose(s)
	}
}

func (m *model) landOrLose(s *lateSwap) {
	if s.lost {
		m.rds.loseLocked(s)
		m.stats["rds late swap lost"]++
		return
	}
	aba := s.changes != m.rds.changes[s.slot]
	m.landing, m.landingABA = s, aba
	matched := m.rds.landLocked(s)
	m.landing, m.landingABA = nil, false
	if matched && aba {
		m.stats["rds late swap matched a state that came back (ABA)"]++
	}
	m.stats[fmt.Sprintf("rds late swap landed, matched=%t", matched)]++
	m.logf("RDS: swap #%d of %s %s -> %s lands late: matched %t (state changed since sent: %t)", s.id, s.slot[len(s.slot)-3:], stateLabel(s.from), stateLabel(s.to), matched, aba)
}

func stateLabel(e rds.ExportState) string {
	h := e.Host
	if len(h) > 4 {
		h = h[len(h)-4:]
	}
	if !e.Open {
		return "closed(" + h + ")"
	}
	return "open(" + h + ")"
}

// endOfStep lands the commands due at this step that have not yet.
func (m *model) endOfStep() {
	if !m.fenced {
		return
	}
	m.rds.mu.Lock()
	defer m.rds.mu.Unlock()
	m.landDue(true)
}

func (m *model) limit(v *modelVolume) int {
	if v.multi {
		return 2
	}
	return 1
}

// hostOf is the host NQN a claim of node on handle lets in.
func (m *model) hostOf(handle, node string, c claims.Claim) string {
	return m.replicas[0].fence.HostOf(handle, node, c)
}

// liveClaims are a volume's claims in the API, joined over its PVs as
// the driver joins them (the newer of two, by time then publish count).
func (m *model) liveClaims(v *modelVolume) map[string]claims.Claim {
	out := map[string]claims.Claim{}
	for _, pv := range v.pvs {
		for n, c := range claimsOf(m.t, m.api, pv) {
			if cur, ok := out[n]; !ok || c.At.After(cur.At) || (c.At.Equal(cur.At) && c.Gen > cur.Gen) {
				out[n] = c
			}
		}
	}
	return out
}

// trackClaims follows the claims after a replica's write of PV pv (every
// volume's when ""): a host whose claim is gone from every PV of its
// volume is released. A released or retired host must never be claimed
// again.
func (m *model) trackClaims(pv string) {
	for _, v := range m.vols {
		if pv != "" && !slices.Contains(v.pvs, pv) {
			continue
		}
		now := map[string]string{}
		for _, pv := range v.pvs {
			for n, c := range claimsOf(m.t, m.api, pv) {
				now[m.hostOf(v.id, n, c)] = n
			}
		}
		for h, n := range now {
			if _, ok := m.claimed[v.id][h]; ok {
				continue
			}
			_, retired := m.retired[v.id][h]
			_, released := m.released[v.id][h]
			switch {
			case !retired && !released:
			default:
				// A claim is never written back with a released nonce
				// (TestCommitDoesNotBringBackAReleasedClaim).
				m.violate("volume %s: node %s's claim with host %s is back after it was released (retired: %t)", v.id, n, h, retired)
			}
		}
		for h := range m.claimed[v.id] {
			if _, ok := now[h]; !ok {
				if m.released[v.id] == nil {
					m.released[v.id] = map[string]int{}
				}
				m.released[v.id][h] = m.step
				if m.op != "" {
					m.opReleased = append(m.opReleased, v.id+"/"+h)
				}
				if m.op == "publish" && m.claimed[v.id][h] == m.opNode {
					m.replacedOwn[h] = true // a re-created node's publish replaced its old claim
				}
				m.logf("claim of %s on %s released (host %s)", m.claimed[v.id][h], v.id[len(v.id)-3:], h[len(h)-4:])
			}
		}
		m.claimed[v.id] = now
	}
}

// checkExports: every export is open to its live claims' attachment
// alone (one of the two in a migration), or closed with no claim.
func (m *model) checkExports(when string) {
	for _, v := range m.vols {
		claims := m.liveClaims(v)
		d, _ := m.rds.disk(m.fakeSlot(v.id))
		var hosts []string
		for n, c := range claims {
			hosts = append(hosts, n+"="+m.hostOf(v.id, n, c))
			if d.Exported && d.AllowHost == m.hostOf(v.id, n, c) {
				hosts = nil
				break
			}
		}
		switch {
		case len(claims) == 0 && d.Exported:
			m.fail("%s: volume %s has no live claim, and its export is open to %q", when, v.id, d.AllowHost)
		case len(claims) > 0 && hosts != nil:
			sort.Strings(hosts)
			m.fail("%s: volume %s's export is nvme-tcp-export=%t allow-host=%q, not its live claims' attachment %v", when, v.id, d.Exported, d.AllowHost, hosts)
		}
	}
}

// connect: node was told it may write; it connects, and stays connected
// (whatever the RDS later allows: the pessimistic reading of RouterOS'
// allow-host, as Linux nvmet behaves) until the RDS drops connections or
// the node unstages. The RDS must let it in at that moment.
func (m *model) connect(v *modelVolume, node string, pc map[string]string) {
	if !m.fenced {
		return
	}
	// The node connects with its attachment's host NQN, or its own when
	// publish_context carries none.
	host := pc[PublishContextHostNQN]
	if host == "" {
		host = modelNQN(node)
	}
	if m.conns[v.id][node] && m.connHost[v.id+"/"+node] == host {
		// Already connected as this attachment (a repeated publish; a
		// migration source keeps its connection while the export allows
		// the target).
		return
	}
	d, _ := m.rds.disk(m.fakeSlot(v.id))
	if !d.Exported || !(d.AllowHost == host || (v.multi && d.AllowHost == "")) {
		m.fail("node %s was told it may write volume %s, but the RDS export is nvme-tcp-export=%t allow-host=%q", node, v.id, d.Exported, d.AllowHost)
	}
	if m.auth {
		// The node connects with the secret it opens (none when
		// publish_context carries none): the RDS must take it.
		var sec nvme.DHCHAPSecret
		if sealed, ok := pc[PublishContextSecret]; ok {
			var err error
			if sec, err = m.nodeKeys[node].Open(sealed); err != nil {
				m.fail("node %s cannot open the secret of volume %s: %v", node, v.id, err)
			}
		}
		if !d.Secret.IsZero() && !d.Secret.Equal(sec) {
			m.fail("node %s was told it may write volume %s, but the RDS export takes another secret than the one it was given (given one: %t)", node, v.id, !sec.IsZero())
		}
		m.connSecret[v.id+"/"+node] = sec
		if !sec.IsZero() {
			m.stats["connect with a secret"]++
			if m.secretOf[v.id] == nil {
				m.secretOf[v.id] = map[string]nvme.DHCHAPSecret{}
			}
			m.secretOf[v.id][host] = sec
		}
	}
	if m.conns[v.id] == nil {
		m.conns[v.id] = map[string]bool{}
	}
	m.conns[v.id][node] = true
	m.connHost[v.id+"/"+node] = host
}

// otherHolderHost: host is the attachment of a live claim of another node
// than node on v.
func (m *model) otherHolderHost(v *modelVolume, node, host string) bool {
	for n, c := range m.liveClaims(v) {
		if n != node && m.hostOf(v.id, n, c) == host {
			return true
		}
	}
	return false
}

// startOp and endOp bracket an operation that may release claims: when
// it completes successfully (an unpublish or publish answered OK, a
// fence's Settle done), the retirement of every attachment it released is
// complete, and those hosts are retired unless the export allows them
// right now. (Otherwise they retire at the next change of the export
// that does not let them in, exportChanged.)
func (m *model) startOp(op string) {
	m.op, m.opNode, m.opReleased = op, "", nil
}

func (m *model) endOp(ok bool) {
	released := m.opReleased
	m.op, m.opNode, m.opReleased = "", "", nil
	if !ok || !m.fenced {
		return
	}
	for _, key := range released {
		id, h, _ := strings.Cut(key, "/")
		if _, still := m.released[id][h]; !still {
			continue
		}
		if d, _ := m.rds.disk(m.fakeSlot(id)); d.Exported && d.AllowHost == h {
			continue
		}
		if m.retired[id] == nil {
			m.retired[id] = map[string]int{}
		}
		m.retired[id][h] = m.step
		delete(m.released[id], h)
	}
}

// modelFencer is a replica's node fencer, each volume's fence bracketed
// as an operation: complete once its release (cut, release, settle)
// succeeded.
type modelFencer struct {
	m *model
	*storagefence.NodeFencer
}

func (f *modelFencer) NodeStale(ctx context.Context, s fencing.StaleHolder) error {
	var errs []error
	for _, v := range s.Volumes {
		f.m.startOp("fence")
		err := f.NodeFencer.NodeStale(ctx, fencing.StaleHolder{Node: s.Node, Reason: s.Reason, Volumes: []fencing.VolumeRef{v}})
		f.m.endOp(err == nil)
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// backed: a success answered to node stands on its live claim, of the
// node's current incarnation, whose attachment's host NQN it carries.
func (m *model) backed(v *modelVolume, node string, pc map[string]string) {
	c, ok := m.liveClaims(v)[node]
	switch {
	case !ok:
		m.fail("node %s was told it may write volume %s, and holds no live claim on it", node, v.id)
	case c.NodeUID != m.uid[node]:
		m.fail("node %s was told it may write volume %s, and its live claim names incarnation %q, not %q", node, v.id, c.NodeUID, m.uid[node])
	case m.fenced && c.Nonce != "" && pc[PublishContextHostNQN] != m.hostOf(v.id, node, c):
		m.fail("node %s was told to connect to volume %s as %q; its live claim's attachment is %q", node, v.id, pc[PublishContextHostNQN], m.hostOf(v.id, node, c))
	}
}

// disconnect: an attachment of node ended by a detach. Kubernetes detaches
// from a healthy node only after its kubelet unstaged the volume (so it
// disconnected); a deleted or out-of-service node may still be running and
// connected.
func (m *model) disconnect(v *modelVolume, node string) {
	if m.uid[node] != "" && !m.oos[node] {
		delete(m.conns[v.id], node)
		delete(m.connHost, v.id+"/"+node) // unstaged: the kernel's controller is gone
		delete(m.connSecret, v.id+"/"+node)
	}
}

func (m *model) capability(multi bool) *csi.VolumeCapability {
	if multi {
		return blockCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
	}
	return mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
}

// replicaClient is the replica's client: the shared server behind a fault
// injector.
func (m *model) replicaClient(r *modelReplica) *fake.Clientset {
	c := &fake.Clientset{}
	c.AddReactor("*", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		fault := r.fault
		r.fault = ""
		if fault == "fail" {
			return true, nil, fmt.Errorf("injected: %w", context.DeadlineExceeded)
		}
		obj, err := m.api.Invokes(a, nil)
		if m.fenced && a.GetResource().Resource == "persistentvolumes" && a.GetVerb() != "get" && a.GetVerb() != "list" && a.GetVerb() != "watch" {
			name := ""
			if n, ok := a.(interface{ GetName() string }); ok {
				name = n.GetName()
			}
			m.trackClaims(name)
		}
		if fault == "lose" {
			return true, nil, fmt.Errorf("injected after the call took effect: %w", context.DeadlineExceeded)
		}
		return true, obj, err
	})
	return c
}

func (m *model) createPV(v *modelVolume) {
	name := v.id
	if len(v.pvs) > 0 || v.next > 0 {
		v.next++
		name = fmt.Sprintf("pv-%s-r%d", v.id[len(v.id)-4:], v.next)
	}
	mode := corev1.ReadWriteOnce
	if v.multi {
		mode = corev1.ReadWriteMany
	}
	pv := testPV(name, v.id, mode, v.multi)
	pv.Status.Phase = corev1.VolumeBound
	if _, err := m.api.CoreV1().PersistentVolumes().Create(m.ctx, pv, metav1.CreateOptions{}); err != nil {
		m.t.Fatal(err)
	}
	v.pvs = append(v.pvs, name)
}

// collect moves the API's new events into every replica's queues.
func (m *model) collect() {
	for _, gvr := range streams {
		w := m.watches[gvr.Resource]
		for more := true; more; {
			select {
			case ev := <-w.ResultChan():
				for _, r := range m.replicas {
					r.pending[gvr.Resource] = append(r.pending[gvr.Resource], ev)
				}
			default:
				more = false
			}
		}
	}
}

// deliver hands up to n pending events of every stream to r's index.
func (m *model) deliver(r *modelReplica, n int) {
	for _, gvr := range streams {
		m.deliverStream(r, gvr.Resource, n)
	}
}

func (m *model) deliverStream(r *modelReplica, resource string, n int) {
	evs := r.pending[resource]
	if n > len(evs) {
		n = len(evs)
	}
	for _, ev := range evs[:n] {
		var err error
		if ev.Type == watch.Deleted {
			err = r.feed.Remove(ev.Object)
		} else {
			err = r.feed.Apply(ev.Object)
		}
		if err != nil {
			m.t.Fatal(err)
		}
	}
	r.pending[resource] = evs[n:]
	r.ctrl.Drain(m.ctx) // reactions may write: collect after
	m.collect()
}

func (m *model) logf(format string, args ...any) {
	m.history = append(m.history, fmt.Sprintf("%6d ", m.step)+fmt.Sprintf(format, args...))
}

// violate records a violation found inside an operation (in a hook of
// the fakes); check fails with it once the operation's answer is logged.
func (m *model) violate(format string, args ...any) {
	msg := fmt.Sprintf("%6d ", m.step) + fmt.Sprintf(format, args...)
	m.history = append(m.history, msg+" <- VIOLATION")
	if m.violation == "" {
		m.violation = msg
	}
}

func (m *model) fail(format string, args ...any) {
	m.t.Helper()
	tail := m.history
	if len(tail) > 60 {
		tail = tail[len(tail)-60:]
	}
	variant := "claims"
	if m.fenced {
		variant = "storage-fencing"
	}
	if m.auth {
		variant = "export-auth"
	}
	if m.onFail != nil {
		m.onFail(fmt.Sprintf("seed %d, step %d: %s", m.seed, m.step, fmt.Sprintf(format, args...)))
		goruntime.Goexit()
	}
	m.t.Fatalf("seed %d (rerun: RDS_CSI_MODEL_SEED=%d RDS_CSI_MODEL_OPS=%d go test -run TestPublishModel/%s ./pkg/csi), step %d: %s\nlast answers and events:\n%s",
		m.seed, m.seed, m.step, variant, m.step, fmt.Sprintf(format, args...), strings.Join(tail, "\n"))
}

func (m *model) vaName(v *modelVolume, node string) string {
	return claims.VolumeAttachmentName(v.id, DefaultDriverName, node)
}

func (m *model) getVA(v *modelVolume, node string) *storagev1.VolumeAttachment {
	va, err := m.api.StorageV1().VolumeAttachments().Get(m.ctx, m.vaName(v, node), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		m.t.Fatal(err)
	}
	return va
}

// publish plays the attach/detach controller (a VolumeAttachment first)
// and the attacher (the call, then status.attached on success).
func (m *model) publish(r *modelReplica, v *modelVolume, node string) {
	va := m.getVA(v, node)
	if va != nil && va.DeletionTimestamp != nil {
		return // a new attachment waits for the old one's detach
	}
	if va == nil {
		pvName := v.pvs[len(v.pvs)-1]
		va = testVA(pvName, node, publishNow)
		va.Name = m.vaName(v, node)
		va.Status.Attached = false
		m.newVAUID(va)
		var err error
		if va, err = m.api.StorageV1().VolumeAttachments().Create(m.ctx, va, metav1.CreateOptions{}); err != nil {
			m.t.Fatal(err)
		}
	}
	m.startOp("publish")
	m.opNode = node
	resp, err := r.cs.ControllerPublishVolume(m.ctx, &csi.ControllerPublishVolumeRequest{VolumeId: v.id, NodeId: m.nodeID(node), VolumeCapability: m.capability(v.multi)})
	m.endOp(err == nil)
	m.logf("%s publish %s -> %s: %v%s", r.name, v.id[len(v.id)-3:], node, codeOf(err), m.exportState(v))
	m.stats["publish "+codeOf(err)]++
	if m.boxes {
		m.countBoxPublish(v, err)
	}
	if err != nil {
		return
	}
	m.backed(v, node, resp.GetPublishContext())
	m.connect(v, node, resp.GetPublishContext())
	m.startHold(v, node)
	// The attacher records the answer's publish_context with attached=true
	// (external-attacher's markAsAttached), after every success.
	m.answeredCtx[va.Name] = resp.GetPublishContext()
	m.toAttach = append(m.toAttach, toAttach{name: va.Name, uid: va.UID, pc: resp.GetPublishContext()})
}

// latePublish is a publish of an attachment whose VolumeAttachment is
// being deleted or gone, delivered to a replica whose index may still
// show it (a paused attacher that lost its lease, issue 21): nobody may
// be told success, and no claim may be made for it (nothing would ever
// release one: the live read before the commit keeps it from being made).
func (m *model) latePublish(r *modelReplica, v *modelVolume, node string) {
	before, had := m.liveClaims(v)[node]
	m.startOp("publish")
	_, err := r.cs.ControllerPublishVolume(m.ctx, &csi.ControllerPublishVolumeRequest{VolumeId: v.id, NodeId: m.nodeID(node), VolumeCapability: m.capability(v.multi)})
	m.endOp(false)
	m.logf("%s late publish %s -> %s: %v%s", r.name, v.id[len(v.id)-3:], node, codeOf(err), m.exportState(v))
	m.stats["late publish "+codeOf(err)]++
	if err == nil {
		m.fail("a late publish of volume %s to %s, whose VolumeAttachment is being deleted or gone, was answered OK", v.id, node)
	}
	after, has := m.liveClaims(v)[node]
	switch {
	case has && !had:
		m.fail("a late publish of volume %s to %s, whose VolumeAttachment is being deleted or gone, left a claim (%+v) that nothing releases", v.id, node, after)
	case has && (after.Nonce != before.Nonce || after.NodeUID != before.NodeUID):
		m.fail("a late publish of volume %s to %s, whose VolumeAttachment is being deleted or gone, replaced its claim %+v by %+v", v.id, node, before, after)
	}
}

// toAttach is a publish success the attacher is to record on the very
// VolumeAttachment it published (not one re-created under the same name).
type toAttach struct {
	name string
	uid  types.UID
	pc   map[string]string
}

func (m *model) newVAUID(va *storagev1.VolumeAttachment) {
	m.vaSeq++
	va.UID = types.UID(fmt.Sprintf("va-%d", m.vaSeq))
}

// markAttached is the attacher's status update after its publishes
// succeeded, for the attachments that still stand.
func (m *model) markAttached() {
	for _, a := range m.toAttach {
		va, err := m.api.StorageV1().VolumeAttachments().Get(m.ctx, a.name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && (va.DeletionTimestamp != nil || va.UID != a.uid)) {
			continue
		}
		if err != nil {
			m.t.Fatal(err)
		}
		va.Status.Attached = true
		va.Status.AttachmentMetadata = a.pc
		if _, err := m.api.StorageV1().VolumeAttachments().Update(m.ctx, va, metav1.UpdateOptions{}); err != nil {
			m.t.Fatal(err)
		}
	}
	m.toAttach = nil
}

func (m *model) startHold(v *modelVolume, node string) {
	uid := m.uid[node]
	if uid == "" || m.oos[node] {
		return // told success, but its incarnation is already fenceable
	}
	for _, h := range m.holds[v.id] {
		if h.node == node && h.uid == uid {
			return
		}
	}
	m.holds[v.id] = append(m.holds[v.id], modelHold{node: node, uid: uid, since: m.step})
}

// unpublish plays a detach: the VolumeAttachment is deleted (its
// finalizer keeps it), the attacher calls ControllerUnpublish, and on
// success the attachment goes and the hold ends.
func (m *model) unpublish(r *modelReplica, v *modelVolume, node string) {
	va := m.getVA(v, node)
	if va == nil {
		return
	}
	if va.DeletionTimestamp == nil {
		now := metav1.NewTime(publishNow)
		va.DeletionTimestamp = &now
		var err error
		if va, err = m.api.StorageV1().VolumeAttachments().Update(m.ctx, va, metav1.UpdateOptions{}); err != nil {
			m.t.Fatal(err)
		}
	}
	m.startOp("unpublish")
	_, err := r.cs.ControllerUnpublishVolume(m.ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: v.id, NodeId: m.nodeID(node)})
	m.endOp(err == nil)
	m.logf("%s unpublish %s -> %s (attached %t): %v%s", r.name, v.id[len(v.id)-3:], node, va.Status.Attached, codeOf(err), m.exportState(v))
	m.stats["unpublish "+codeOf(err)]++
	if err != nil {
		return
	}
	m.disconnect(v, node)
	if err := m.api.StorageV1().VolumeAttachments().Delete(m.ctx, va.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		m.t.Fatal(err)
	}
	m.endHold(v, node)
	m.late = append(m.late, struct{ vol, node string }{v.id, node})
}

func (m *model) holdOf(v *modelVolume, node string) bool {
	for _, h := range m.holds[v.id] {
		if h.node == node {
			return true
		}
	}
	return false
}

func (m *model) endHold(v *modelVolume, node string) {
	var keep []modelHold
	for _, h := range m.holds[v.id] {
		if h.node != node {
			keep = append(keep, h)
		}
	}
	m.holds[v.id] = keep
}

// voidHolds: node's incarnation is deleted or out of service; its holds
// may be fenced from now on.
func (m *model) voidHolds(node, uid string) {
	for id, hs := range m.holds {
		var keep []modelHold
		for _, h := range hs {
			if h.node != node || h.uid != uid {
				keep = append(keep, h)
			}
		}
		m.holds[id] = keep
	}
}

func (m *model) volume(id string) *modelVolume {
	for _, v := range m.vols {
		if v.id == id {
			return v
		}
	}
	m.t.Fatalf("no volume %s", id)
	return nil
}

func codeOf(err error) string { return code(err).String() }

func (m *model) check() {
	if m.violation != "" {
		m.fail("%s", m.violation)
	}
	for _, v := range m.vols {
		limit := m.limit(v)
		for node := range m.conns[v.id] {
			host := m.connHost[v.id+"/"+node]
			if at, ok := m.retired[v.id][host]; ok {
				m.fail("volume %s: node %s is still connected as %s, an attachment retired at step %d (never dropped since): a fenced attachment's writes land", v.id, node, host, at)
			}
		}
		if hs := m.holds[v.id]; len(hs) > limit {
			var who []string
			for _, h := range hs {
				who = append(who, fmt.Sprintf("%s (%s, told since step %d)", h.node, h.uid, h.since))
			}
			m.fail("volume %s is held by %d nodes at once: %s", v.id, len(hs), strings.Join(who, ", "))
		}
		if c := m.conns[v.id]; len(c) > limit {
			m.fail("volume %s may be written by %d nodes at once on the RDS (connected, never dropped since): %v", v.id, len(c), keys(c))
		}
	}
}

func (m *model) nodeOp(node string) {
	ctx := m.ctx
	switch uid := m.uid[node]; {
	case uid == "":
		if _, err := m.api.CoreV1().Nodes().Create(ctx, m.newNode(node), metav1.CreateOptions{}); err != nil {
			m.t.Fatal(err)
		}
		m.oos[node] = false
		m.logf("node %s re-created as %s", node, m.uid[node])
	case m.rng.Intn(3) == 0:
		if err := m.api.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{}); err != nil {
			m.t.Fatal(err)
		}
		m.voidHolds(node, uid)
		m.uid[node] = ""
		m.logf("node %s deleted", node)
	default:
		n, err := m.api.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			m.t.Fatal(err)
		}
		m.oos[node] = !m.oos[node]
		n.Spec.Taints = nil
		if m.oos[node] {
			n.Spec.Taints = []corev1.Taint{{Key: fencing.OutOfServiceTaint, Effect: corev1.TaintEffectNoExecute}}
			m.voidHolds(node, uid)
		}
		if _, err := m.api.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			m.t.Fatal(err)
		}
		m.logf("node %s out-of-service=%t", node, m.oos[node])
	}
}

// pvOp re-creates a volume's PV under a new name, or deletes the older of
// two, as an administrator does with a Retained volume; only a PV that no
// claim and no VolumeAttachment uses is deleted.
func (m *model) pvOp(v *modelVolume) {
	if len(v.pvs) < 2 {
		m.createPV(v)
		m.logf("PV %s created for %s", v.pvs[len(v.pvs)-1], v.id[len(v.id)-3:])
		return
	}
	old := v.pvs[0]
	pv, err := m.api.CoreV1().PersistentVolumes().Get(m.ctx, old, metav1.GetOptions{})
	if err != nil {
		m.t.Fatal(err)
	}
	if c, _ := claims.DecodeClaims(pv); len(c) > 0 {
		return
	}
	vas, err := m.api.StorageV1().VolumeAttachments().List(m.ctx, metav1.ListOptions{})
	if err != nil {
		m.t.Fatal(err)
	}
	for _, va := range vas.Items {
		if *va.Spec.Source.PersistentVolumeName == old {
			return
		}
	}
	if err := m.api.CoreV1().PersistentVolumes().Delete(m.ctx, old, metav1.DeleteOptions{}); err != nil {
		m.t.Fatal(err)
	}
	v.pvs = v.pvs[1:]
	m.logf("PV %s deleted", old)
}

func (m *model) randomStep() {
	m.step++
	if m.boxes {
		m.maybeStall()
	}
	r := m.replicas[m.rng.Intn(len(m.replicas))]
	v := m.vols[m.rng.Intn(len(m.vols))]
	node := m.nodes[m.rng.Intn(len(m.nodes))]
	switch op := m.rng.Intn(100); {
	case op < 35:
		// Without drawing from the schedule's random source (the seeds of
		// earlier findings still replay): while a detach is under way,
		// and now and then after it, the old attachment's publish comes
		// again, late (issue 21's paused replica).
		if va := m.getVA(v, node); (va != nil && va.DeletionTimestamp != nil) || (va == nil && m.step%7 == 0) {
			m.latePublish(r, v, node)
		} else {
			m.publish(r, v, node)
		}
	case op < 60:
		m.unpublish(r, v, node)
	case op < 66 && len(m.late) > 0:
		// A late unpublish: an answered request delivered again, to any
		// replica, long after; nobody acts on its answer.
		// Mostly a recent one (a retry racing the next attachment),
		// sometimes any.
		pick := m.rng.Intn(len(m.late))
		if m.rng.Intn(4) > 0 {
			pick = len(m.late) - 1 - m.rng.Intn(min(4, len(m.late)))
		}
		l := m.late[pick]
		lv := m.volume(l.vol)
		va := m.getVA(lv, l.node)
		if va != nil && va.DeletionTimestamp == nil {
			m.stats["late unpublish over a live attachment"]++
		}
		m.startOp("unpublish")
		_, err := r.cs.ControllerUnpublishVolume(m.ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: l.vol, NodeId: m.nodeID(l.node)})
		m.endOp(err == nil)
		m.logf("%s late unpublish %s -> %s: %v%s", r.name, l.vol[len(l.vol)-3:], l.node, codeOf(err), m.exportState(lv))
		m.stats["late unpublish"]++
		if err == nil && va != nil && va.DeletionTimestamp != nil {
			// CSI names an unpublish by volume and node only: while that
			// node's attachment is being detached (Kubernetes deletes it
			// once the node no longer uses the volume), an earlier
			// request's duplicate is that detach's unpublish, and its
			// success ends the hold as the attacher's own would.
			m.endHold(lv, l.node)
			m.disconnect(lv, l.node)
		}
	case op < 70:
		m.nodeOp(node)
	case op < 72:
		m.pvOp(v)
	case op < 74:
		m.leader = m.rng.Intn(len(m.replicas))
	case op < 78:
		r.fault = []string{"fail", "lose"}[m.rng.Intn(2)]
	case op < 80 && m.fenced:
		// The RDS refuses the next export change (SSH down, or another
		// replica changed it first).
		method := []string{"SwapExport", "GetDisk"}[m.rng.Intn(2)]
		m.rds.failNext(method, []error{errors.New("injected: ssh: connection refused"), rds.ErrExportChanged}[m.rng.Intn(2)])
		m.logf("the RDS fails the next %s", method)
	case op < 90:
		m.markAttached()
	case op < 93 && m.fenced:
		// The leader's periodic reconcile; now and then a former leader's,
		// which has not noticed yet that its lease is lost.
		rep, who := m.replicas[m.leader], "leader"
		if m.rng.Intn(4) == 0 {
			rep, who = m.replicas[1-m.leader], "old leader"
		}
		m.reconcile(rep, who)
	}
	m.endOfStep()
	m.collect()
	// The schedule: each stream of each replica is paused for a while
	// (its informer behind), or delivers a part or all of what it has
	// pending.
	for _, rep := range m.replicas {
		for _, gvr := range streams {
			res := gvr.Resource
			if m.step < rep.pausedUntil[res] {
				continue
			}
			switch d := m.rng.Intn(20); {
			case d < 2:
				rep.pausedUntil[res] = m.step + 1 + m.rng.Intn(40)
			case d < 6:
				m.deliverStream(rep, res, m.rng.Intn(3))
			default:
				m.deliverStream(rep, res, 1<<30)
			}
		}
	}
	m.check()
}

// reconcile runs its reconcile (Fence.Reconcile) on rep. When no RDS command was in
// flight, rep's index had every event and the pass failed nothing, every
// export must then match the live claims.
func (m *model) reconcile(rep *modelReplica, who string) (fixed int, err error) {
	m.rds.mu.Lock()
	quiet := len(m.rds.inFlight) == 0
	m.rds.mu.Unlock()
	for _, evs := range rep.pending {
		quiet = quiet && len(evs) == 0
	}
	var found []string
	report := func(mm storagefence.Mismatch) {
		found = append(found, fmt.Sprintf("%s: %s -> %s (%v)", mm.Volume[len(mm.Volume)-3:], stateLabel(mm.Found), stateLabel(mm.Now), mm.Err))
	}
	if m.boxes {
		fixed, err = m.reconcileBoxes(rep, report)
	} else {
		fixed, err = rep.fence.Reconcile(m.ctx, report)
	}
	m.logf("%s (%s) reconciles: %d fixed %v, err %v", rep.name, who, fixed, found, err)
	m.stats["reconcile fixed"] += fixed
	m.stats[fmt.Sprintf("reconcile err=%t", err != nil)]++
	m.rds.mu.Lock()
	quiet = quiet && len(m.rds.inFlight) == 0
	m.rds.mu.Unlock()
	if quiet && err == nil {
		m.stats["reconcile checked"]++
		m.checkExports(fmt.Sprintf("after the %s's reconcile on a caught-up index with no RDS command in flight", who))
	}
	return fixed, err
}

// heal ends the faults and the lag, detaches everything, and then expects
// every volume to attach again: nothing is stuck. With storage fencing,
// every RDS command still in flight lands (or is lost) first, in random
// order; then the leader's reconcile must leave every export matching its
// live claims, and once more at the very end.
func (m *model) heal() {
	m.stalledUntil = 0 // every box answers again
	for _, r := range m.replicas {
		r.fault = ""
		r.pausedUntil = map[string]int{}
	}
	if m.fenced {
		m.rds.mu.Lock()
		m.lateOff = true
		m.rds.fail = map[string]error{}
		inFlight := append([]*lateSwap(nil), m.rds.inFlight...)
		m.rng.Shuffle(len(inFlight), func(i, j int) { inFlight[i], inFlight[j] = inFlight[j], inFlight[i] })
		for _, s := range inFlight {
			m.landOrLose(s)
		}
		m.rds.mu.Unlock()
	}
	m.markAttached()
	sync := func() {
		for round := 0; round < 3; round++ {
			for _, r := range m.replicas {
				m.deliver(r, 1<<30)
			}
		}
	}
	sync()
	m.check()
	if m.fenced {
		if _, err := m.reconcile(m.replicas[m.leader], "leader"); err != nil {
			m.fail("healed: the leader's reconcile fails: %v", err)
		}
		m.checkExports("healed, every RDS command landed or lost, after the leader's reconcile")
		m.check()
	}
	for _, v := range m.vols {
		for _, n := range m.nodes {
			for try := 0; m.getVA(v, n) != nil; try++ {
				if try == 5 {
					m.fail("volume %s: the detach from %s never succeeds", v.id, n)
				}
				m.unpublish(m.replicas[try%2], v, n)
				sync()
			}
		}
	}
	m.check()
	var live []string
	for _, n := range m.nodes {
		if m.uid[n] != "" && !m.oos[n] {
			live = append(live, n)
		}
	}
	if len(live) == 0 {
		return
	}
	for i, v := range m.vols {
		node := live[i%len(live)]
		r := m.replicas[i%2]
		if m.getVA(v, node) == nil {
			va := testVA(v.pvs[len(v.pvs)-1], node, publishNow)
			va.Name = m.vaName(v, node)
			m.newVAUID(va)
			if _, err := m.api.StorageV1().VolumeAttachments().Create(m.ctx, va, metav1.CreateOptions{}); err != nil {
				m.t.Fatal(err)
			}
		}
		var err error
		for try := 0; try < 3; try++ {
			_, err = r.cs.ControllerPublishVolume(m.ctx, &csi.ControllerPublishVolumeRequest{VolumeId: v.id, NodeId: m.nodeID(node), VolumeCapability: m.capability(v.multi)})
			if err == nil {
				break
			}
			sync()
		}
		if err != nil {
			claims := map[string]claims.Claim{}
			for _, pv := range v.pvs {
				for n, c := range claimsOf(m.t, m.api, pv) {
					claims[pv+"/"+n] = c
				}
			}
			m.fail("volume %s is stuck: with every attachment detached, publishing it to %s fails: %v (claims %v)", v.id, node, err, keys(claims))
		}
	}
	if m.fenced {
		sync()
		fixed, err := m.reconcile(m.replicas[m.leader], "leader")
		if err != nil || fixed != 0 {
			m.fail("healed and published again: the leader's reconcile fixed %d exports, err %v; every publish should have left its export right", fixed, err)
		}
		m.checkExports("healed and published again, after the leader's reconcile")
		m.check()
	}
}

// modelOps is the size of the model check: RDS_CSI_MODEL_OPS, 100000 by
// default (make model, part of make test; a tenth under the race detector,
// in make unit); make soak runs more.
func modelOps(t *testing.T) (ops int, seeds []int64) {
	ops = 100_000
	if raceDetector {
		ops = 10_000
	}
	if s := os.Getenv("RDS_CSI_MODEL_OPS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("RDS_CSI_MODEL_OPS=%q: %v", s, err)
		}
		ops = n
	}
	if s := os.Getenv("RDS_CSI_MODEL_SEED"); s != "" {
		seed, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("RDS_CSI_MODEL_SEED=%q: %v", s, err)
		}
		return ops, []int64{seed}
	}
	for i := int64(1); i <= 20; i++ {
		seeds = append(seeds, i)
	}
	return ops, seeds
}

func TestPublishModel(t *testing.T) {
	t.Run("claims", func(t *testing.T) { runModel(t, false) })
	// Storage fencing on: the same schedule, and the checker also follows
	// who may be connected on the RDS.
	t.Run("storage-fencing", func(t *testing.T) { runModel(t, true) })
	// Authenticated attachments too: the secret is part of the token.
	t.Run("export-auth", func(t *testing.T) { runModelWith(t, true, true) })
}

// TestPublishModelCatchesAKeptPassword is the export-auth model's negative
// control: an RDS (or a client) that keeps the old password when a swap
// moves the allowed host must be caught.
func TestPublishModelCatchesAKeptPassword(t *testing.T) {
	for seed := int64(1); seed <= 20; seed++ {
		var failure string
		done := make(chan struct{})
		go func() {
			defer close(done)
			m := newModelWith(t, seed, true, true, func(f *fakeRDS) { f.keepPasswordOnHostChange = true })
			m.onFail = func(msg string) { failure = msg }
			for i := 0; i < 2000 && failure == ""; i++ {
				m.randomStep()
			}
		}()
		<-done
		if failure != "" {
			t.Logf("caught: %s", failure)
			return
		}
	}
	t.Fatal("a kept password went unnoticed over 20 seeds of 2000 steps")
}

func runModel(t *testing.T, fenced bool) { runModelWith(t, fenced, false) }

func runModelWith(t *testing.T, fenced, auth bool) {
	runModelConfig(t, modelConfig{fenced: fenced, auth: auth})
}

func runModelConfig(t *testing.T, cfg modelConfig) map[string]int {
	auth := cfg.auth
	ops, seeds := modelOps(t)
	per := ops / len(seeds)
	totals := map[string]int{}
	start := time.Now()
	for _, seed := range seeds {
		m := newModelConfig(t, seed, cfg)
		for i := 0; i < per; i++ {
			m.randomStep()
		}
		m.heal()
		for k, n := range m.stats {
			totals[k] += n
		}
	}
	var lines []string
	for k, n := range totals {
		lines = append(lines, fmt.Sprintf("%s=%d", k, n))
	}
	sort.Strings(lines)
	t.Logf("%d operations over %d seeds in %s, 0 violations, 0 stuck: %s", per*len(seeds), len(seeds), time.Since(start).Round(time.Millisecond), strings.Join(lines, " "))
	if totals["publish OK"] == 0 || totals["publish FailedPrecondition"] == 0 || (auth && totals["connect with a secret"] == 0) {
		t.Fatalf("degenerate run: %v", totals)
	}
	return totals
}
