// Command lab-runc runs runc with an OOM score the machine allows. The
// kubelet tier uses it as containerd's runtime binary only where no
// process may lower an OOM score: the machines this project is built on
// run in a sandbox whose capability bounding set lacks CAP_SYS_RESOURCE,
// so writing a negative value to /proc/self/oom_score_adj is refused, and
// runc fails every pod sandbox (the kubelet gives sandboxes -998 and
// critical pods' containers -997) with "failed to update
// /proc/self/oom_score_adj: Permission denied". The OOM score decides only
// whom the kernel kills first when memory runs out; nothing the tier tests
// depends on it.
//
// For `create`, `run` and `exec`, the bundle's config.json
// (process.oomScoreAdj) or the --process file (oomScoreAdj) gets the
// caller's own score where it asks for a lower one; then the runc named by
// $LAB_RUNC runs with the same arguments.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

func main() {
	real := os.Getenv("LAB_RUNC")
	if real == "" {
		fmt.Fprintln(os.Stderr, "lab-runc: LAB_RUNC names no runc")
		os.Exit(1)
	}
	if err := clamp(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "lab-runc:", err)
		os.Exit(1)
	}
	err := syscall.Exec(real, append([]string{real}, os.Args[1:]...), os.Environ())
	fmt.Fprintln(os.Stderr, "lab-runc: exec", real+":", err)
	os.Exit(1)
}

// clamp raises the OOM score the spec asks for to this process's own.
func clamp(args []string) error {
	own, err := ownScore()
	if err != nil {
		return err
	}
	for i, a := range args {
		val := ""
		switch {
		case (a == "--bundle" || a == "-b") && i+1 < len(args):
			val = filepath.Join(args[i+1], "config.json")
		case strings.HasPrefix(a, "--bundle="):
			val = filepath.Join(strings.TrimPrefix(a, "--bundle="), "config.json")
		case (a == "--process" || a == "-p") && i+1 < len(args):
			val = args[i+1]
		case strings.HasPrefix(a, "--process="):
			val = strings.TrimPrefix(a, "--process=")
		}
		if val != "" {
			if err := clampFile(val, own); err != nil {
				return err
			}
		}
	}
	return nil
}

func ownScore() (int, error) {
	b, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// clampFile rewrites a runtime spec (config.json: process.oomScoreAdj) or
// a process spec (oomScoreAdj) whose score is below own; other fields are
// kept as they are.
func clampFile(path string, own int) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	proc := doc
	if p, ok := doc["process"].(map[string]any); ok {
		proc = p
	}
	v, ok := proc["oomScoreAdj"].(float64)
	if !ok || int(v) >= own {
		return nil
	}
	proc["oomScoreAdj"] = own
	out, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, st.Mode().Perm())
}
