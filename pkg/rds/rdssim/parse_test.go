package rdssim

import (
	"reflect"
	"testing"
)

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		bad  bool
	}{
		{in: "0", want: 0},
		{in: "1", want: 1},
		{in: "10737418240", want: 10 * gib},
		{in: "1k", want: kib},
		{in: "1K", want: kib},
		{in: "1536M", want: 1536 * mib},
		{in: "10G", want: 10 * gib},
		{in: "2T", want: 2 * tib},
		{in: "8388607T", want: 8388607 * tib},
		{in: "8388608T", bad: true},
		{in: "", bad: true},
		{in: "G", bad: true},
		{in: "1.5G", bad: true},
		{in: "10GiB", bad: true},
		{in: "10g", bad: true},
		{in: "1m", bad: true},
		{in: "-1", bad: true},
		{in: "+1", bad: true},
		{in: " 1", bad: true},
		{in: "99999999999999999999", bad: true},
	} {
		got, err := ParseSize(tc.in)
		if tc.bad != (err != nil) || (!tc.bad && got != tc.want) {
			t.Errorf("ParseSize(%q) = %d, %v; want %d (error: %v)", tc.in, got, err, tc.want, tc.bad)
		}
	}
}

func TestSizeFormats(t *testing.T) {
	for _, tc := range []struct {
		n             int64
		spaced, human string
	}{
		{0, "0", "0"},
		{512, "512", "512"},
		{1023, "1 023", "1023"},
		{1024, "1 024", "1.0KiB"},
		{1536, "1 536", "1.5KiB"},
		{10 * mib, "10 485 760", "10.0MiB"},
		{1536 * mib, "1 610 612 736", "1.5GiB"},
		{50 * gib, "53 687 091 200", "50.0GiB"},
		{tib, "1 099 511 627 776", "1024.0GiB"},
		{10*gib + 1, "10 737 418 241", "10.0GiB"},
	} {
		if got := spacedNumber(tc.n); got != tc.spaced {
			t.Errorf("spacedNumber(%d) = %q, want %q", tc.n, got, tc.spaced)
		}
		if got := humanSize(tc.n); got != tc.human {
			t.Errorf("humanSize(%d) = %q, want %q", tc.n, got, tc.human)
		}
	}
}

func TestParseCommand(t *testing.T) {
	for _, tc := range []struct {
		line string
		want *command
	}{
		{"/disk add slot=a", &command{menu: "disk", verb: "add", end: 16, args: []arg{{key: "slot", keyPos: 10, val: value{text: "a", pos: 15}}}}},
		{"/disk/add slot=a", &command{menu: "disk", verb: "add", end: 16, args: []arg{{key: "slot", keyPos: 10, val: value{text: "a", pos: 15}}}}},
		{"disk add", &command{menu: "disk", verb: "add", end: 8}},
		{"  /system   resource print  ", &command{menu: "system/resource", verb: "print", end: 28}},
		{"/system/resource/print", &command{menu: "system/resource", verb: "print", end: 22}},
		{`/disk set [find where slot="a" and type=file] file-size=1G`, &command{menu: "disk", verb: "set", end: 58, args: []arg{
			{keyPos: 10, val: value{pos: 10, find: &findExpr{pos: 10, conds: []cond{{key: "slot", keyPos: 22, value: "a"}, {key: "type", keyPos: 35, value: "file"}}}}},
			{key: "file-size", keyPos: 46, val: value{text: "1G", pos: 56}},
		}}},
		{`/disk remove [find]`, &command{menu: "disk", verb: "remove", end: 19, args: []arg{{keyPos: 13, val: value{pos: 13, find: &findExpr{pos: 13}}}}}},
		{`/disk set "a b" slot=`, &command{menu: "disk", verb: "set", end: 21, args: []arg{
			{keyPos: 10, val: value{text: "a b", quoted: true, pos: 10}},
			{key: "slot", keyPos: 16, val: value{pos: 21}},
		}}},
		{`/disk print where slot="q\"u\\o\$t\?e"`, &command{menu: "disk", verb: "print", end: 38, args: []arg{
			{keyPos: 12, val: value{text: "where", pos: 12}},
			{key: "slot", keyPos: 18, val: value{text: `q"u\o$t?e`, quoted: true, pos: 23}},
		}}},
		{"", nil},
		{"/disk", nil},
	} {
		got, err := parseCommand(tc.line)
		if err != nil {
			t.Errorf("%q: %v", tc.line, err)
			continue
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q:\n got %+v\nwant %+v", tc.line, got, tc.want)
		}
	}
}

func TestQuoteRoundTrip(t *testing.T) {
	for _, s := range []string{"", "a", `q"u\o$t`, "a b"} {
		p := &parser{s: quote(s)}
		got, err := p.quoted()
		if err != nil || got != s || !p.eof() {
			t.Errorf("quote(%q) = %s parses back as %q, %v", s, quote(s), got, err)
		}
	}
}

func FuzzParseCommand(f *testing.F) {
	for _, s := range []string{
		`/disk add type=file file-path="/storage-pool/k8s/pvc-1.img" file-size=10G slot="pvc-1"`,
		`/disk set [find slot="pvc-1"] file-size=20G`,
		`/disk print detail where slot="a" and type=file`,
		"/disk print\n/x", `/disk set [find slot="a$b"]`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		cmd, err := parseCommand(line)
		if err != nil {
			if _, ok := err.(cliError); !ok {
				t.Fatalf("%q: error of type %T", line, err)
			}
			return
		}
		if cmd != nil && cmd.menu == "" {
			t.Fatalf("%q: command without a menu", line)
		}
	})
}
