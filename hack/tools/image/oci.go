// Package image writes and reads the driver's container image as one OCI
// archive, without a container engine: a root filesystem directory (made
// by hack/build-image.sh from Debian packages and the Go build) becomes a
// single gzip layer, an OCI image config and manifest, and a tar holding an
// OCI image layout (oci-layout, index.json, blobs/sha256/...) plus the
// docker-compatible manifest.json that older `docker load` reads. The
// index names the image both ways containerd reads it
// (io.containerd.image.name, the full reference, for `ctr images import`
// and `kind load image-archive`; org.opencontainers.image.ref.name, the
// tag). Every timestamp is the given creation time, so the same inputs give
// the same bytes.
package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// Media types of the OCI image spec.
const (
	MediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	MediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	MediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	MediaTypeLayerGz  = "application/vnd.oci.image.layer.v1.tar+gzip"

	AnnotationContainerdName = "io.containerd.image.name"
	AnnotationRefName        = "org.opencontainers.image.ref.name"
)

// Descriptor points at a blob.
type Descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *Platform         `json:"platform,omitempty"`
}

// Platform of an image.
type Platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

// Index is index.json.
type Index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []Descriptor `json:"manifests"`
}

// Manifest is an OCI image manifest.
type Manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        Descriptor   `json:"config"`
	Layers        []Descriptor `json:"layers"`
}

// Config is the part of an OCI image config this image uses.
type Config struct {
	Created      string      `json:"created"`
	Architecture string      `json:"architecture"`
	OS           string      `json:"os"`
	Config       RunConfig   `json:"config"`
	RootFS       RootFS      `json:"rootfs"`
	History      []HistoryEl `json:"history"`
}

// RunConfig is how a container of the image runs.
type RunConfig struct {
	User       string            `json:"User,omitempty"`
	Entrypoint []string          `json:"Entrypoint"`
	Cmd        []string          `json:"Cmd,omitempty"`
	Env        []string          `json:"Env"`
	WorkingDir string            `json:"WorkingDir,omitempty"`
	Labels     map[string]string `json:"Labels,omitempty"`
}

// RootFS lists the layers' uncompressed digests.
type RootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

// HistoryEl is one history entry.
type HistoryEl struct {
	Created   string `json:"created"`
	CreatedBy string `json:"created_by"`
	Comment   string `json:"comment,omitempty"`
}

// DockerManifest is one entry of the docker-compatible manifest.json.
type DockerManifest struct {
	Config   string   `json:"Config"`
	RepoTags []string `json:"RepoTags"`
	Layers   []string `json:"Layers"`
}

// Options describe the image to write.
type Options struct {
	RootFS     string            // directory whose contents become the image's /
	Ref        string            // registry/repository:tag
	Arch       string            // GOARCH of the root filesystem: amd64 (default) or arm64
	Entrypoint []string          // e.g. ["/rds-csi-driver"]; none: Cmd alone runs
	Cmd        []string          // default arguments (or the command, without Entrypoint)
	User       string            // uid[:gid] the container runs as; empty: root
	Labels     map[string]string // image labels (org.opencontainers.image.*)
	Created    time.Time         // every timestamp in the archive
	Comment    string            // history comment: what the layer holds
}

// Write writes the archive for o to out.
func Write(out io.Writer, o Options) error {
	tag, err := Tag(o.Ref)
	if err != nil {
		return err
	}
	created := o.Created.UTC()
	arch := o.Arch
	switch arch {
	case "":
		arch = "amd64"
	case "amd64", "arm64":
	default:
		return fmt.Errorf("architecture %q: amd64 or arm64", arch)
	}
	var layer bytes.Buffer
	diffID, err := writeLayer(&layer, o.RootFS, created)
	if err != nil {
		return err
	}
	layerDesc := describe(MediaTypeLayerGz, layer.Bytes())
	cfg := Config{
		Created:      created.Format(time.RFC3339),
		Architecture: arch,
		OS:           "linux",
		Config: RunConfig{
			User:       o.User,
			Entrypoint: o.Entrypoint,
			Cmd:        o.Cmd,
			Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			WorkingDir: "/",
			Labels:     o.Labels,
		},
		RootFS:  RootFS{Type: "layers", DiffIDs: []string{diffID}},
		History: []HistoryEl{{Created: created.Format(time.RFC3339), CreatedBy: "hack/build-image.sh", Comment: o.Comment}},
	}
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	cfgDesc := describe(MediaTypeConfig, cfgJSON)
	manJSON, err := json.Marshal(Manifest{SchemaVersion: 2, MediaType: MediaTypeManifest, Config: cfgDesc, Layers: []Descriptor{layerDesc}})
	if err != nil {
		return err
	}
	manDesc := describe(MediaTypeManifest, manJSON)
	manDesc.Platform = &Platform{Architecture: arch, OS: "linux"}
	manDesc.Annotations = map[string]string{AnnotationContainerdName: o.Ref, AnnotationRefName: tag}
	idxJSON, err := json.Marshal(Index{SchemaVersion: 2, MediaType: MediaTypeIndex, Manifests: []Descriptor{manDesc}})
	if err != nil {
		return err
	}
	dockerJSON, err := json.Marshal([]DockerManifest{{
		Config:   BlobPath(cfgDesc.Digest),
		RepoTags: []string{o.Ref},
		Layers:   []string{BlobPath(layerDesc.Digest)},
	}})
	if err != nil {
		return err
	}

	tw := tar.NewWriter(out)
	dir := func(name string) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: created, Format: tar.FormatPAX})
	}
	file := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: created, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	steps := []func() error{
		func() error { return file("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)) },
		func() error { return file("index.json", idxJSON) },
		func() error { return file("manifest.json", dockerJSON) },
		func() error { return dir("blobs/") },
		func() error { return dir("blobs/sha256/") },
		func() error { return file(BlobPath(cfgDesc.Digest), cfgJSON) },
		func() error { return file(BlobPath(manDesc.Digest), manJSON) },
		func() error { return file(BlobPath(layerDesc.Digest), layer.Bytes()) },
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return fmt.Errorf("writing the archive: %w", err)
		}
	}
	return tw.Close()
}

// Tag returns the tag of ref (registry/repo:tag), or an error if it has none.
func Tag(ref string) (string, error) {
	i := strings.LastIndex(ref, ":")
	if i < 0 || strings.Contains(ref[i:], "/") || i == len(ref)-1 {
		return "", fmt.Errorf("image reference %q has no tag (want registry/repository:tag)", ref)
	}
	return ref[i+1:], nil
}

// BlobPath is the archive path of the blob with digest d.
func BlobPath(d string) string { return "blobs/sha256/" + strings.TrimPrefix(d, "sha256:") }

// Digest returns the sha256 digest of data in OCI form.
func Digest(data []byte) string {
	s := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(s[:])
}

func describe(mediaType string, data []byte) Descriptor {
	return Descriptor{MediaType: mediaType, Digest: Digest(data), Size: int64(len(data))}
}

// writeLayer writes root's tree as a gzip'd tar in path order with every
// time set to created, owners as on disk (numeric), hard links as links;
// it returns the uncompressed tar's digest (the layer's diff ID).
func writeLayer(w io.Writer, root string, created time.Time) (string, error) {
	var paths []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != root {
			paths = append(paths, p)
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", root, err)
	}
	sort.Strings(paths)
	gz, err := gzip.NewWriterLevel(w, gzip.BestSpeed)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	tw := tar.NewWriter(io.MultiWriter(gz, h))
	links := map[uint64]string{} // inode -> first path, for hard links
	for _, p := range paths {
		fi, err := os.Lstat(p)
		if err != nil {
			return "", err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		target := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if target, err = os.Readlink(p); err != nil {
				return "", err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, target)
		if err != nil {
			return "", fmt.Errorf("%s: %w", p, err)
		}
		hdr.Name = rel
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname = "", ""
		hdr.ModTime, hdr.AccessTime, hdr.ChangeTime = created, time.Time{}, time.Time{}
		hdr.Format = tar.FormatPAX
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			hdr.Uid, hdr.Gid = int(st.Uid), int(st.Gid)
			if fi.Mode().IsRegular() && st.Nlink > 1 {
				if first, seen := links[st.Ino]; seen {
					hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
				} else {
					links[st.Ino] = rel
				}
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return "", fmt.Errorf("%s: %w", p, err)
		}
		if hdr.Typeflag == tar.TypeReg {
			f, err := os.Open(p)
			if err != nil {
				return "", err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			if err != nil {
				return "", fmt.Errorf("%s: %w", p, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	if err := gz.Close(); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}
