// Command oci-image writes a root filesystem directory as an OCI image
// archive that docker load, ctr images import and kind load image-archive
// accept (package image). hack/build-image.sh runs it:
//
//	oci-image --rootfs DIR --ref REGISTRY/REPO:TAG --out FILE [--arch amd64|arm64] [--created UNIX] [--label K=V]...
//	          [--entrypoint PATH] [--cmd ARG]... [--user UID[:GID]]
//
// hack/build-kubelet-tier.sh writes the kubelet tier's images with it too
// (the sidecars, busybox, pause, agnhost).
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/srvlab/rds-csi/hack/tools/image"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "oci-image:", err)
		os.Exit(1)
	}
}

type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, " ") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

type labels map[string]string

func (l labels) String() string { return fmt.Sprint(map[string]string(l)) }
func (l labels) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("label %q: want key=value", v)
	}
	l[k] = val
	return nil
}

func run(args []string) error {
	fs := flag.NewFlagSet("oci-image", flag.ContinueOnError)
	o := image.Options{Labels: labels{}}
	out := fs.String("out", "", "the archive to write")
	created := fs.Int64("created", 0, "creation time, seconds since the epoch (e.g. the commit's time), for reproducible output")
	entry := fs.String("entrypoint", "/rds-csi-driver", "the image's entrypoint; empty for none (the first --cmd is the command)")
	var cmd stringList
	fs.Var(&cmd, "cmd", "a default argument, or with an empty --entrypoint the command and its arguments (repeatable, in order)")
	fs.StringVar(&o.User, "user", "", "the user the container runs as, uid[:gid]; empty: root")
	fs.StringVar(&o.RootFS, "rootfs", "", "the root filesystem directory")
	fs.StringVar(&o.Ref, "ref", "", "the image reference, registry/repository:tag")
	fs.StringVar(&o.Arch, "arch", "amd64", "the root filesystem's architecture: amd64 or arm64")
	fs.StringVar(&o.Comment, "comment", "", "what the layer holds (history comment)")
	fs.Var(labels(o.Labels), "label", "an image label, key=value (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.RootFS == "" || o.Ref == "" || *out == "" || fs.NArg() != 0 {
		return fmt.Errorf("--rootfs, --ref and --out are required, and nothing else")
	}
	if _, err := image.Tag(o.Ref); err != nil {
		return err
	}
	if *entry != "" {
		o.Entrypoint = []string{*entry}
	}
	if len(o.Entrypoint) == 0 && len(cmd) == 0 {
		return fmt.Errorf("an image needs an --entrypoint or a --cmd")
	}
	o.Cmd = cmd
	o.Created = time.Unix(*created, 0)
	tmp, err := os.CreateTemp(filepath.Dir(*out), ".oci-image-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := image.Write(tmp, o); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), *out)
}
