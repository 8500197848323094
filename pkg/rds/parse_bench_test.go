package rds

import (
	"fmt"
	"strings"
	"testing"
)

// BenchmarkParsePrintDetail120KB parses 120 KB of print detail output in
// three shapes: many disks (a large ListDisks), and one entry whose
// properties run over thousands of continuation lines (what made the old
// parser quadratic), and one value of thousands of words. docs/BENCHMARKS.md records the figures.
func BenchmarkParsePrintDetail120KB(b *testing.B) {
	const size = 120 << 10
	var many strings.Builder
	many.WriteString("Flags: B - BLOCK-DEVICE; M - MOUNTED; t - NVME-TCP-EXPORT\n")
	for i := 0; many.Len() < size; i++ {
		fmt.Fprintf(&many, "%3d Bt type=file slot=\"pvc-%08d\" slot-default=\"\" parent=\"\" fs=-\n"+
			"      model=\"/storage-pool/kubernetes-volumes/pvc-%08d.img\" size=10 737 418 240\n"+
			"      nvme-tcp-export=yes nvme-tcp-server-port=4420 nvme-tcp-server-nqn=\"nqn.2000-02.com.mikrotik:pvc-%08d\"\n"+
			"      file-path=/storage-pool/kubernetes-volumes/pvc-%08d.img file-size=10.0GiB\n\n", i, i, i, i, i)
	}
	var one strings.Builder
	one.WriteString(" 0 B type=file slot=\"pvc-1\" size=1 024\n")
	for i := 0; one.Len() < size; i++ {
		fmt.Fprintf(&one, "      prop-%d=value-%d\n", i, i)
	}
	// One value of thousands of space-separated words (as `size=53 687`).
	var words strings.Builder
	words.WriteString(" 0 type=file slot=\"pvc-1\" size=1")
	for words.Len() < size {
		words.WriteString(" 000")
	}
	words.WriteString("\n")
	for _, tc := range []struct{ name, out string }{{"many-disks", many.String()}, {"one-long-entry", one.String()}, {"one-long-value", words.String()}} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(tc.out)))
			for i := 0; i < b.N; i++ {
				if _, err := ParsePrintDetail(tc.out); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
