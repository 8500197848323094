package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"sigs.k8s.io/yaml"
)

// The image make image builds: a valid archive named by the reference the
// manifests and the chart deploy, whose root filesystem runs the driver
// and every node tool it calls (chroot into the unpacked layer). It builds
// the archive with hack/build-image.sh unless RDS_CSI_IMAGE_ARCHIVE names
// one. Root only (chroot, file owners): skips without it, fails in CI.
func TestImageRunsTheDriverAndNodeTools(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("needs root (chroot into the image's root filesystem); CI runs as root")
		}
		t.Skip("needs root: chroot into the image's root filesystem")
	}
	repo := repoRoot(t)
	path := os.Getenv("RDS_CSI_IMAGE_ARCHIVE")
	if path == "" {
		path = filepath.Join(t.TempDir(), "image.tar")
		cmd := exec.Command(filepath.Join(repo, "hack", "build-image.sh"), path)
		cmd.Dir = repo
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("hack/build-image.sh: %v\n%s", err, out)
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

	// The manifests and the chart deploy the image by this reference.
	for _, f := range []string{"manifests/base/controller.yaml", "manifests/base/node.yaml"} {
		if img := pluginImage(t, filepath.Join(repo, f)); img != a.ref() {
			t.Errorf("%s runs %s; the image is %s", f, img, a.ref())
		}
	}
	if img := chartImage(t, filepath.Join(repo, "charts/rds-csi/values.yaml")); img != a.ref() {
		t.Errorf("the chart's default image is %s; the image is %s", img, a.ref())
	}
	if ep := a.config.Config.Entrypoint; len(ep) != 1 || ep[0] != "/rds-csi-driver" {
		t.Errorf("entrypoint %v", ep)
	}

	root := t.TempDir()
	if err := unpack(a.layer, root); err != nil {
		t.Fatal(err)
	}
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

	if out := chroot(t, root, "/rds-csi-driver", "--version"); strings.TrimSpace(out) == "" {
		t.Error("rds-csi-driver --version printed nothing")
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
	t.Logf("%s: %d bytes, layer %d bytes unpacked, %s", a.ref(), len(data), len(a.layer), a.config.History[0].Comment)
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

func chartImage(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Image struct{ Repository, Tag string }
	}
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v.Image.Repository + ":" + v.Image.Tag
}
