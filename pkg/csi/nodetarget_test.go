package csi

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestNodeTargetPathsHoldingSomethingElseAreLeftAlone: NodeUnpublishVolume
// at a path with nothing mounted removed whatever was there (a file with
// data, a symbolic link), and NodePublishVolume mounted over a file with
// data or a directory with entries (hiding it, and the unpublish then
// removed the file). A publish makes, and an unpublish removes, only an
// empty directory (filesystem) or an empty file (raw block); anything else
// at a target path is FAILED_PRECONDITION, untouched. On real loop devices.
func TestNodeTargetPathsHoldingSomethingElseAreLeftAlone(t *testing.T) {
	requireNodeHost(t)
	env := startSimEnv(t, simEnvConfig{LoopNode: true})
	ctx := context.Background()
	blk := newNodeVolume(t, env, "target-block", 64*1024*1024, blockCapability(sw))
	fsv := newNodeVolume(t, env, "target-fs", nodeTestSize, mountCapability("ext4", sw))
	for _, v := range []*nodeVolume{blk, fsv} {
		v.must(t, "NodeStageVolume", v.stage(t))
	}
	dir := t.TempDir()
	data := []byte("not a volume's")
	file := filepath.Join(dir, "file")
	full := filepath.Join(dir, "full")
	link := filepath.Join(dir, "link")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(full, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(full, "entry"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	intact := func(when string) {
		t.Helper()
		if got, err := os.ReadFile(file); err != nil || !bytes.Equal(got, data) {
			t.Errorf("%s: the file: %q, %v", when, got, err)
		}
		if got, err := os.ReadFile(filepath.Join(full, "entry")); err != nil || !bytes.Equal(got, data) {
			t.Errorf("%s: the directory's entry: %q, %v", when, got, err)
		}
		if dest, err := os.Readlink(link); err != nil || dest != file {
			t.Errorf("%s: the link: %q, %v", when, dest, err)
		}
		for _, p := range []string{file, full, link} {
			if isMounted(t, p) {
				t.Errorf("%s: something is mounted at %s", when, p)
			}
		}
	}
	unpublish := func(v *nodeVolume, p string) error {
		_, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.id(), TargetPath: p})
		return err
	}
	publish := func(v *nodeVolume, p string) error {
		_, err := env.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: v.id(), StagingTargetPath: v.staging,
			TargetPath: p, VolumeCapability: v.cap, VolumeContext: v.vol.VolumeContext})
		return err
	}
	for _, c := range []struct {
		name string
		err  error
	}{
		{"unpublish at a file with data", unpublish(blk, file)},
		{"unpublish at a directory with entries", unpublish(fsv, full)},
		{"unpublish at a symbolic link", unpublish(blk, link)},
		{"raw block publish over a file with data", publish(blk, file)},
		{"filesystem publish over a directory with entries", publish(fsv, full)},
	} {
		if status.Code(c.err) != codes.FailedPrecondition {
			t.Errorf("%s: %v; want FAILED_PRECONDITION", c.name, c.err)
		}
	}
	intact("after the refused calls")

	// What a publish makes and leaves: an empty file or directory, taken
	// (kubelet's own shape) and removed by the unpublish.
	emptyFile, emptyDir := filepath.Join(dir, "empty-file"), filepath.Join(dir, "empty-dir")
	if err := os.WriteFile(emptyFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(emptyDir, 0o750); err != nil {
		t.Fatal(err)
	}
	blk.must(t, "NodePublishVolume at an empty file", publish(blk, emptyFile))
	fsv.must(t, "NodePublishVolume at an empty directory", publish(fsv, emptyDir))
	if !isBlockDevice(emptyFile) || !isMounted(t, emptyDir) {
		t.Fatal("the publishes at the empty file and directory are not there")
	}
	for _, p := range []struct {
		v *nodeVolume
		p string
	}{{blk, emptyFile}, {fsv, emptyDir}} {
		for range 2 { // the second finds nothing: success
			p.v.must(t, "NodeUnpublishVolume", unpublish(p.v, p.p))
		}
		if _, err := os.Lstat(p.p); !os.IsNotExist(err) {
			t.Errorf("%s is still there after its unpublish: %v", p.p, err)
		}
	}
	if err := os.WriteFile(emptyFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	blk.must(t, "NodeUnpublishVolume at an empty file left by a publish", unpublish(blk, emptyFile))
	intact("at the end")
	for _, v := range []*nodeVolume{blk, fsv} {
		v.teardown(t)
	}
}
