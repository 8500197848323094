// Package framework is the e2e harness: a real, kubelet-less Kubernetes
// control plane (hack/controlplane.sh: etcd, kube-apiserver with RBAC,
// kube-controller-manager), the RDS simulator over real SSH, the driver as
// its real binary on a unix socket, the kubernetes-csi sidecars with leader
// election, and "kubelets" that are only Node, CSINode and Lease objects
// kept fresh by a goroutine.
//
// Everything a test starts is stopped by PID in t.Cleanup, also when the
// test fails; a watchdog stops the control plane even if the test binary
// dies without running its cleanups (a -timeout panic).
//
// Each test writes its artifacts (timeline.log, the component logs) to
// ArtifactsRoot()/<test>-<time>/ and prints that path. The timeline records
// every step, every wait with how long it took, and every change of the API
// objects a CSI driver cares about, with the time since the test started.
//
// Tests run side by side (t.Parallel), each with its own control plane:
// FreePort hands every port out once per test binary, SocketDir and the
// artifact directory are per test, builds are once per test binary, and
// control planes start two at a time (RDS_CSI_E2E_STARTS). Nothing here
// may change process-wide state (environment, working directory).
//
// The binaries come from hack/build-controlplane.sh (.cache/bin); when they
// are missing, EnsureBinaries runs that script unless RDS_CSI_E2E_BUILD=0,
// in which case the test fails saying what to run.
package framework
