package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// A controller started outside a cluster without --kubeconfig says how to
// run it without the API (--publish=false), not only how to give it one.
func TestControllerWithoutAPINamesPublishFalse(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	for _, extra := range [][]string{nil, {"--kubeconfig=" + dir + "/nope"}} {
		args := append([]string{"--mode=controller", "--rds-address=10.0.0.1", "--rds-key-file=" + dir + "/key", "--rds-known-hosts-file=" + dir + "/kh"}, extra...)
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), args, &stdout, &stderr); code != 1 {
			t.Errorf("%v: exit %d, want 1", extra, code)
		}
		for _, want := range []string{"--kubeconfig", "--publish=false"} {
			if !strings.Contains(stderr.String(), want) {
				t.Errorf("%v: %q does not mention %s", extra, stderr.String(), want)
			}
		}
	}
}
