package csi

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// Filesystems a volume may be formatted with. The empty fs_type means the
// node's default, DefaultFsType.
var SupportedFsTypes = []string{"ext4", "xfs"}

// DefaultFsType is used when a mount capability names no filesystem.
const DefaultFsType = "ext4"

// offeredAccessModes are the access modes this driver serves.
// MULTI_NODE_MULTI_WRITER is offered for raw block volumes only (KubeVirt
// live migration); SINGLE_NODE_READER_ONLY and MULTI_NODE_SINGLE_WRITER
// are not offered (Kubernetes does not use them).
var offeredAccessModes = []csi.VolumeCapability_AccessMode_Mode{
	csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER,
	csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY,
	csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER,
}

// checkCapability says why a volume capability is not supported (nil: it
// is). The message is meant for the user who wrote the PVC.
func checkCapability(c *csi.VolumeCapability) error {
	if c == nil {
		return fmt.Errorf("a volume capability is empty")
	}
	mode := c.GetAccessMode().GetMode()
	if mode == csi.VolumeCapability_AccessMode_UNKNOWN {
		return fmt.Errorf("a volume capability has no access mode")
	}
	var block bool
	switch t := c.GetAccessType().(type) {
	case *csi.VolumeCapability_Block:
		block = true
	case *csi.VolumeCapability_Mount:
		fs := t.Mount.GetFsType()
		if fs != "" && !slices.Contains(SupportedFsTypes, fs) {
			return fmt.Errorf("filesystem %q is not supported; use one of %s", fs, strings.Join(SupportedFsTypes, ", "))
		}
	default:
		return fmt.Errorf("a volume capability has neither block nor mount access type")
	}
	if !slices.Contains(offeredAccessModes, mode) {
		return fmt.Errorf("access mode %s is not offered; offered are SINGLE_NODE_WRITER, SINGLE_NODE_SINGLE_WRITER, SINGLE_NODE_MULTI_WRITER, MULTI_NODE_READER_ONLY, and MULTI_NODE_MULTI_WRITER for raw block volumes", mode)
	}
	if mode == csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER && !block {
		return fmt.Errorf("MULTI_NODE_MULTI_WRITER (ReadWriteMany) is offered for raw block volumes only: ext4 and xfs are not cluster filesystems, and mounting one read-write on two nodes corrupts it; use volumeMode: Block (e.g. for KubeVirt live migration) or a single-node access mode")
	}
	return nil
}

// checkCapabilities checks a request's capability list.
func checkCapabilities(caps []*csi.VolumeCapability) error {
	if len(caps) == 0 {
		return fmt.Errorf("volume capabilities are required")
	}
	for _, c := range caps {
		if err := checkCapability(c); err != nil {
			return err
		}
	}
	return nil
}

// isBlockOnly reports whether every capability asks for a raw block device.
func isBlockOnly(caps ...*csi.VolumeCapability) bool {
	if len(caps) == 0 {
		return false
	}
	for _, c := range caps {
		if c.GetBlock() == nil {
			return false
		}
	}
	return true
}

// provisionerParameterPrefix marks parameters that Kubernetes sidecars add
// (e.g. csi.storage.k8s.io/pvc/name with --extra-create-metadata); they are
// accepted and ignored.
const provisionerParameterPrefix = "csi.storage.k8s.io/"

// ParameterRDS is the StorageClass parameter that pins a box: its volumes
// go to the RDS of that name (pkg/backends), whatever topology allows
// besides.
const ParameterRDS = "rds"

// checkParameters rejects every parameter key the driver does not know,
// so that a typo in a StorageClass fails loudly instead of being ignored.
// The driver's one parameter is ParameterRDS; the filesystem arrives in
// the volume capability (the provisioner turns csi.storage.k8s.io/fstype
// into it).
func checkParameters(params map[string]string) error {
	var unknown []string
	for k, v := range params {
		if k == ParameterRDS {
			if !labelValuePattern.MatchString(v) {
				return fmt.Errorf("parameter %s=%q is not the name of an RDS (a label value)", ParameterRDS, v)
			}
			continue
		}
		if !strings.HasPrefix(k, provisionerParameterPrefix) {
			unknown = append(unknown, fmt.Sprintf("%q", k))
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	sort.Strings(unknown)
	return fmt.Errorf("unknown parameter(s) %s; this driver accepts %s and keys prefixed %s: remove them from the StorageClass or VolumeSnapshotClass", strings.Join(unknown, ", "), ParameterRDS, provisionerParameterPrefix)
}
