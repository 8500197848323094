package framework

import (
	"os"
	"testing"
	"time"
)

func TestParseProcStatCPU(t *testing.T) {
	// A command name with a space and a ")" in it; utime 250, stime 31.
	line := "4242 (kube ) api) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 31 0 0 20 0 12 0 123 456 789\n"
	got, err := parseProcStatCPU([]byte(line))
	if err != nil || got != 2810*time.Millisecond {
		t.Fatalf("parseProcStatCPU = %v, %v; want 2.81s", got, err)
	}
	for _, bad := range []string{"4242 no name here", "4242 (x) S 1 2 3", "4242 (x) S 1 4242 4242 0 -1 4194560 100 0 0 0 2x0 31 0"} {
		if _, err := parseProcStatCPU([]byte(bad)); err == nil {
			t.Errorf("parseProcStatCPU(%q) took it", bad)
		}
	}
	if _, err := ReadProcCPU(os.Getpid()); err != nil {
		t.Fatalf("this process: %v", err)
	}
}
