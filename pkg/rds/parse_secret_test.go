package rds

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// An error about RouterOS output it could not read quotes the word it
// could not read; where that word is (a part of) an export's secret, the
// error would carry it to the CO, events and logs. Such text is withheld.
func TestParseErrorsWithholdSecrets(t *testing.T) {
	const secret = "DHHC-1:00:c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3JldDE=:"
	for _, out := range []string{
		// A bare word after a quoted value: "unexpected word".
		" 0   slot=\"pvc-1\" nvme-tcp-server-secret=\"x\" " + secret + "\n",
		// The same at the end of the entry.
		" 0   slot=\"pvc-1\" " + secret,
		// A property name that is not one: "bad property name".
		" 0   slot=\"pvc-1\" " + secret + "=1\n",
	} {
		_, err := ParsePrintDetail(out)
		if err == nil || !errors.Is(err, ErrBadOutput) {
			t.Fatalf("%q: err %v, want ErrBadOutput", out, err)
		}
		if strings.Contains(err.Error(), "c2VjcmV0") || strings.Contains(strings.ToLower(err.Error()), "dhhc-") {
			t.Errorf("%q: the error quotes the secret: %v", out, err)
		}
	}
}

// An entry of the listing the driver cannot read is logged with its text
// for the operator, but never with a secret in it: a disk with an export
// password prints its nvme-tcp-server-secret (what the allowed host
// presents to connect), RouterOS may wrap it over two lines, and the
// reconcile lists every disk every minute.
func TestSkippedEntryLogHidesTheSecret(t *testing.T) {
	const (
		keyHead = "q0VtZ2hGbWxrU3Zq"
		keyTail = "VGhpcyBpcyBub3QgYSByZWFsIGtleQ=="
	)
	listing := "Flags: B - BLOCK-DEVICE; M - MOUNTED; t - NVME-TCP-EXPORT\n" +
		" 0 B t type=file slot=\"pvc-1\" file-path=/storage-pool/k8s/pvc-1.img\n" +
		"       size=1 073 741 824 nvme-tcp-export=yes nvme-tcp-server-port=4420\n" +
		"       nvme-tcp-server-nqn=\"nqn.2000-02.com.mikrotik:pvc-1\"\n" +
		" \n" +
		" 1 Bt type=file slot=\"pvc-2\" size=lots nvme-tcp-export=yes\n" +
		"       nvme-tcp-server-secret=\"DHHC-1:00:" + keyHead + "\n" +
		"       " + keyTail + ":\" file-path=/storage-pool/k8s/pvc-2.img\n"
	env := startSim(t, 10*GiB)
	c := env.client(t, nil)
	var (
		mu   sync.Mutex
		logs bytes.Buffer
	)
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&syncWriter{mu: &mu, w: &logs}), textlogger.Verbosity(10)))
	ctx := klog.NewContext(context.Background(), logger)
	env.sim.InjectFault(rdssim.Fault{Kind: rdssim.FaultGarbage, Match: "where type=file", Output: listing})
	disks, err := c.ListDisks(ctx)
	if err != nil || len(disks) != 1 {
		t.Fatalf("ListDisks = %+v, %v", disks, err)
	}
	mu.Lock()
	defer mu.Unlock()
	out := logs.String()
	if !strings.Contains(out, "skipped a /disk entry") || !strings.Contains(out, "pvc-2") {
		t.Fatalf("no warning naming the skipped entry, so this proves nothing:\n%s", out)
	}
	if !strings.Contains(out, "lots") || !strings.Contains(out, "nvme-tcp-server-secret="+`\"`+hiddenValue) {
		t.Fatalf("the warning no longer shows what it could not read, or hides the secret some other way than <hidden>:\n%s", out)
	}
	for _, part := range []string{keyHead, keyTail[:16]} {
		if strings.Contains(out, part) {
			t.Fatalf("the warning shows the secret (%q):\n%s", part, out)
		}
	}
}

// Raw lines (an entry the parser could not even split into properties)
// that hold a secret, wrapped or not, are withheld whole; other text is
// logged as it was.
func TestLoggableText(t *testing.T) {
	for _, tc := range []struct {
		text     string
		withheld bool
	}{
		{" 1 Q? type=file slot=\"x\" size=lots\n", false},
		{" 1 Q? nvme-tcp-server-secret=\"DHHC-1:00:abc\n       def:\"\n", true},
		{" 1 Q? nvme-tcp-server-sec\n       ret=\"DH\n       HC-1:00:abc:\"\n", true},
		{" 1 Q? nvme-tcp-server-password=hunter2hunter2hunter2\n", true},
		{"1 Bt nvme-tcp-server-secret=\"<hidden>\" size=\"lots\"", false},
	} {
		got := loggableText(tc.text)
		if withheld := got != truncateTo(tc.text, 300); withheld != tc.withheld {
			t.Errorf("loggableText(%q) = %q, want withheld %v", tc.text, got, tc.withheld)
		}
	}
}
