package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --node-lease needs the API and a namespace: outside a pod (no token
// mounted) without --kubeconfig the start fails naming what is missing,
// and with a kubeconfig but no --node-lease-namespace it fails naming the
// flag (there is no pod namespace to default to); nothing is served
// either time.
func TestNodeLeaseNeedsTheAPIAndANamespace(t *testing.T) {
	if _, err := os.Stat("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
		t.Skip("running in a pod: its namespace is the default")
	}
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`{"apiVersion": "v1", "kind": "Config",
 "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
 "users": [{"name": "u", "user": {"token": "t"}}],
 "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}], "current-context": "c"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		extra []string
		want  string
	}{
		{[]string{"--node-lease"}, "--node-lease needs the Kubernetes API"},
		{[]string{"--node-lease", "--kubeconfig=" + kubeconfig}, "--node-lease outside a pod needs --node-lease-namespace"},
	} {
		args, endpoint := nodeArgs(dir, i)
		code, serving, stderr := startOrExit(t, append(args, tc.extra...), endpoint)
		if serving || code != 1 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, serving %t, stderr %q; want exit 1 naming %q", tc.extra, code, serving, stderr, tc.want)
		}
	}
}
