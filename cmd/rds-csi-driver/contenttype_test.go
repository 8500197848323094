package main

import (
	"context"
	"flag"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The controller's requests ask kube-apiserver for protobuf by default
// (and say protobuf for the bodies they send), JSON when told; a value
// that is neither is refused at start.
func TestKubeAPIContentType(t *testing.T) {
	var mu sync.Mutex
	var accept string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		accept = r.Header.Get("Accept")
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"kind":"Node","apiVersion":"v1","metadata":{"name":"n"}}`))
	}))
	defer srv.Close()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: "+srv.URL+"\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user: {}\ncurrent-context: c\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args       []string
		wantAccept string
		problem    string
	}{
		{nil, "application/vnd.kubernetes.protobuf,application/json", ""},
		{[]string{"--kube-api-content-type=application/json"}, "application/json", ""},
		{[]string{"--kube-api-content-type=application/yaml"}, "", `--kube-api-content-type="application/yaml" is neither`},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		o := controllerOptions{MigrationTimeout: 1, ExportReconcilePeriod: DefaultRDSCommandTimeout, RDSCommandTimeout: DefaultRDSCommandTimeout,
			WatchStallThreshold: 1, ReactionTimeout: 1}
		o.addFlags(fs)
		if err := fs.Parse(append([]string{"--kubeconfig=" + kubeconfig}, tc.args...)); err != nil {
			t.Fatal(err)
		}
		err := o.validate()
		if tc.problem != "" {
			if err == nil || !strings.Contains(err.Error(), tc.problem) {
				t.Errorf("%v: validate() = %v, want %q", tc.args, err, tc.problem)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		cfg, err := o.restConfig()
		if err != nil {
			t.Fatal(err)
		}
		c, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.CoreV1().Nodes().Get(context.Background(), "n", metav1.GetOptions{}); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		mu.Lock()
		got := accept
		mu.Unlock()
		if got != tc.wantAccept {
			t.Errorf("%v: Accept %q, want %q", tc.args, got, tc.wantAccept)
		}
		if cfg.ContentType != strings.Split(tc.wantAccept, ",")[0] {
			t.Errorf("%v: request bodies as %q, want %q", tc.args, cfg.ContentType, strings.Split(tc.wantAccept, ",")[0])
		}
	}
}
