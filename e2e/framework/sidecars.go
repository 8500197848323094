package framework

import (
	"path/filepath"
	"testing"
)

// SidecarOptions configure one sidecar process.
type SidecarOptions struct {
	Name      string   // process name; default the binary's name
	ExtraArgs []string // appended after the common flags
	// Hostname, when set, runs the sidecar in its own UTS namespace with
	// this host name. Leader election identifies a candidate by host name,
	// so two replicas on one machine need different ones.
	Hostname string
}

// StartSidecar runs a kubernetes-csi sidecar from BinDir on the driver's
// socket, as the driver's ServiceAccount, with leader election in the
// driver's namespace. It is stopped in tb.Cleanup.
func StartSidecar(tb testing.TB, tl *Timeline, root, dir, binary string, d *Driver, dep *Deployment, opts SidecarOptions) *Process {
	tb.Helper()
	if !HaveBinary(root, binary) {
		tb.Fatalf("%s is not in %s: hack/build-controlplane.sh did not build it (see .cache/build/status.tsv)", binary, BinDir(root))
	}
	if opts.Name == "" {
		opts.Name = binary
	}
	args := []string{
		"--csi-address=" + d.Socket,
		"--kubeconfig=" + dep.Kubeconfig,
		"--leader-election",
		"--leader-election-namespace=" + dep.Namespace,
		"--timeout=30s",
		"--v=4",
	}
	args = append(args, opts.ExtraArgs...)
	bin, args := withHostname(opts.Hostname, filepath.Join(BinDir(root), binary), args)
	return StartProcess(tb, tl, opts.Name, filepath.Join(dir, opts.Name+".log"), bin, args...)
}

// StartProvisioner runs csi-provisioner. Its Topology feature is GA (always
// on): volumes carry the RDS's topology segment, and it provisions only once
// some CSINode lists the driver (NewNode registers one).
func StartProvisioner(tb testing.TB, tl *Timeline, root, dir string, d *Driver, dep *Deployment, extra ...string) *Process {
	tb.Helper()
	args := append([]string{"--extra-create-metadata", "--retry-interval-max=5s"}, extra...)
	return StartSidecar(tb, tl, root, dir, "csi-provisioner", d, dep, SidecarOptions{ExtraArgs: args})
}

// StartAttacher runs csi-attacher.
func StartAttacher(tb testing.TB, tl *Timeline, root, dir string, d *Driver, dep *Deployment, extra ...string) *Process {
	tb.Helper()
	args := append([]string{"--retry-interval-max=5s"}, extra...)
	return StartSidecar(tb, tl, root, dir, "csi-attacher", d, dep, SidecarOptions{ExtraArgs: args})
}

// withHostname wraps bin in unshare(1) so that it runs in its own UTS
// namespace with the given host name (we run as root); "" leaves it alone.
func withHostname(hostname, bin string, args []string) (string, []string) {
	if hostname == "" {
		return bin, args
	}
	return "unshare", append([]string{"--uts", "--", "sh", "-c", `hostname "$0" && exec "$@"`, hostname, bin}, args...)
}
