package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// archive is a parsed image archive.
type archive struct {
	files    map[string][]byte
	index    Index
	manifest Manifest
	config   Config
	docker   []DockerManifest
	layer    []byte // uncompressed
}

// readArchive parses data and checks that it is what docker load, ctr
// images import and kind load image-archive read: an OCI layout whose
// blobs match their digests and sizes, and a manifest.json that names the
// same config and layer.
func readArchive(data []byte) (*archive, error) {
	a := &archive{files: map[string][]byte{}}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return nil, err
		}
		a.files[h.Name] = b
	}
	var layout struct {
		Version string `json:"imageLayoutVersion"`
	}
	if err := json.Unmarshal(a.files["oci-layout"], &layout); err != nil || layout.Version != "1.0.0" {
		return nil, fmt.Errorf("oci-layout: %q (%v)", a.files["oci-layout"], err)
	}
	if err := json.Unmarshal(a.files["index.json"], &a.index); err != nil {
		return nil, fmt.Errorf("index.json: %w", err)
	}
	if a.index.SchemaVersion != 2 || a.index.MediaType != MediaTypeIndex || len(a.index.Manifests) != 1 {
		return nil, fmt.Errorf("index.json: %s", a.files["index.json"])
	}
	blob := func(d Descriptor) ([]byte, error) {
		b, ok := a.files[BlobPath(d.Digest)]
		switch {
		case !ok:
			return nil, fmt.Errorf("blob %s is missing", d.Digest)
		case Digest(b) != d.Digest || int64(len(b)) != d.Size:
			return nil, fmt.Errorf("blob %s: digest %s, size %d, want size %d", d.Digest, Digest(b), len(b), d.Size)
		}
		return b, nil
	}
	md := a.index.Manifests[0]
	mb, err := blob(md)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(mb, &a.manifest); err != nil || md.MediaType != MediaTypeManifest || a.manifest.MediaType != MediaTypeManifest {
		return nil, fmt.Errorf("manifest %s (%v)", mb, err)
	}
	cb, err := blob(a.manifest.Config)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(cb, &a.config); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if len(a.manifest.Layers) != 1 || len(a.config.RootFS.DiffIDs) != 1 {
		return nil, fmt.Errorf("want one layer: manifest %d, config %d", len(a.manifest.Layers), len(a.config.RootFS.DiffIDs))
	}
	lb, err := blob(a.manifest.Layers[0])
	if err != nil {
		return nil, err
	}
	zr, err := gzip.NewReader(bytes.NewReader(lb))
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	if a.layer, err = io.ReadAll(zr); err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	if Digest(a.layer) != a.config.RootFS.DiffIDs[0] {
		return nil, fmt.Errorf("layer's diff ID %s, config says %s", Digest(a.layer), a.config.RootFS.DiffIDs[0])
	}
	if err := json.Unmarshal(a.files["manifest.json"], &a.docker); err != nil || len(a.docker) != 1 {
		return nil, fmt.Errorf("manifest.json: %s (%v)", a.files["manifest.json"], err)
	}
	d := a.docker[0]
	if d.Config != BlobPath(a.manifest.Config.Digest) || len(d.Layers) != 1 || d.Layers[0] != BlobPath(a.manifest.Layers[0].Digest) {
		return nil, fmt.Errorf("manifest.json %+v names other blobs than the OCI manifest", d)
	}
	if len(d.RepoTags) != 1 || d.RepoTags[0] != md.Annotations[AnnotationContainerdName] {
		return nil, fmt.Errorf("manifest.json tags %v, index names %q", d.RepoTags, md.Annotations[AnnotationContainerdName])
	}
	return a, nil
}

// ref is the image the archive names.
func (a *archive) ref() string { return a.index.Manifests[0].Annotations[AnnotationContainerdName] }

// The writer's output is a valid archive, and the same inputs give the
// same bytes (hard links stay links, times are the given one).
func TestWriteIsReproducible(t *testing.T) {
	root := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(root, "usr/sbin"), 0o755))
	must(t, os.WriteFile(filepath.Join(root, "usr/sbin/mke2fs"), []byte("tool"), 0o755))
	must(t, os.Link(filepath.Join(root, "usr/sbin/mke2fs"), filepath.Join(root, "usr/sbin/mkfs.ext4")))
	must(t, os.Symlink("usr/sbin", filepath.Join(root, "sbin")))
	o := Options{RootFS: root, Ref: "registry.example/rds-csi-driver:v1.2.3", Entrypoint: []string{"/rds-csi-driver"}, Created: time.Unix(1700000000, 0)}
	var first, second bytes.Buffer
	must(t, Write(&first, o))
	must(t, os.Chtimes(filepath.Join(root, "usr/sbin/mke2fs"), time.Now(), time.Now()))
	must(t, Write(&second, o))
	if !bytes.Equal(first.Bytes(), second.Bytes()) {
		t.Error("two writes of the same tree differ")
	}
	a, err := readArchive(first.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if a.ref() != o.Ref || a.index.Manifests[0].Annotations[AnnotationRefName] != "v1.2.3" {
		t.Errorf("index annotations %v", a.index.Manifests[0].Annotations)
	}
	entries := layerEntries(t, a.layer)
	if h := entries["usr/sbin/mkfs.ext4"]; h == nil || h.Typeflag != tar.TypeLink || h.Linkname != "usr/sbin/mke2fs" {
		t.Errorf("mkfs.ext4: %+v, want a hard link to usr/sbin/mke2fs", h)
	}
	if h := entries["sbin"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "usr/sbin" {
		t.Errorf("sbin: %+v, want a symlink to usr/sbin", h)
	}
	if _, err := Tag("registry.example:5000/rds-csi-driver"); err == nil {
		t.Error("a reference without a tag (only a registry port) was accepted")
	}
}

func layerEntries(t *testing.T, layer []byte) map[string]*tar.Header {
	t.Helper()
	out := map[string]*tar.Header{}
	tr := tar.NewReader(bytes.NewReader(layer))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = h
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
