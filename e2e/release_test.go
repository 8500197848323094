//go:build e2e

package e2e

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/srvlab/rds-csi/e2e/framework"
)

// make release, as the tag workflow runs it, checked file by file
// (docs/release.md, "make release"): in a clean clone of this commit (the
// working tree's uncommitted changes are not in it), as root, with this
// checkout's cache (the Debian packages, syft). Then every binary is built
// a second time from another clone, at another path, and must be the same
// bytes: the release is reproducible.
func TestReleaseArtifacts(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("make release needs root (the images); CI runs as root")
		}
		t.Skip("make release needs root (the images: apt's cache, the root filesystem's owners)")
	}
	e := framework.NewEnv(t, framework.EnvOptions{})
	tl := e.TL
	head := gitOut(t, e.Root, "rev-parse", "HEAD")
	clone := func(name string) string {
		dir := filepath.Join(t.TempDir(), name)
		gitOut(t, e.Root, "clone", "-q", "--no-checkout", e.Root, dir)
		gitOut(t, dir, "checkout", "-q", "--detach", head)
		return dir
	}
	cache := filepath.Join(e.Root, ".cache")
	if c := os.Getenv("RDS_CSI_RELEASE_CACHE"); c != "" {
		cache = c
	}

	done := tl.Step("make release in a clean clone of " + head[:12])
	src := clone("release")
	version := gitOutCmd(t, src, filepath.Join(src, "hack", "version.sh"))
	commitTime, err := strconv.ParseInt(gitOut(t, src, "log", "-1", "--format=%ct"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	release := strings.TrimSpace(readFile(t, filepath.Join(src, "VERSION")))
	dist := filepath.Join(e.Dir, "dist")
	logf, err := os.Create(filepath.Join(e.Dir, "make-release.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("make", "release", "DIST="+dist)
	cmd.Dir = src
	cmd.Env = append(withoutEnv(os.Environ(), "VERSION", "MAKEFLAGS", "TZ"), "RDS_CSI_CACHE="+cache, "TZ="+releaseTZ)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Run(); err != nil {
		logf.Close()
		t.Fatalf("make release: %v\n%s", err, tailFile(filepath.Join(e.Dir, "make-release.log"), 40))
	}
	logf.Close()
	done()
	tl.Logf("release %s of %s (VERSION %s) in %s", version, head[:12], release, dist)

	chartName := "rds-csi-" + strings.TrimPrefix(version, "v") + ".tgz"
	platforms := []string{"linux_amd64", "linux_arm64", "darwin_amd64", "darwin_arm64"}
	arches := []string{"amd64", "arm64"}
	want := []string{"RELEASE-NOTES.md", "SHA256SUMS", chartName, "rds.yaml"}
	for _, p := range platforms {
		want = append(want, "kubectl-rds_"+p+".tar.gz", "kubectl-rds_"+p+".spdx.json")
	}
	for _, a := range arches {
		want = append(want, "rds-csi-driver-image_linux_"+a+".tar", "rds-csi-driver-image_linux_"+a+".spdx.json", "rds-csi-driver_linux_"+a+".spdx.json")
	}
	sort.Strings(want)
	entries, err := os.ReadDir(dist)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, en := range entries {
		got = append(got, en.Name())
	}
	sort.Strings(got)
	if !slices.Equal(got, want) {
		t.Fatalf("dist holds %v;\nwant %v", got, want)
	}

	done = tl.Step("SHA256SUMS covers every file and matches it")
	f, err := os.Open(filepath.Join(dist, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	sums := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q", sc.Text())
		}
		sums[name] = sum
	}
	f.Close()
	for _, name := range want {
		if name == "SHA256SUMS" {
			continue
		}
		if s := fileSum(t, filepath.Join(dist, name)); sums[name] != s {
			t.Errorf("%s: sha256 %s, SHA256SUMS says %q", name, s, sums[name])
		}
	}
	if len(sums) != len(want)-1 {
		t.Errorf("SHA256SUMS lists %d files, want %d", len(sums), len(want)-1)
	}
	done()

	done = tl.Step("kubectl-rds archives: the krew manifest's sums and addresses, a static binary of the platform and version")
	var krew struct {
		Spec struct {
			Version   string
			Platforms []struct {
				Selector struct{ MatchLabels map[string]string }
				URI      string
				SHA256   string
				Bin      string
			}
		}
	}
	if err := yaml.Unmarshal([]byte(readFile(t, filepath.Join(dist, "rds.yaml"))), &krew); err != nil {
		t.Fatal(err)
	}
	if krew.Spec.Version != version || len(krew.Spec.Platforms) != len(platforms) {
		t.Errorf("krew manifest: version %s, %d platforms; want %s, %d", krew.Spec.Version, len(krew.Spec.Platforms), version, len(platforms))
	}
	binaries := map[string][]byte{} // release name -> binary, as shipped
	for _, p := range krew.Spec.Platforms {
		plat := p.Selector.MatchLabels["os"] + "_" + p.Selector.MatchLabels["arch"]
		archive := "kubectl-rds_" + plat + ".tar.gz"
		if p.SHA256 != sums[archive] || p.SHA256 != fileSum(t, filepath.Join(dist, archive)) {
			t.Errorf("krew %s: sha256 %s, the archive's is %s", plat, p.SHA256, fileSum(t, filepath.Join(dist, archive)))
		}
		if p.URI != "https://github.com/srvlab/rds-csi/releases/download/"+version+"/"+archive {
			t.Errorf("krew %s: uri %s", plat, p.URI)
		}
		checkArchiveStamps(t, filepath.Join(dist, archive), commitTime)
		files := tarFiles(t, filepath.Join(dist, archive), true)
		bin, ok := files["kubectl-rds"]
		if !ok || len(files) != 1 {
			t.Errorf("%s holds %v; want kubectl-rds alone", archive, mapKeysOf(files))
			continue
		}
		checkReleaseBinary(t, archive, bin, p.Selector.MatchLabels["os"], p.Selector.MatchLabels["arch"], version)
		binaries["kubectl-rds_"+plat] = bin
	}
	done()

	done = tl.Step("image archives: linux/amd64 and linux/arm64, tagged with the version, the driver of that platform")
	manifests := map[string]string{} // image archive -> its manifest's digest
	for _, a := range arches {
		name := "rds-csi-driver-image_linux_" + a + ".tar"
		ref, arch, driver := readImage(t, filepath.Join(dist, name))
		manifests[name] = imageManifestDigest(t, filepath.Join(dist, name))
		if ref != "ghcr.io/srvlab/rds-csi-driver:"+version || arch != a {
			t.Errorf("%s: %s for %s; want ghcr.io/srvlab/rds-csi-driver:%s for %s", name, ref, arch, version, a)
		}
		checkReleaseBinary(t, name+":/rds-csi-driver", driver, "linux", a, version)
		binaries["rds-csi-driver_linux_"+a] = driver
	}
	done()

	done = tl.Step("SBOMs: SPDX JSON, each naming what it describes")
	for _, name := range want {
		if !strings.HasSuffix(name, ".spdx.json") {
			continue
		}
		var doc struct {
			SPDXVersion string `json:"spdxVersion"`
			Name        string `json:"name"`
			Packages    []struct {
				SPDXID      string `json:"SPDXID"`
				Name        string `json:"name"`
				VersionInfo string `json:"versionInfo"`
				Checksums   []struct {
					Algorithm string `json:"algorithm"`
					Value     string `json:"checksumValue"`
				} `json:"checksums"`
			} `json:"packages"`
			Relationships []struct {
				Element string `json:"spdxElementId"`
				Related string `json:"relatedSpdxElement"`
				Type    string `json:"relationshipType"`
			} `json:"relationships"`
		}
		if err := json.Unmarshal([]byte(readFile(t, filepath.Join(dist, name))), &doc); err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		pkgs := map[string]string{}
		for _, p := range doc.Packages {
			pkgs[p.Name] = p.VersionInfo
		}
		wantPkgs := []string{"k8s.io/client-go"}
		if strings.HasPrefix(name, "rds-csi-driver-image_") {
			wantPkgs = append(wantPkgs, "e2fsprogs", "util-linux", "xfsprogs", "google.golang.org/grpc")
		} else if strings.HasPrefix(name, "rds-csi-driver_") {
			wantPkgs = append(wantPkgs, "google.golang.org/grpc", "golang.org/x/crypto")
		}
		if doc.SPDXVersion != "SPDX-2.3" {
			t.Errorf("%s: spdxVersion %q", name, doc.SPDXVersion)
		}
		for _, p := range wantPkgs {
			if _, ok := pkgs[p]; !ok {
				t.Errorf("%s (%d packages) does not list %s", name, len(doc.Packages), p)
			}
		}
		// What the document describes is the file shipped under its name:
		// its root package (the document DESCRIBES it) carries the sha256
		// of the binary as the archive or the image ships it, or the
		// digest of the image archive's manifest. Names and package lists
		// alone would pass an SBOM of another platform's binary, or of the
		// other architecture's image.
		subject := strings.TrimSuffix(name, ".spdx.json")
		var wantSHA256 string
		if strings.HasPrefix(name, "rds-csi-driver-image_") {
			wantSHA256 = strings.TrimPrefix(manifests[subject+".tar"], "sha256:")
		} else if b, ok := binaries[subject]; ok {
			wantSHA256 = sum(b)
		}
		var roots []string
		for _, r := range doc.Relationships {
			if r.Element == "SPDXRef-DOCUMENT" && r.Type == "DESCRIBES" {
				roots = append(roots, r.Related)
			}
		}
		var described []string
		for _, p := range doc.Packages {
			if !slices.Contains(roots, p.SPDXID) {
				continue
			}
			for _, c := range p.Checksums {
				if c.Algorithm == "SHA256" {
					described = append(described, c.Value)
				}
			}
			if p.VersionInfo != version {
				t.Errorf("%s describes %s at version %q; want %s", name, p.Name, p.VersionInfo, version)
			}
		}
		if wantSHA256 == "" || len(described) != 1 || described[0] != wantSHA256 {
			t.Errorf("%s describes sha256 %v (roots %v); the shipped %s is %q", name, described, roots, subject, wantSHA256)
		}
	}
	done()

	done = tl.Step("release notes: CHANGELOG.md's section")
	notes := readFile(t, filepath.Join(dist, "RELEASE-NOTES.md"))
	section := "## [Unreleased]"
	if version == release {
		section = "## [" + strings.TrimPrefix(release, "v") + "]"
	}
	changelog := readFile(t, filepath.Join(src, "CHANGELOG.md"))
	i := strings.Index(changelog, section)
	if i < 0 || !strings.HasPrefix(notes, "# rds-csi "+version) {
		t.Errorf("RELEASE-NOTES.md starts %q; CHANGELOG.md section %q at %d", firstLine(notes), section, i)
	} else {
		body := changelog[i+len(section):]
		body = body[strings.Index(body, "\n")+1:]
		if j := strings.Index(body, "\n## "); j >= 0 {
			body = body[:j+1]
		}
		text := strings.TrimSpace(strings.Split(body, "\n[")[0])
		if !strings.Contains(notes, text) {
			t.Errorf("RELEASE-NOTES.md is not CHANGELOG.md's section %s:\n%s", section, notes)
		}
		// An empty section is contained in anything: the notes then say
		// that nothing is recorded, and never hold another section.
		if text == "" && !strings.Contains(notes, "CHANGELOG.md records no change since "+release) {
			t.Errorf("CHANGELOG.md's section %s is empty; RELEASE-NOTES.md does not say so:\n%s", section, notes)
		}
		if strings.Contains(notes, "\n## ") {
			t.Errorf("RELEASE-NOTES.md holds another section of CHANGELOG.md:\n%s", notes)
		}
	}
	done()

	done = tl.Step("the chart package installs: rendered by Helm, accepted by kube-apiserver, running the version's image")
	render := buildRender(t, e.Root)
	objs := decodeStream(t, chartName, runRender(t, render, "helm", filepath.Join(dist, chartName)))
	// Every container (init containers too: the node DaemonSet's
	// kubelet-dir-check) that runs the driver's image runs this version's,
	// and the controller and the node plugin each run it.
	const driverImage = "ghcr.io/srvlab/rds-csi-driver"
	runs := map[string][]string{} // kind -> containers running this version's image
	for _, o := range objs {
		if o.GetKind() != "Deployment" && o.GetKind() != "DaemonSet" {
			continue
		}
		b, err := json.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		var w struct {
			Spec struct {
				Template struct {
					Spec struct {
						InitContainers, Containers []struct{ Name, Image string }
					}
				}
			}
		}
		if err := json.Unmarshal(b, &w); err != nil {
			t.Fatal(err)
		}
		pod := w.Spec.Template.Spec
		for _, c := range append(pod.InitContainers, pod.Containers...) {
			switch {
			case c.Image == driverImage+":"+version:
				runs[o.GetKind()] = append(runs[o.GetKind()], c.Name)
			case strings.HasPrefix(c.Image, driverImage+":") || strings.HasPrefix(c.Image, driverImage+"@"):
				t.Errorf("%s %s, container %s, runs %s; want %s:%s", o.GetKind(), o.GetName(), c.Name, c.Image, driverImage, version)
			}
		}
	}
	if len(runs["Deployment"]) == 0 || len(runs["DaemonSet"]) == 0 {
		t.Errorf("the packaged chart runs %s:%s in %v; want the controller (Deployment) and the node plugin (DaemonSet)", driverImage, version, runs)
	}
	accepted, skipped := dryRunCreate(t, e, objs)
	tl.Logf("%s: accepted %v", chartName, accepted)
	if len(skipped) > 0 || accepted["Deployment"] != 1 || accepted["DaemonSet"] != 1 || accepted["CSIDriver"] != 1 {
		t.Errorf("%s: accepted %v, skipped %v", chartName, accepted, skipped)
	}
	done()

	done = tl.Step("reproducible: every binary built again from another clone, at another path, in another environment, is the same")
	again := clone("again")
	rebuilt := filepath.Join(t.TempDir(), "bin")
	cmd = exec.Command(filepath.Join(again, "hack", "release.sh"), "--binaries", rebuilt)
	cmd.Dir = again
	// What a person rebuilding the release may have set, which Go or a
	// build script reads: another time zone (26 hours from releaseTZ, so
	// the local date always differs: a date stamped by the script shows),
	// another amd64/arm64 level and GOFLAGS. The release's builds must
	// not depend on them.
	cmd.Env = append(withoutEnv(os.Environ(), "VERSION", "TZ", "GOAMD64", "GOARM64", "GOFLAGS"),
		"VERSION="+version, "TZ=Etc/GMT-14", "GOAMD64=v3", "GOARM64=v8.2", "GOFLAGS=-tags=rebuild")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/release.sh --binaries: %v\n%s", err, out)
	}
	if len(binaries) != len(platforms)+len(arches) {
		t.Fatalf("%d shipped binaries found", len(binaries))
	}
	for name, shipped := range binaries {
		b, err := os.ReadFile(filepath.Join(rebuilt, name))
		if err != nil {
			t.Error(err)
			continue
		}
		if !bytes.Equal(b, shipped) {
			t.Errorf("%s built again from %s differs from the release's (%s, rebuilt %s)", name, again, sum(shipped), sum(b))
		}
	}
	done()
}

// releaseTZ is the time zone make release runs in (UTC-12), 26 hours
// from the rebuild's (UTC+14).
const releaseTZ = "Etc/GMT+12"

// withoutEnv is env without the variables named.
func withoutEnv(env []string, names ...string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return slices.Contains(names, k)
	})
}

// checkReleaseBinary: a Go binary of os/arch, static, stamped with the
// version and built with the release's flags.
func checkReleaseBinary(t *testing.T, what string, bin []byte, goos, goarch, version string) {
	t.Helper()
	bi, err := buildinfo.Read(bytes.NewReader(bin))
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return
	}
	s := map[string]string{}
	for _, kv := range bi.Settings {
		s[kv.Key] = kv.Value
	}
	// Go records no -ldflags with -trimpath: the version -X stamped is a
	// string in the binary.
	if s["GOOS"] != goos || s["GOARCH"] != goarch || s["CGO_ENABLED"] != "0" || s["-trimpath"] != "true" || s["vcs.revision"] != "" ||
		!bytes.Contains(bin, []byte(version)) {
		t.Errorf("%s: built with %v; want %s/%s, CGO_ENABLED=0, -trimpath, no VCS stamp, the version %s in it", what, s, goos, goarch, version)
	}
}

// readImage reads an image archive's reference, architecture and the
// driver binary in its layer.
func readImage(t *testing.T, path string) (ref, arch string, driver []byte) {
	t.Helper()
	files := tarFiles(t, path, false)
	var index struct {
		Manifests []struct {
			Digest      string            `json:"digest"`
			Annotations map[string]string `json:"annotations"`
			Platform    struct {
				Architecture string `json:"architecture"`
			} `json:"platform"`
		} `json:"manifests"`
	}
	if err := json.Unmarshal(files["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("%s: index.json %s (%v)", path, files["index.json"], err)
	}
	m := index.Manifests[0]
	var manifest struct {
		Layers []struct {
			Digest string `json:"digest"`
		} `json:"layers"`
	}
	blob := func(d string) []byte { return files["blobs/sha256/"+strings.TrimPrefix(d, "sha256:")] }
	if err := json.Unmarshal(blob(m.Digest), &manifest); err != nil || len(manifest.Layers) != 1 {
		t.Fatalf("%s: manifest (%v)", path, err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(blob(manifest.Layers[0].Digest)))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == "rds-csi-driver" {
			if driver, err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
	if driver == nil {
		t.Fatalf("%s: no /rds-csi-driver in the layer", path)
	}
	return m.Annotations["io.containerd.image.name"], m.Platform.Architecture, driver
}

// imageManifestDigest is the digest of the one manifest an image
// archive's index.json lists.
func imageManifestDigest(t *testing.T, path string) string {
	t.Helper()
	var index struct {
		Manifests []struct {
			Digest string `json:"digest"`
		} `json:"manifests"`
	}
	if err := json.Unmarshal(tarFiles(t, path, false)["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("%s: index.json (%v)", path, err)
	}
	return index.Manifests[0].Digest
}

// checkArchiveStamps: a release archive stamps nothing of the run that
// made it, so a second release of the commit gives the same bytes (and
// the krew manifest's sha256 the same value): no time or file name in
// the gzip header, and every tar entry at the commit's time.
func checkArchiveStamps(t *testing.T, path string, commitTime int64) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if !zr.ModTime.IsZero() || zr.Name != "" {
		t.Errorf("%s: the gzip header stamps time %s and name %q; want none", path, zr.ModTime, zr.Name)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if h.ModTime.Unix() != commitTime {
			t.Errorf("%s: %s is stamped %s; want the commit's time %s", path, h.Name, h.ModTime.UTC(), time.Unix(commitTime, 0).UTC())
		}
	}
}

// tarFiles reads the regular files of a tar (gzip'd if gz).
func tarFiles(t *testing.T, path string, gz bool) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var r io.Reader = f
	if gz {
		zr, err := gzip.NewReader(f)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		r = zr
	}
	out := map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		if gz && (h.Uid != 0 || h.Gid != 0 || h.Mode&0o111 == 0) {
			t.Errorf("%s: %s owned by %d:%d, mode %o; want root's, executable", path, h.Name, h.Uid, h.Gid, h.Mode)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = b
	}
}

func fileSum(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sum(b)
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func gitOut(t *testing.T, dir string, args ...string) string {
	t.Helper()
	return gitOutCmd(t, dir, "git", args...)
}

func gitOutCmd(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return strings.TrimSpace(string(out))
}

func tailFile(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func mapKeysOf[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
