package framework

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// A real node of the kubelet tier lives in a network namespace of its own
// that the test makes (realnode.go); nothing of it is routed to the host's
// network. What must cross the boundary crosses here, in this process, by
// sockets made inside the node's namespace and spliced to loopback sockets
// of the host: the node's kubelet and pods reach the API server and the
// RDS simulator through listeners on addresses of the node's own loopback,
// and the API server reaches the kubelets through an HTTP CONNECT proxy on
// a unix socket (its egress selector) that dials into the node.

// inNetns runs fn on an OS thread that has joined the network namespace at
// nsPath, so that sockets fn makes belong to that namespace. The thread
// goes back to this process's namespace afterwards; one that cannot is
// left locked and so ends with the goroutine.
func inNetns(nsPath string, fn func() error) error {
	target, err := os.Open(nsPath)
	if err != nil {
		return err
	}
	defer target.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			errc <- err
			return
		}
		defer self.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", nsPath, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("setns back: %w", err)) // the thread stays locked and dies
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// ListenInNetns listens on addr (TCP) inside the network namespace nsPath.
func ListenInNetns(nsPath, addr string) (net.Listener, error) {
	var l net.Listener
	err := inNetns(nsPath, func() (err error) {
		l, err = net.Listen("tcp", addr)
		return err
	})
	return l, err
}

// DialInNetns connects to addr (TCP) from inside the network namespace nsPath.
func DialInNetns(ctx context.Context, nsPath, addr string) (net.Conn, error) {
	var c net.Conn
	err := inNetns(nsPath, func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	return c, err
}

// Forwarder accepts on one listener and splices each connection to a new
// one from dial; Close stops it and closes every connection it made.
type Forwarder struct {
	l     net.Listener
	dial  func(ctx context.Context) (net.Conn, error)
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// Forward serves l until Close, splicing to what dial returns.
func Forward(l net.Listener, dial func(ctx context.Context) (net.Conn, error)) *Forwarder {
	ctx, stop := context.WithCancel(context.Background())
	f := &Forwarder{l: l, dial: dial, ctx: ctx, stop: stop, conns: map[net.Conn]struct{}{}}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				f.serve(c)
			}()
		}
	}()
	return f
}

func (f *Forwarder) track(c net.Conn, add bool) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !add {
		delete(f.conns, c)
		return true
	}
	if f.ctx.Err() != nil {
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *Forwarder) serve(c net.Conn) {
	if !f.track(c, true) {
		c.Close()
		return
	}
	defer f.track(c, false)
	defer c.Close()
	up, err := f.dial(f.ctx)
	if err != nil {
		return
	}
	if !f.track(up, true) {
		up.Close()
		return
	}
	defer f.track(up, false)
	defer up.Close()
	splice(c, up)
}

// splice copies both ways until either side ends.
func splice(a, b net.Conn) {
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if tc, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	<-done
}

// Close stops accepting and cuts every connection, as a node that loses
// power cuts its own.
func (f *Forwarder) Close() {
	f.stop()
	f.l.Close()
	f.mu.Lock()
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// EgressProxy is the API server's way into the nodes: kube-apiserver's
// egress selector (EgressSelectorConfiguration, selection "cluster",
// HTTPConnect over a unix socket) sends "CONNECT ip:port" for every
// connection to a kubelet (logs, exec, port-forward, the node proxy); the
// proxy finds the node by the address asked for (its name, kube-apiserver's
// first choice, or its IP) and dials from inside its network namespace,
// to the node's IP.
type EgressProxy struct {
	Socket string
	mu     sync.Mutex
	nodes  map[string]string // node name or IP -> network namespace path
	ips    map[string]string // node name -> IP
	fwd    *Forwarder
}

// StartEgressProxy listens on the unix socket path.
func StartEgressProxy(path string) (*EgressProxy, error) {
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	p := &EgressProxy{Socket: path, nodes: map[string]string{}, ips: map[string]string{}}
	p.fwd = &Forwarder{l: l, conns: map[net.Conn]struct{}{}}
	p.fwd.ctx, p.fwd.stop = context.WithCancel(context.Background())
	p.fwd.wg.Add(1)
	go func() {
		defer p.fwd.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.fwd.wg.Add(1)
			go func() {
				defer p.fwd.wg.Done()
				p.serve(c)
			}()
		}
	}()
	return p, nil
}

// Route sends connections to the node name or ip into the network
// namespace nsPath; an empty nsPath removes the route (a node that lost
// power answers nothing).
func (p *EgressProxy) Route(name, ip, nsPath string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if nsPath == "" {
		delete(p.nodes, ip)
		delete(p.nodes, name)
		delete(p.ips, name)
		return
	}
	p.nodes[ip], p.nodes[name], p.ips[name] = nsPath, nsPath, ip
}

func (p *EgressProxy) serve(c net.Conn) {
	f := p.fwd
	if !f.track(c, true) {
		c.Close()
		return
	}
	defer f.track(c, false)
	defer c.Close()
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	fail := func(code int, msg string) {
		fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s", code, http.StatusText(code), len(msg), msg)
	}
	if req.Method != http.MethodConnect {
		fail(http.StatusMethodNotAllowed, "only CONNECT")
		return
	}
	host, port, err := net.SplitHostPort(req.Host)
	if err != nil {
		fail(http.StatusBadRequest, err.Error())
		return
	}
	p.mu.Lock()
	ns := p.nodes[host]
	p.mu.Unlock()
	if ns == "" {
		fail(http.StatusBadGateway, "no node has the address "+host)
		return
	}
	p.mu.Lock()
	if ip := p.ips[host]; ip != "" {
		host = ip
	}
	p.mu.Unlock()
	up, err := DialInNetns(f.ctx, ns, net.JoinHostPort(host, port))
	if err != nil {
		fail(http.StatusBadGateway, strings.TrimSpace(err.Error()))
		return
	}
	if !f.track(up, true) {
		up.Close()
		return
	}
	defer f.track(up, false)
	defer up.Close()
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	// Bytes the client sent after its request are in br's buffer.
	if n := br.Buffered(); n > 0 {
		b, _ := br.Peek(n)
		if _, err := up.Write(b); err != nil {
			return
		}
	}
	splice(c, up)
}

// Close stops the proxy and cuts its connections.
func (p *EgressProxy) Close() { p.fwd.Close() }

// EgressSelectorConfig is kube-apiserver's --egress-selector-config-file
// for the proxy on socket.
func EgressSelectorConfig(socket string) string {
	return `apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: ` + socket + "\n"
}
