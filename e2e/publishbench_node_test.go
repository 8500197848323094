//go:build e2e

package e2e

import "github.com/srvlab/rds-csi/e2e/framework"

// benchNode registers a node as this release's node plugin does (the bare
// node name as its node ID). It is a file of its own so that the publish
// benchmark runs unchanged on a commit from before per-attachment host
// NQNs, with this file replaced (docs/BENCHMARKS.md).
func benchNode(e *framework.Env, name string) { e.NewNode(name) }
