package main

import (
	"bytes"
	"context"
	"flag"
	"os"
	"regexp"
	"strings"
	"testing"

	"k8s.io/klog/v2"
)

// maxFlagHelp is the longest one-line help of a flag: the detail is in
// docs/flags.md, which names every flag.
const maxFlagHelp = 100

// flagHelp parses the flag package's usage: each flag's name and its help
// line(s).
func flagHelp(usage string) map[string][]string {
	help := map[string][]string{}
	var name string
	for _, l := range strings.Split(usage, "\n") {
		if m := regexp.MustCompile(`^  -(\S+)`).FindStringSubmatch(l); m != nil {
			name = m[1]
			help[name] = nil
			if _, rest, ok := strings.Cut(l, "\t"); ok { // a bool flag's help shares its line
				help[name] = append(help[name], rest)
			}
			continue
		}
		if name != "" && strings.HasPrefix(l, "    \t") {
			help[name] = append(help[name], strings.TrimPrefix(l, "    \t"))
		}
	}
	return help
}

// Every flag of the driver (klog's aside) has one line of help, and
// docs/flags.md describes it in full.
func TestFlagHelpIsOneLineEach(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"-h"}, &stdout, &stderr); code != 0 {
		t.Fatalf("-h: exit %d: %s", code, stderr.String())
	}
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	docs, err := os.ReadFile("../../docs/flags.md")
	if err != nil {
		t.Fatal(err)
	}
	help := flagHelp(stdout.String())
	if len(help) < 40 {
		t.Fatalf("found %d flags in -h:\n%s", len(help), stdout.String())
	}
	for name, lines := range help {
		if klogFlags.Lookup(name) != nil {
			continue // klog's own
		}
		text := regexp.MustCompile(` \(default .*\)$`).ReplaceAllString(strings.Join(lines, " "), "")
		if len(lines) != 1 || len(text) > maxFlagHelp {
			t.Errorf("--%s: help of %d lines, %d characters (at most one line of %d; the detail goes to docs/flags.md): %q", name, len(lines), len(text), maxFlagHelp, text)
		}
		if !strings.Contains(string(docs), "`--"+name+"`") {
			t.Errorf("--%s is not in docs/flags.md", name)
		}
	}
}
