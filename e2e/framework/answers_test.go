package framework

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestDriverAnswersAndMaxHolders(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "ctrl-a.log")
	b := filepath.Join(dir, "ctrl-b.log")
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(a, `I1123 10:00:00.000100   42 controllerpublish.go:308] "published" volume="pvc-1" node="node-2" pv="pvc-1" reason="" verdict="allow"
I1123 10:00:00.000200   42 server.go:80] "response" method="/csi.v1.Controller/ControllerPublishVolume" id=3 response="{}" duration="12.5ms"
I1123 10:00:00.000300   42 server.go:80] "response" method="/csi.v1.Controller/ControllerPublishVolume" id=4 response="{}" duration="3ms"
I1123 10:00:05.000000   42 controllerpublish.go:381] "unpublished" volume="pvc-1" node="node-2" pv="pvc-1" released=true
`)
	// ctrl-b publishes node-3 before ctrl-a's unpublish of node-2, then
	// publishes another volume after it.
	write(b, `I1123 10:00:04.000000   43 controllerpublish.go:308] "published" method="/csi.v1.Controller/ControllerPublishVolume" id=20 volume="pvc-1" node="node-3" pv="pvc-1"
I1123 10:00:06.000000   43 controllerpublish.go:308] "published" volume="pvc-2" node="node-1" pv="pvc-2"
`)
	answers, err := DriverAnswers(a, b)
	if err != nil {
		t.Fatal(err)
	}
	if len(answers) != 4 || answers[1].Replica != "ctrl-b" || !answers[1].Publish || answers[2].Publish {
		t.Fatalf("answers %v", answers)
	}
	if n, why := MaxHolders(answers, "pvc-1"); n != 2 || len(why) != 2 {
		t.Fatalf("pvc-1: %d holders (%v), want 2", n, why)
	}
	if n, _ := MaxHolders(answers, "pvc-2"); n != 1 {
		t.Fatalf("pvc-2: %d holders, want 1", n)
	}
	ds, err := PublishDurations(a, b)
	if err != nil || len(ds) != 2 || Quantile(ds, 0) != 3*time.Millisecond || Quantile(ds, 1) != 12500*time.Microsecond {
		t.Fatalf("publish durations %v, %v", ds, err)
	}
}
