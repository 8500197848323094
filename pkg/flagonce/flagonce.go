// Package flagonce parses a command line in which every flag may be given
// once. The standard flag package lets a later value silently replace an
// earlier one (--mode=all --mode=node runs as node), which hides a clash
// such as a chart's own flag and an extra argument for the same setting;
// here the second value is a flag error naming both values.
//
// It must never change what a single occurrence of a flag means, nor the
// usage text the flag set prints.
package flagonce

import (
	"flag"
	"fmt"
	"strings"
)

// Parse parses args with fs (as fs.Parse does) and refuses a flag given
// more than once.
func Parse(fs *flag.FlagSet, args []string) error {
	values := map[*flag.Flag]flag.Value{}
	var repeated *RepeatedError
	fs.VisitAll(func(f *flag.Flag) {
		values[f] = f.Value
		f.Value = &once{Value: f.Value, name: f.Name, repeated: &repeated}
	})
	// The usage text (printed on -h and on an error, inside fs.Parse) reads
	// the flags' own values: their types name the arguments, their zero
	// values decide which defaults are shown.
	restore := func() {
		for f, v := range values {
			f.Value = v
		}
	}
	defer restore()
	usage := fs.Usage
	defer func() { fs.Usage = usage }()
	fs.Usage = func() {
		restore()
		if usage != nil {
			usage()
			return
		}
		fmt.Fprintf(fs.Output(), "Usage of %s:\n", fs.Name())
		fs.PrintDefaults()
	}
	err := fs.Parse(args)
	if err != nil && repeated != nil {
		return repeated // the flag package's "invalid value" would blame the value
	}
	return err
}

// RepeatedError is a flag given more than once.
type RepeatedError struct {
	Name          string
	First, Second string
}

func (e *RepeatedError) Error() string {
	return fmt.Sprintf("flag -%s is given more than once (%q, then %q): give each flag once", e.Name, e.First, e.Second)
}

// once passes the first Set on and refuses every later one.
type once struct {
	flag.Value
	name     string
	first    string // the value given first; set says whether there was one
	set      bool
	repeated **RepeatedError
}

func (o *once) Set(s string) error {
	if o.set {
		*o.repeated = &RepeatedError{Name: o.name, First: o.first, Second: s}
		return *o.repeated
	}
	o.first, o.set = s, true
	return o.Value.Set(s)
}

// IsBoolFlag keeps a boolean flag usable without a value (-v, not -v=true).
func (o *once) IsBoolFlag() bool {
	b, ok := o.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// Replace is the command line args with the flags of extra in place of its
// own of the same names, for composing a command line from a standard one
// and overrides. Every flag of both is in one word (-name or -name=value).
func Replace(args, extra []string) []string {
	name := func(arg string) string { n, _, _ := strings.Cut(strings.TrimLeft(arg, "-"), "="); return n }
	given := map[string]bool{}
	for _, a := range extra {
		given[name(a)] = true
	}
	var out []string
	for _, a := range args {
		if !given[name(a)] {
			out = append(out, a)
		}
	}
	return append(out, extra...)
}
