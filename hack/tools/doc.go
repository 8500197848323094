// Package tools is the rds-csi build and test tooling that must stay out of
// the driver's module: the Helm SDK and kustomize (render/, the chart
// tests), the helm command itself (a tool of go.mod: the docs' helm
// install blocks run it against a real API server, docs/cluster_test.go),
// and the OCI image writer (cmd/oci-image, image/). A module of its
// own, so that neither the Helm SDK's dependencies nor their versions reach
// the driver's go.mod or binary. docs/deploy.md says why.
package tools
