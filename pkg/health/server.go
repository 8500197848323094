package health

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
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

	mux *http.ServeMux

	mu        sync.Mutex
	checks    []Check
	lastReady *bool // for logging transitions only
}

// New returns a Server with the given readiness checks.
func New(checks ...Check) (*Server, error) {
	s := &Server{mux: http.NewServeMux()}
	for _, c := range checks {
		if err := s.AddCheck(c); err != nil {
			return nil, err
		}
	}
	s.mux.HandleFunc("/healthz", s.healthz)
	s.mux.HandleFunc("/readyz", s.readyz)
	return s, nil
}

// AddCheck adds a readiness check; names must be unique and non-empty. It
// may be called while serving (for example once the informers exist).
func (s *Server) AddCheck(c Check) error {
	if c.Name == "" || strings.ContainsAny(c.Name, " \n/") {
		return fmt.Errorf("readiness check name %q must be non-empty without spaces or slashes", c.Name)
	}
	if c.Func == nil {
		return fmt.Errorf("readiness check %q has no function", c.Name)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, have := range s.checks {
		if have.Name == c.Name {
			return fmt.Errorf("readiness check %q is registered twice", c.Name)
		}
	}
	s.checks = append(s.checks, c)
	return nil
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

type checkResult struct {
	name string
	err  error
}

// run runs every check concurrently, each under the check timeout, and
// returns the results in registration order.
func (s *Server) run(ctx context.Context) []checkResult {
	s.mu.Lock()
	checks := append([]Check(nil), s.checks...)
	s.mu.Unlock()
	timeout := s.CheckTimeout
	if timeout <= 0 {
		timeout = DefaultCheckTimeout
	}
	results := make([]checkResult, len(checks))
	var wg sync.WaitGroup
	for i, c := range checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			results[i] = checkResult{name: c.Name, err: runCheck(cctx, c)}
		}()
	}
	wg.Wait()
	return results
}

// runCheck runs c, turning a check that ignores its context into a
// timeout instead of a hung probe.
func runCheck(ctx context.Context, c Check) error {
	done := make(chan error, 1)
	go func() { done <- c.Func(ctx) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("no answer: %w", ctx.Err())
	}
}

// Ready reports nil when every check passes, otherwise an error naming each
// failing check.
func (s *Server) Ready(ctx context.Context) error {
	var errs []error
	for _, r := range s.run(ctx) {
		if r.err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", r.name, r.err))
		}
	}
	return errors.Join(errs...)
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	results := s.run(r.Context())
	var b strings.Builder
	var failed []string
	for _, res := range results {
		if res.err != nil {
			failed = append(failed, res.name)
			fmt.Fprintf(&b, "[-]%s failed: %s\n", res.name, oneLine(res.err.Error()))
			continue
		}
		fmt.Fprintf(&b, "[+]%s ok\n", res.name)
	}
	s.logTransition(r.Context(), failed, results)
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
func (s *Server) logTransition(ctx context.Context, failed []string, results []checkResult) {
	ready := len(failed) == 0
	s.mu.Lock()
	changed := s.lastReady == nil || *s.lastReady != ready
	s.lastReady = &ready
	s.mu.Unlock()
	if !changed {
		return
	}
	logger := klog.FromContext(ctx)
	if ready {
		logger.Info("ready: every readiness check passes", "checks", len(results))
		return
	}
	for _, res := range results {
		if res.err != nil {
			logger.Info("not ready", "check", res.name, "reason", res.err.Error())
		}
	}
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", "; ") }

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
