package vm

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The test binary doubles as a fake qemu-system-x86_64 (TestMain): with
// FAKE_QEMU set it plays a guest instead of running the tests.
//
//	FAKE_QEMU_KVM   what it does under -enable-kvm: "abort" (QEMU's
//	                "failed to set MSR" assertion, at once), "hang" (the
//	                firmware's and kernel's real-mode lines, then nothing,
//	                until killed), "boot" (a guest like under TCG),
//	                "probe-only" (reaches /init in a probe boot, crashes in
//	                a run)
//	FAKE_QEMU_EXIT  the exit status the "guest command" writes (default 0)
//	FAKE_QEMU_LOG   a file that gets one line per start: "kvm" or "tcg",
//	                and "probe" for a probe boot
//
// A guest run checks what the real /init relies on: the results share
// (-fsdev id=results, QEMU's option escaping undone) holds run.sh, and no
// host path is on the kernel command line.
func TestMain(m *testing.M) {
	if os.Getenv("FAKE_QEMU") == "1" {
		os.Exit(fakeQEMU(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// fakeQEMUConfig is a Config whose QEMU is this test binary in fake mode.
func fakeQEMUConfig(t *testing.T, kvmBehaviour string) Config {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("FAKE_QEMU", "1")
	t.Setenv("FAKE_QEMU_KVM", kvmBehaviour)
	t.Setenv("FAKE_QEMU_LOG", filepath.Join(t.TempDir(), "starts"))
	// Any file will do as kernel and initramfs: the fake reads neither.
	return Config{Kernel: exe, Initrd: exe, QEMU: exe}
}

// fakeStarts is what FAKE_QEMU_LOG recorded.
func fakeStarts(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(os.Getenv("FAKE_QEMU_LOG"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(strings.ReplaceAll(string(b), " ", "-"))
}

func fakeQEMU(args []string) int {
	kvm, probe := false, false
	var appendLine, results string
	for i := 0; i < len(args); i++ {
		switch args[i] {
		case "-enable-kvm":
			kvm = true
		case "-append":
			i++
			appendLine = args[i]
			probe = strings.Contains(" "+appendLine+" ", " rdsvm.probe=1 ")
		case "-fsdev":
			i++
			opts := qemuOpts(args[i])
			if opts["id"] == "results" {
				results = opts["path"]
			}
		}
	}
	start := "tcg"
	if kvm {
		start = "kvm"
	}
	if probe {
		start += " probe"
	}
	if f, err := os.OpenFile(os.Getenv("FAKE_QEMU_LOG"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
		fmt.Fprintln(f, start)
		f.Close()
	}
	if kvm {
		switch os.Getenv("FAKE_QEMU_KVM") {
		case "abort":
			fmt.Println("qemu-system-x86_64: error: failed to set MSR 0x10a to 0x69")
			fmt.Println("qemu-system-x86_64: ../../target/i386/kvm/kvm.c:3045: kvm_buf_set_msrs: Assertion `ret == cpu->kvm_msr_buf->nmsrs' failed.")
			return 134
		case "hang":
			fmt.Println("Probing EDD (edd=off to disable)... ok")
			time.Sleep(time.Hour) // killed by the caller's deadline
			return 1
		case "probe-only":
			if !probe {
				fmt.Println("qemu-system-x86_64: KVM: entry failed, hardware error 0x80000021")
				return 1
			}
		case "boot":
		default:
			fmt.Println("fake qemu: FAKE_QEMU_KVM not set")
			return 2
		}
	}
	fmt.Println("Probing EDD (edd=off to disable)... ok")
	fmt.Println("rdsvm: init reached")
	if probe {
		return 0
	}
	if results == "" {
		fmt.Println("fake qemu: no -fsdev id=results")
		return 3
	}
	if strings.Contains(appendLine, results) {
		fmt.Printf("fake qemu: the results path is on the kernel command line: %q\n", appendLine)
		return 3
	}
	sh, err := os.ReadFile(filepath.Join(results, "run.sh"))
	if err != nil {
		fmt.Printf("fake qemu: results share %q: %v\n", results, err)
		return 3
	}
	fmt.Printf("guest: run.sh has %d bytes\n", len(sh))
	status := os.Getenv("FAKE_QEMU_EXIT")
	if status == "" {
		status = "0"
	}
	if err := os.WriteFile(filepath.Join(results, "exit-status"), []byte(status+"\n"), 0o644); err != nil {
		fmt.Printf("fake qemu: %v\n", err)
		return 3
	}
	return 0
}

// qemuOpts parses a QEMU option list such as "local,id=x,path=a,,b" the
// way QEMU does: a doubled comma is a comma inside a value.
func qemuOpts(s string) map[string]string {
	opts := map[string]string{}
	var parts []string
	var cur strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == ',' {
			if i+1 < len(s) && s[i+1] == ',' {
				cur.WriteByte(',')
				i++
				continue
			}
			parts = append(parts, cur.String())
			cur.Reset()
			continue
		}
		cur.WriteByte(s[i])
	}
	parts = append(parts, cur.String())
	for _, p := range parts {
		k, v, _ := strings.Cut(p, "=")
		opts[k] = v
	}
	return opts
}
