package health

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/srvlab/rds-csi/pkg/metrics"
)

// switchable is a readiness check whose answer the test sets.
type switchable struct {
	mu  sync.Mutex
	err error
}

func (c *switchable) set(err error) { c.mu.Lock(); c.err = err; c.mu.Unlock() }
func (c *switchable) check(context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func get(t *testing.T, client *http.Client, url string) (int, string) {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading the body: %v", url, err)
	}
	return resp.StatusCode, string(body)
}

func TestReadyzFlipsWhenChecksPass(t *testing.T) {
	informers := &switchable{err: errors.New("informers not synced: VolumeAttachment")}
	rds := &switchable{err: errors.New("dial tcp 192.0.2.1:22: connection refused")}
	s, err := New(Check{Name: "informers-synced", Func: informers.check}, Check{Name: "rds", Func: rds.check})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()

	steps := []struct {
		name          string
		informers     error
		rds           error
		wantCode      int
		wantInBody    []string
		wantNotInBody []string
	}{
		{
			name:      "both failing",
			informers: errors.New("informers not synced: VolumeAttachment"), rds: errors.New("dial tcp 192.0.2.1:22: connection refused"),
			wantCode:   http.StatusServiceUnavailable,
			wantInBody: []string{"[-]informers-synced failed: informers not synced: VolumeAttachment", "[-]rds failed: dial tcp 192.0.2.1:22: connection refused", "readyz check failed: informers-synced, rds"},
		},
		{
			name: "informers synced, RDS still down", rds: errors.New("ssh: handshake failed"),
			wantCode:      http.StatusServiceUnavailable,
			wantInBody:    []string{"[+]informers-synced ok", "[-]rds failed: ssh: handshake failed", "readyz check failed: rds"},
			wantNotInBody: []string{"informers-synced failed"},
		},
		{
			name:       "all pass",
			wantCode:   http.StatusOK,
			wantInBody: []string{"[+]informers-synced ok", "[+]rds ok", "ok"},
		},
		{
			name: "RDS lost again", rds: errors.New("multi\nline"),
			wantCode:   http.StatusServiceUnavailable,
			wantInBody: []string{"[-]rds failed: multi; line"},
		},
	}
	for _, st := range steps {
		informers.set(st.informers)
		rds.set(st.rds)
		code, body := get(t, srv.Client(), srv.URL+"/readyz")
		if code != st.wantCode {
			t.Errorf("%s: /readyz status %d, want %d; body:\n%s", st.name, code, st.wantCode, body)
		}
		for _, want := range st.wantInBody {
			if !strings.Contains(body, want) {
				t.Errorf("%s: /readyz body lacks %q:\n%s", st.name, want, body)
			}
		}
		for _, not := range st.wantNotInBody {
			if strings.Contains(body, not) {
				t.Errorf("%s: /readyz body has %q:\n%s", st.name, not, body)
			}
		}
		// Liveness never depends on the checks.
		if code, body := get(t, srv.Client(), srv.URL+"/healthz"); code != http.StatusOK || body != "ok\n" {
			t.Errorf("%s: /healthz = %d %q, want 200 ok", st.name, code, body)
		}
	}
}

func TestReadyzWithoutChecksIsReady(t *testing.T) {
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	if code, body := get(t, srv.Client(), srv.URL+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz = %d %q, want 200", code, body)
	}
}

func TestAHangingCheckFailsInsteadOfHanging(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	s, err := New(Check{Name: "stuck", Func: func(context.Context) error {
		<-release // ignores its context, like a dial without a deadline
		return nil
	}}, Check{Name: "quick", Func: func(context.Context) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	s.CheckTimeout = 20 * time.Millisecond
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	code, body := get(t, srv.Client(), srv.URL+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "[-]stuck failed: no answer: context deadline exceeded") ||
		!strings.Contains(body, "[+]quick ok") || strings.Contains(body, "quick failed") {
		t.Errorf("/readyz = %d:\n%s\nwant 503 naming the stuck check, and the check that answered in time ok", code, body)
	}
}

func TestCheckNamesAreValidated(t *testing.T) {
	ok := func(context.Context) error { return nil }
	tests := []struct {
		name   string
		checks []Check
	}{
		{"empty name", []Check{{Name: "", Func: ok}}},
		{"space", []Check{{Name: "rds reachable", Func: ok}}},
		{"no function", []Check{{Name: "rds"}}},
		{"duplicate", []Check{{Name: "rds", Func: ok}, {Name: "rds", Func: ok}}},
	}
	for _, tc := range tests {
		if _, err := New(tc.checks...); err == nil {
			t.Errorf("%s: New accepted %v", tc.name, tc.checks)
		}
	}
	if _, err := New(Check{Name: "rds", Func: ok}, Check{Name: "informers-synced", Func: ok}); err != nil {
		t.Errorf("New with two valid checks: %v", err)
	}
}

// TestServeUntilContextDone runs the real listener: /healthz, /readyz and
// /metrics from pkg/metrics are served, and cancelling the context stops
// the server and frees the port.
func TestServeUntilContextDone(t *testing.T) {
	m := metrics.New()
	informers := &switchable{err: errors.New("not synced")}
	s, err := New(Check{Name: "informers-synced", Func: informers.check})
	if err != nil {
		t.Fatal(err)
	}
	s.Handle("/metrics", m.Handler())

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := "http://" + lis.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, lis) }()

	client := &http.Client{Timeout: 5 * time.Second}
	if code, _ := get(t, client, addr+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz = %d", code)
	}
	if code, _ := get(t, client, addr+"/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz before sync = %d, want 503", code)
	}
	informers.set(nil)
	if code, _ := get(t, client, addr+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz after sync = %d, want 200", code)
	}
	m.SetLeader(true)
	code, body := get(t, client, addr+"/metrics")
	if code != http.StatusOK || !strings.Contains(body, "\nrds_csi_leader 1\n") {
		t.Errorf("/metrics = %d, want 200 with rds_csi_leader 1:\n%.2000s", code, body)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve after cancel: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return within 30s of its context being cancelled")
	}
	// The port is closed: nothing answers any more.
	if resp, err := client.Get(addr + "/healthz"); err == nil {
		resp.Body.Close()
		t.Error("the server still answers after Serve returned")
	}
}

func TestListenAndServeReportsABadAddress(t *testing.T) {
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	err = s.ListenAndServe(context.Background(), "127.0.0.1:not-a-port")
	if err == nil || !strings.Contains(err.Error(), "listening for diagnostics on 127.0.0.1:not-a-port") {
		t.Errorf("ListenAndServe = %v, want a listen error naming the address", err)
	}
}
