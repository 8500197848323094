package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/srvlab/rds-csi/pkg/rds"
	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// simWithKey starts the simulator and returns rdsctl's connection flags
// and a client of the driver's kind for arranging state.
func simWithKey(t *testing.T, mods ...func(*rdssim.Config)) ([]string, *rds.Client, *rdssim.Server) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "id_ed25519")
	pub, err := rdssim.WriteClientKey(keyFile, "rdsctl test")
	if err != nil {
		t.Fatal(err)
	}
	cfg := rdssim.Config{DataDir: filepath.Join(dir, "pool"), AuthorizedKeys: []ssh.PublicKey{pub}}
	for _, m := range mods {
		m(&cfg)
	}
	srv, err := rdssim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	addr, err := srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	host, portStr, _ := strings.Cut(addr, ":")
	port, _ := strconv.Atoi(portStr)
	client, err := rds.NewClient(rds.Config{Address: host, Port: port, User: "admin", KeyFile: keyFile, InsecureSkipHostKeyCheck: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return []string{"--address", host, "--port", portStr, "--key", keyFile, "--insecure-skip-host-key-check"}, client, srv
}

// rdsctl and the driver name the same files by default: what rdsctl
// creates is where the driver looks, and rdsctl deletes the driver's
// snapshot files.
func TestRdsctlUsesTheDriversNaming(t *testing.T) {
	flags, client, srv := simWithKey(t)
	ctx := context.Background()
	if err := run(append(flags, "create", "pvc-1", "1G"), io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	d, err := client.GetDisk(ctx, "pvc-1")
	if err != nil {
		t.Fatal(err)
	}
	if d.FilePath != rds.VolumeFilePath(rds.DefaultVolumePath, "pvc-1") || d.FilePath != "/storage-pool/kubernetes-volumes/pvc-1.img" {
		t.Errorf("rdsctl created %s; the driver's default is %s", d.FilePath, rds.VolumeFilePath(rds.DefaultVolumePath, "pvc-1"))
	}
	// A snapshot as the driver names it (pkg/csi snapshotFilePath).
	snapFile := rds.DefaultVolumePath + "/snapshots/snap-1.src-pvc-1.t-1767323045000000006.img"
	if _, err := client.CopyDisk(ctx, rds.CopyDiskRequest{Slot: "snap-1", FilePath: snapFile, SourceSlot: "pvc-1"}); err != nil {
		t.Fatal(err)
	}
	if err := run(append(flags, "delete", "snap-1"), io.Discard, io.Discard); err != nil {
		t.Fatalf("rdsctl delete of the driver's snapshot: %v", err)
	}
	if err := run(append(flags, "delete", "pvc-1"), io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	if disks := srv.Disks(); len(disks) != 0 {
		t.Errorf("disks left: %+v", disks)
	}
	if _, err := client.GetFile(ctx, snapFile); err == nil {
		t.Errorf("snapshot file %s left behind", snapFile)
	}
	// A disk that is not the driver's is refused.
	if _, err := client.CreateDisk(ctx, rds.CreateDiskRequest{Slot: "other", FilePath: "/storage-pool/elsewhere/other.img", Size: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	if err := run(append(flags, "delete", "other"), io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "not a volume or snapshot file") {
		t.Errorf("delete of a foreign disk: %v", err)
	}
}

// An operator opens and closes an export with the driver's own fencing
// calls: a move turns the export off first, a close clears the host, and
// a close for a host the export is no longer open to leaves it open.
func TestRdsctlExport(t *testing.T) {
	flags, client, srv := simWithKey(t)
	ctx := context.Background()
	const a, b = "nqn.2014-08.org.nvmexpress:uuid:a", "nqn.2014-08.org.nvmexpress:uuid:b"
	state := func() (bool, string) {
		d, err := client.GetDisk(ctx, "pvc-1")
		if err != nil {
			t.Fatal(err)
		}
		return d.Exported, d.AllowHost
	}
	if err := run(append(flags, "-closed", "create", "pvc-1", "1G"), io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	if exp, _ := state(); exp {
		t.Fatal("-closed create exported the disk")
	}
	steps := []struct {
		args     []string
		exported bool
		host     string
		drops    int
		err      string
	}{
		{args: []string{"export", "pvc-1", "on", a}, exported: true, host: a},
		{args: []string{"export", "pvc-1", "on", a}, exported: true, host: a},
		{args: []string{"export", "pvc-1", "on", b}, exported: true, host: b, drops: 1},
		{args: []string{"-keep-connections", "export", "pvc-1", "on", a}, exported: true, host: a, drops: 1},
		{args: []string{"export", "pvc-1", "off", b}, exported: true, host: a, drops: 1, err: "left open"},
		{args: []string{"export", "pvc-1", "off"}, exported: false, host: "", drops: 2},
		{args: []string{"export", "pvc-1", "off"}, exported: false, host: "", drops: 2},
		{args: []string{"export", "pvc-1", "on", "any"}, exported: true, host: "", drops: 2},
		{args: []string{"export", "pvc-1", "off", "any"}, exported: false, host: "", drops: 3},
		{args: []string{"export", "pvc-1", "on"}, exported: false, host: "", drops: 3, err: "usage"},
		{args: []string{"export", "pvc-1", "on", "host-b"}, exported: false, host: "", drops: 3, err: "invalid argument"},
		{args: []string{"export", "pvc-9", "on", a}, exported: false, host: "", drops: 3, err: "not found"},
	}
	for _, st := range steps {
		err := run(append(flags, st.args...), io.Discard, io.Discard)
		if st.err == "" && err != nil || st.err != "" && (err == nil || !strings.Contains(err.Error(), st.err)) {
			t.Fatalf("rdsctl %s: %v, want %q", strings.Join(st.args, " "), err, st.err)
		}
		if exp, host := state(); exp != st.exported || host != st.host {
			t.Errorf("after rdsctl %s: exported %v to %q, want %v to %q", strings.Join(st.args, " "), exp, host, st.exported, st.host)
		}
		if got := srv.ConnectionDrops("pvc-1"); got != st.drops {
			t.Errorf("after rdsctl %s: %d connection drops, want %d", strings.Join(st.args, " "), got, st.drops)
		}
	}
}

// TestMain lets the tests run rdsctl as a process (rdsctlProcess): its
// exit status and what it writes to stdout and stderr, logs included.
func TestMain(m *testing.M) {
	if os.Getenv("RDSCTL_TEST_RUN_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// rdsctlProcess runs rdsctl with args as its own process.
func rdsctlProcess(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "RDSCTL_TEST_RUN_MAIN=1")
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return code, out.String(), errOut.String()
}

// Flags after the command are parsed (or refused when unknown), never
// ignored; -h is help, not an error; extra arguments are refused.
func TestRdsctlCommandLine(t *testing.T) {
	flags, _, _ := simWithKey(t)
	code, out, errOut := rdsctlProcess(t, append([]string{"list", "-show-commands"}, flags...)...)
	if code != 0 || !strings.Contains(out, "  > /disk print detail where type=file") {
		t.Errorf("list -show-commands: exit %d, stdout %q, stderr %q: the flag after the command was not applied", code, out, errOut)
	}
	code, out, errOut = rdsctlProcess(t, append(flags, "list", "--json")...)
	if code != 2 || !strings.Contains(errOut, "-json") || out != "" {
		t.Errorf("list --json: exit %d, stdout %q, stderr %q; want exit 2 naming the unknown flag", code, out, errOut)
	}
	for _, help := range []string{"-h", "--help"} {
		code, out, _ = rdsctlProcess(t, help)
		if code != 0 || !strings.Contains(out, "usage: rdsctl") || !strings.Contains(out, "-show-commands") {
			t.Errorf("%s: exit %d, stdout %q; want the usage and exit 0", help, code, out)
		}
	}
	for _, args := range [][]string{{"list", "extra"}, {"get"}, {"get", "a", "b"}, {"create", "pvc-1"}, {"frobnicate"}, {}, {"export", "pvc-1", "on"}, {"export", "pvc-1", "open", "any"}} {
		code, out, errOut = rdsctlProcess(t, append(flags, args...)...)
		if code != 2 || out != "" || !strings.Contains(errOut, "rdsctl -h") {
			t.Errorf("rdsctl %q: exit %d, stdout %q, stderr %q; want a usage error (exit 2)", args, code, out, errOut)
		}
	}
}

// Ports and the timeout are range-checked before anything is dialled.
func TestRdsctlRanges(t *testing.T) {
	flags, _, _ := simWithKey(t)
	for _, tc := range []struct{ flag, says string }{
		{"-port=0", "-port"}, {"-port=70000", "-port"}, {"-nvme-port=0", "-nvme-port"}, {"-nvme-port=65536", "-nvme-port"},
		{"-timeout=0", "-timeout"}, {"-timeout=-1s", "-timeout"}, {"-timeout=1ms", "-timeout must be at least 1s"},
		{"-login-options=c+t", "-login-options: invalid argument"},
		{"-pool=a b", "-pool"}, {"-base-path=relative", "-base-path"}, {"-nqn-prefix=mikrotik:", "-nqn-prefix"},
	} {
		code, _, errOut := rdsctlProcess(t, append(append([]string{}, flags...), tc.flag, "probe")...)
		if code != 2 || !strings.Contains(errOut, tc.says) {
			t.Errorf("%s: exit %d, stderr %q; want exit 2 naming %s", tc.flag, code, errOut, tc.says)
		}
	}
}

// stdout is rdsctl's answer and nothing else, stderr is empty on success:
// the client's INFO lines (an export change logs one) appear with -v only.
func TestRdsctlOutputIsPipeClean(t *testing.T) {
	insecure, _, srv := simWithKey(t)
	// A pinned host key: skipping the check would warn on stderr, by design.
	knownHosts := filepath.Join(t.TempDir(), "known_hosts")
	if err := srv.WriteKnownHosts(knownHosts); err != nil {
		t.Fatal(err)
	}
	flags := append(insecure[:len(insecure)-1:len(insecure)-1], "--known-hosts", knownHosts)
	const host = "nqn.2014-08.org.nvmexpress:uuid:a"
	if err := run(append(flags, "create", "pvc-1", "1G"), io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := rdsctlProcess(t, append(flags, "export", "pvc-1", "on", host)...)
	if code != 0 || !strings.HasPrefix(out, "pvc-1: exported to "+host) || strings.Count(out, "\n") != 1 {
		t.Errorf("export on: exit %d, stdout %q", code, out)
	}
	if errOut != "" {
		t.Errorf("export on wrote to stderr besides its answer: %q", errOut)
	}
	code, _, errOut = rdsctlProcess(t, append(flags, "-v", "export", "pvc-1", "off")...)
	if code != 0 || !strings.Contains(errOut, "RDS export closed") {
		t.Errorf("-v export off: exit %d, stderr %q; want the client's log", code, errOut)
	}
}

// Sizes: a size that is not a whole number of bytes, or not a size, is a
// usage error naming the input (not blamed on RouterOS), nothing created;
// a shrink is refused, the disk unchanged.
func TestRdsctlSizes(t *testing.T) {
	flags, client, srv := simWithKey(t)
	for _, tc := range []struct{ size, says string }{
		{"1.5", `size "1.5" is 1.5 bytes, not a whole number of bytes`},
		{"abc", `size "abc" is not a number`},
		{"0", `size "0" must be more than 0 bytes`},
	} {
		code, out, errOut := rdsctlProcess(t, append(flags, "create", "pvc-1", tc.size)...)
		if code != 2 || !strings.Contains(errOut, tc.says) || strings.Contains(errOut, "RouterOS") || out != "" {
			t.Errorf("create pvc-1 %s: exit %d, stdout %q, stderr %q; want %q", tc.size, code, out, errOut, tc.says)
		}
		if d := srv.Disks(); len(d) != 0 {
			t.Fatalf("create pvc-1 %s created %+v", tc.size, d)
		}
	}
	if err := run(append(flags, "create", "pvc-1", "1G"), io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := rdsctlProcess(t, append(flags, "resize", "pvc-1", "512M")...)
	if code != 1 || !strings.Contains(errOut, "disk pvc-1 has 1073741824 bytes, more than the 536870912 of size \"512M\": disks never shrink") || out != "" {
		t.Errorf("resize to a smaller size: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if d, err := client.GetDisk(context.Background(), "pvc-1"); err != nil || d.Size != rds.GiB {
		t.Errorf("after a refused shrink: %+v %v", d, err)
	}
	if code, out, errOut = rdsctlProcess(t, append(flags, "resize", "pvc-1", "2G")...); code != 0 || !strings.Contains(out, "2147483648") {
		t.Errorf("resize to 2G: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// A disk without a backing file (the pool itself) is refused by name.
func TestRdsctlDeleteOfADiskWithoutFile(t *testing.T) {
	flags, _, _ := simWithKey(t)
	code, _, errOut := rdsctlProcess(t, append(flags, "delete", "storage-pool")...)
	if code != 1 || !strings.Contains(errOut, "disk storage-pool has no backing file") || strings.Contains(errOut, "uses ,") {
		t.Errorf("delete storage-pool: exit %d, stderr %q", code, errOut)
	}
}

// create of a disk that exists says so and changes nothing (the client's
// create is idempotent for the driver's retries, which by hand hid that
// -closed left an open disk open).
func TestRdsctlCreateOfAnExistingDisk(t *testing.T) {
	flags, client, _ := simWithKey(t)
	if err := run(append(flags, "create", "pvc-1", "1G"), io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"create", "pvc-1", "1G"}, {"-closed", "create", "pvc-1", "1G"}, {"create", "pvc-1", "2G"}} {
		code, out, errOut := rdsctlProcess(t, append(flags, args...)...)
		if code != 1 || out != "" || !strings.Contains(errOut, "disk pvc-1 exists already (1073741824 bytes, exported to any host); nothing changed") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
	if d, err := client.GetDisk(context.Background(), "pvc-1"); err != nil || !d.Exported || d.Size != rds.GiB {
		t.Errorf("after the refused creates: %+v %v", d, err)
	}
}

// A create whose /disk add ran but whose reply was lost, and whose
// clean-up then failed to remove the file, leaves the backing file
// without a disk. The file path is the slot's own (rdsctl names files as
// the driver does), so the next create takes the file for debris of that
// attempt and removes it, as the driver's CreateVolume does, instead of
// failing on "already exists" for ever; a file some disk uses is never
// removed.
func TestRdsctlCreateAfterALostReplyAndAFailedCleanup(t *testing.T) {
	flags, client, srv := simWithKey(t)
	// Every /disk add runs and its reply is lost: the first creates the
	// disk, the client's re-sends find it there and are lost too, so the
	// outcome stays unknown and the client cleans up; the clean-up
	// removes the disk but fails to remove the file.
	srv.InjectFault(rdssim.Fault{Kind: rdssim.FaultDropAfterExec, Match: "/disk add", Count: -1})
	srv.FailNth(1, "/file remove", "failure: simulated failure")
	var stdout, stderr bytes.Buffer
	if err := run(append(flags, "create", "pvc-1", "1G"), &stdout, &stderr); err == nil {
		t.Fatalf("the create with a lost reply and a failed clean-up succeeded: %s", stdout.String())
	}
	srv.ClearFaults()
	ctx := context.Background()
	if _, err := client.GetDisk(ctx, "pvc-1"); !errors.Is(err, rds.ErrNotFound) {
		t.Fatalf("after the failed create: disk %v, want none", err)
	}
	file := rds.VolumeFilePath(rds.DefaultVolumePath, "pvc-1")
	if _, err := client.GetFile(ctx, file); err != nil {
		t.Fatalf("the failed clean-up left no file to block the slot (%v): the fault injection did not reproduce the case", err)
	}
	code, out, errOut := rdsctlProcess(t, append(flags, "create", "pvc-1", "1G")...)
	if code != 0 || !strings.Contains(out, "pvc-1") {
		t.Fatalf("create after the failed one: exit %d, stdout %q, stderr %q; want the slot's leftover file removed and the disk created", code, out, errOut)
	}
	if d, err := client.GetDisk(ctx, "pvc-1"); err != nil || d.FilePath != file || d.Size != rds.GiB {
		t.Errorf("created: %+v %v", d, err)
	}
	// A file a disk uses is never taken for debris: a disk in another
	// slot on pvc-2's path keeps it, and the create fails.
	if _, err := client.CreateDisk(ctx, rds.CreateDiskRequest{Slot: "other", FilePath: rds.VolumeFilePath(rds.DefaultVolumePath, "pvc-2"), Size: rds.GiB}); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = rdsctlProcess(t, append(flags, "create", "pvc-2", "1G")...)
	if code != 1 || !strings.Contains(errOut, "already exists") {
		t.Errorf("create over a file another disk uses: exit %d, stderr %q; want it refused", code, errOut)
	}
	if d, err := client.GetDisk(ctx, "other"); err != nil || d.FilePath != rds.VolumeFilePath(rds.DefaultVolumePath, "pvc-2") {
		t.Errorf("the disk using the file: %+v %v", d, err)
	}
}

// rdsctl copy sets the copy's whole export (closed, its own NQN and
// port): on a RouterOS whose copy-from takes the source's properties (as
// its CLI manual describes add's copy-from), a copy that left them to
// RouterOS answered to the source's NQN once exported.
func TestRdsctlCopySetsItsOwnExport(t *testing.T) {
	flags, client, _ := simWithKey(t, func(c *rdssim.Config) { c.CopyFromProperties = rdssim.CopyFromInherit })
	ctx := context.Background()
	if err := run(append(flags, "create", "pvc-src", "1G"), io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	if err := run(append(flags, "copy", "pvc-copy", "pvc-src"), io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	src, err := client.GetDisk(ctx, "pvc-src")
	if err != nil {
		t.Fatal(err)
	}
	d, err := client.GetDisk(ctx, "pvc-copy")
	if err != nil {
		t.Fatal(err)
	}
	if d.Exported || d.NQN == src.NQN || d.NQN != "nqn.2000-02.com.mikrotik:pvc-copy" {
		t.Errorf("the copy: exported=%t NQN %q (the source's is %q); want closed, with its own NQN", d.Exported, d.NQN, src.NQN)
	}
}

// Arguments that cannot be right (a slot, a size, a host NQN) are usage
// errors, exit 2 and nothing done, told apart from a failure of the RDS
// (exit 1) by a script; they are checked before anything is dialled.
func TestRdsctlBadArgumentsAreUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"get", "a b"}, `get: invalid argument: slot "a b"`},
		{[]string{"create", "pvc-1", "10X"}, `size "10X" is not a number`},
		{[]string{"create", "pvc-1", "0"}, `size "0" must be more than 0 bytes`},
		{[]string{"create", "pvc-1", "8E"}, `size "8E"`},
		{[]string{"resize", "pvc-1", "1Q"}, `size "1Q"`},
		{[]string{"resize", "PVC", "1G"}, `slot "PVC"`},
		{[]string{"delete", "../x"}, `slot "../x"`},
		{[]string{"copy", "pvc-2", "pvc 1"}, `SOURCE: invalid argument: slot "pvc 1"`},
		{[]string{"copy", "pvc-2", "pvc-1", "1.5"}, `size "1.5"`},
		{[]string{"allow-host", "pvc-1", "notnqn"}, `NQN "notnqn"`},
		{[]string{"export", "a;b", "off"}, `slot "a;b"`},
		{[]string{"gen-key", ""}, "PATH is empty"},
	} {
		var stdout, stderr bytes.Buffer
		code := cli(append(closedRDS(t), tc.args...), &stdout, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), tc.says) || strings.Contains(stderr.String(), "dial") || stdout.Len() != 0 {
			t.Errorf("%q: exit %d, stderr %q: want a usage error (exit 2) saying %s", tc.args, code, stderr.String(), tc.says)
		}
	}
}

// A negative size ("create pvc-1 -1") is the size argument, not an
// unknown flag: one line that names the size. A negative value of a flag
// that takes one stays that flag's value.
func TestRdsctlNegativeSize(t *testing.T) {
	for _, args := range [][]string{{"create", "pvc-1", "-1"}, {"resize", "pvc-1", "-5G"}, {"copy", "pvc-2", "pvc-1", "-.5G"}, {"create", "-show-commands", "pvc-1", "-1"}} {
		var stdout, stderr bytes.Buffer
		code := cli(append(closedRDS(t), args...), &stdout, &stderr)
		out := strings.TrimSpace(stderr.String())
		if code != 2 || strings.Count(out, "\n") != 0 || !strings.Contains(out, `size "`+args[len(args)-1]+`"`) {
			t.Errorf("%q: exit %d, stderr %q: want one line naming the size", args, code, out)
		}
	}
	var stdout, stderr bytes.Buffer
	base := closedRDS(t)
	base = base[:len(base)-2] // its own -timeout
	code := cli(append(base, "-timeout", "-1s", "probe"), &stdout, &stderr)
	if code != 2 || !strings.Contains(stderr.String(), "-timeout must be at least 1s") {
		t.Errorf("-timeout -1s: exit %d, stderr %q: want the timeout refused as a value of -timeout", code, stderr.String())
	}
}

// A flag given twice is refused, one line naming both values, not
// silently last-wins (before or after the command alike); a flag error
// is one line.
func TestRdsctlRepeatedFlagRefused(t *testing.T) {
	for _, args := range [][]string{
		{"-port", "22", "probe"},
		{"probe", "-show-commands", "-show-commands"},
		{"list", "-key", "other"},
		{"list", "-json"},
	} {
		var stdout, stderr bytes.Buffer
		code := cli(append(closedRDS(t), args...), &stdout, &stderr)
		out := strings.TrimSpace(stderr.String())
		if code != 2 || strings.Count(out, "\n") != 0 || strings.Contains(out, "dial") {
			t.Errorf("%q: exit %d, stderr %q: want a one-line usage error", args, code, out)
		}
		if args[len(args)-1] != "-json" && !strings.Contains(out, "is given more than once") {
			t.Errorf("%q: stderr %q does not say the flag is repeated", args, out)
		}
	}
}

// gen-key never replaces a file: an existing PATH.pub (whose private key
// was moved away, say) is kept, and no key is left without its .pub.
func TestRdsctlGenKeyKeepsExistingFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "id_ed25519")
	if err := os.WriteFile(path+".pub", []byte("ssh-ed25519 AAAA keep-me\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := cli([]string{"gen-key", path}, &stdout, &stderr)
	if b, _ := os.ReadFile(path + ".pub"); string(b) != "ssh-ed25519 AAAA keep-me\n" {
		t.Errorf("gen-key overwrote the existing %s.pub: %q", path, b)
	}
	if code != 1 || !strings.Contains(stderr.String(), path+".pub exists already") {
		t.Errorf("gen-key next to an existing .pub: exit %d, stderr %q", code, stderr.String())
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("gen-key left a private key without its public key: %v", err)
	}
	// An existing private key is kept too, and no .pub written beside it.
	other := filepath.Join(dir, "other")
	if err := os.WriteFile(other, []byte("key"), 0o600); err != nil {
		t.Fatal(err)
	}
	stderr.Reset()
	if code := cli([]string{"gen-key", other}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), other+" exists already") {
		t.Errorf("gen-key over an existing key: exit %d, stderr %q", code, stderr.String())
	}
	if _, err := os.Stat(other + ".pub"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("gen-key wrote a .pub beside a key it did not write: %v", err)
	}
	// A fresh PATH gets both, and the pair is one key.
	fresh := filepath.Join(dir, "fresh")
	stdout.Reset()
	if code := cli([]string{"gen-key", fresh}, &stdout, &stderr); code != 0 {
		t.Fatalf("gen-key %s: exit %d, %q", fresh, code, stderr.String())
	}
	privPEM, _ := os.ReadFile(fresh)
	pubLine, _ := os.ReadFile(fresh + ".pub")
	signer, err := ssh.ParsePrivateKey(privPEM)
	if err != nil {
		t.Fatal(err)
	}
	pub, _, _, _, err := ssh.ParseAuthorizedKey(pubLine)
	if err != nil || !bytes.Equal(pub.Marshal(), signer.PublicKey().Marshal()) {
		t.Errorf("the .pub is not the key's public key: %v", err)
	}
}

// -address is a host alone: "127.0.0.1:22" (as ssh users type it), a
// space or brackets are a usage error naming -address and pointing at
// -port, not a transport failure after the client's retries.
func TestRdsctlAddressIsAHost(t *testing.T) {
	key := filepath.Join(t.TempDir(), "id_ed25519")
	if _, err := rdssim.WriteClientKey(key, ""); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"-address", "127.0.0.1:22"}, `-address: invalid argument: address "127.0.0.1:22" has a port (22)`},
		{[]string{"-address", "rds 1"}, "-address"},
		{[]string{"-address", "[::1]"}, "without brackets"},
		{[]string{"-nvme-address", "127.0.0.1:4420"}, "-nvme-address"},
	} {
		var stdout, stderr bytes.Buffer
		code := cli(append(tc.args, "-key", key, "-insecure-skip-host-key-check", "-timeout", "5s", "probe"), &stdout, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), tc.says) || !strings.Contains(stderr.String(), "port") {
			t.Errorf("%q: exit %d, stderr %q: want a usage error saying %s", tc.args, code, stderr.String(), tc.says)
		}
	}
}

// The connection flags are checked before anything is dialled, each a
// usage error naming the flag: a missing -key or -known-hosts, an empty
// -user, a -key that is not a key, bad -login-options.
func TestRdsctlConnectionFlagsAreUsageErrors(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "id_ed25519")
	if _, err := rdssim.WriteClientKey(key, ""); err != nil {
		t.Fatal(err)
	}
	notAKey := filepath.Join(dir, "not-a-key")
	if err := os.WriteFile(notAKey, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	insecure := "-insecure-skip-host-key-check"
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{insecure}, "-key is required"},
		{[]string{"-key", key}, "-known-hosts is required"},
		{[]string{"-key", key, insecure, "-user", ""}, "-user is empty"},
		{[]string{"-key", filepath.Join(dir, "missing"), insecure}, "missing"},
		{[]string{"-key", notAKey, insecure}, "not-a-key"},
		{[]string{"-key", key, insecure, "-login-options", "x y"}, `login options "x y"`},
		{[]string{"-key", key, "-known-hosts", filepath.Join(dir, "missing-kh")}, "missing-kh"},
	} {
		var stdout, stderr bytes.Buffer
		code := cli(append(tc.args, "-address", "127.0.0.1", "-port", "1", "probe"), &stdout, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), tc.says) || strings.Contains(stderr.String(), "dial") {
			t.Errorf("%q: exit %d, stderr %q: want a usage error saying %s", tc.args, code, stderr.String(), tc.says)
		}
	}
}

// A bad flag value or argument is a usage error (exit 2, with the usage
// hint), so that a script can tell a typo from an RDS failure, and nothing
// is sent to the RDS, for either of:
//
//	rdsctl -key K -known-hosts KH selftest -o yaml
//	rdsctl -key K -known-hosts KH copy s1 s1
func TestUsageErrorsExitTwo(t *testing.T) {
	flags, _, _ := simWithKey(t)
	for _, args := range [][]string{{"selftest", "-o", "yaml"}, {"copy", "s1", "s1"}} {
		code, out, errOut := rdsctlProcess(t, append(append([]string{"-show-commands"}, flags...), args...)...)
		if code != 2 || strings.Contains(out, "> ") || !strings.Contains(errOut, "rdsctl -h") {
			t.Errorf("rdsctl %q: exit %d, stdout %q, stderr %q; want a usage error (exit 2), nothing sent", args, code, out, errOut)
		}
	}
}

// A flag of another command is refused, not silently ignored (`list -o
// json` printing the text table, exit 0), as kubectl rds refuses a flag
// its command does not use; so is a negative -copy-wait.
func TestFlagsACommandDoesNotUse(t *testing.T) {
	flags, _, _ := simWithKey(t)
	for _, args := range [][]string{{"list", "-o", "json"}, {"list", "-closed"}, {"probe", "-keep-connections"}, {"selftest", "-copy-wait", "-1s"}} {
		code, out, errOut := rdsctlProcess(t, append(append([]string{"-show-commands"}, flags...), args...)...)
		if code != 2 || strings.Contains(out, "> ") || !strings.Contains(errOut, args[1]) {
			t.Errorf("rdsctl %q: exit %d, stdout %.200q, stderr %.200q; want a usage error (exit 2) naming the flag, nothing sent", args, code, out, errOut)
		}
	}
}

// A flag that means something only with another, or with one form of its
// command, is refused without it rather than ignored: -nvme-address
// without -data ran the whole self-test as if it were not given, and
// -keep-connections does nothing to an export that is closed.
func TestFlagsThatNeedAnotherRefused(t *testing.T) {
	flags, _, srv := simWithKey(t)
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"selftest", "-nvme-address", "127.0.0.1"}, "-nvme-address needs -data"},
		{[]string{"export", "pvc-1", "off", "-keep-connections"}, "-keep-connections is a flag of export on, not export off"},
	} {
		code, out, errOut := rdsctlProcess(t, append(append([]string{"-show-commands"}, flags...), tc.args...)...)
		if code != 2 || out != "" || !strings.Contains(errOut, tc.says) {
			t.Errorf("rdsctl %q: exit %d, stdout %.200q, stderr %.200q; want a usage error (exit 2) saying %q, nothing sent", tc.args, code, out, errOut, tc.says)
		}
	}
	if n := srv.Stats().Accepted; n != 0 {
		t.Errorf("the refused commands connected %d times to the RDS", n)
	}
}

// -key naming the .pub that gen-key wrote beside the key says that it is a
// public key and that -key wants the private key, not "SSH key k.pub:
// ssh: no key found". Input: rdsctl gen-key k;
// chmod 400 k.pub; rdsctl -key k.pub -known-hosts KH probe.
func TestPublicKeyNamedAsSuch(t *testing.T) {
	dir := t.TempDir()
	key := dir + "/k"
	if code, _, errOut := rdsctlProcess(t, "gen-key", key); code != 0 {
		t.Fatalf("gen-key: exit %d: %s", code, errOut)
	}
	if err := os.Chmod(key+".pub", 0o400); err != nil {
		t.Fatal(err)
	}
	kh := dir + "/known_hosts"
	if err := os.WriteFile(kh, []byte("127.0.0.1 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := rdsctlProcess(t, "-key", key+".pub", "-known-hosts", kh, "probe")
	if code != 2 || !strings.Contains(errOut, "is a public key; -key wants the private key ("+key+")") {
		t.Errorf("-key k.pub: exit %d, stderr %q; want exit 2 saying it is a public key (give the private key)", code, errOut)
	}
}
