package health

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
)

// Check is one named readiness condition; Func returns nil when it holds,
// otherwise an error saying what is missing (it ends up in the /readyz body
// and in the log).
type Check struct {
	Name string
	Func func(ctx context.Context) error
}

// DefaultCheckTimeout bounds one readiness check, so a hanging dependency
// makes /readyz fail instead of hang past the kubelet's probe timeout.
const DefaultCheckTimeout = 5 * time.Second

// shutdownTimeout bounds how long in-flight requests may finish once the
// context is done.
const shutdownTimeout = 5 * time.Second

// Server serves /healthz, /readyz and any handler mounted with Handle.
type Server struct {
	// CheckTimeout bounds each readiness check (DefaultCheckTimeout if 0).
	// Set it before serving.
	CheckTimeout time.Duration

	mux    *http.ServeMux
	checks []Check // fixed by New

	// lastReady is what the last /readyz answered (0: none yet, 1: ready,
	// 2: not ready), for logging transitions only.
	lastReady atomic.Int32
}

// New returns a Server with the given readiness checks; names must be
// unique, non-empty and without spaces or slashes.
func New(checks ...Check) (*Server, error) {
	seen := map[string]bool{}
	for _, c := range checks {
		switch {
		case c.Name == "" || strings.ContainsAny(c.Name, " \n/"):
			return nil, fmt.Errorf("readiness check name %q must be non-empty without spaces or slashes", c.Name)
		case c.Func == nil:
			return nil, fmt.Errorf("readiness check %q has no function", c.Name)
		case seen[c.Name]:
			return nil, fmt.Errorf("readiness check %q is registered twice", c.Name)
		}
		seen[c.Name] = true
	}
	s := &Server{mux: http.NewServeMux(), checks: slices.Clone(checks)}
	s.mux.HandleFunc("/healthz", s.healthz)
	s.mux.HandleFunc("/readyz", s.readyz)
	return s, nil
}

// Handle mounts h at pattern (for example "/metrics").
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// Handler is the server's routes, for tests and for embedding.
func (s *Server) Handler() http.Handler { return s.mux }

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write([]byte("ok\n"))
}

// run runs every check concurrently under one deadline and returns their
// errors in registration order. A check that ignores its context counts as
// a timeout instead of hanging the probe.
func (s *Server) run(ctx context.Context) []error {
	timeout := s.CheckTimeout
	if timeout <= 0 {
		timeout = DefaultCheckTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	done := make([]chan error, len(s.checks))
	for i, c := range s.checks {
		done[i] = make(chan error, 1)
		go func() { done[i] <- c.Func(ctx) }()
	}
	errs := make([]error, len(s.checks))
	for i := range done {
		select {
		case errs[i] = <-done[i]:
		case <-ctx.Done():
			select { // an answer that came in time counts
			case errs[i] = <-done[i]:
			default:
				errs[i] = fmt.Errorf("no answer: %w", ctx.Err())
			}
		}
	}
	return errs
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	errs := s.run(r.Context())
	var b strings.Builder
	var failed []string
	for i, c := range s.checks {
		if errs[i] != nil {
			failed = append(failed, c.Name)
			fmt.Fprintf(&b, "[-]%s failed: %s\n", c.Name, strings.ReplaceAll(errs[i].Error(), "\n", "; "))
			continue
		}
		fmt.Fprintf(&b, "[+]%s ok\n", c.Name)
	}
	s.logTransition(r.Context(), errs, len(failed) == 0)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if len(failed) > 0 {
		fmt.Fprintf(&b, "readyz check failed: %s\n", strings.Join(failed, ", "))
		w.WriteHeader(http.StatusServiceUnavailable)
	} else {
		b.WriteString("ok\n")
	}
	_, _ = w.Write([]byte(b.String()))
}

// logTransition logs when readiness changes, not on every probe.
func (s *Server) logTransition(ctx context.Context, errs []error, ready bool) {
	state := int32(2)
	if ready {
		state = 1
	}
	if s.lastReady.Swap(state) == state {
		return
	}
	logger := klog.FromContext(ctx)
	if ready {
		logger.Info("ready: every readiness check passes", "checks", len(s.checks))
		return
	}
	for i, err := range errs {
		if err != nil {
			logger.Info("not ready", "check", s.checks[i].Name, "reason", err.Error())
		}
	}
}

// Serve serves on lis until ctx is done, then shuts down gracefully
// (in-flight requests get a few seconds). It returns nil after a shutdown
// caused by ctx, and the error if serving fails before.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	srv := &http.Server{
		Handler:           s.mux,
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serving diagnostics on %s: %w", lis.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		return fmt.Errorf("serving diagnostics on %s: %w", lis.Addr(), serr)
	}
	if err != nil {
		return fmt.Errorf("stopping the diagnostics server on %s: %w", lis.Addr(), err)
	}
	return nil
}

// ListenAndServe listens on addr (host:port, ":8080") and serves until ctx
// is done; see Serve.
func (s *Server) ListenAndServe(ctx context.Context, addr string) error {
	var lc net.ListenConfig
	lis, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("listening for diagnostics on %s: %w", addr, err)
	}
	return s.Serve(ctx, lis)
}
