package rdssim

import (
	"strings"
	"testing"
	"time"
)

// TestCopyTakesTime: a copy in progress (held here by CopyGate, not by
// the clock) does not hold up other commands, its disk is not listed and
// its file cannot be removed; once it completes the disk is there.
func TestCopyTakesTime(t *testing.T) {
	// The copy is held until the checks are made (CopyGate): on a loaded
	// machine the 2 s a 64 MiB copy takes at 32 MiB/s could pass first.
	gate := make(chan struct{})
	ts := startSim(t, func(c *Config) { c.CopyRate = 32 * mib; c.CopyGate = gate })
	ts.mustRun(addCmd("pvc-1", "64M"))
	sess, err := ts.client.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	var out strings.Builder
	sess.Stdout = &out
	if err := sess.Start(copyCmd("snap-1", "pvc-1", "")); err != nil {
		t.Fatal(err)
	}
	// Until the copy is under way: the command log shows a command when
	// it arrives, before it runs, so it is not the signal.
	deadline := time.Now().Add(10 * time.Second)
	for !ts.srv.copyUnderWay("/storage-pool/k8s/snap-1.img") && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := ts.run(`/disk print detail where slot="snap-1"`); got != diskLegendLine {
		t.Errorf("the copy's disk while copying:\n%s", got)
	}
	if got := ts.run(`/file remove [find name="storage-pool/k8s/snap-1.img"]`); got != "failure: file is in use by a copy in progress\n" {
		t.Errorf("removing a copy's file while copying: %q", got)
	}
	close(gate)
	if err := sess.Wait(); err != nil || out.String() != "" {
		t.Fatalf("copy: %v, %q", err, out.String())
	}
	if d := ts.srv.Disks(); len(d) != 2 || d[1].Slot != "snap-1" || d[1].Size != 64*mib {
		t.Fatalf("after the copy: %+v", d)
	}
}

// TestCopyFromVariants: a copy-from that sets only nvme-tcp-export=no
// takes the source's port, NQN and allowed host under CopyFromInherit (the
// default, as RouterOS's CLI manual describes copy-from) and a new disk's
// defaults under CopyFromFresh; its data is the source's under
// CopyFromDataCopy and zeros under CopyFromDataNone, at the source's size
// either way.
func TestCopyFromVariants(t *testing.T) {
	pattern := []byte("rds-csi copy-from pattern")
	for _, tc := range []struct {
		props    CopyFromProperties
		data     CopyFromData
		wantNQN  string
		wantHost string
		wantData bool
		wantPort int
	}{
		{props: "", data: "", wantNQN: "nqn.2000-02.com.mikrotik:pvc-1", wantHost: "nqn.2014-08.org.nvmexpress:uuid:host-a", wantData: true, wantPort: 4420},
		{props: CopyFromFresh, data: CopyFromDataCopy, wantNQN: "", wantHost: "", wantData: true, wantPort: defaultNVMePort},
		{props: CopyFromInherit, data: CopyFromDataNone, wantNQN: "nqn.2000-02.com.mikrotik:pvc-1", wantHost: "nqn.2014-08.org.nvmexpress:uuid:host-a", wantData: false, wantPort: 4420},
	} {
		t.Run(string(tc.props)+"/"+string(tc.data), func(t *testing.T) {
			ts := startSim(t, func(c *Config) { c.CopyFromProperties, c.CopyFromData = tc.props, tc.data })
			ts.mustRun(addCmd("pvc-1", "4M"))
			ts.mustRun(`/disk set [find slot="pvc-1"] nvme-tcp-server-allow-host-name="nqn.2014-08.org.nvmexpress:uuid:host-a"`)
			if err := ts.srv.WriteDisk("pvc-1", mib, pattern); err != nil {
				t.Fatal(err)
			}
			ts.mustRun(copyCmd("snap-1", "pvc-1", ""))
			var got *DiskInfo
			for _, d := range ts.srv.Disks() {
				if d.Slot == "snap-1" {
					got = &d
				}
			}
			if got == nil {
				t.Fatalf("no copy: %+v", ts.srv.Disks())
			}
			if got.NVMeTCPExport || got.NVMeTCPNQN != tc.wantNQN || got.AllowHostName != tc.wantHost || got.NVMeTCPPort != tc.wantPort || got.Size != 4*mib {
				t.Errorf("copy: %+v; want not exported, port %d, NQN %q, allowed host %q, 4 MiB", *got, tc.wantPort, tc.wantNQN, tc.wantHost)
			}
			data, err := ts.srv.ReadDisk("snap-1", mib, len(pattern))
			if err != nil {
				t.Fatal(err)
			}
			if copied := string(data) == string(pattern); copied != tc.wantData {
				t.Errorf("copy's data %q: copied=%v, want %v", data, copied, tc.wantData)
			}
		})
	}
	if _, err := ParseCopyFromProperties("Inherit"); err == nil {
		t.Error("ParseCopyFromProperties accepted Inherit")
	}
	if _, err := ParseCopyFromData("zero"); err == nil {
		t.Error("ParseCopyFromData accepted zero")
	}
}

// copyUnderWay reports whether a copy to filePath is in progress.
func (s *Server) copyUnderWay(filePath string) bool {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	return s.copying[filePath]
}
