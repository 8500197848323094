// Package version holds the version every binary of this repository
// reports: `--version`, the CSI GetPluginInfo vendor_version, the
// driver's User-Agent and its start-up log line.
//
// It is set at link time from hack/version.sh (the one source of the
// version: the file VERSION names the latest release, git says how far
// this commit is from it), with
//
//	go build -ldflags "-X github.com/srvlab/rds-csi/pkg/version.Version=$(hack/version.sh)"
//
// as `make build`, `make image` and `make release` do. A build that does
// not set it (`go build` or `go test` by hand) says "dev". Nothing in this
// package may change at run time.
package version

// Version is the build's version, for example v0.2.0 (a release),
// v0.2.0-12-gabcdef0 (12 commits after it, at abcdef0) or
// v0.2.0-12-gabcdef0-dirty (with uncommitted changes). Set by the linker
// only.
var Version = "dev"

// LDFlag is the -X linker flag that stamps v as the version.
func LDFlag(v string) string { return "-X github.com/srvlab/rds-csi/pkg/version.Version=" + v }
