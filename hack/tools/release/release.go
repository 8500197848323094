// Package release makes the parts of a release that are not builds (make
// release, hack/release.sh): the chart package, the krew manifest with the
// archives' sha256, and the release notes cut from CHANGELOG.md. Each is a
// function of its inputs alone (no clock, no paths), so a release of one
// commit gives the same bytes again.
package release

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"helm.sh/helm/v3/pkg/chart/loader"
	"sigs.k8s.io/yaml"
)

// semver is a version as hack/version.sh prints it: vMAJOR.MINOR.PATCH and
// an optional pre-release (a build between releases: -12-gabcdef0[-dirty]).
var semver = regexp.MustCompile(`^v(\d+)\.(\d+)\.(\d+)(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$`)

// CheckVersion refuses what is not a version hack/version.sh prints.
func CheckVersion(v string) error {
	if !semver.MatchString(v) {
		return fmt.Errorf("version %q: want vMAJOR.MINOR.PATCH[-PRERELEASE]", v)
	}
	return nil
}

// ChartVersion is the chart's version for the driver's version v: v
// without its "v" (Helm wants SemVer 2; a build between releases is a
// pre-release of the chart too).
func ChartVersion(v string) string { return strings.TrimPrefix(v, "v") }

// chartYAMLVersion matches the version and appVersion lines of Chart.yaml.
var (
	chartVersionLine    = regexp.MustCompile(`(?m)^version: .*$`)
	chartAppVersionLine = regexp.MustCompile(`(?m)^appVersion: .*$`)
)

// PackageChart writes the chart in dir as the archive helm package makes
// (NAME/ at the top, every file of the chart), with Chart.yaml's version
// and appVersion set from v, every time mtime, owner root and mode 0644,
// in path order: the same chart and version give the same bytes (helm
// package stamps the time of the run). It returns the file's name,
// NAME-VERSION.tgz, in outDir. The written archive is read back with
// Helm's own loader, which must find the chart and the versions.
func PackageChart(dir, v, outDir string, mtime time.Time) (string, error) {
	if err := CheckVersion(v); err != nil {
		return "", err
	}
	ch, err := loader.LoadDir(dir)
	if err != nil {
		return "", fmt.Errorf("chart %s: %w", dir, err)
	}
	if _, err := os.Stat(filepath.Join(dir, ".helmignore")); err == nil {
		return "", errors.New("the chart has a .helmignore, which PackageChart does not read: every file of the chart directory is packaged")
	}
	name := ch.Metadata.Name
	var files []string
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			files = append(files, p)
		} else if !d.IsDir() {
			return fmt.Errorf("%s: not a regular file", p)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	sort.Strings(files)
	var buf bytes.Buffer
	gz, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return "", err
	}
	tw := tar.NewWriter(gz)
	for _, p := range files {
		data, err := os.ReadFile(p)
		if err != nil {
			return "", err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		if rel == "Chart.yaml" {
			if !chartVersionLine.Match(data) || !chartAppVersionLine.Match(data) {
				return "", fmt.Errorf("%s: no version: or appVersion: line to set", p)
			}
			data = chartVersionLine.ReplaceAll(data, []byte("version: "+ChartVersion(v)))
			data = chartAppVersionLine.ReplaceAll(data, []byte("appVersion: "+v))
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name + "/" + rel, Mode: 0o644, Size: int64(len(data)),
			ModTime: mtime.UTC(), Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return "", err
		}
		if _, err := tw.Write(data); err != nil {
			return "", err
		}
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	if err := gz.Close(); err != nil {
		return "", err
	}
	back, err := loader.LoadArchive(bytes.NewReader(buf.Bytes()))
	if err != nil {
		return "", fmt.Errorf("Helm cannot load the packaged chart: %w", err)
	}
	if back.Metadata.Version != ChartVersion(v) || back.Metadata.AppVersion != v || len(back.Templates) != len(ch.Templates) {
		return "", fmt.Errorf("the packaged chart reads back as version %s, appVersion %s, %d templates; want %s, %s, %d",
			back.Metadata.Version, back.Metadata.AppVersion, len(back.Templates), ChartVersion(v), v, len(ch.Templates))
	}
	out := filepath.Join(outDir, name+"-"+ChartVersion(v)+".tgz")
	return out, os.WriteFile(out, buf.Bytes(), 0o644)
}

// KrewPlatforms are the platforms kubectl-rds is released for, as
// os/arch: each has an archive kubectl-rds_OS_ARCH.tar.gz.
var KrewPlatforms = []string{"linux/amd64", "linux/arm64", "darwin/amd64", "darwin/arm64"}

// KrewArchive is the release archive of kubectl-rds for os/arch.
func KrewArchive(platform string) string {
	return "kubectl-rds_" + strings.ReplaceAll(platform, "/", "_") + ".tar.gz"
}

// Krew fills the krew manifest template: spec.version is v, and each
// platform's uri and sha256 are those of its archive, published under
// downloadBase/v/; sums maps an archive's name to its sha256 (hex). The
// template must list exactly KrewPlatforms.
func Krew(template []byte, v, downloadBase string, sums map[string]string) ([]byte, error) {
	if err := CheckVersion(v); err != nil {
		return nil, err
	}
	var m map[string]any
	if err := yaml.Unmarshal(template, &m); err != nil {
		return nil, fmt.Errorf("krew manifest: %w", err)
	}
	spec, ok := m["spec"].(map[string]any)
	if !ok {
		return nil, errors.New("krew manifest: no spec")
	}
	spec["version"] = v
	platforms, _ := spec["platforms"].([]any)
	seen := map[string]bool{}
	for _, p := range platforms {
		pm, ok := p.(map[string]any)
		if !ok {
			return nil, errors.New("krew manifest: a platform is not a map")
		}
		sel, _ := pm["selector"].(map[string]any)
		labels, _ := sel["matchLabels"].(map[string]any)
		platform := fmt.Sprintf("%v/%v", labels["os"], labels["arch"])
		archive := KrewArchive(platform)
		sum, ok := sums[archive]
		if !ok {
			return nil, fmt.Errorf("krew manifest: no archive %s for platform %s", archive, platform)
		}
		if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(sum) {
			return nil, fmt.Errorf("sha256 of %s: %q", archive, sum)
		}
		pm["uri"] = strings.TrimSuffix(downloadBase, "/") + "/" + v + "/" + archive
		pm["sha256"] = sum
		seen[platform] = true
	}
	for _, p := range KrewPlatforms {
		if !seen[p] {
			return nil, fmt.Errorf("krew manifest: platform %s is not in the template", p)
		}
	}
	if len(seen) != len(KrewPlatforms) {
		return nil, fmt.Errorf("krew manifest: platforms %v; want %v", seen, KrewPlatforms)
	}
	out, err := yaml.Marshal(m)
	if err != nil {
		return nil, err
	}
	return append([]byte("# krew plugin manifest of kubectl-rds "+v+" (make release; docs/kubectl-rds.md).\n"), out...), nil
}

// Notes cuts the release notes of version v out of a Keep a Changelog
// file: the section "## [X.Y.Z] - DATE" of release (vX.Y.Z, the file
// VERSION) when v is the release itself, else (a build between releases)
// the "## [Unreleased]" section, headed with v. The section's text is
// kept as written; link reference lines ("[x]: url") at the end of the
// file are dropped. A release without its section, or with an empty one,
// is an error: a release says what changed. An empty Unreleased section
// gives notes that say so.
func Notes(changelog []byte, v, release string) ([]byte, error) {
	if err := CheckVersion(v); err != nil {
		return nil, err
	}
	want := "## [" + strings.TrimPrefix(release, "v") + "]"
	if v != release {
		want = "## [Unreleased]"
	}
	var out bytes.Buffer
	in := false
	found := false
	sc := bufio.NewScanner(bytes.NewReader(changelog))
	linkRef := regexp.MustCompile(`^\[[^\]]+\]: `)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			if in {
				break
			}
			if line == want || strings.HasPrefix(line, want+" ") {
				in, found = true, true
				title := v
				if _, date, ok := strings.Cut(line, "] - "); ok && v == release {
					title += " (" + date + ")"
				} else if v != release {
					title += " (a build after " + release + ": what is not released yet)"
				}
				fmt.Fprintf(&out, "# rds-csi %s\n", title)
				continue
			}
		}
		if in && !linkRef.MatchString(line) {
			out.WriteString(line + "\n")
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("CHANGELOG.md has no section %q", want)
	}
	notes := bytes.TrimRight(out.Bytes(), "\n")
	if bytes.Count(notes, []byte("\n")) < 2 {
		if v == release {
			return nil, fmt.Errorf("CHANGELOG.md's section %q is empty: a release says what changed", want)
		}
		// A build between releases before anyone wrote down a change.
		notes = append(notes, []byte("\n\nCHANGELOG.md records no change since "+release+" yet.")...)
	}
	return append(notes, '\n'), nil
}

// ReadSums reads a SHA256SUMS file ("HEX  NAME" lines, as sha256sum
// writes them) into a map of name to sum.
func ReadSums(r io.Reader) (map[string]string, error) {
	sums := map[string]string{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok || len(sum) != 64 || name == "" {
			return nil, fmt.Errorf("SHA256SUMS line %q", sc.Text())
		}
		sums[strings.TrimPrefix(name, "*")] = sum
	}
	return sums, sc.Err()
}
