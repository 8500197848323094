package rdssim

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/ssh"
	"k8s.io/klog/v2"
)

// DefaultPoolName is the pool disk's slot and mount point on a stock RDS.
const DefaultPoolName = "storage-pool"

// DefaultPoolSize is used when Config.PoolSize is zero.
const DefaultPoolSize = 100 << 30 // 100 GiB

// serverVersion is what RouterOS announces.
const serverVersion = "SSH-2.0-ROSSSH"

// handshakeTimeout bounds how long a connection may take to authenticate.
const handshakeTimeout = 30 * time.Second

// ErrNotFound is returned by BackingFile for an unknown slot.
var ErrNotFound = errors.New("rdssim: no such disk")

// Config configures a Server.
type Config struct {
	// DataDir holds the pool: disk files live under it (the RouterOS path
	// "/<PoolName>/k8s/a.img" is DataDir/k8s/a.img) together with the
	// simulator's state file. Created if missing. Required.
	DataDir string
	// PoolName is the pool disk's slot and mount point; default
	// "storage-pool".
	PoolName string
	// PoolSize is the pool's capacity in bytes; default 100 GiB.
	PoolSize int64
	// HostKey is the SSH host key. When nil, the key at HostKeyPath is
	// loaded or generated; when both are empty, a fresh in-memory key is
	// used (it changes with every New).
	HostKey     ssh.Signer
	HostKeyPath string
	// AuthorizedKeys are the public keys allowed to log in (any user name).
	// Required.
	AuthorizedKeys []ssh.PublicKey
	// Latency is added before every command; SetLatency changes it later.
	Latency time.Duration
	// TerminalWidth is the width print output wraps at, as RouterOS wraps
	// at the terminal's width: properties move whole to the next line and
	// a value longer than a line is broken in the middle. 0 means
	// DefaultTerminalWidth; negative means no wrapping. A login name with a
	// width option ("admin+ct511w") overrides it for that connection.
	TerminalWidth int
	// CopyRate is how many bytes per second /disk add copy-from copies:
	// the command returns, and the new disk appears, after size/CopyRate
	// (assumed: RouterOS shows a copy's disk only once it is complete).
	// Meanwhile other commands run, and the copy's file exists and cannot
	// be removed. 0 copies at once.
	CopyRate int64
	// CopyGate, when set, holds every copy until it is closed (or the
	// server stops), instead of size/CopyRate: a test sees a copy in
	// progress without racing its timer.
	CopyGate <-chan struct{}
	// CopyFromProperties and CopyFromData model what /disk add copy-from
	// takes from its source (copyfrom.go): by default the source's
	// properties where the add sets none (CopyFromInherit, as RouterOS's
	// CLI manual describes copy-from; CopyFromFresh: a new disk's), and
	// its data, as the driver assumes.
	CopyFromProperties CopyFromProperties
	CopyFromData       CopyFromData
	// ExitStatusOnFailure makes a refused command exit with status 1
	// instead of 0 (RouterOS is assumed to exit 0 and say "failure: ..."),
	// to check that a client copes with both.
	ExitStatusOnFailure bool
	// CRLF ends output lines with "\r\n" instead of "\n", to check that a
	// client copes with both.
	CRLF bool
	// Logger receives connection and command logs; the zero value discards
	// them.
	Logger klog.Logger
	// Now is the clock for uptime and timestamps; default time.Now.
	Now func() time.Time
	// Exporter, when set, makes real NVMe/TCP targets follow the disks'
	// nvme-tcp-export settings (NvmetExporter); New reconciles it with the
	// disk table, so a restarted simulator keeps its exports.
	Exporter Exporter
	// AllowHostChange is what a change of a disk's allowed host does to
	// the connections already established to its export: keep (the
	// default, as Linux nvmet) or drop. Export off drops them either way.
	AllowHostChange AllowHostChange
	// ClosedExportProps is whether /disk print shows the NVMe/TCP server
	// properties of a disk whose export is off: shown (the default) or
	// hidden, as RAID disks printed on RDS2216 hardware (closedexport.go).
	ClosedExportProps ClosedExportProps
	// GlobalRequests is how SSH global requests (keepalive@openssh.com)
	// are answered: reject (the default), ignore or close
	// (globalrequests.go).
	GlobalRequests GlobalRequests
	// ValueBreak is where print output breaks a value longer than the rest
	// of its line: at the width (the default) or before a '-' short of it,
	// as hardware was seen to (printvariants.go).
	ValueBreak ValueBreak
	// Legend is which flags a listing's Flags legend names: used (the
	// default) or all (printvariants.go).
	Legend Legend
}

// Stats counts connections.
type Stats struct {
	Accepted        int // TCP connections accepted and served
	Refused         int // closed at once because of SetRefuseConnections
	HandshakeFailed int // SSH handshake or authentication failed
	Commands        int // exec requests received
	GlobalRequests  int // SSH global requests received (keepalives)
}

// Server is a simulated RDS: an SSH server that runs the RouterOS subset of
// docs/routeros.md against real sparse files. All methods are safe for
// concurrent use.
type Server struct {
	dataDir  string
	pool     string
	poolSize int64
	crlf     bool
	width    int
	exitFail bool
	copyRate int64
	copyGate <-chan struct{}
	pending  *pendingCopy    // set by a copying diskAdd for execute; under stateMu
	copying  map[string]bool // file paths of copies in progress; under stateMu
	copyFrom copyModel
	log      klog.Logger
	now      func() time.Time
	started  time.Time
	hostKey  ssh.Signer
	sshConf  *ssh.ServerConfig

	stateMu sync.Mutex // the disk table and the files under dataDir
	disks   []*disk

	exporter       Exporter // guarded by stateMu, like the exports below
	lastExports    []Export
	exportsApplied bool
	hostChange     AllowHostChange
	closedProps    ClosedExportProps
	globalReqs     GlobalRequests
	valueBreak     ValueBreak
	legend         Legend
	drops          map[string]int          // ConnectionDrops by slot; under stateMu
	hw             hardwareState           // the array and drives (hardware.go); under stateMu
	io             map[string]*ioState     // file disks' I/O counters by slot (diskio.go); under stateMu
	monitors       map[string]monitorState // the last monitor-traffic by slot (diskio.go); under stateMu
	exportLog      []ExportChange          // under stateMu

	faultMu sync.Mutex // faults, seq, late, held; taken before logMu
	faults  []*armedFault
	seq     int
	late    *lateBatch // FaultLate commands held since the last ReleaseLate
	held    int        // FaultLate commands not landed yet

	logMu  sync.Mutex
	cmdLog []*Command

	latency atomic.Int64 // time.Duration
	refuse  atomic.Bool

	connMu    sync.Mutex
	closed    bool
	listeners []net.Listener
	conns     map[net.Conn]struct{}
	stats     Stats
	wg        sync.WaitGroup

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
}

// New creates a Server and loads its disk table from the data directory.
// It does not listen yet: call Serve or Start.
func New(cfg Config) (*Server, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("rdssim: DataDir is required")
	}
	if len(cfg.AuthorizedKeys) == 0 {
		return nil, errors.New("rdssim: at least one authorized key is required")
	}
	if cfg.PoolName == "" {
		cfg.PoolName = DefaultPoolName
	}
	if strings.ContainsAny(cfg.PoolName, "/\\ \"$") || strings.HasPrefix(cfg.PoolName, ".") {
		return nil, fmt.Errorf("rdssim: invalid pool name %q", cfg.PoolName)
	}
	if cfg.PoolSize == 0 {
		cfg.PoolSize = DefaultPoolSize
	}
	if cfg.PoolSize < 0 {
		return nil, fmt.Errorf("rdssim: negative pool size %d", cfg.PoolSize)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.TerminalWidth == 0 {
		cfg.TerminalWidth = DefaultTerminalWidth
	}
	hostChange, err := ParseAllowHostChange(string(cfg.AllowHostChange))
	if err != nil {
		return nil, fmt.Errorf("rdssim: %w", err)
	}
	closedProps, err := ParseClosedExportProps(string(cfg.ClosedExportProps))
	if err != nil {
		return nil, fmt.Errorf("rdssim: %w", err)
	}
	globalReqs, err := ParseGlobalRequests(string(cfg.GlobalRequests))
	if err != nil {
		return nil, fmt.Errorf("rdssim: %w", err)
	}
	valueBreak, err := ParseValueBreak(string(cfg.ValueBreak))
	if err != nil {
		return nil, fmt.Errorf("rdssim: %w", err)
	}
	legend, err := ParseLegend(string(cfg.Legend))
	if err != nil {
		return nil, fmt.Errorf("rdssim: %w", err)
	}
	copyFrom, err := newCopyModel(cfg)
	if err != nil {
		return nil, fmt.Errorf("rdssim: %w", err)
	}
	dataDir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return nil, fmt.Errorf("rdssim: create data dir: %w", err)
	}
	hostKey := cfg.HostKey
	switch {
	case hostKey != nil:
	case cfg.HostKeyPath != "":
		if hostKey, err = LoadOrGenerateHostKey(cfg.HostKeyPath); err != nil {
			return nil, fmt.Errorf("rdssim: %w", err)
		}
	default:
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, err
		}
		if hostKey, err = ssh.NewSignerFromKey(priv); err != nil {
			return nil, err
		}
	}
	disks, err := loadState(dataDir)
	if err != nil {
		return nil, fmt.Errorf("rdssim: %w", err)
	}

	s := &Server{
		dataDir:     dataDir,
		pool:        cfg.PoolName,
		poolSize:    cfg.PoolSize,
		crlf:        cfg.CRLF,
		width:       cfg.TerminalWidth,
		exitFail:    cfg.ExitStatusOnFailure,
		copyRate:    cfg.CopyRate,
		copyGate:    cfg.CopyGate,
		copying:     map[string]bool{},
		copyFrom:    copyFrom,
		log:         cfg.Logger,
		now:         cfg.Now,
		hostKey:     hostKey,
		disks:       disks,
		conns:       map[net.Conn]struct{}{},
		exporter:    cfg.Exporter,
		hostChange:  hostChange,
		closedProps: closedProps,
		globalReqs:  globalReqs,
		valueBreak:  valueBreak,
		legend:      legend,
		drops:       map[string]int{},
	}
	if err := s.syncExports(); err != nil {
		return nil, fmt.Errorf("rdssim: %w", err)
	}
	s.started = s.now()
	s.latency.Store(int64(cfg.Latency))
	s.ctx, s.cancel = context.WithCancel(context.Background())

	authorized := make([][]byte, len(cfg.AuthorizedKeys))
	for i, k := range cfg.AuthorizedKeys {
		authorized[i] = k.Marshal()
	}
	s.sshConf = &ssh.ServerConfig{
		ServerVersion: serverVersion,
		PublicKeyCallback: func(meta ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			m := key.Marshal()
			for _, a := range authorized {
				if bytes.Equal(a, m) {
					return &ssh.Permissions{}, nil
				}
			}
			return nil, fmt.Errorf("public key of user %q is not authorized", meta.User())
		},
	}
	s.sshConf.AddHostKey(hostKey)
	return s, nil
}

// HostPublicKey is the server's SSH host key, for a known_hosts entry.
func (s *Server) HostPublicKey() ssh.PublicKey { return s.hostKey.PublicKey() }

// Addr is the address of the first listener, "" before Serve/Start.
func (s *Server) Addr() string {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	if len(s.listeners) == 0 {
		return ""
	}
	return s.listeners[0].Addr().String()
}

// DataDir is the absolute data directory.
func (s *Server) DataDir() string { return s.dataDir }

// Start listens on addr ("127.0.0.1:0" for a free port) and serves in the
// background. It returns the address actually listened on.
func (s *Server) Start(addr string) (string, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("rdssim: listen: %w", err)
	}
	if !s.addListener(l) {
		l.Close()
		return "", errors.New("rdssim: server closed")
	}
	s.wg.Add(1) // addListener succeeded, so Close has not started waiting
	go func() {
		defer s.wg.Done()
		if err := s.serve(l); err != nil {
			s.log.Error(err, "serve stopped", "addr", l.Addr().String())
		}
	}()
	return l.Addr().String(), nil
}

// Serve accepts connections on l until Close. It returns nil after Close.
func (s *Server) Serve(l net.Listener) error {
	if !s.addListener(l) {
		l.Close()
		return errors.New("rdssim: server closed")
	}
	return s.serve(l)
}

func (s *Server) addListener(l net.Listener) bool {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	if s.closed {
		return false
	}
	s.listeners = append(s.listeners, l)
	return true
}

func (s *Server) serve(l net.Listener) error {
	for {
		c, err := l.Accept()
		if err != nil {
			if s.ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		if s.refuse.Load() {
			s.connMu.Lock()
			s.stats.Refused++
			s.connMu.Unlock()
			c.Close()
			continue
		}
		if !s.track(c) {
			c.Close()
			continue
		}
		go func() {
			defer s.wg.Done()
			defer s.untrack(c)
			s.handleConn(c)
		}()
	}
}

// track registers a connection so Close can end it; false once closed.
func (s *Server) track(c net.Conn) bool {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	s.stats.Accepted++
	s.wg.Add(1)
	return true
}

func (s *Server) untrack(c net.Conn) {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	delete(s.conns, c)
}

// Stats returns the connection counters.
func (s *Server) Stats() Stats {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	st := s.stats
	s.faultMu.Lock()
	st.Commands = s.seq
	s.faultMu.Unlock()
	return st
}

// Close stops listening, drops every connection and waits for their
// goroutines. The data directory keeps the disks for the next New.
func (s *Server) Close() error {
	s.connMu.Lock()
	if s.closed {
		s.connMu.Unlock()
		return nil
	}
	s.closed = true
	s.cancel()
	for _, l := range s.listeners {
		l.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.connMu.Unlock()
	s.wg.Wait()
	return nil
}

func (s *Server) handleConn(c net.Conn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(handshakeTimeout))
	sconn, chans, reqs, err := ssh.NewServerConn(c, s.sshConf)
	if err != nil {
		s.connMu.Lock()
		s.stats.HandshakeFailed++
		s.connMu.Unlock()
		s.log.V(1).Info("ssh handshake failed", "remote", c.RemoteAddr().String(), "err", err)
		return
	}
	c.SetDeadline(time.Time{})
	log := s.log.WithValues("remote", c.RemoteAddr().String(), "user", sconn.User())
	log.V(2).Info("connected")

	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	go func() {
		sconn.Wait()
		cancel()
	}()
	go s.serveGlobalRequests(c, reqs)

	var sessions sync.WaitGroup
	for nc := range chans {
		if nc.ChannelType() != "session" {
			nc.Reject(ssh.UnknownChannelType, "only session channels are supported")
			continue
		}
		ch, creqs, err := nc.Accept()
		if err != nil {
			continue
		}
		sessions.Add(1)
		go func() {
			defer sessions.Done()
			s.handleSession(ctx, c, ch, creqs, sconn.User())
		}()
	}
	cancel()
	sessions.Wait()
	log.V(2).Info("disconnected")
}

// handleSession serves one session channel: one exec, like RouterOS.
func (s *Server) handleSession(ctx context.Context, c net.Conn, ch ssh.Channel, reqs <-chan *ssh.Request, user string) {
	defer ch.Close()
	defer func() { go ssh.DiscardRequests(reqs) }()
	for {
		select {
		case <-ctx.Done():
			return
		case req, ok := <-reqs:
			if !ok {
				return
			}
			switch req.Type {
			case "exec":
				var payload struct{ Command string }
				if err := ssh.Unmarshal(req.Payload, &payload); err != nil {
					req.Reply(false, nil)
					continue
				}
				// Log the command before accepting the request: a client
				// whose session.Start returned finds it in Commands().
				entry, fault, late, latency := s.arrive(payload.Command, user)
				req.Reply(true, nil)
				s.exec(ctx, c, ch, reqs, entry, fault, late, latency)
				return
			case "env", "pty-req", "window-change":
				req.Reply(true, nil)
			default: // shell, subsystem: only exec is offered
				req.Reply(false, nil)
			}
		}
	}
}

// exec runs one logged command after its latency, applies its fault, and
// replies on the channel.
func (s *Server) exec(ctx context.Context, c net.Conn, ch ssh.Channel, reqs <-chan *ssh.Request, entry *Command, fault Fault, late *lateBatch, latency time.Duration) {
	line := entry.Text // immutable after arrive
	s.log.V(2).Info("command", "seq", entry.Seq, "user", entry.User, "command", redactPasswords(line), "fault", fault.Kind.String())

	if late != nil {
		// Held first, whatever the latency: it lands after the commands
		// that arrive meanwhile, even with its client gone.
		landed := s.waitLate(reqs, fault.Delay, late)
		var (
			out    string
			failed bool
		)
		if landed {
			out, failed = s.execute(entry.Seq, line, s.widthFor(entry))
			s.logUpdate(entry, func(e *Command) { e.Executed, e.Result = true, out })
		}
		s.doneLate(late)
		s.log.V(2).Info("late command", "seq", entry.Seq, "landed", landed)
		if landed {
			s.logUpdate(entry, func(e *Command) { e.Output = out })
			s.reply(ch, out, failed)
		}
		return
	}
	if latency > 0 {
		if !waitOrGone(ctx, reqs, latency) {
			return
		}
	}
	var (
		out    string
		failed bool
	)
	switch fault.Kind {
	case FaultHang:
		waitOrGone(ctx, reqs, -1)
		return
	case FaultDropBeforeExec:
		c.Close()
		return
	case FaultFail:
		out, failed = withNewline(fault.Output), true
	default:
		out, failed = s.execute(entry.Seq, line, s.widthFor(entry))
		s.logUpdate(entry, func(e *Command) { e.Executed, e.Result = true, out })
	}
	switch fault.Kind {
	case FaultDropAfterExec:
		c.Close()
		return
	case FaultGarbage:
		out = fault.Output
	}
	s.logUpdate(entry, func(e *Command) { e.Output = out })
	s.reply(ch, out, failed)
}

// widthFor is the terminal width a command's output wraps at.
func (s *Server) widthFor(entry *Command) int {
	if entry.TerminalWidth > 0 {
		return entry.TerminalWidth
	}
	return s.width
}

// reply sends a command's output and exit status; false when the client
// is gone.
func (s *Server) reply(ch ssh.Channel, out string, failed bool) bool {
	if s.crlf {
		out = strings.ReplaceAll(out, "\n", "\r\n")
	}
	if _, err := ch.Write([]byte(out)); err != nil {
		return false
	}
	status := uint32(0)
	if failed && s.exitFail {
		status = 1
	}
	_, err := ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{status}))
	return err == nil
}

// waitOrGone waits d (forever when d < 0) and reports whether the time
// passed; it returns false early when the client closed the session or the
// connection, or the server is closing. It keeps serving the session's
// requests meanwhile, so the SSH connection never stalls.
func waitOrGone(ctx context.Context, reqs <-chan *ssh.Request, d time.Duration) bool {
	var timeout <-chan time.Time
	if d >= 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	for {
		select {
		case <-timeout:
			return true
		case <-ctx.Done():
			return false
		case req, ok := <-reqs:
			if !ok {
				return false
			}
			req.Reply(false, nil)
		}
	}
}

func withNewline(s string) string {
	if s == "" || strings.HasSuffix(s, "\n") {
		return s
	}
	return s + "\n"
}

// BackingFile returns the host path of the file behind the disk with this
// slot, e.g. to attach it to a loop device.
func (s *Server) BackingFile(slot string) (string, error) {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	d := s.diskBySlot(slot)
	if d == nil {
		return "", fmt.Errorf("%w: slot %q", ErrNotFound, slot)
	}
	rel, err := s.relPath(d.FilePath)
	if err != nil {
		return "", err
	}
	return s.hostPath(rel), nil
}

// DiskInfo describes one file disk, for assertions.
type DiskInfo struct {
	Slot          string
	FilePath      string // RouterOS path
	BackingFile   string // host path
	Size          int64  // the backing file's length; -1 if it is missing
	NVMeTCPExport bool
	NVMeTCPPort   int
	NVMeTCPNQN    string
	AllowHostName string
	// Secret is the nvme-tcp-server-secret the disk prints for its
	// password: what the allowed host must present. "" without one.
	Secret string
}

// Disks returns the file disks in table order.
func (s *Server) Disks() []DiskInfo {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	out := make([]DiskInfo, 0, len(s.disks))
	for _, d := range s.disks {
		info := DiskInfo{
			Slot:          d.Slot,
			FilePath:      d.FilePath,
			Size:          s.fileSize(d),
			NVMeTCPExport: d.Export,
			NVMeTCPPort:   d.Port,
			NVMeTCPNQN:    d.NQN,
			AllowHostName: d.AllowHost,
			Secret:        serverSecret(d.Password),
		}
		if rel, err := s.relPath(d.FilePath); err == nil {
			info.BackingFile = s.hostPath(rel)
		}
		out = append(out, info)
	}
	return out
}

// Free is the pool's free space as /disk print reports it.
func (s *Server) Free() (int64, error) {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	return s.free()
}
