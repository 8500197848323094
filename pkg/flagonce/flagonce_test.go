package flagonce

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"testing"
	"time"
)

func newFlagSet(out *bytes.Buffer) (*flag.FlagSet, *string, *bool, *time.Duration) {
	fs := flag.NewFlagSet("prog", flag.ContinueOnError)
	fs.SetOutput(out)
	mode := fs.String("mode", "all", "what to run")
	v := fs.Bool("v", false, "verbose")
	d := fs.Duration("timeout", time.Minute, "timeout")
	return fs, mode, v, d
}

func TestParseRefusesARepeatedFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want RepeatedError
	}{
		{[]string{"--mode=all", "--mode=node"}, RepeatedError{"mode", "all", "node"}},
		{[]string{"-mode", "node", "-mode", "node"}, RepeatedError{"mode", "node", "node"}}, // the same value twice is a clash too
		{[]string{"-v", "-v=false"}, RepeatedError{"v", "true", "false"}},
		{[]string{"-timeout=1s", "--timeout", "2s"}, RepeatedError{"timeout", "1s", "2s"}},
	} {
		var out bytes.Buffer
		fs, _, _, _ := newFlagSet(&out)
		err := Parse(fs, tc.args)
		var repeated *RepeatedError
		if !errors.As(err, &repeated) || *repeated != tc.want || !strings.HasPrefix(err.Error(), "flag -"+tc.want.Name+" is given more than once") {
			t.Errorf("%q: err %v, want a refusal of the repeated flag -%s", tc.args, err, tc.want.Name)
		}
	}
}

func TestParseKeepsSingleFlags(t *testing.T) {
	var out bytes.Buffer
	fs, mode, v, d := newFlagSet(&out)
	if err := Parse(fs, []string{"-v", "--mode=node", "-timeout", "5s", "rest", "-mode=x"}); err != nil {
		t.Fatal(err)
	}
	if *mode != "node" || !*v || *d != 5*time.Second || strings.Join(fs.Args(), " ") != "rest -mode=x" {
		t.Errorf("mode %q v %v timeout %v args %q", *mode, *v, *d, fs.Args())
	}
	// The flags are the set's own again: a later Parse or Set behaves as
	// the flag package's.
	if err := fs.Set("mode", "controller"); err != nil || *mode != "controller" {
		t.Errorf("Set after Parse: %v, %q", err, *mode)
	}
}

// The usage text printed inside Parse is the flag package's own.
func TestParseUsageUnchanged(t *testing.T) {
	var want, got bytes.Buffer
	plain, _, _, _ := newFlagSet(&want)
	_ = plain.Parse([]string{"-h"})
	fs, _, _, _ := newFlagSet(&got)
	if err := Parse(fs, []string{"-h"}); err != flag.ErrHelp {
		t.Fatalf("-h: %v", err)
	}
	if got.String() != want.String() || !strings.Contains(got.String(), "-timeout duration") {
		t.Errorf("usage:\n%s\nwant:\n%s", got.String(), want.String())
	}
}

func TestReplace(t *testing.T) {
	got := Replace([]string{"--mode=all", "--v=4", "--leader-election", "--endpoint=unix:///a"}, []string{"-v=2", "--leader-election=false"})
	want := "--mode=all --endpoint=unix:///a -v=2 --leader-election=false"
	if strings.Join(got, " ") != want {
		t.Errorf("Replace: %q, want %q", got, want)
	}
	var out bytes.Buffer
	fs, _, v, _ := newFlagSet(&out)
	if err := Parse(fs, Replace([]string{"-v", "--mode=node"}, []string{"-v=false"})); err != nil || *v {
		t.Errorf("a replaced flag is given once: %v, -v %v", err, *v)
	}
}
