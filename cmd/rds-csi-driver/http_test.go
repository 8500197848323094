package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// --http-endpoint is served in every mode: node mode and a controller
// without the Kubernetes API (--publish=false) too, with the metrics of
// what runs there.
func TestHTTPEndpointInEveryMode(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "id_ed25519")
	if _, err := rdssim.WriteClientKey(key, "test"); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		args  []string
		wants []string // in /metrics
	}{
		{"node", []string{"--mode=node", "--node-id=n1", "--rds-name=rds1", "--node-nvme-dir=" + filepath.Join(dir, "nvme")},
			[]string{`rds_csi_node_operation_duration_seconds_count{operation="stage",result="success"} 0`, "rds_csi_node_connected_subsystems 0", "go_goroutines"}},
		{"controller --publish=false", []string{"--mode=controller", "--publish=false", "--rds-address=127.0.0.1", "--rds-port=1",
			"--rds-key-file=" + key, "--rds-insecure-skip-host-key-check"},
			[]string{"rds_csi_rds_ssh_connected"}},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			addr := freeAddr(t)
			args := append(tc.args, "--endpoint=unix://"+filepath.Join(dir, tc.name[:4]+string(rune('0'+i))+".sock"), "--http-endpoint="+addr)
			ctx, cancel := context.WithCancel(context.Background())
			var stderr bytes.Buffer
			done := make(chan int)
			go func() { done <- run(ctx, args, io.Discard, &stderr) }()
			defer func() {
				cancel()
				if code := <-done; code != 0 {
					t.Errorf("exit %d: %s", code, stderr.String())
				}
			}()
			var body string
			err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
				resp, err := http.Get("http://" + addr + "/metrics")
				if err != nil {
					return false, nil
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				body = string(b)
				return resp.StatusCode == http.StatusOK, nil
			})
			if err != nil {
				t.Fatalf("no /metrics on %s: %v; stderr: %s", addr, err, stderr.String())
			}
			for _, w := range tc.wants {
				if !strings.Contains(body, w) {
					t.Errorf("/metrics lacks %q", w)
				}
			}
			resp, err := http.Get("http://" + addr + "/healthz")
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Errorf("/healthz: %v %v", resp, err)
			} else {
				resp.Body.Close()
			}
		})
	}
}
