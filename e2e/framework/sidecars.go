package framework

import (
	"path/filepath"
	"slices"
	"testing"
)

// SidecarOptions configure one sidecar process.
type SidecarOptions struct {
	Name      string   // process name; default the binary's name
	ExtraArgs []string // appended last (a later flag wins)
	// Hostname, when set, runs the sidecar in its own UTS namespace with
	// this host name. Leader election identifies a candidate by host name,
	// so two replicas on one machine need different ones.
	Hostname string
}

// StartSidecar runs a kubernetes-csi sidecar from BinDir on the driver's
// socket as the driver's ServiceAccount. Its flags are those of container
// in manifests/base/controller.yaml (socket path and namespace made local,
// --http-endpoint dropped), so it runs as deployed, with leader election;
// without that manifest, a minimal equivalent. --kubeconfig and --v=4
// follow, then opts.ExtraArgs. It is stopped in tb.Cleanup.
func StartSidecar(tb testing.TB, tl *Timeline, root, dir, binary, container string, d *Driver, dep *Deployment, opts SidecarOptions) *Process {
	tb.Helper()
	if !HaveBinary(root, binary) {
		tb.Fatalf("%s is not in %s: hack/build-controlplane.sh did not build it (see .cache/build/status.tsv)", binary, BinDir(root))
	}
	if opts.Name == "" {
		opts.Name = binary
	}
	args, ok, err := ManifestContainerArgs(root, container)
	if err != nil {
		tb.Fatalf("manifests/base/%s: %v", controllerManifest, err)
	}
	if ok {
		if args, err = localizeArgs(args, d.Socket, dep.Namespace); err != nil {
			tb.Fatalf("container %s of manifests/base/%s: %v", container, controllerManifest, err)
		}
		tl.Logf("%s: flags of container %s in manifests/base/%s", opts.Name, container, controllerManifest)
	} else {
		args = []string{"--csi-address=" + d.Socket, "--leader-election", "--leader-election-namespace=" + dep.Namespace, "--timeout=60s"}
		tl.Logf("%s: no container %s in manifests/base/%s, minimal flags", opts.Name, container, controllerManifest)
	}
	args = append(args, "--kubeconfig="+dep.Kubeconfig, "--v=4")
	args = append(args, opts.ExtraArgs...)
	bin := filepath.Join(BinDir(root), binary)
	if slices.Contains(args, "--enable-capacity") {
		// csi-provisioner publishes capacity into $NAMESPACE, as in its pod.
		args = append([]string{"NAMESPACE=" + dep.Namespace, bin}, args...)
		bin = "env"
	}
	bin, args = withHostname(opts.Hostname, bin, args)
	return StartProcess(tb, tl, opts.Name, filepath.Join(dir, opts.Name+".log"), bin, args...)
}

// StartProvisioner runs csi-provisioner. Its Topology feature is GA (always
// on): volumes carry the RDS's topology segment, and it provisions only once
// some CSINode lists the driver (NewNode registers one). Failed calls are
// retried within 5 s instead of the default 5 min backoff cap.
func StartProvisioner(tb testing.TB, tl *Timeline, root, dir string, d *Driver, dep *Deployment, opts SidecarOptions) *Process {
	tb.Helper()
	opts.ExtraArgs = append([]string{"--retry-interval-max=5s"}, opts.ExtraArgs...)
	return StartSidecar(tb, tl, root, dir, "csi-provisioner", "csi-provisioner", d, dep, opts)
}

// StartAttacher runs csi-attacher (retries capped at 5 s).
func StartAttacher(tb testing.TB, tl *Timeline, root, dir string, d *Driver, dep *Deployment, opts SidecarOptions) *Process {
	tb.Helper()
	opts.ExtraArgs = append([]string{"--retry-interval-max=5s"}, opts.ExtraArgs...)
	return StartSidecar(tb, tl, root, dir, "csi-attacher", "csi-attacher", d, dep, opts)
}

// StartResizer runs csi-resizer; tests needing it should skip when
// HaveBinary(root, "csi-resizer") is false (it is optional in the build).
func StartResizer(tb testing.TB, tl *Timeline, root, dir string, d *Driver, dep *Deployment, opts SidecarOptions) *Process {
	tb.Helper()
	return StartSidecar(tb, tl, root, dir, "csi-resizer", "csi-resizer", d, dep, opts)
}

// StartSnapshotter runs the csi-snapshotter sidecar. Snapshots also need
// InstallSnapshotCRDs and StartSnapshotController.
func StartSnapshotter(tb testing.TB, tl *Timeline, root, dir string, d *Driver, dep *Deployment, opts SidecarOptions) *Process {
	tb.Helper()
	return StartSidecar(tb, tl, root, dir, "csi-snapshotter", "csi-snapshotter", d, dep, opts)
}

// withHostname wraps bin in unshare(1) so that it runs in its own UTS
// namespace with the given host name (we run as root); "" leaves it alone.
func withHostname(hostname, bin string, args []string) (string, []string) {
	if hostname == "" {
		return bin, args
	}
	return "unshare", append([]string{"--uts", "--", "sh", "-c", `hostname "$0" && exec "$@"`, hostname, bin}, args...)
}
