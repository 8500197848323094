// Command release makes the parts of a release that are not builds
// (package release); hack/release.sh runs it:
//
//	release chart --version V --out DIR [--mtime UNIX] CHARTDIR   prints the package's path
//	release krew --version V --sums SHA256SUMS [--download-base URL] TEMPLATE > rds.yaml
//	release notes --version V --release R CHANGELOG > RELEASE-NOTES.md
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/srvlab/rds-csi/hack/tools/release"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: release chart|krew|notes ... (see the command's doc)")
	}
	fs := flag.NewFlagSet("release "+args[0], flag.ContinueOnError)
	version := fs.String("version", "", "the version (hack/version.sh)")
	switch args[0] {
	case "chart":
		out := fs.String("out", "", "the directory to write the package into")
		mtime := fs.Int64("mtime", 0, "every file's time, seconds since the epoch (the commit's)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if fs.NArg() != 1 || *out == "" {
			return fmt.Errorf("usage: release chart --version V --out DIR [--mtime UNIX] CHARTDIR")
		}
		p, err := release.PackageChart(fs.Arg(0), *version, *out, time.Unix(*mtime, 0))
		if err != nil {
			return err
		}
		fmt.Println(p)
		return nil
	case "krew":
		sumsFile := fs.String("sums", "", "SHA256SUMS of the archives")
		base := fs.String("download-base", "https://github.com/srvlab/rds-csi/releases/download", "where the release's archives are published, without the version")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if fs.NArg() != 1 || *sumsFile == "" {
			return fmt.Errorf("usage: release krew --version V --sums SHA256SUMS TEMPLATE")
		}
		tmpl, err := os.ReadFile(fs.Arg(0))
		if err != nil {
			return err
		}
		f, err := os.Open(*sumsFile)
		if err != nil {
			return err
		}
		defer f.Close()
		sums, err := release.ReadSums(f)
		if err != nil {
			return err
		}
		out, err := release.Krew(tmpl, *version, *base, sums)
		if err != nil {
			return err
		}
		_, err = os.Stdout.Write(out)
		return err
	case "notes":
		rel := fs.String("release", "", "the latest release (the file VERSION)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if fs.NArg() != 1 || *rel == "" {
			return fmt.Errorf("usage: release notes --version V --release R CHANGELOG")
		}
		changelog, err := os.ReadFile(fs.Arg(0))
		if err != nil {
			return err
		}
		out, err := release.Notes(changelog, *version, *rel)
		if err != nil {
			return err
		}
		_, err = os.Stdout.Write(out)
		return err
	}
	return fmt.Errorf("unknown command %q: chart, krew or notes", args[0])
}
