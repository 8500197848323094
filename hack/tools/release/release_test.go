package release

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chart/loader"
	"sigs.k8s.io/yaml"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// The chart package: Helm loads it with the version and appVersion of the
// build, every template and value of the chart in it, and a second
// package of the same chart and version is the same bytes.
func TestPackageChartIsHelmsAndReproducible(t *testing.T) {
	dir := filepath.Join(repoRoot(t), "charts", "rds-csi")
	mtime := time.Unix(1700000000, 0)
	for _, v := range []string{"v0.2.0", "v0.2.0-12-gabcdef0-dirty"} {
		a, b := t.TempDir(), t.TempDir()
		pa, err := PackageChart(dir, v, a, mtime)
		if err != nil {
			t.Fatal(err)
		}
		pb, err := PackageChart(dir, v, b, mtime)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(pa) != "rds-csi-"+strings.TrimPrefix(v, "v")+".tgz" {
			t.Errorf("package %s", pa)
		}
		da, _ := os.ReadFile(pa)
		db, _ := os.ReadFile(pb)
		if !bytes.Equal(da, db) {
			t.Errorf("%s: two packages of the same chart differ", v)
		}
		ch, err := loader.Load(pa)
		if err != nil {
			t.Fatal(err)
		}
		src, err := loader.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		if ch.Metadata.Version != strings.TrimPrefix(v, "v") || ch.Metadata.AppVersion != v {
			t.Errorf("%s: packaged chart says version %s appVersion %s", v, ch.Metadata.Version, ch.Metadata.AppVersion)
		}
		if len(ch.Templates) != len(src.Templates) || len(ch.Schema) == 0 || ch.Values["image"] == nil {
			t.Errorf("%s: packaged chart has %d templates (source %d), schema %d bytes", v, len(ch.Templates), len(src.Templates), len(ch.Schema))
		}
	}
	if _, err := PackageChart(dir, "0.2.0", t.TempDir(), mtime); err == nil {
		t.Error("a version without v was packaged")
	}
}

// The krew manifest from the repository's template: every platform gets
// its archive's sum and the release's address; a template without an
// archive for a platform, or a sum that is not one, is refused.
func TestKrewFillsEveryPlatformFromItsArchive(t *testing.T) {
	tmpl, err := os.ReadFile(filepath.Join(repoRoot(t), "krew", "rds.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	sums := map[string]string{}
	for i, p := range KrewPlatforms {
		sums[KrewArchive(p)] = strings.Repeat(string("abcd"[i]), 64)
	}
	out, err := Krew(tmpl, "v1.2.3", "https://example.invalid/dl/", sums)
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Spec struct {
			Version   string
			Platforms []struct {
				Selector struct{ MatchLabels map[string]string }
				URI      string
				SHA256   string
			}
		}
	}
	if err := yaml.Unmarshal(out, &m); err != nil {
		t.Fatal(err)
	}
	if m.Spec.Version != "v1.2.3" || len(m.Spec.Platforms) != len(KrewPlatforms) {
		t.Fatalf("spec %+v", m.Spec)
	}
	for _, p := range m.Spec.Platforms {
		archive := KrewArchive(p.Selector.MatchLabels["os"] + "/" + p.Selector.MatchLabels["arch"])
		if p.SHA256 != sums[archive] || p.URI != "https://example.invalid/dl/v1.2.3/"+archive {
			t.Errorf("%s: uri %s sha256 %s", archive, p.URI, p.SHA256)
		}
	}
	delete(sums, KrewArchive("darwin/arm64"))
	if _, err := Krew(tmpl, "v1.2.3", "https://example.invalid/dl", sums); err == nil || !strings.Contains(err.Error(), "darwin/arm64") {
		t.Errorf("a missing archive: %v", err)
	}
	sums[KrewArchive("darwin/arm64")] = "0"
	if _, err := Krew(tmpl, "v1.2.3", "https://example.invalid/dl", sums); err == nil {
		t.Error("a sum that is not one was taken")
	}
}

const changelog = `# Changelog

Intro.

## [Unreleased]

### Fixed
- a thing after the release

## [0.2.0] - 2026-12-06

### Added
- versions

### Upgrading
- from v0.1.0: nothing to do

## [0.1.0] - 2026-11-01

- old

[Unreleased]: https://example.invalid/compare/v0.2.0...HEAD
[0.2.0]: https://example.invalid/releases/tag/v0.2.0
`

// Release notes are the release's own section, or for a build between
// releases the unreleased one, never a neighbour's; a release with no
// section of its own is refused.
func TestNotesAreTheReleasesSection(t *testing.T) {
	got, err := Notes([]byte(changelog), "v0.2.0", "v0.2.0")
	if err != nil {
		t.Fatal(err)
	}
	want := "# rds-csi v0.2.0 (2026-12-06)\n\n### Added\n- versions\n\n### Upgrading\n- from v0.1.0: nothing to do\n"
	if string(got) != want {
		t.Errorf("release notes:\n%s\nwant:\n%s", got, want)
	}
	got, err = Notes([]byte(changelog), "v0.2.0-3-gabcdef0", "v0.2.0")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(got), "# rds-csi v0.2.0-3-gabcdef0 (a build after v0.2.0") || !strings.Contains(string(got), "a thing after the release") || strings.Contains(string(got), "versions") {
		t.Errorf("notes of a build between releases:\n%s", got)
	}
	if _, err := Notes([]byte(changelog), "v0.3.0", "v0.3.0"); err == nil {
		t.Error("a release without its section got notes")
	}
	empty := strings.Replace(changelog, "### Fixed\n- a thing after the release\n", "", 1)
	got, err = Notes([]byte(empty), "v0.2.0-1-gabcdef0", "v0.2.0")
	if err != nil || !strings.Contains(string(got), "records no change since v0.2.0") {
		t.Errorf("notes of a build after a release with nothing unreleased: %q, %v", got, err)
	}
	emptyRelease := strings.Replace(changelog, "### Added\n- versions\n\n### Upgrading\n- from v0.1.0: nothing to do\n", "", 1)
	if _, err := Notes([]byte(emptyRelease), "v0.2.0", "v0.2.0"); err == nil {
		t.Error("a release with an empty section got notes")
	}
	// The repository's own CHANGELOG.md has the section of its VERSION.
	root := repoRoot(t)
	cl, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	v, err := os.ReadFile(filepath.Join(root, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Notes(cl, strings.TrimSpace(string(v)), strings.TrimSpace(string(v))); err != nil {
		t.Errorf("CHANGELOG.md: %v", err)
	}
}
