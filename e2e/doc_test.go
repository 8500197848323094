//go:build e2e

// Package e2e runs the driver against a real kube-apiserver and
// kube-controller-manager, the real kubernetes-csi sidecars and the RDS
// simulator over SSH; see e2e/framework for the harness and hack/README.md
// for how the control plane is built. Run with `make e2e` or
//
//	go test -tags e2e -count=1 -timeout 40m ./e2e/...
package e2e
