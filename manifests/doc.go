// Package manifests holds no code: it is the kustomize tree that deploys
// the driver (base/, storageclass/, snapshot/, monitoring/, overlays/,
// examples/) and the Go test that parses every manifest into the API's
// typed objects and checks the invariants an operator relies on.
// docs/deploy.md explains the layout.
package manifests
