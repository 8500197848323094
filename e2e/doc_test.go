//go:build e2e

// Package e2e runs the driver against a real kube-apiserver and
// kube-controller-manager, the real kubernetes-csi sidecars and the RDS
// simulator over SSH; see e2e/framework for the harness and hack/README.md
// for how the control plane is built. Run with `make e2e` or
//
//	go test -tags e2e -count=1 -timeout 40m -parallel 6 ./e2e/...
//
// Scenarios run side by side (t.Parallel); e2e/README.md says what a new
// one must do to be safe beside the others.
package e2e
