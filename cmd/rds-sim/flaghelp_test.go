package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"
)

// Every flag of rds-sim has one line of help, and docs/flags.md
// describes it in full.
func TestFlagHelpIsOneLineEach(t *testing.T) {
	var stderr bytes.Buffer
	if err := run(context.Background(), []string{"-h"}, io.Discard, &stderr); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	docs, err := os.ReadFile("../../docs/flags.md")
	if err != nil {
		t.Fatal(err)
	}
	flags, _, _ := strings.Cut(stderr.String(), "Fault control")
	help := map[string][]string{}
	var name string
	for _, l := range strings.Split(flags, "\n") {
		if m := regexp.MustCompile(`^  -(\S+)`).FindStringSubmatch(l); m != nil {
			name = m[1]
			help[name] = nil
			if _, rest, ok := strings.Cut(l, "\t"); ok {
				help[name] = append(help[name], rest)
			}
		} else if name != "" && strings.HasPrefix(l, "    \t") {
			help[name] = append(help[name], strings.TrimPrefix(l, "    \t"))
		}
	}
	if len(help) < 20 {
		t.Fatalf("found %d flags in -h:\n%s", len(help), stderr.String())
	}
	for name, lines := range help {
		text := regexp.MustCompile(` \(default .*\)$`).ReplaceAllString(strings.Join(lines, " "), "")
		if len(lines) != 1 || len(text) > 100 {
			t.Errorf("--%s: help of %d lines, %d characters (at most one line of 100; the detail goes to docs/flags.md): %q", name, len(lines), len(text), text)
		}
		if !strings.Contains(string(docs), "`--"+name+"`") && !strings.Contains(string(docs), "`-"+name+"`") {
			t.Errorf("--%s is not in docs/flags.md", name)
		}
	}
}
