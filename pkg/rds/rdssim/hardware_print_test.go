package rdssim

import (
	"strings"
	"testing"
)

// The shapes of issue 22: flag columns under a legend of the flags in use,
// a mounted image beside the driver's disks, and the NVMe/TCP server
// properties of a closed export left out of the print (as the RAID disks
// of the RDS2216 captures print), behind Config.ClosedExportProps.

// TestFlagColumnsBesideMountedImage: with a mounted image among the file
// disks the legend is B, M, t; every exported disk prints `B t` and a
// closed one `B  `, as issue 22 item 2 describes the hardware.
func TestFlagColumnsBesideMountedImage(t *testing.T) {
	ts := startSim(t, func(c *Config) { c.TerminalWidth = -1 })
	if err := ts.srv.AddMountedImage("debian-iso", "/storage-pool/iso/debian.iso", mib); err != nil {
		t.Fatal(err)
	}
	ts.mustRun(addCmd("pvc-1", "1G"))
	ts.mustRun(`/disk add type=file file-path="/storage-pool/k8s/pvc-2.img" file-size=1G slot="pvc-2" nvme-tcp-export=no`)
	out := ts.run(`/disk print detail where type=file`)
	lines := strings.Split(out, "\n")
	want := []string{
		"Flags: B - BLOCK-DEVICE; M - MOUNTED; t - NVME-TCP-EXPORT",
		` 0 BM  type=file slot="debian-iso" `,
		` 1 B t type=file slot="pvc-1" `,
		` 2 B   type=file slot="pvc-2" `,
	}
	if len(lines) < 6 || lines[0] != want[0] || !strings.HasPrefix(lines[1], want[1]) || !strings.HasPrefix(lines[3], want[2]) || !strings.HasPrefix(lines[5], want[3]) {
		t.Fatalf("got:\n%s\nwant entries starting\n%s", out, strings.Join(want, "\n"))
	}
	if !strings.Contains(lines[1], ` mount-point="debian-iso" `) {
		t.Errorf("the image has no mount point: %s", lines[1])
	}
	// Without the image, the same disks under a legend of B and t.
	if out := ts.run(`/disk print detail where type=file and nvme-tcp-export=yes`); !strings.HasPrefix(out, "Flags: B - BLOCK-DEVICE; t - NVME-TCP-EXPORT\n 0 Bt type=file") {
		t.Errorf("exported only:\n%s", out)
	}
	// The image survives a restart, and /file remove refuses it.
	ts.restart()
	if out := ts.run(`/file remove [find name="storage-pool/iso/debian.iso"]`); !strings.Contains(out, "in use") {
		t.Errorf("removing a mounted image: %q", out)
	}
}

// TestClosedExportPropsHidden: with ClosedExportProps hidden a disk whose
// export is off prints no port, NQN or allowed host; conditions still see
// them; once exported it prints them again. The default shows them.
func TestClosedExportPropsHidden(t *testing.T) {
	const closedAdd = `/disk add type=file file-path="/storage-pool/k8s/pvc-1.img" file-size=1G slot="pvc-1" nvme-tcp-export=no nvme-tcp-server-port=4420 nvme-tcp-server-nqn="nqn.2000-02.com.mikrotik:pvc-1"`
	const host = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-4000-8000-000000000001"
	ts := startSim(t, func(c *Config) { c.TerminalWidth = -1; c.ClosedExportProps = ClosedExportHidden })
	ts.mustRun(closedAdd)
	ts.mustRun(`/disk set [find where slot="pvc-1" and nvme-tcp-server-allow-host-name="" and nvme-tcp-export=no] nvme-tcp-server-allow-host-name="` + host + `"`)
	out := ts.run(`/disk print detail where slot="pvc-1"`)
	if strings.Contains(out, "nvme-tcp-server-") || !strings.Contains(out, " nvme-tcp-export=no ") {
		t.Errorf("closed export prints its server properties:\n%s", out)
	}
	// The hidden allowed host is still the one a condition matches.
	if out := ts.run(`/disk print detail where slot="pvc-1" and nvme-tcp-server-allow-host-name="` + host + `"`); !strings.Contains(out, `slot="pvc-1"`) {
		t.Errorf("condition on the hidden host matched nothing:\n%s", out)
	}
	if out := ts.run(`/disk print detail where slot="pvc-1" and nvme-tcp-server-allow-host-name=""`); strings.Contains(out, `slot="pvc-1"`) {
		t.Errorf("condition on another host matched:\n%s", out)
	}
	ts.mustRun(`/disk set [find where slot="pvc-1" and nvme-tcp-server-allow-host-name="` + host + `" and nvme-tcp-export=no] nvme-tcp-export=yes`)
	out = ts.run(`/disk print detail where slot="pvc-1"`)
	for _, p := range []string{" nvme-tcp-server-port=4420 ", ` nvme-tcp-server-nqn="nqn.2000-02.com.mikrotik:pvc-1" `, ` nvme-tcp-server-allow-host-name="` + host + `" `} {
		if !strings.Contains(out, p) {
			t.Errorf("exported disk does not print %s:\n%s", p, out)
		}
	}

	shown := startSim(t, func(c *Config) { c.TerminalWidth = -1 })
	shown.mustRun(closedAdd)
	if out := shown.run(`/disk print detail where slot="pvc-1"`); !strings.Contains(out, " nvme-tcp-server-port=4420 ") {
		t.Errorf("default: closed export hides its port:\n%s", out)
	}
	if _, err := ParseClosedExportProps("sometimes"); err == nil {
		t.Error("ParseClosedExportProps accepted a bad value")
	}
}

// TestValueBreakHyphen: with ValueBreak hyphen a value longer than the
// rest of its line is broken before its last '-' that fits, short of the
// width, as RDS hardware broke a file-path (the peer driver's a28f18e);
// never inside the key, and at the width when the value has no '-'.
func TestValueBreakHyphen(t *testing.T) {
	ts := startSim(t, func(c *Config) { c.ValueBreak = ValueBreakHyphen })
	slot := "pvc-ccdecfad-a8bf-572e-9120-464c4d99f12f"
	ts.mustRun(`/disk add type=file file-path="/storage-pool/metal-csi/` + slot + `.img" file-size=1G slot="` + slot + `" nvme-tcp-export=yes nvme-tcp-server-port=4420 nvme-tcp-server-nqn="nqn.2000-02.com.mikrotik:` + slot + `"`)
	out := ts.run(`/disk print detail where slot="` + slot + `"`)
	lines := strings.Split(out, "\n")
	short := false
	for i, l := range lines {
		if len(l) > DefaultTerminalWidth {
			t.Errorf("line %d is %d long:\n%s", i, len(l), out)
		}
		if i+1 < len(lines) && strings.HasPrefix(strings.TrimLeft(lines[i+1], " "), "-") {
			short = short || len(l) < DefaultTerminalWidth
			if strings.HasSuffix(l, "file") || strings.HasSuffix(l, "nvme") {
				t.Errorf("a key was broken: %q", l)
			}
		}
	}
	if !short {
		t.Errorf("no value was broken before a '-' short of the width:\n%s", out)
	}
	if _, err := ParseValueBreak("anywhere"); err == nil {
		t.Error("ParseValueBreak accepted a bad value")
	}
}

// TestLegendAll: with Legend all the legend names every flag and each
// entry has a column for each, blank where it does not carry the flag.
func TestLegendAll(t *testing.T) {
	ts := startSim(t, func(c *Config) { c.TerminalWidth = -1; c.Legend = LegendAll })
	ts.mustRun(addCmd("pvc-1", "1G"))
	out := ts.run(`/disk print detail where slot="pvc-1"`)
	if !strings.HasPrefix(out, "Flags: "+diskLegend+"\n 0 B t type=file ") {
		t.Errorf("got:\n%s", out)
	}
	if _, err := ParseLegend("some"); err == nil {
		t.Error("ParseLegend accepted a bad value")
	}
}
