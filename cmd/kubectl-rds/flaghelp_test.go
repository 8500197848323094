package main

import (
	"flag"
	"os"
	"strings"
	"testing"
)

// Every flag of kubectl rds has one short line of help and is described
// in full in docs/flags.md; the usage names each.
func TestFlagHelpIsOneLineEach(t *testing.T) {
	fs := flag.NewFlagSet("kubectl rds", flag.ContinueOnError)
	var g globalOptions
	g.addFlags(fs)
	var inv invocation
	fs.StringVar(&inv.node, "node", "", "release: the node whose claim is dropped")
	fs.BoolVar(&inv.yes, "yes", false, "release: do not ask for confirmation")
	docs, err := os.ReadFile("../../docs/flags.md")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		n++
		if strings.Contains(f.Usage, "\n") || len(f.Usage) > 100 {
			t.Errorf("--%s: help %q is not one line of at most 100 characters", f.Name, f.Usage)
		}
		if !strings.Contains(string(docs), "`--"+f.Name+"`") && !strings.Contains(string(docs), "`-"+f.Name+"`") {
			t.Errorf("--%s is not in docs/flags.md", f.Name)
		}
		if !strings.Contains(usage, "-"+f.Name) {
			t.Errorf("--%s is not in kubectl rds's usage", f.Name)
		}
	})
	if n < 9 {
		t.Fatalf("only %d flags", n)
	}
}
