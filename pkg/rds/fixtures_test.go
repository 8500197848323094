package rds

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// The fixtures the client tests share, in one place: the simulator and
// clients on it, SSH servers and relays that misbehave in ways the
// simulator does not, a log sink, and RouterOS output. A file of tests
// holds its tests and what only they use.

// The simulator and clients on it.

// simEnv is the simulator on loopback and a client pinned to its host key.
type simEnv struct {
	sim      *rdssim.Server
	signer   ssh.Signer
	known    string
	host     string
	port     int
	poolSize int64
}

func startSim(t testing.TB, poolSize int64) *simEnv { return startSimWith(t, poolSize, nil) }

// startSimWith starts the simulator with its defaults (wrapping at 80
// columns) changed by mod.
func startSimWith(t testing.TB, poolSize int64, mod func(*rdssim.Config)) *simEnv {
	t.Helper()
	signer, pub, err := rdssim.NewTestKeys()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := rdssim.Config{
		DataDir:        filepath.Join(dir, "pool"),
		PoolSize:       poolSize,
		HostKeyPath:    filepath.Join(dir, "host_key"),
		AuthorizedKeys: []ssh.PublicKey{pub},
	}
	if mod != nil {
		mod(&cfg)
	}
	sim, err := rdssim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	addr, err := sim.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	known := filepath.Join(dir, "known_hosts")
	if err := sim.WriteKnownHosts(known); err != nil {
		t.Fatal(err)
	}
	host, port := splitAddr(t, addr)
	return &simEnv{sim: sim, signer: signer, known: known, host: host, port: port, poolSize: poolSize}
}

func splitAddr(t testing.TB, addr string) (string, int) {
	t.Helper()
	i := strings.LastIndex(addr, ":")
	var port int
	for _, c := range addr[i+1:] {
		port = port*10 + int(c-'0')
	}
	return addr[:i], port
}

func (e *simEnv) config() Config {
	return Config{
		Address: e.host, Port: e.port, User: "admin", Signer: e.signer, KnownHostsFile: e.known,
		RetryBaseDelay: time.Millisecond, RetryMaxDelay: 5 * time.Millisecond,
		// No width option: the simulator wraps at its default 80 columns,
		// as the hardware did, so every client test parses wrapped output.
		LoginOptions: "ct",
	}
}

func (e *simEnv) client(t testing.TB, mod func(*Config)) *Client {
	t.Helper()
	cfg := e.config()
	if mod != nil {
		mod(&cfg)
	}
	c, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// assertNoLeftovers checks the simulator holds no disk and the pool
// directory holds no disk file.
func (e *simEnv) assertNoLeftovers(t *testing.T) {
	t.Helper()
	if d := e.sim.Disks(); len(d) != 0 {
		t.Errorf("leftover disks: %+v", d)
	}
	_ = filepath.WalkDir(e.sim.DataDir(), func(p string, de os.DirEntry, err error) error {
		if err == nil && !de.IsDir() && strings.HasSuffix(p, ".img") {
			t.Errorf("leftover file %s", p)
		}
		return nil
	})
	if free, err := e.sim.Free(); err != nil || free != e.poolSize {
		t.Errorf("pool free = %d, %v; want %d", free, err, e.poolSize)
	}
}

func (e *simEnv) fileExists(t *testing.T, path string) bool {
	t.Helper()
	c, err := NewClient(e.config())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.GetFile(context.Background(), path)
	if err != nil && !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
	return err == nil
}

func req(slot string, size int64) CreateDiskRequest {
	return CreateDiskRequest{Slot: slot, FilePath: "/storage-pool/k8s/" + slot + ".img", Size: size,
		Export: &Export{Port: 4420, NQN: "nqn.2000-02.com.mikrotik:" + slot}}
}

func countCommands(env *simEnv, prefix string) int {
	n := 0
	for _, c := range env.sim.Commands() {
		if strings.HasPrefix(c.Text, prefix) {
			n++
		}
	}
	return n
}

// lastPrint is the output of the last command containing match.
func lastPrint(env *simEnv, match string) string {
	out := ""
	for _, cmd := range env.sim.Commands() {
		if strings.Contains(cmd.Text, match) {
			out = cmd.Output
		}
	}
	return out
}

const (
	hostA = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-4000-8000-000000000001"
	hostB = "nqn.2014-08.org.nvmexpress:uuid:bbbbbbbb-0000-4000-8000-000000000002"
	hostC = "nqn.2014-08.org.nvmexpress:uuid:cccccccc-0000-4000-8000-000000000003"
)

// diskState is a disk's export as the simulator holds it.
type diskState struct {
	exported bool
	host     string
}

func (e *simEnv) exportState(t *testing.T, slot string) diskState {
	t.Helper()
	for _, d := range e.sim.Disks() {
		if d.Slot == slot {
			return diskState{d.NVMeTCPExport, d.AllowHostName}
		}
	}
	t.Fatalf("no disk %q in the simulator", slot)
	return diskState{}
}

// setCommands lists the /disk set commands the simulator received since
// the last ResetCommands.
func (e *simEnv) setCommands() []string {
	var out []string
	for _, c := range e.sim.Commands() {
		if strings.HasPrefix(c.Text, "/disk set") {
			out = append(out, c.Text)
		}
	}
	return out
}

// prepare creates pvc-a closed and brings it to state with unconditional
// commands (the simulator's own command line, not the code under test).
func (e *simEnv) prepare(t *testing.T, c *Client, st diskState) {
	t.Helper()
	ctx := context.Background()
	r := req("pvc-a", GiB)
	r.Export.Closed = true
	if _, err := c.CreateDisk(ctx, r); err != nil {
		t.Fatal(err)
	}
	if err := c.SetAllowedHost(ctx, "pvc-a", st.host); err != nil {
		t.Fatal(err)
	}
	if st.exported {
		if _, err := c.exec(ctx, "/disk set [find slot=%s] nvme-tcp-export=yes", "pvc-a"); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.exportState(t, "pvc-a"); got != st {
		t.Fatalf("prepared %+v, want %+v", got, st)
	}
	e.sim.ResetCommands()
}

func cond(host, export string) string {
	return `/disk set [find where slot="pvc-a" and nvme-tcp-server-allow-host-name="` + host + `" and nvme-tcp-export=` + export + `] `
}

// The driver's own names, at their real lengths: a volume path of 77
// characters, an NQN of 65, a snapshot file of 155.
const (
	wrapVolume   = "pvc-3f2c1a2b-5d4e-4f60-9120-464c8a7b9d0e"
	wrapSnapshot = "snap-0b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d"
	wrapBase     = "/storage-pool/kubernetes-volumes"
	wrapSnapFile = wrapBase + "/snapshots/" + wrapSnapshot + ".src-" + wrapVolume + ".t-1795000000123456789.img"
)

func wrapReq() CreateDiskRequest {
	return CreateDiskRequest{Slot: wrapVolume, FilePath: wrapBase + "/" + wrapVolume + ".img", Size: GiB,
		Export: &Export{Port: 4420, NQN: "nqn.2000-02.com.mikrotik:" + wrapVolume}}
}

// SSH servers and relays.

// serveSSH listens on loopback and runs serve for every connection, with
// a server config (no client auth, a fresh host key) for the SSH side;
// it returns the port. For servers that misbehave in ways the simulator
// does not.
func serveSSH(t *testing.T, serve func(c net.Conn, cfg *ssh.ServerConfig)) int {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	hostKey, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &ssh.ServerConfig{NoClientAuth: true}
	cfg.AddHostKey(hostKey)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
			go serve(c, cfg)
		}
	}()
	_, port := splitAddr(t, l.Addr().String())
	return port
}

// scriptedSSH serves exec requests with answer(cmd) as output and exit
// status 0, and records the commands.
type scriptedSSH struct {
	mu   sync.Mutex
	cmds []string
}

func (s *scriptedSSH) serve(t *testing.T, answer func(cmd string) string) int {
	return serveSSH(t, func(c net.Conn, cfg *ssh.ServerConfig) {
		defer c.Close()
		_, chans, reqs, err := ssh.NewServerConn(c, cfg)
		if err != nil {
			return
		}
		go ssh.DiscardRequests(reqs)
		for nc := range chans {
			ch, creqs, err := nc.Accept()
			if err != nil {
				return
			}
			go func() {
				for r := range creqs {
					if r.Type != "exec" || len(r.Payload) < 4 {
						r.Reply(false, nil)
						continue
					}
					n := binary.BigEndian.Uint32(r.Payload)
					cmd := string(r.Payload[4 : 4+n])
					s.mu.Lock()
					s.cmds = append(s.cmds, cmd)
					s.mu.Unlock()
					r.Reply(true, nil)
					ch.Write([]byte(answer(cmd)))
					ch.SendRequest("exit-status", false, []byte{0, 0, 0, 0})
					ch.Close()
					return
				}
			}()
		}
	})
}

// blackHole accepts TCP connections and never answers, so an SSH handshake
// with it hangs until the connections are closed.
type blackHole struct {
	l     net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func newBlackHole(t *testing.T) *blackHole {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackHole{l: l}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			b.mu.Lock()
			b.conns = append(b.conns, c)
			b.mu.Unlock()
		}
	}()
	t.Cleanup(b.close)
	return b
}

func (b *blackHole) close() {
	b.l.Close()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.conns {
		c.Close()
	}
}

// delayRelay is a TCP relay on loopback that forwards each direction after
// a fixed one-way delay, so every network round trip costs 2×delay: what
// separates a reused connection from a new one (TCP and SSH handshakes,
// key exchange, authentication) is counted in round trips, as across a
// real network. Bandwidth is not limited.
type delayRelay struct {
	l      net.Listener
	target string
	delay  time.Duration
	wg     sync.WaitGroup
}

func startDelayRelay(tb testing.TB, target string, oneWay time.Duration) *delayRelay {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	r := &delayRelay{l: l, target: target, delay: oneWay}
	r.wg.Add(1)
	go r.serve()
	tb.Cleanup(func() { l.Close(); r.wg.Wait() })
	return r
}

func (r *delayRelay) serve() {
	defer r.wg.Done()
	for {
		in, err := r.l.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", r.target)
		if err != nil {
			in.Close()
			continue
		}
		r.wg.Add(2)
		go r.pipe(in, out)
		go r.pipe(out, in)
	}
}

// pipe copies src to dst, each chunk written delay after it was read.
func (r *delayRelay) pipe(src, dst net.Conn) {
	defer r.wg.Done()
	type chunk struct {
		data []byte
		due  time.Time
	}
	queue := make(chan chunk, 1024)
	go func() {
		defer dst.Close()
		for c := range queue {
			time.Sleep(time.Until(c.due))
			if _, err := dst.Write(c.data); err != nil {
				return
			}
		}
	}()
	defer close(queue)
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			queue <- chunk{data: append([]byte(nil), buf[:n]...), due: time.Now().Add(r.delay)}
		}
		if err != nil {
			if err != io.EOF {
				src.Close()
			}
			return
		}
	}
}

// Logs.

// syncWriter is a log sink safe for concurrent writers: writes go to w
// under mu.
type syncWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// RouterOS output.

// realDisk is print detail output as seen on RDS hardware (RouterOS 7).
const realDisk = `Flags: B - BLOCK-DEVICE; t - NVME-TCP-EXPORT
31 Bt type=file slot="vm-storage-001" slot-default="" parent="" fs=- model="/raid10/vm-storage-001.img" size=1 099 511 627 776 mount-filesystem=no mount-read-only=no compress=no sector-size=512 raid-master=none nvme-tcp-export=yes
      nvme-tcp-server-port=4420 nvme-tcp-server-nqn="nqn.2026-09.com.mikrotik:rds2216.vm-storage-001" nvme-tcp-server-allow-host-name="" iscsi-export=no nfs-sharing=no smb-sharing=no media-sharing=no media-interface=none swap=no
      file-path=/raid10/vm-storage-001.img file-size=1024.0GiB file-offset=0
`

// unnumbered is the shape the peer driver's tests recorded: no legend, no
// entry number, one property group per line.
const unnumbered = `type=file slot="pvc-test-123" slot-default="" parent="" fs=-
               model="/storage-pool/test.img"
               size=53 687 091 200 mount-filesystem=yes mount-read-only=no
               nvme-tcp-export=yes nvme-tcp-server-port=4420
               nvme-tcp-server-nqn="nqn.2000-02.com.mikrotik:pvc-test-123"
               file-path=/storage-pool/test.img
               file-size=50.0GiB file-offset=0`

// unreadableBeside is a listing of the driver's disk and an entry the
// parser cannot read (a flag the legend does not name, and a property it
// does not know how to read), both on the same file path.
const unreadableBeside = "Flags: B - BLOCK-DEVICE; M - MOUNTED; t - NVME-TCP-EXPORT\n" +
	" 0 B t type=file slot=\"pvc-1\" file-path=/storage-pool/k8s/pvc-1.img\n" +
	"       size=1 073 741 824 nvme-tcp-export=yes nvme-tcp-server-port=4420\n" +
	"       nvme-tcp-server-nqn=\"nqn.2000-02.com.mikrotik:pvc-1\"\n" +
	" \n" +
	" 1 Q?  type=file slot=\"mystery\" model=\"x\" size=lots\n" +
	"       file-path=/storage-pool/k8s/pvc-\n" +
	"       2.img\n"

// hostile are values that must never reach RouterOS: each could end a
// quoted string, start a new command, or expand a variable.
var hostile = []string{
	"pvc-1;/system reboot", "pvc-1]", "pvc-1[", `pvc-1"`, "pvc-1'", "pvc 1", "pvc-1\n/disk remove 0",
	"pvc-1\r", "$x", "pvc-$(id)", "pvc-1`", "pvc-1\\", "pvc-1{", "pvc-1\t", "", "-pvc", "pvc-",
	"PVC-1", strings.Repeat("a", 65), "pvc\x00", "pvc/1", "pvc.1",
}

const (
	corpusVolume   = "pvc-3f2c1a2b-5d4e-4f60-9120-464c8a7b9d0e"
	corpusSnapshot = "snap-0b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d"
	corpusSnapFile = "/storage-pool/kubernetes-volumes/snapshots/" + corpusSnapshot + ".src-" + corpusVolume + ".t-1795000000123456789.img"
	corpusHashed   = "vol-0123456789abcdef0123456789abcdef"
	corpusClosed   = "pvc-0f923194-922a-5dd8-b376-c2c6ccb56dd8"
)

func corpusDir() string { return filepath.Join("testdata", "routeros") }

func readCorpus(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(corpusDir(), name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// wordWrap lays out each line as RouterOS was seen to: properties
// separated by spaces, moved whole to the next line (indented by indent)
// when they do not fit, and a property longer than a whole line broken at
// exactly width columns.
func wordWrap(text string, width, indent int) string {
	var b strings.Builder
	for _, line := range strings.Split(text, "\n") {
		lead := len(line) - len(strings.TrimLeft(line, " "))
		cur := line[:lead]
		for _, word := range strings.Fields(line) {
			switch {
			case len(cur) == lead && lead > 0 || len(cur) == 0:
			case len(cur)+1+len(word) <= width:
				cur += " "
			default:
				b.WriteString(cur + "\n")
				cur = strings.Repeat(" ", indent)
			}
			cur += word
			for len(cur) > width {
				b.WriteString(cur[:width] + "\n")
				cur = strings.Repeat(" ", indent) + cur[width:]
			}
		}
		b.WriteString(cur + "\n")
	}
	return b.String()
}

// longestLine is the length of the longest line of out, without its CR.
func longestLine(out string) int {
	longest := 0
	for _, line := range strings.Split(out, "\n") {
		longest = max(longest, len(strings.TrimSuffix(line, "\r")))
	}
	return longest
}
