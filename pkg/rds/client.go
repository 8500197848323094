package rds

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
	"k8s.io/klog/v2"
)

// Config of the SSH transport.
type Config struct {
	Address string // host name or IP of the RDS
	Port    int    // SSH port, default 22
	User    string
	// LoginOptions are RouterOS console login options, sent after a '+'
	// in the login name (MikroTik's "console login options"). Default
	// "ct511w4098h": no colours, no terminal detection, 511 columns, so
	// RouterOS does not wrap the driver's longest lines; "none" sends
	// User unchanged, as does a User that already has a '+'.
	LoginOptions string

	// Signer authenticates the client. When nil, KeyFile is read: an
	// unencrypted OpenSSH or PEM private key, mounted from a Secret.
	Signer  ssh.Signer
	KeyFile string

	// KnownHostsFile pins the RDS host key (OpenSSH known_hosts format).
	// Required unless InsecureSkipHostKeyCheck is set.
	KnownHostsFile string
	// InsecureSkipHostKeyCheck accepts any host key. Labs only: it lets
	// anyone on the path impersonate the RDS and receive every command.
	InsecureSkipHostKeyCheck bool

	MaxSessions    int           // concurrent SSH sessions, default 4
	DialTimeout    time.Duration // TCP connect + SSH handshake, default 10s
	CommandTimeout time.Duration // one attempt of one command, default 30s
	// CopyTimeout bounds a /disk add copy-from, which copies the whole
	// source and takes time in proportion to its size; default 1h, and
	// never past the caller's context.
	CopyTimeout time.Duration
	// KeepAliveInterval paces TCP keepalive on the SSH connection: probes
	// after this long idle, then every interval, three unanswered drop it;
	// on Linux, data unacknowledged for four intervals (5s at least) drops
	// it too (TCP_USER_TIMEOUT). Default 15s; <0 disables both. No SSH-level
	// keepalive is sent: RouterOS's SSH server does not support
	// keepalive@openssh.com, and a server that ignores it, refuses it or
	// closes the connection on it must never cost a command in flight.
	KeepAliveInterval time.Duration
	MaxAttempts       int           // per command, transient failures only, default 4
	RetryBaseDelay    time.Duration // default 200ms, doubled per attempt, jittered
	RetryMaxDelay     time.Duration // default 5s

	// Observer, when set, sees every command attempt's outcome (for logs,
	// metrics and the demo). A command's secrets (an export password), and
	// a print's (a disk's nvme-tcp-server-secret), are shown as "<hidden>".
	Observer func(CommandRecord)
}

// CommandRecord describes one command as run.
type CommandRecord struct {
	Command  string
	Output   string
	Err      error
	Attempts int
	Duration time.Duration
}

// DefaultLoginOptions ask RouterOS for unwrapped, uncoloured output.
const DefaultLoginOptions = "ct511w4098h"

var loginOptionsPattern = regexp.MustCompile(`^([0-9]*[a-z])+$`)

func (c *Config) setDefaults() {
	if c.LoginOptions == "" {
		c.LoginOptions = DefaultLoginOptions
	}
	if c.Port == 0 {
		c.Port = 22
	}
	if c.MaxSessions <= 0 {
		c.MaxSessions = 4
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 10 * time.Second
	}
	if c.CommandTimeout <= 0 {
		c.CommandTimeout = 30 * time.Second
	}
	if c.CopyTimeout <= 0 {
		c.CopyTimeout = time.Hour
	}
	if c.KeepAliveInterval == 0 {
		c.KeepAliveInterval = 15 * time.Second
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 4
	}
	if c.RetryBaseDelay <= 0 {
		c.RetryBaseDelay = 200 * time.Millisecond
	}
	if c.RetryMaxDelay <= 0 {
		c.RetryMaxDelay = 5 * time.Second
	}
}

// Client runs RouterOS commands over one long-lived SSH connection, which it
// re-dials transparently after a failure. It is safe for concurrent use.
type Client struct {
	cfg    Config
	addr   string
	sshCfg *ssh.ClientConfig
	sem    chan struct{}

	mu      sync.Mutex
	conn    *ssh.Client
	dialing chan struct{} // closed when the dial in progress ends; nil when none
	dials   int
	closed  bool

	skipped atomic.Int64 // listing entries skipped as unreadable (SkippedEntries)

	memoMu sync.Mutex
	memo   map[string]exportMemo // by slot: candidates for hidden export properties (hidden.go)
}

// NewClient validates the configuration and loads the key and known_hosts.
// It does not connect; the first command does.
func NewClient(cfg Config) (*Client, error) {
	cfg.setDefaults()
	if cfg.Address == "" || cfg.User == "" {
		return nil, fmt.Errorf("%w: RDS address and user are required", ErrInvalidArgument)
	}
	signer := cfg.Signer
	if signer == nil {
		if cfg.KeyFile == "" {
			return nil, fmt.Errorf("%w: an SSH private key file is required", ErrInvalidArgument)
		}
		pem, err := os.ReadFile(cfg.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("reading SSH key: %w", err)
		}
		// The .pub beside the key is the usual mistake; its mode and
		// the parser would say only "readable by others" or "no key found".
		if IsPublicKey(pem) {
			return nil, fmt.Errorf("%w: SSH key %s is a public key; the private key is wanted (%s, the file without .pub)", ErrInvalidArgument, cfg.KeyFile, strings.TrimSuffix(cfg.KeyFile, ".pub"))
		}
		// Anyone who reads the key is the driver on the RDS. Readable by
		// others is refused; by the group (a Secret mounted 0440 for a
		// non-root fsGroup) is allowed with a warning.
		if fi, err := os.Stat(cfg.KeyFile); err == nil {
			switch perm := fi.Mode().Perm(); {
			case perm&0o007 != 0:
				return nil, fmt.Errorf("%w: SSH key %s is readable by others (mode %v); mount it with defaultMode 0400 or 0440", ErrInvalidArgument, cfg.KeyFile, perm)
			case perm&0o070 != 0:
				klog.Warningf("SSH key %s is readable by its group (mode %v); 0400 is enough unless the pod runs as a non-root fsGroup", cfg.KeyFile, perm)
			}
		}
		signer, err = ssh.ParsePrivateKey(pem)
		if err != nil {
			var missing *ssh.PassphraseMissingError
			if errors.As(err, &missing) {
				return nil, fmt.Errorf("%w: SSH key %s is passphrase-protected; mount an unencrypted key from a Secret", ErrInvalidArgument, cfg.KeyFile)
			}
			return nil, fmt.Errorf("%w: SSH key %s: %v", ErrInvalidArgument, cfg.KeyFile, err)
		}
	}
	login := cfg.User
	if cfg.LoginOptions != "none" && !strings.Contains(login, "+") {
		if err := ValidateLoginOptions(cfg.LoginOptions); err != nil {
			return nil, err
		}
		login += "+" + cfg.LoginOptions
	}
	addr := net.JoinHostPort(cfg.Address, strconv.Itoa(cfg.Port))
	sshCfg := &ssh.ClientConfig{
		User:    login,
		Auth:    []ssh.AuthMethod{ssh.PublicKeys(signer)},
		Timeout: cfg.DialTimeout,
	}
	if cfg.InsecureSkipHostKeyCheck {
		// A pinned key says which RDS is the right one; skipping the check
		// would silently accept another.
		if cfg.KnownHostsFile != "" {
			if cb, err := knownhosts.New(cfg.KnownHostsFile); err == nil && len(knownKeyAlgorithms(cb, addr)) > 0 {
				return nil, fmt.Errorf("%w: known_hosts %s pins the host key of %s, and skipping the host key check would accept any key; drop one of the two", ErrInvalidArgument, cfg.KnownHostsFile, knownhosts.Normalize(addr))
			}
		}
		klog.Warningf("INSECURE: RDS host key verification is disabled for %s; anyone on the network path can impersonate the RDS. Use a pinned known_hosts file outside labs.", addr)
		sshCfg.HostKeyCallback = ssh.InsecureIgnoreHostKey()
	} else {
		if cfg.KnownHostsFile == "" {
			return nil, fmt.Errorf("%w: a known_hosts file pinning the RDS host key is required (or the insecure lab option)", ErrInvalidArgument)
		}
		cb, err := knownhosts.New(cfg.KnownHostsFile)
		if err != nil {
			return nil, fmt.Errorf("%w: known_hosts %s: %v", ErrInvalidArgument, cfg.KnownHostsFile, err)
		}
		sshCfg.HostKeyCallback = pinnedHostKey(cb)
		sshCfg.HostKeyAlgorithms = knownKeyAlgorithms(cb, addr)
		if len(sshCfg.HostKeyAlgorithms) == 0 {
			return nil, fmt.Errorf("%w: known_hosts %s has no entry for %s", ErrInvalidArgument, cfg.KnownHostsFile, knownhosts.Normalize(addr))
		}
	}
	return &Client{cfg: cfg, addr: addr, sshCfg: sshCfg, sem: make(chan struct{}, cfg.MaxSessions), memo: map[string]exportMemo{}}, nil
}

// ValidateLoginOptions checks RouterOS console login options (sent after
// '+' in the user name), or "none" for none.
func ValidateLoginOptions(o string) error {
	if o != "none" && !loginOptionsPattern.MatchString(o) {
		return fmt.Errorf("%w: login options %q must be RouterOS console options such as %q, or none", ErrInvalidArgument, o, DefaultLoginOptions)
	}
	return nil
}

// IsPublicKey reports whether data is an SSH public key (a .pub file, an
// authorized_keys line, RFC 4716 or PEM public key) rather than a
// private key.
func IsPublicKey(data []byte) bool {
	if _, _, _, _, err := ssh.ParseAuthorizedKey(data); err == nil {
		return true
	}
	text := string(data)
	return strings.Contains(text, "---- BEGIN SSH2 PUBLIC KEY ----") || strings.Contains(text, "-----BEGIN PUBLIC KEY-----") ||
		strings.Contains(text, "-----BEGIN RSA PUBLIC KEY-----")
}

// pinnedHostKey turns knownhosts' errors into ErrHostKey.
func pinnedHostKey(cb ssh.HostKeyCallback) ssh.HostKeyCallback {
	return func(host string, remote net.Addr, key ssh.PublicKey) error {
		if err := cb(host, remote, key); err != nil {
			return fmt.Errorf("%w: %s presented %s %s: %v", ErrHostKey, host, key.Type(), ssh.FingerprintSHA256(key), err)
		}
		return nil
	}
}

// knownKeyAlgorithms lists the key types pinned for addr, so the server is
// asked for a key type we can verify rather than one we have no entry for.
func knownKeyAlgorithms(cb ssh.HostKeyCallback, addr string) []string {
	var ke *knownhosts.KeyError
	err := cb(addr, &net.TCPAddr{IP: net.IPv4zero}, probeKey{})
	if !errors.As(err, &ke) {
		return nil
	}
	var algos []string
	seen := map[string]bool{}
	for _, k := range ke.Want {
		t := k.Key.Type()
		names := []string{t}
		if t == ssh.KeyAlgoRSA {
			names = []string{ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256, ssh.KeyAlgoRSA}
		}
		for _, n := range names {
			if !seen[n] {
				seen[n] = true
				algos = append(algos, n)
			}
		}
	}
	return algos
}

// PinnedHostKeys lists the host keys the known_hosts file pins for the
// RDS at address and port (none: no entry).
func PinnedHostKeys(knownHostsFile, address string, port int) ([]ssh.PublicKey, error) {
	cb, err := knownhosts.New(knownHostsFile)
	if err != nil {
		return nil, fmt.Errorf("%w: known_hosts %s: %v", ErrInvalidArgument, knownHostsFile, err)
	}
	var ke *knownhosts.KeyError
	if err := cb(net.JoinHostPort(address, strconv.Itoa(port)), &net.TCPAddr{IP: net.IPv4zero}, probeKey{}); !errors.As(err, &ke) {
		return nil, nil
	}
	keys := make([]ssh.PublicKey, len(ke.Want))
	for i, k := range ke.Want {
		keys[i] = k.Key
	}
	return keys, nil
}

// probeKey is a key of a type no known_hosts line has; offering it to the
// knownhosts callback makes it list the keys it does know for a host.
type probeKey struct{}

func (probeKey) Type() string                        { return "rds-csi-probe" }
func (probeKey) Marshal() []byte                     { return []byte("rds-csi-probe") }
func (probeKey) Verify([]byte, *ssh.Signature) error { return errors.New("probe key") }

// Close closes the connection. The client cannot be used afterwards.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.conn != nil {
		err := c.conn.Close()
		c.conn = nil
		return err
	}
	return nil
}

// Dials reports how many SSH connections the client has opened.
func (c *Client) Dials() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dials
}

// Connected reports whether a connection is currently open.
func (c *Client) Connected() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn != nil
}

// connection returns the shared connection, dialling it when there is
// none. One caller dials, outside the lock; the others wait for that dial
// or their own deadline, whichever comes first, so a slow dial never holds
// a caller past its context.
func (c *Client) connection(ctx context.Context) (*ssh.Client, error) {
	for {
		c.mu.Lock()
		switch {
		case c.closed:
			c.mu.Unlock()
			return nil, errors.New("rds client is closed")
		case c.conn != nil:
			conn := c.conn
			c.mu.Unlock()
			return conn, nil
		case c.dialing != nil:
			wait := c.dialing
			c.mu.Unlock()
			select {
			case <-wait:
				continue // the dial ended: use its connection or dial again
			case <-ctx.Done():
				return nil, fmt.Errorf("%w: waiting for the connection to %s: %v", ErrTransient, c.addr, ctx.Err())
			}
		}
		done := make(chan struct{})
		c.dialing = done
		c.mu.Unlock()
		conn, err := c.dial(ctx)
		c.mu.Lock()
		c.dialing = nil
		close(done)
		if err == nil {
			if c.closed {
				c.mu.Unlock()
				conn.Close()
				return nil, errors.New("rds client is closed")
			}
			c.conn = conn
			c.dials++
		}
		c.mu.Unlock()
		return conn, err
	}
}

// errSilentPeer: the RDS accepted the TCP connection and sent no SSH
// banner, or did not answer a session's opening within the command's
// deadline. Another attempt within the same command would wait the same
// way, so the command is not retried (it stays ErrTransient for its
// caller).
var errSilentPeer = errors.New("no SSH banner")

// dial opens a new SSH connection, the TCP connect and the SSH handshake
// bounded together by DialTimeout (and ctx). It logs what it waits for, so
// that a silent RDS is visible before the timeout.
func (c *Client) dial(ctx context.Context) (*ssh.Client, error) {
	logger := klog.FromContext(ctx).WithValues("address", c.addr)
	dctx, cancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
	defer cancel()
	start := time.Now()
	logger.V(2).Info("connecting to the RDS over SSH", "timeout", c.cfg.DialTimeout)
	tcp, err := c.dialer().DialContext(dctx, "tcp", c.addr)
	if err != nil {
		return nil, fmt.Errorf("%w: dial %s: %v", ErrTransient, c.addr, err)
	}
	// The handshake has no context; bound it with a deadline on the socket.
	if dl, ok := dctx.Deadline(); ok {
		_ = tcp.SetDeadline(dl)
	}
	watched := &readCounter{Conn: tcp}
	// Say what is being waited for when the handshake is slow: a TCP
	// accept with no SSH banner otherwise looks like nothing at all.
	slow := time.AfterFunc(min(2*time.Second, c.cfg.DialTimeout/2), func() {
		if watched.n.Load() == 0 {
			logger.Info("waiting for the RDS's SSH banner: the TCP connection is open and the RDS has sent nothing yet", "waited", time.Since(start).Round(time.Millisecond), "timeout", c.cfg.DialTimeout)
		} else {
			logger.Info("waiting for the RDS to finish the SSH handshake (key exchange, host key, authentication)", "waited", time.Since(start).Round(time.Millisecond), "timeout", c.cfg.DialTimeout)
		}
	})
	sc, chans, reqs, err := ssh.NewClientConn(watched, c.addr, c.sshCfg)
	slow.Stop()
	if err != nil {
		tcp.Close()
		switch {
		case errors.Is(err, ErrHostKey):
			return nil, err
		case isAuthFailure(err):
			return nil, fmt.Errorf("%w: %w: SSH authentication to %s as %q refused: check the key and the RDS user", ErrInvalidArgument, ErrAuthRefused, c.addr, c.cfg.User)
		case watched.n.Load() == 0 && isTimeout(err):
			return nil, fmt.Errorf("%w: %w: %s accepted the TCP connection but sent no SSH banner within %s; is the RDS's SSH service (/ip service ssh) on that port, and is the RDS answering?",
				ErrTransient, errSilentPeer, c.addr, time.Since(start).Round(time.Millisecond))
		}
		return nil, fmt.Errorf("%w: SSH handshake with %s: %v", ErrTransient, c.addr, err)
	}
	_ = tcp.SetDeadline(time.Time{})
	logger.V(2).Info("connected to the RDS over SSH", "took", time.Since(start).Round(time.Millisecond))
	return ssh.NewClient(sc, chans, reqs), nil
}

// dialer sets TCP keepalive (see Config.KeepAliveInterval) on the SSH
// connection's socket.
func (c *Client) dialer() *net.Dialer {
	ka := c.cfg.KeepAliveInterval
	if ka < 0 {
		return &net.Dialer{KeepAlive: -1}
	}
	return &net.Dialer{
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: ka, Interval: ka, Count: 3},
		Control: func(_, _ string, rc syscall.RawConn) error {
			return setUserTimeout(rc, max(4*ka, 5*time.Second))
		},
	}
}

// readCounter counts the bytes read from a connection.
type readCounter struct {
	net.Conn
	n atomic.Int64
}

func (r *readCounter) Read(p []byte) (int, error) {
	n, err := r.Conn.Read(p)
	r.n.Add(int64(n))
	return n, err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

func isAuthFailure(err error) bool {
	return err != nil && bytes.Contains([]byte(err.Error()), []byte("unable to authenticate"))
}

// drop forgets conn if it is still the current connection.
func (c *Client) drop(conn *ssh.Client) {
	c.mu.Lock()
	if c.conn == conn {
		c.conn = nil
	}
	c.mu.Unlock()
	conn.Close()
}

// run executes one command, retrying transport failures with jittered
// exponential backoff, and turns RouterOS error text into errors.
func (c *Client) run(ctx context.Context, cmd string) (string, error) {
	return c.runHiding(ctx, cmd, nil)
}

// runHiding is run for a command that carries secrets (an export
// password): each of them is replaced by "<hidden>" in everything the
// command leaves behind, the Observer's record (command log, metrics,
// the demo) and the error (CommandError's command and RouterOS's answer,
// which may quote the command back), so that only the SSH session sees
// them.
func (c *Client) runHiding(ctx context.Context, cmd string, secrets []string) (string, error) {
	start := time.Now()
	var (
		out      string
		err      error
		attempts int
	)
	timeout, resend := c.cfg.CommandTimeout, true
	if isCopy(cmd) {
		// A copy may run for long, and must not run twice: a re-sent
		// add could find a partial copy and take it for the result.
		timeout, resend = c.cfg.CopyTimeout, false
	}
	if isConditional(cmd) {
		// A compare-and-swap (SwapExport) whose outcome is unknown may
		// still land; a second copy of it is a second chance for its
		// condition to match later, after its state came back (ABA).
		// The caller re-reads and decides again instead.
		resend = false
	}
	for attempts = 1; ; attempts++ {
		out, err = c.runOnce(ctx, cmd, timeout)
		if err == nil {
			if isPrint(cmd) {
				err = classifyOutput(cmd, out)
			} else {
				err = classifySilent(cmd, out)
			}
			break
		}
		if !errors.Is(err, ErrTransient) || attempts >= c.cfg.MaxAttempts || ctx.Err() != nil ||
			(!resend && errors.Is(err, ErrOutcomeUnknown)) || errors.Is(err, errSilentPeer) {
			break
		}
		klog.FromContext(ctx).V(2).Info("retrying RDS command after transport failure", "attempt", attempts, "err", err)
		if werr := c.wait(ctx, attempts); werr != nil {
			break
		}
	}
	if len(secrets) > 0 {
		out, err = hideSecrets(out, secrets), hideInError(err, secrets)
		cmd = hideSecrets(cmd, secrets)
	}
	if c.cfg.Observer != nil {
		seen := out
		if isPrint(cmd) {
			// A print of a disk with an export password shows its secret.
			seen = hideSensitiveOutput(out)
		}
		c.cfg.Observer(CommandRecord{Command: cmd, Output: seen, Err: err, Attempts: attempts, Duration: time.Since(start)})
	}
	return out, err
}

func hideSecrets(s string, secrets []string) string {
	for _, v := range secrets {
		if v != "" {
			s = strings.ReplaceAll(s, v, hiddenValue)
		}
	}
	return s
}

// hideInError hides secrets in a CommandError (the only error that
// carries a command or RouterOS's text); another error that shows one
// anyway is replaced by its text with them hidden, keeping its kind.
func hideInError(err error, secrets []string) error {
	if err == nil {
		return nil
	}
	var ce *CommandError
	if errors.As(err, &ce) {
		ce.Command, ce.Output = hideSecrets(ce.Command, secrets), hideSecrets(ce.Output, secrets)
	}
	if msg := err.Error(); hideSecrets(msg, secrets) != msg {
		return &hiddenError{msg: hideSecrets(msg, secrets), err: err}
	}
	return err
}

// hiddenError is an error whose text had secrets hidden; errors.Is and As
// still see what it wraps.
type hiddenError struct {
	msg string
	err error
}

func (e *hiddenError) Error() string { return e.msg }
func (e *hiddenError) Unwrap() error { return e.err }

// exec renders a command (see command) and runs it.
func (c *Client) exec(ctx context.Context, format string, values ...string) (string, error) {
	cmd, err := command(format, values...)
	if err != nil {
		return "", err
	}
	return c.run(ctx, cmd)
}

// isCopy: /disk add copy-from.
func isCopy(cmd string) bool { return strings.Contains(cmd, " copy-from=") }

// isConditional: a command that acts only where its [find where ...]
// condition still holds.
func isConditional(cmd string) bool {
	return strings.Contains(cmd, " set [find where ")
}

// isPrint tells a print command (or monitor-traffic), whose output is
// data, from a command that prints nothing when it succeeds.
func isPrint(cmd string) bool {
	return strings.Contains(cmd, " print") || strings.Contains(cmd, " monitor-traffic ")
}

// printDetail runs a `print detail` command and parses its entries; an
// entry it cannot read fails it (printListing reads the others).
func (c *Client) printDetail(ctx context.Context, format string, values ...string) ([]Entry, error) {
	l, err := c.printListing(ctx, format, values...)
	if err != nil {
		return nil, err
	}
	return l.strict()
}

// printListing runs a `print detail` command and parses its entries,
// skipping the ones it cannot read. Output that is not a listing at all is
// RouterOS refusing the command, whatever its wording.
func (c *Client) printListing(ctx context.Context, format string, values ...string) (Listing, error) {
	cmd, err := command(format, values...)
	if err != nil {
		return Listing{}, err
	}
	out, err := c.run(ctx, cmd)
	if err != nil {
		return Listing{}, err
	}
	l, err := ParseListing(out)
	if err != nil {
		line := strings.TrimSpace(firstLine(out))
		if !strings.Contains(line, "=") && !strings.HasPrefix(line, "Flags:") && !entryStart.MatchString(line) {
			return Listing{}, &CommandError{Command: cmd, Output: line, kind: errorKind(line)}
		}
		return Listing{}, fmt.Errorf("%w (command: %s)", err, cmd)
	}
	return l, nil
}

func (c *Client) wait(ctx context.Context, attempt int) error {
	d := c.cfg.RetryBaseDelay << (attempt - 1)
	if d > c.cfg.RetryMaxDelay || d <= 0 {
		d = c.cfg.RetryMaxDelay
	}
	d = d/2 + rand.N(d/2+1) // jitter in [d/2, d]
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// runOnce is one attempt: one session on the shared connection, bounded
// by timeout, the session's opening included. A command that outlives it
// has its session closed; the connection and the other sessions on it
// carry on (a dead peer is found by TCP keepalive and the user timeout,
// see Config.KeepAliveInterval).
func (c *Client) runOnce(ctx context.Context, cmd string, timeout time.Duration) (string, error) {
	select {
	case c.sem <- struct{}{}:
		defer func() { <-c.sem }()
	case <-ctx.Done():
		return "", fmt.Errorf("%w: waiting for an SSH session slot: %v", ErrTransient, ctx.Err())
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := c.connection(cctx)
	if err != nil {
		return "", err
	}
	sess, err := openSession(cctx, conn)
	switch {
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		// Nothing was sent. The connection is left to TCP keepalive and
		// the user timeout (commands in flight on it may still be
		// answered); another attempt on it now would wait the same way.
		return "", fmt.Errorf("%w: %w: opening an SSH session on the connection to %s: %v", ErrTransient, errSilentPeer, c.addr, err)
	case err != nil:
		c.drop(conn)
		return "", fmt.Errorf("%w: opening SSH session: %v", ErrTransient, err)
	}
	// x/crypto/ssh copies stdout and stderr in separate goroutines; a shared
	// writer must be locked or replies get lost.
	var buf lockedBuffer
	sess.Stdout = &buf
	sess.Stderr = &buf
	if err := sess.Start(cmd); err != nil {
		sess.Close()
		c.drop(conn)
		// The exec request may have gone out before the connection was
		// lost, and RouterOS may have run it: its outcome is unknown.
		return "", fmt.Errorf("%w: starting the command: %v", ErrOutcomeUnknown, err)
	}
	done := make(chan error, 1)
	go func() { done <- sess.Wait() }()
	select {
	case err = <-done:
		sess.Close()
	case <-cctx.Done():
		// Only this session is given up; its goroutine ends when the
		// channel closes.
		sess.Close()
		return "", fmt.Errorf("%w: command timed out after it was sent: %v", ErrOutcomeUnknown, cctx.Err())
	}
	var exitErr *ssh.ExitError
	switch {
	case err == nil:
		return buf.String(), nil
	case errors.As(err, &exitErr):
		// RouterOS reports errors in the text; a non-zero status is not a
		// transport failure, but it is a refusal: the text says which.
		line := strings.TrimSpace(firstLine(buf.String()))
		if line == "" {
			return "", &CommandError{Command: cmd, Output: fmt.Sprintf("exit status %d without output", exitErr.ExitStatus()), kind: ErrCommandFailed}
		}
		return "", &CommandError{Command: cmd, Output: line, kind: errorKind(line)}
	case errors.Is(err, io.EOF), isExitMissing(err):
		c.drop(conn)
		return "", fmt.Errorf("%w: connection lost during command", ErrOutcomeUnknown)
	default:
		c.drop(conn)
		return "", fmt.Errorf("%w: %v", ErrOutcomeUnknown, err)
	}
}

// openSession opens a session on conn, giving up at ctx's end (a session
// opened after that is closed at once).
func openSession(ctx context.Context, conn *ssh.Client) (*ssh.Session, error) {
	type result struct {
		s   *ssh.Session
		err error
	}
	done := make(chan result, 1)
	go func() {
		s, err := conn.NewSession()
		done <- result{s, err}
	}()
	select {
	case r := <-done:
		return r.s, r.err
	case <-ctx.Done():
		go func() {
			if r := <-done; r.s != nil {
				r.s.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// lockedBuffer is a bytes.Buffer safe for the two copy goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *lockedBuffer) Bytes() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Clone(l.b.Bytes())
}

func isExitMissing(err error) bool {
	var em *ssh.ExitMissingError
	return errors.As(err, &em)
}
