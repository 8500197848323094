package image

import (
	"archive/tar"
	"bytes"
	"debug/buildinfo"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"sigs.k8s.io/yaml"
)

// The image make image builds: a valid archive named by the repository
// the manifests and the chart deploy and tagged with the version of the
// driver in it, whose root filesystem runs the driver and every node tool
// it calls (chroot into the unpacked layer). It builds the archive with
// hack/build-image.sh unless RDS_CSI_IMAGE_ARCHIVE names one. Root only
// (chroot, file owners): skips without it, fails in CI.
func TestImageRunsTheDriverAndNodeTools(t *testing.T) {
	needRoot(t)
	repo := repoRoot(t)
	a, root := buildAndUnpack(t, repo, "amd64", os.Getenv("RDS_CSI_IMAGE_ARCHIVE"))
	checkDeployedRef(t, repo, a)
	checkELFs(t, root, elf.EM_X86_64)
	// What a container runtime provides and the tools open: /dev/null, and
	// /proc (the e2fsprogs read /etc/mtab, a link to /proc/self/mounts).
	if err := syscall.Mknod(filepath.Join(root, "dev/null"), syscall.S_IFCHR|0o666, int(mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("proc", filepath.Join(root, "proc"), "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
		t.Fatalf("mounting /proc in the image's root: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(filepath.Join(root, "proc"), syscall.MNT_DETACH); err != nil {
			t.Errorf("unmounting the image's /proc: %v", err)
		}
	})

	// The tag is the version of the driver inside.
	if out, tag := strings.TrimSpace(chroot(t, root, "/rds-csi-driver", "--version")), mustTag(t, a.ref()); out != tag {
		t.Errorf("rds-csi-driver --version in the image says %q; the image's tag is %s", out, tag)
	}
	// Each tool the node service runs (k8s.io/mount-utils and pkg/nvme) and
	// nvme-cli, by the name the driver runs it (found on PATH).
	for _, c := range [][]string{
		{"mount", "-V"}, {"umount", "-V"}, {"blkid", "-V"}, {"blockdev", "--version"}, {"losetup", "--version"},
		{"fsck", "--version"}, {"e2fsck", "-V"}, {"mkfs.ext4", "-V"}, {"mkfs.xfs", "-V"}, {"xfs_growfs", "-V"},
		{"modprobe", "--version"}, {"nvme", "version"},
	} {
		chroot(t, root, c...)
	}
	// And they work: format, identify, check and grow both filesystems in
	// image files, as NodeStage and NodeExpand do on a device.
	chroot(t, root, "truncate", "-s", "64M", "/tmp/ext4.img")
	chroot(t, root, "mkfs.ext4", "-q", "-F", "/tmp/ext4.img")
	if out := chroot(t, root, "blkid", "-p", "-s", "TYPE", "-o", "export", "/tmp/ext4.img"); !strings.Contains(out, "TYPE=ext4") {
		t.Errorf("blkid on a fresh ext4: %q", out)
	}
	chroot(t, root, "fsck", "-n", "-t", "ext4", "/tmp/ext4.img")
	chroot(t, root, "truncate", "-s", "96M", "/tmp/ext4.img")
	chroot(t, root, "resize2fs", "/tmp/ext4.img")
	chroot(t, root, "truncate", "-s", "320M", "/tmp/xfs.img")
	chroot(t, root, "mkfs.xfs", "-q", "-f", "/tmp/xfs.img")
	if out := chroot(t, root, "blkid", "-p", "-s", "TYPE", "-o", "export", "/tmp/xfs.img"); !strings.Contains(out, "TYPE=xfs") {
		t.Errorf("blkid on a fresh xfs: %q", out)
	}
	chroot(t, root, "fsck.xfs", "/tmp/xfs.img")
	t.Logf("%s: layer %d bytes unpacked, %s", a.ref(), len(a.layer), a.config.History[0].Comment)
}

// The arm64 image (make image-arm64), put together without running any of
// it: its config and index say linux/arm64, every executable and library
// in it is an arm64 ELF whose interpreter and libraries are in the image
// (so it would start on an arm64 node; nothing here can run it without an
// emulator), and the driver is the arm64 build of the version its tag
// names. Builds the archive (ARCH=arm64 hack/build-image.sh) unless
// RDS_CSI_IMAGE_ARCHIVE_ARM64 names one. Root only (apt's cache, owners).
func TestImageArm64HoldsOnlyArm64Executables(t *testing.T) {
	needRoot(t)
	repo := repoRoot(t)
	a, root := buildAndUnpack(t, repo, "arm64", os.Getenv("RDS_CSI_IMAGE_ARCHIVE_ARM64"))
	checkDeployedRef(t, repo, a)
	if a.config.Architecture != "arm64" || a.index.Manifests[0].Platform == nil || a.index.Manifests[0].Platform.Architecture != "arm64" {
		t.Errorf("config architecture %q, index platform %+v; want arm64", a.config.Architecture, a.index.Manifests[0].Platform)
	}
	checkELFs(t, root, elf.EM_AARCH64)
	bi, err := buildinfo.ReadFile(filepath.Join(root, "rds-csi-driver"))
	if err != nil {
		t.Fatal(err)
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if settings["GOARCH"] != "arm64" || settings["GOOS"] != "linux" || settings["CGO_ENABLED"] != "0" || settings["-trimpath"] != "true" {
		t.Errorf("the image's driver was built with %v; want linux/arm64, CGO_ENABLED=0, -trimpath", settings)
	}
	// Go records no -ldflags with -trimpath: the version -X stamped is a
	// string in the binary.
	bin, err := os.ReadFile(filepath.Join(root, "rds-csi-driver"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(bin, []byte(mustTag(t, a.ref()))) {
		t.Errorf("the image's driver holds no version %s", mustTag(t, a.ref()))
	}
	for _, tool := range []string{"mount", "umount", "blkid", "blockdev", "losetup", "fsck", "e2fsck", "mkfs.ext4", "resize2fs", "mkfs.xfs", "xfs_growfs", "modprobe", "nvme"} {
		if p := lookPath(root, tool); strings.HasSuffix(p, "-not-on-the-image-PATH") {
			t.Errorf("%s is not on the arm64 image's PATH", tool)
		}
	}
	t.Logf("%s linux/arm64: layer %d bytes unpacked, %s", a.ref(), len(a.layer), a.config.History[0].Comment)
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("needs root (apt's cache, the root filesystem's owners, chroot); CI runs as root")
		}
		t.Skip("needs root: apt's cache, the root filesystem's owners, chroot")
	}
}

// buildAndUnpack reads the archive at path (building it for arch with
// hack/build-image.sh when path is empty) and unpacks its layer.
func buildAndUnpack(t *testing.T, repo, arch, path string) (*archive, string) {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "image.tar")
		cmd := exec.Command(filepath.Join(repo, "hack", "build-image.sh"), path)
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "ARCH="+arch)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("ARCH=%s hack/build-image.sh: %v\n%s", arch, err, out)
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	a, err := readArchive(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if ep := a.config.Config.Entrypoint; len(ep) != 1 || ep[0] != "/rds-csi-driver" {
		t.Errorf("entrypoint %v", ep)
	}
	root := t.TempDir()
	if err := unpack(a.layer, root); err != nil {
		t.Fatal(err)
	}
	return a, root
}

// checkDeployedRef: the manifests and the chart deploy the image's
// repository at the release's tag (the file VERSION; the chart's tag is
// its appVersion). A build between releases is tagged with its own
// version; a release's build, with the release's.
func checkDeployedRef(t *testing.T, repo string, a *archive) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	release := strings.TrimSpace(string(b))
	name := strings.TrimSuffix(a.ref(), ":"+mustTag(t, a.ref()))
	for _, f := range []string{"manifests/base/controller.yaml", "manifests/base/node.yaml"} {
		if img := pluginImage(t, filepath.Join(repo, f)); img != name+":"+release {
			t.Errorf("%s runs %s; want %s:%s (the image's repository, the release's tag)", f, img, name, release)
		}
	}
	if img := chartImage(t, filepath.Join(repo, "charts/rds-csi")); img != name+":"+release {
		t.Errorf("the chart's default image is %s; want %s:%s", img, name, release)
	}
	if tag := mustTag(t, a.ref()); tag != release && !strings.HasPrefix(tag, release+"-") {
		t.Errorf("the image is tagged %s: neither the release %s nor a build after it", tag, release)
	}
}

func mustTag(t *testing.T, ref string) string {
	t.Helper()
	tag, err := Tag(ref)
	if err != nil {
		t.Fatal(err)
	}
	return tag
}

// checkELFs: every regular file in root that is an ELF is of machine m,
// and its interpreter and the libraries it needs are in root (looked up
// in the directories of Debian's multiarch layout and beside the file, as
// glibc's gconv modules find theirs, through the image's own symlinks).
func checkELFs(t *testing.T, root string, m elf.Machine) {
	t.Helper()
	libDirs := []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib", "/lib"}
	inRoot := func(p string) bool {
		// Resolve p's symlinks inside root, never the host's.
		for range 40 {
			fi, err := os.Lstat(filepath.Join(root, p))
			if err != nil {
				return false
			}
			if fi.Mode()&os.ModeSymlink == 0 {
				return true
			}
			target, err := os.Readlink(filepath.Join(root, p))
			if err != nil {
				return false
			}
			if !filepath.IsAbs(target) {
				target = filepath.Join(filepath.Dir(p), target)
			}
			p = filepath.Clean(target)
		}
		return false
	}
	// The image's directory links (/lib -> usr/lib) are relative, so the
	// host follows them inside root; only the last element is resolved here.
	n := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := elf.Open(p)
		if err != nil {
			return nil // not an ELF
		}
		defer f.Close()
		rel := "/" + strings.TrimPrefix(p, root+"/")
		n++
		if f.Machine != m {
			t.Errorf("%s is a %s ELF; the image is %s", rel, f.Machine, m)
			return nil
		}
		for _, prog := range f.Progs {
			if prog.Type != elf.PT_INTERP {
				continue
			}
			b := make([]byte, prog.Filesz)
			if _, err := prog.ReadAt(b, 0); err != nil {
				return fmt.Errorf("%s: interpreter: %w", rel, err)
			}
			if interp := strings.TrimRight(string(b), "\x00"); !inRoot(interp) {
				t.Errorf("%s: its interpreter %s is not in the image", rel, interp)
			}
		}
		libs, err := f.ImportedLibraries()
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		for _, lib := range libs {
			found := false
			for _, dir := range append([]string{filepath.Dir(rel)}, libDirs...) {
				if inRoot(filepath.Join(dir, lib)) {
					found = true
					break
				}
			}
			if !found {
				t.Errorf("%s needs %s, which is not in the image", rel, lib)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 20 {
		t.Errorf("only %d ELF files in the image", n)
	}
	t.Logf("%d ELF files, all %s, their interpreters and libraries in the image", n, m)
}

// chroot runs args in root with the image's PATH and returns its output.
func chroot(t *testing.T, root string, args ...string) string {
	t.Helper()
	// Not exec.Command: it would look the name up on this host's PATH.
	cmd := &exec.Cmd{Path: args[0], Args: args}
	if !strings.HasPrefix(args[0], "/") {
		cmd.Path = lookPath(root, args[0])
	}
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("in the image: %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// lookPath finds name on the image's PATH, as a path inside root.
func lookPath(root, name string) string {
	for _, d := range []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"} {
		// Lstat: a link (modprobe -> /bin/kmod) points into the image.
		if fi, err := os.Lstat(filepath.Join(root, d, name)); err == nil && !fi.IsDir() {
			return d + "/" + name
		}
	}
	return "/" + name + "-not-on-the-image-PATH"
}

func mkdev(major, minor uint32) uint64 {
	return uint64(major)<<8 | uint64(minor)
}

// unpack extracts an uncompressed layer into dir with owners and modes.
func unpack(layer []byte, dir string) error {
	tr := tar.NewReader(bytes.NewReader(layer))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Clean(h.Name)
		if filepath.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("layer entry %q escapes the root", h.Name)
		}
		p := filepath.Join(dir, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.Symlink(h.Linkname, p); err != nil {
				return err
			}
		case tar.TypeLink:
			if err := os.Link(filepath.Join(dir, filepath.Clean(h.Linkname)), p); err != nil {
				return err
			}
			continue
		default:
			return fmt.Errorf("layer entry %q: unexpected type %c", h.Name, h.Typeflag)
		}
		if err := os.Lchown(p, h.Uid, h.Gid); err != nil {
			return err
		}
		if h.Typeflag != tar.TypeSymlink {
			// Chmod after chown: chown clears set-user-ID bits (mount's).
			if err := os.Chmod(p, h.FileInfo().Mode()&(os.ModePerm|os.ModeSetuid|os.ModeSetgid|os.ModeSticky)); err != nil {
				return err
			}
		}
	}
}

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for d := dir; d != "/"; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "hack", "build-image.sh")); err == nil {
			return d
		}
	}
	t.Fatalf("no repository root above %s", dir)
	return ""
}

// pluginImage is the image of the rds-csi-plugin container in file.
func pluginImage(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(b), "\n---") {
		var o struct {
			Spec struct {
				Template struct {
					Spec struct {
						Containers []struct{ Name, Image string }
					}
				}
			}
		}
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		for _, c := range o.Spec.Template.Spec.Containers {
			if c.Name == "rds-csi-plugin" {
				return c.Image
			}
		}
	}
	t.Fatalf("%s: no rds-csi-plugin container", file)
	return ""
}

// chartImage is the default image of the chart in dir: values.yaml's
// repository and tag, the tag defaulting to Chart.yaml's appVersion (as
// the rds-csi.image template does).
func chartImage(t *testing.T, dir string) string {
	t.Helper()
	var v struct {
		Image struct{ Repository, Tag string }
	}
	var c struct {
		AppVersion string `json:"appVersion"`
	}
	for f, into := range map[string]any{"values.yaml": &v, "Chart.yaml": &c} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, into); err != nil {
			t.Fatal(err)
		}
	}
	if v.Image.Tag == "" {
		v.Image.Tag = c.AppVersion
	}
	return v.Image.Repository + ":" + v.Image.Tag
}
