package rdssim

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// docSample returns the first entry of the print detail sample in
// docs/routeros.md, legend included: the simulator must print exactly that.
func docSample(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "routeros.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "```text\nFlags:")
	if !ok {
		t.Fatal("no print detail sample in docs/routeros.md")
	}
	entry, _, _ := strings.Cut(rest, "\n\n")
	return "Flags:" + entry + "\n"
}

// wide lays print output out at 100 columns, the width of the sample in
// docs/routeros.md, for the tests that compare output line for line.
func wide(c *Config) { c.TerminalWidth = 100 }

// diskLegendLine is what /disk print prints when nothing matches.
const diskLegendLine = "Flags: " + diskLegend + "\n"

func TestDiskPrintMatchesDocSample(t *testing.T) {
	ts := startSim(t, wide)
	ts.mustRun(addCmd("pvc-1", "10G"))
	if got, want := ts.run(`/disk print detail where slot="pvc-1"`), docSample(t); got != want {
		t.Errorf("print detail:\n%s\nwant (docs/routeros.md):\n%s", got, want)
	}
}

func TestDiskPrint(t *testing.T) {
	ts := startSim(t, wide)
	ts.mustRun(addCmd("pvc-1", "10G"))
	ts.mustRun(copyCmd("snap-1", "pvc-1", ""))
	ts.mustRun(`/disk add type=file file-path="/storage-pool/k8s/pvc-with-a-much-longer-name-0123456789abcdef.img" file-size=1536M slot="pvc-with-a-much-longer-name-0123456789abcdef" nvme-tcp-export=yes nvme-tcp-server-port=4421 nvme-tcp-server-nqn="nqn.2000-02.com.mikrotik:pvc-with-a-much-longer-name-0123456789abcdef"`)

	const legend = "Flags: B - BLOCK-DEVICE; M - MOUNTED; t - NVME-TCP-EXPORT\n"
	// The copy takes the source's port and NQN (copy-from as RouterOS's
	// CLI manual describes it, the simulator's default).
	const snap = ` 1 B  type=file slot="snap-1" slot-default="" parent="" fs=- model="/storage-pool/k8s/snap-1.img"
      size=10 737 418 240 mount-filesystem=no mount-read-only=no compress=no sector-size=512
      raid-master=none nvme-tcp-export=no nvme-tcp-server-port=4420
      nvme-tcp-server-nqn="nqn.2000-02.com.mikrotik:pvc-1" nvme-tcp-server-allow-host-name=""
      iscsi-export=no nfs-sharing=no smb-sharing=no media-sharing=no media-interface=none swap=no
      file-path=/storage-pool/k8s/snap-1.img file-size=10.0GiB file-offset=0
`
	const long = ` 0 Bt type=file slot="pvc-with-a-much-longer-name-0123456789abcdef" slot-default="" parent="" fs=-
      model="/storage-pool/k8s/pvc-with-a-much-longer-name-0123456789abcdef.img" size=1 610 612 736
      mount-filesystem=no mount-read-only=no compress=no sector-size=512 raid-master=none
      nvme-tcp-export=yes nvme-tcp-server-port=4421
      nvme-tcp-server-nqn="nqn.2000-02.com.mikrotik:pvc-with-a-much-longer-name-0123456789abcdef"
      nvme-tcp-server-allow-host-name="" iscsi-export=no nfs-sharing=no smb-sharing=no
      media-sharing=no media-interface=none swap=no
      file-path=/storage-pool/k8s/pvc-with-a-much-longer-name-0123456789abcdef.img file-size=1.5GiB
      file-offset=0
`
	const array = ` 4 B   type=raid slot="raid1" slot-default="" parent="" fs=- model="RAID6" size=30 726 004 506 624
       raid-master=none raid-type=raid-6 raid-device-count=6 raid-state="active" nvme-tcp-export=no
       iscsi-export=no nfs-sharing=no smb-sharing=no media-sharing=no media-interface=none swap=no
`
	first := strings.TrimPrefix(docSample(t), "Flags: B - BLOCK-DEVICE; t - NVME-TCP-EXPORT\n")
	pool := func(free string) string {
		return ` 0 BM type=partition slot="storage-pool" slot-default="" parent="" fs=btrfs model=""
      size=107 374 182 400 free=` + free + ` mount-filesystem=yes mount-read-only=no
      mount-point="storage-pool" compress=no sector-size=512 raid-master=none nvme-tcp-export=no
      iscsi-export=no nfs-sharing=no smb-sharing=no media-sharing=no media-interface=none swap=no
`
	}
	// relayout gives an entry another number and flag field: the flags
	// stand in the columns of the legend printed with it (only the flags
	// the listing uses), and the continuation lines follow the first
	// property.
	relayout := func(entry string, n int, field string) string {
		first, rest, _ := strings.Cut(entry, "\n")
		_, props, _ := strings.Cut(strings.TrimLeft(first, " 0123456789"), " type=")
		prefix := fmt.Sprintf("%2d %s ", n, field)
		out := prefix + "type=" + props + "\n"
		for _, l := range strings.Split(strings.TrimSuffix(rest, "\n"), "\n") {
			out += strings.Repeat(" ", len(prefix)) + strings.TrimLeft(l, " ") + "\n"
		}
		return out
	}
	const (
		legendB   = "Flags: B - BLOCK-DEVICE\n"
		legendBM  = "Flags: B - BLOCK-DEVICE; M - MOUNTED\n"
		legendBt  = "Flags: B - BLOCK-DEVICE; t - NVME-TCP-EXPORT\n"
		legendBMt = legend
	)

	for _, tc := range []struct {
		cmd, want string
	}{
		{`/disk print detail where slot="snap-1"`, legendB + relayout(snap, 0, "B")},
		{`/disk print detail where slot=snap-1`, legendB + relayout(snap, 0, "B")},
		{`/disk print detail where type=file`, legendBt + first + "\n" + snap + "\n" + relayout(long, 2, "Bt")},
		{`/disk/print detail where type="file" and slot="pvc-1"`, legendBt + first},
		{`/disk print detail where slot="pvc-with-a-much-longer-name-0123456789abcdef"`, legendBt + long},
		{`/disk print detail where mount-point="storage-pool"`, legendBM + pool("84 288 733 184")},
		{`/disk print detail where mount-point=storage-pool`, legendBM + pool("84 288 733 184")},
		{`/disk print detail where size="10 737 418 240" and nvme-tcp-export=no`, legendB + relayout(snap, 0, "B")},
		{`/disk print detail where slot="nope"`, legendBMt},
		{`/disk print detail where mount-point="other-pool"`, legendBMt},
		// Every disk but the simulated drives (hardware.go; the array has
		// raid-master=none too, TestHardwareListing checks the whole).
		{`/disk print detail where raid-master=none`, legendBMt + relayout(pool("84 288 733 184"), 0, "BM ") + "\n" + relayout(first, 1, "B t") + "\n" + relayout(snap, 2, "B  ") + "\n" + relayout(long, 3, "B t") + "\n" + array},
	} {
		t.Run(tc.cmd, func(t *testing.T) {
			if got := ts.run(tc.cmd); got != tc.want {
				t.Errorf("got:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}

func TestFilePrint(t *testing.T) {
	ts := startSim(t, wide)
	ts.mustRun(addCmd("pvc-1", "10G"))
	ts.mustRun(`/disk add type=file file-path="/storage-pool/small" file-size=512 slot="small"`)
	stamp := time.Date(2026, 11, 22, 10, 0, 1, 0, time.UTC)
	for _, p := range []string{"", "k8s", "k8s/pvc-1.img", "small"} {
		if err := os.Chtimes(ts.hostFile(p), stamp, stamp); err != nil {
			t.Fatal(err)
		}
	}
	const (
		pvc   = " 0 name=storage-pool/k8s/pvc-1.img type=.img file size=10.0GiB last-modified=2026-11-22 10:00:01\n"
		root  = " 0 name=storage-pool type=directory last-modified=2026-11-22 10:00:01\n"
		k8s   = " 1 name=storage-pool/k8s type=directory last-modified=2026-11-22 10:00:01\n"
		small = " 3 name=storage-pool/small type=file size=512 last-modified=2026-11-22 10:00:01\n"
	)
	for _, tc := range []struct {
		cmd, want string
	}{
		{`/file print detail where name="storage-pool/k8s/pvc-1.img"`, pvc},
		{`/file print detail where name=storage-pool/k8s/pvc-1.img`, pvc},
		{`/file/print detail where name="storage-pool/k8s/none.img"`, ""},
		{`/file print detail`, root + "\n" + k8s + "\n" + " 2" + pvc[2:] + "\n" + small},
		{`/file print detail where type=directory`, root + "\n" + k8s},
	} {
		t.Run(tc.cmd, func(t *testing.T) {
			if got := ts.run(tc.cmd); got != tc.want {
				t.Errorf("got:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}

func TestSystemResourcePrint(t *testing.T) {
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	ts := startSim(t, func(c *Config) { c.Now = clock.Now })
	clock.Add(3*24*time.Hour + 4*time.Hour + 12*time.Minute + 5*time.Second)
	want := `                   uptime: 3d4h12m5s
                  version: 7.20.4 (stable)
               build-time: 2025-11-04 10:00:00
         factory-software: 7.16
              free-memory: 28.1GiB
             total-memory: 31.2GiB
                      cpu: ARM64
                cpu-count: 16
                 cpu-load: 1%
           free-hdd-space: 100.0GiB
          total-hdd-space: 100.0GiB
        architecture-name: arm64
               board-name: RDS2216
                 platform: MikroTik
`
	for _, cmd := range []string{"/system resource print", "/system/resource/print", "/system/resource print without-paging"} {
		if got := ts.run(cmd); got != want {
			t.Errorf("%s:\n%s\nwant:\n%s", cmd, got, want)
		}
	}
}

func TestCRLF(t *testing.T) {
	ts := startSim(t, func(c *Config) { c.CRLF, c.TerminalWidth = true, 100 })
	ts.mustRun(addCmd("pvc-1", "10G"))
	want := strings.ReplaceAll(docSample(t), "\n", "\r\n")
	if got := ts.run(`/disk print detail where slot="pvc-1"`); got != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
	if got := ts.run(`/disk frob`); got != "bad command name frob (line 1 column 7)\r\n" {
		t.Errorf("error with CRLF: %q", got)
	}
}

func TestCommandErrors(t *testing.T) {
	ts := startSim(t, nil)
	ts.mustRun(addCmd("pvc-1", "1G"))
	const add = `/disk add type=file file-path="/storage-pool/k8s/x.img" slot="x" `
	for _, tc := range []struct {
		name, cmd, want string
	}{
		{"dollar in quotes", `/disk print detail where slot="a$b"`, "syntax error (line 1 column 33)"},
		{"dollar bare", `/disk print detail where slot=$x`, "syntax error (line 1 column 31)"},
		{"semicolon", `/disk remove [find slot="pvc-1"];/system reboot`, "expected end of command (line 1 column 33)"},
		{"backtick", "/disk print detail where slot=`id`", "syntax error (line 1 column 31)"},
		{"newline", "/disk print\n/system reboot", "expected end of command (line 1 column 12)"},
		{"newline in quotes", "/disk print detail where slot=\"a\nb\"", "syntax error (line 1 column 33)"},
		{"unterminated quote", `/disk print detail where slot="pvc-1`, "syntax error (line 1 column 37)"},
		{"bad escape", `/disk print detail where slot="a\nb"`, "syntax error (line 1 column 33)"},
		{"braces", `/disk print detail where slot={x}`, "syntax error (line 1 column 31)"},
		{"quote glued to word", `/disk print detail where slot="a"b`, "syntax error (line 1 column 34)"},
		{"unknown command", `/disk frob`, "bad command name frob (line 1 column 7)"},
		{"unknown menu", `/foo print`, "bad command name foo (line 1 column 2)"},
		{"unknown command slash form", `/disk/frob`, "bad command name frob (line 1 column 7)"},
		{"unknown find", `/disk remove [grab slot="x"]`, "bad command name grab (line 1 column 15)"},
		{"unknown argument", add + `file-size=1G color=red`, "expected end of command (line 1 column 79)"},
		{"unnamed argument to add", add + `file-size=1G now`, "expected end of command (line 1 column 79)"},
		{"unknown where property", `/disk print detail where colour=red`, "expected end of command (line 1 column 26)"},
		{"unknown find property", `/disk remove [find colour=red]`, "expected end of command (line 1 column 20)"},
		{"dangling and", `/disk print detail where slot=a and`, "syntax error (line 1 column 36)"},
		{"argument before where", `/disk print detail slot=a`, "expected end of command (line 1 column 20)"},
		{"bad size suffix", add + `file-size=10X`, "invalid value for argument file-size"},
		{"fractional size", add + `file-size=1.5G`, "invalid value for argument file-size"},
		{"size with unit word", add + `file-size=10GiB`, "invalid value for argument file-size"},
		{"zero size", add + `file-size=0`, "invalid value for argument file-size"},
		{"negative size", add + `file-size=-1`, "invalid value for argument file-size"},
		{"huge size", add + `file-size=99999999999999999999`, "invalid value for argument file-size"},
		{"overflowing size", add + `file-size=9999999999T`, "invalid value for argument file-size"},
		{"empty size", add + `file-size=`, "invalid value for argument file-size"},
		{"bad export", add + `file-size=1G nvme-tcp-export=maybe`, "input does not match any value of nvme-tcp-export"},
		{"bad port", add + `file-size=1G nvme-tcp-server-port=70000`, "invalid value for argument nvme-tcp-server-port"},
		{"bad type", `/disk add type=floppy file-path="/storage-pool/x.img" file-size=1G slot=x`, "input does not match any value of type"},
		{"other type", `/disk add type=tmpfs slot=x`, "failure: only type=file is supported by the simulator"},
		{"no type", `/disk add file-path="/storage-pool/x.img" file-size=1G slot=x`, "failure: type not specified"},
		{"no slot", `/disk add type=file file-path="/storage-pool/x.img" file-size=1G`, "failure: slot not specified"},
		{"no path", `/disk add type=file file-size=1G slot=x`, "failure: file-path not specified"},
		{"no size", add, "failure: file-size not specified"},
		{"path outside pool", `/disk add type=file file-path="/other/x.img" file-size=1G slot=x`, "failure: invalid file-path, must be a file under /storage-pool/"},
		{"path escaping pool", `/disk add type=file file-path="/storage-pool/../x.img" file-size=1G slot=x`, "failure: invalid file-path, must be a file under /storage-pool/"},
		{"path is pool", `/disk add type=file file-path="/storage-pool/" file-size=1G slot=x`, "failure: invalid file-path, must be a file under /storage-pool/"},
		{"reserved path", `/disk add type=file file-path="/storage-pool/.rdssim-state.json" file-size=1G slot=x`, "failure: invalid file-path, must be a file under /storage-pool/"},
		{"duplicate slot", `/disk add type=file file-path="/storage-pool/k8s/other.img" file-size=1G slot="pvc-1"`, "failure: disk with such slot already exists"},
		{"duplicate file", `/disk add type=file file-path="/storage-pool/k8s/pvc-1.img" file-size=1G slot="other"`, "failure: file already exists"},
		{"copy from missing", copyCmd("c", "nope", ""), "failure: no such item"},
		{"copy from missing by name", `/disk add type=file file-path="/storage-pool/c.img" slot=c copy-from=nope`, "failure: no such item"},
		{"copy smaller than source", copyCmd("c", "pvc-1", "file-size=512M"), "failure: file-size is smaller than the size of the copy-from disk"},
		{"set missing by name", `/disk set nope file-size=2G`, "failure: no such item"},
		{"remove missing by name", `/disk remove nope`, "failure: no such item"},
		{"set without target", `/disk set file-size=2G`, "syntax error (line 1 column 23)"},
		{"set unknown property", `/disk set [find slot="pvc-1"] colour=red`, "expected end of command (line 1 column 31)"},
		{"shrink", `/disk set [find slot="pvc-1"] file-size=512M`, "failure: can not shrink disk, file-size is smaller than the current size"},
		{"file remove missing by name", `/file remove "storage-pool/none"`, "failure: no such item"},
		{"file remove in use", `/file remove [find name="storage-pool/k8s/pvc-1.img"]`, "failure: file is in use by disk pvc-1"},
		{"file remove mount point", `/file remove [find name="storage-pool"]`, "failure: can not remove the mount point of a disk"},
		{"file remove non-empty directory", `/file remove [find name="storage-pool/k8s"]`, "failure: directory is not empty"},
		{"not enough space", add + `file-size=100G`, "failure: not enough space"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ts.run(tc.cmd); got != tc.want+"\n" {
				t.Errorf("%s\n got: %q\nwant: %q", tc.cmd, got, tc.want+"\n")
			}
		})
	}
	// None of the refused commands changed anything.
	if got := ts.srv.Disks(); len(got) != 1 || got[0].Slot != "pvc-1" || got[0].Size != gib {
		t.Errorf("disks after refused commands: %+v", got)
	}
	if got, want := listFiles(t, ts.cfg.DataDir), []string{".", ".rdssim-state.json", "k8s", "k8s/pvc-1.img"}; !slices.Equal(got, want) {
		t.Errorf("files after refused commands: %v, want %v", got, want)
	}
}

func TestSilentNoOps(t *testing.T) {
	ts := startSim(t, nil)
	for _, cmd := range []string{
		`/disk remove [find slot="nope"]`,
		`/disk set [find slot="nope"] file-size=1G`,
		`/disk set [find slot="nope"] nvme-tcp-server-allow-host-name=""`,
		`/file remove [find name="storage-pool/nope.img"]`,
		``,
		`   `,
		`/disk`,
	} {
		ts.mustRun(cmd)
	}
}

func TestAddCreatesSparseFile(t *testing.T) {
	ts := startSim(t, func(c *Config) { c.PoolSize, c.TerminalWidth = 3*tib, 100 })
	for _, tc := range []struct {
		size string
		want int64
	}{
		{"1", 1},
		{"4097", 4097},
		{"1k", kib},
		{"3K", 3 * kib},
		{"10M", 10 * mib},
		{"1536M", 1536 * mib},
		{"3G", 3 * gib},
		{"1T", tib},
		{"10737418241", 10*gib + 1},
	} {
		t.Run(tc.size, func(t *testing.T) {
			slot := "d-" + tc.size
			ts.mustRun(fmt.Sprintf(`/disk/add type=file file-path="/storage-pool/deep/dir/%s.img" file-size=%s slot=%q`, slot, tc.size, slot))
			path := ts.hostFile("deep/dir/" + slot + ".img")
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Size() != tc.want {
				t.Errorf("file size %d, want exactly %d", fi.Size(), tc.want)
			}
			if a := allocated(t, path); a > 64*kib {
				t.Errorf("file occupies %d bytes, want a sparse file", a)
			}
			if bf, err := ts.srv.BackingFile(slot); err != nil || bf != path {
				t.Errorf("BackingFile = %q, %v; want %q", bf, err, path)
			}
			out := ts.run(fmt.Sprintf(`/disk print detail where slot=%q`, slot))
			if !strings.Contains(out, " size="+spacedNumber(tc.want)+" ") {
				t.Errorf("print does not show size=%s:\n%s", spacedNumber(tc.want), out)
			}
		})
	}
}

func writeAt(t *testing.T, path string, off int64, data []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, off); err != nil {
		t.Fatal(err)
	}
}

func readAt(t *testing.T, path string, off int64, n int) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, off); err != nil {
		t.Fatal(err)
	}
	return buf
}

func TestCopyFrom(t *testing.T) {
	ts := startSim(t, nil)
	ts.mustRun(addCmd("src", "1G"))
	src, err := ts.srv.BackingFile("src")
	if err != nil {
		t.Fatal(err)
	}
	// Data at the start, across a chunk boundary and at the very end.
	marks := map[int64][]byte{
		0:                       []byte("superblock"),
		copyChunk - 3:           []byte("across-the-chunk-boundary"),
		700*mib + 12345:         bytes.Repeat([]byte{0xab}, 3*copyChunk),
		gib - int64(len("end")): []byte("end"),
	}
	for off, data := range marks {
		writeAt(t, src, off, data)
	}

	for _, tc := range []struct {
		name, extra string
		size        int64
	}{
		{"same size", "", gib},
		{"grown", "file-size=2G", 2 * gib},
		{"equal size given", "file-size=1024M", gib},
	} {
		t.Run(tc.name, func(t *testing.T) {
			slot := strings.ReplaceAll(tc.name, " ", "-")
			ts.mustRun(copyCmd(slot, "src", tc.extra))
			dst, err := ts.srv.BackingFile(slot)
			if err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(dst)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Size() != tc.size {
				t.Errorf("copy size %d, want %d", fi.Size(), tc.size)
			}
			for off, data := range marks {
				if got := readAt(t, dst, off, len(data)); !bytes.Equal(got, data) {
					t.Errorf("copy at %d: %q, want %q", off, got[:min(len(got), 32)], data[:min(len(data), 32)])
				}
			}
			if a, limit := allocated(t, dst), int64(8*mib); a > limit {
				t.Errorf("copy occupies %d bytes, want at most %d (sparse)", a, limit)
			}
			if a := allocated(t, dst); a < 3*copyChunk {
				t.Errorf("copy occupies %d bytes, less than the data it holds", a)
			}
		})
	}

	// The copies are independent: writes to either side stay there.
	dst, _ := ts.srv.BackingFile("same-size")
	writeAt(t, src, 0, []byte("SOURCE-CHANGED"))
	writeAt(t, dst, 100, []byte("COPY-CHANGED"))
	if got := readAt(t, dst, 0, len("superblock")); string(got) != "superblock" {
		t.Errorf("copy changed with its source: %q", got)
	}
	if got := readAt(t, src, 100, len("COPY-CHANGED")); !bytes.Equal(got, make([]byte, len("COPY-CHANGED"))) {
		t.Errorf("source changed with its copy: %q", got)
	}
	// Restore from a snapshot: a copy of a copy, exported as a volume.
	ts.mustRun(`/disk add type=file file-path="/storage-pool/k8s/restored.img" slot="restored" copy-from=[find slot="same-size"] nvme-tcp-export=yes nvme-tcp-server-port=4420 nvme-tcp-server-nqn="nqn.2000-02.com.mikrotik:restored"`)
	restored, _ := ts.srv.BackingFile("restored")
	if got := readAt(t, restored, 100, len("COPY-CHANGED")); string(got) != "COPY-CHANGED" {
		t.Errorf("restored copy: %q", got)
	}
	if d := ts.srv.Disks()[4]; d.Slot != "restored" || !d.NVMeTCPExport || d.NVMeTCPNQN != "nqn.2000-02.com.mikrotik:restored" {
		t.Errorf("restored disk: %+v", d)
	}
}

func TestNotEnoughSpaceLeavesNothingBehind(t *testing.T) {
	ts := startSim(t, func(c *Config) { c.PoolSize = 10 * gib })
	ts.mustRun(addCmd("a", "6G"))
	before := listFiles(t, ts.cfg.DataDir)
	for _, cmd := range []string{
		`/disk add type=file file-path="/storage-pool/new/dir/b.img" file-size=5G slot="b"`,
		`/disk add type=file file-path="/storage-pool/new/dir/b.img" slot="b" copy-from=[find slot="a"]`,
		`/disk add type=file file-path="/storage-pool/new/dir/b.img" slot="b" copy-from=[find slot="a"] file-size=7G`,
		`/disk set [find slot="a"] file-size=11G`,
	} {
		if got := ts.run(cmd); got != "failure: not enough space\n" {
			t.Errorf("%s: %q", cmd, got)
		}
	}
	if after := listFiles(t, ts.cfg.DataDir); !slices.Equal(before, after) {
		t.Errorf("files changed: before %v, after %v", before, after)
	}
	if d := ts.srv.Disks(); len(d) != 1 || d[0].Size != 6*gib {
		t.Errorf("disks: %+v", d)
	}
	// Exactly the free space fits.
	ts.mustRun(`/disk add type=file file-path="/storage-pool/b.img" file-size=4G slot="b"`)
	if free, _ := ts.srv.Free(); free != 0 {
		t.Errorf("free %d, want 0", free)
	}
}

func TestSetAndResize(t *testing.T) {
	ts := startSim(t, func(c *Config) { c.PoolSize, c.TerminalWidth = 10*gib, -1 })
	ts.mustRun(addCmd("pvc-1", "1G"))
	path, _ := ts.srv.BackingFile("pvc-1")
	writeAt(t, path, 4096, []byte("data"))

	ts.mustRun(`/disk set [find slot="pvc-1"] file-size=2G`)
	ts.mustRun(`/disk/set [find slot=pvc-1] file-size=2G`) // same size: nothing to do
	ts.mustRun(`/disk set pvc-1 file-size=2049M`)          // plain name
	fi, _ := os.Stat(path)
	if fi.Size() != 2049*mib {
		t.Errorf("size after grow %d", fi.Size())
	}
	if got := readAt(t, path, 4096, 4); string(got) != "data" {
		t.Errorf("grow lost data: %q", got)
	}
	if got := ts.run(`/disk set [find slot="pvc-1"] file-size=1G`); !strings.HasPrefix(got, "failure: ") {
		t.Errorf("shrink: %q", got)
	}
	if got := ts.run(`/disk set [find slot="pvc-1"] file-size=11G`); got != "failure: not enough space\n" {
		t.Errorf("grow past the pool: %q", got)
	}
	if fi, _ := os.Stat(path); fi.Size() != 2049*mib {
		t.Errorf("refused resize changed the size to %d", fi.Size())
	}

	host := "nqn.2014-08.org.nvmexpress:uuid:0b3e2b41-7b5a-4b58-a5a3-5f2c1e2a9d10"
	ts.mustRun(`/disk set [find slot="pvc-1"] nvme-tcp-server-allow-host-name="` + host + `"`)
	out := ts.run(`/disk print detail where slot="pvc-1"`)
	if !strings.Contains(out, `nvme-tcp-server-allow-host-name="`+host+`"`) || !strings.Contains(out, "file-size=2.0GiB") || !strings.Contains(out, "size=2 148 532 224 ") {
		t.Errorf("print after set:\n%s", out)
	}
	ts.mustRun(`/disk set [find slot="pvc-1"] nvme-tcp-server-allow-host-name=""`)
	if d := ts.srv.Disks()[0]; d.AllowHostName != "" {
		t.Errorf("allow-host not cleared: %+v", d)
	}
	ts.mustRun(`/disk set [find slot="pvc-1"] nvme-tcp-export=no`)
	if out := ts.run(`/disk print detail where slot="pvc-1"`); !strings.HasPrefix(out, "Flags: B - BLOCK-DEVICE\n 0 B type=file") {
		t.Errorf("t flag still shown:\n%s", out)
	}
}

func TestRemove(t *testing.T) {
	ts := startSim(t, func(c *Config) { c.PoolSize = 10 * gib })
	ts.mustRun(addCmd("pvc-1", "4G"))
	path, _ := ts.srv.BackingFile("pvc-1")

	ts.mustRun(`/disk remove [find slot="pvc-1"]`)
	if out := ts.run(`/disk print detail where slot="pvc-1"`); out != diskLegendLine {
		t.Errorf("disk still printed:\n%s", out)
	}
	if _, err := ts.srv.BackingFile("pvc-1"); err == nil {
		t.Error("BackingFile of a removed disk succeeded")
	}
	// The file stays, and keeps its space, until /file remove.
	if _, err := os.Stat(path); err != nil {
		t.Errorf("backing file removed with the disk: %v", err)
	}
	if free, _ := ts.srv.Free(); free != 6*gib {
		t.Errorf("free %d after disk remove, want %d", free, 6*gib)
	}
	if got := ts.run(addCmd("pvc-1", "1G")); got != "failure: file already exists\n" {
		t.Errorf("re-add over the left file: %q", got)
	}
	ts.mustRun(`/file remove [find name="storage-pool/k8s/pvc-1.img"]`)
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("file still there: %v", err)
	}
	if free, _ := ts.srv.Free(); free != 10*gib {
		t.Errorf("free %d after file remove", free)
	}
	if out := ts.run(`/file print detail where name="storage-pool/k8s/pvc-1.img"`); out != "" {
		t.Errorf("file still printed:\n%s", out)
	}
	ts.mustRun(`/file remove "storage-pool/k8s"`) // empty directory, by name
	ts.mustRun(addCmd("pvc-1", "1G"))
}

func TestStateSurvivesRestart(t *testing.T) {
	ts := startSim(t, nil)
	ts.mustRun(addCmd("pvc-1", "10G"))
	ts.mustRun(copyCmd("snap-1", "pvc-1", ""))
	ts.mustRun(addCmd("gone", "1G"))
	ts.mustRun(`/disk remove [find slot="gone"]`)
	ts.mustRun(`/disk set [find slot="pvc-1"] nvme-tcp-server-allow-host-name="nqn.2014-08.org.nvmexpress:uuid:1"`)
	hostKey := ts.srv.HostPublicKey().Marshal()
	before := ts.run(`/disk print detail`)
	backing, _ := ts.srv.BackingFile("snap-1")

	ts.restart()
	if got := ts.run(`/disk print detail`); got != before {
		t.Errorf("after restart:\n%s\nbefore:\n%s", got, before)
	}
	if got, _ := ts.srv.BackingFile("snap-1"); got != backing {
		t.Errorf("BackingFile after restart %q, want %q", got, backing)
	}
	if !bytes.Equal(ts.srv.HostPublicKey().Marshal(), hostKey) {
		t.Error("host key changed across restart")
	}
	if got := ts.run(addCmd("pvc-1", "1G")); got != "failure: disk with such slot already exists\n" {
		t.Errorf("duplicate after restart: %q", got)
	}
}

func TestCorruptStateRefused(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, stateFileName), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, pub, _ := NewTestKeys()
	if _, err := New(Config{DataDir: dir, AuthorizedKeys: []ssh.PublicKey{pub}}); err == nil {
		t.Error("New accepted a corrupt state file")
	}
}

func TestConcurrentClients(t *testing.T) {
	ts := startSim(t, nil)
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := ts.dial(ts.signer)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			for _, cmd := range []string{addCmd(fmt.Sprintf("c-%d", i), "1G"), `/disk print detail where type=file`} {
				sess, err := c.NewSession()
				if err != nil {
					errs <- err
					return
				}
				out, err := sess.CombinedOutput(cmd)
				sess.Close()
				if err != nil || strings.HasPrefix(string(out), "failure") {
					errs <- fmt.Errorf("%s: %v %q", cmd, err, out)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if d := ts.srv.Disks(); len(d) != n {
		t.Errorf("%d disks, want %d", len(d), n)
	}
	if got := len(ts.srv.Commands()); got != 2*n {
		t.Errorf("%d commands logged, want %d", got, 2*n)
	}
}
