package framework

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// FreezeAPIServer stops kube-apiserver (SIGSTOP): every client's requests
// and watches hang, as in an outage of the API server's host. It returns
// the function that resumes it (SIGCONT).
func (cp *ControlPlane) FreezeAPIServer(tl *Timeline) (resume func() error, err error) {
	b, err := os.ReadFile(filepath.Join(cp.Dir, "pids", "kube-apiserver.pid"))
	if err != nil {
		return nil, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver.pid: %w", err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return nil, fmt.Errorf("SIGSTOP kube-apiserver (pid %d): %w", pid, err)
	}
	tl.Logf("kube-apiserver (pid %d) frozen", pid)
	return func() error {
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			return fmt.Errorf("SIGCONT kube-apiserver (pid %d): %w", pid, err)
		}
		tl.Logf("kube-apiserver (pid %d) resumed", pid)
		return nil
	}, nil
}
