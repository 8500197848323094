// Package nvme is the node-side data path: it connects this node's kernel
// NVMe/TCP initiator to an RDS volume's subsystem, finds the block device the
// kernel made for it, and disconnects it again.
//
// TCPConnector is the production implementation. It connects by writing one
// option string to /dev/nvme-fabrics (no nvme-cli in the node image, exact
// errno from the kernel), always passes explicit ctrl_loss_tmo,
// reconnect_delay, keep_alive_tmo and (unless configured off)
// fast_io_fail_tmo, and the host identity of the attachment: its own host
// NQN with a host ID derived from it when the controller gave it one, the
// node's persistent host NQN and host ID otherwise. It finds devices by
// scanning sysfs for the subsystem NQN. Device names are never cached:
// controllers and namespaces are renumbered after a reconnect, so every
// lookup resolves the NQN afresh.
//
// A new attachment never shares a kernel controller or multipath head with
// an earlier one: before connecting, Connect disconnects every controller
// of the subsystem that connected with another host NQN (a fenced
// attachment's controller may still be reconnecting with writes queued).
//
// LoopConnector is the test implementation for machines without NVMe/TCP: it
// attaches a volume's backing file as a loop device, so the rest of the node
// path (mkfs, mount, resize) runs on a real block device.
//
// Both only ever act on NQNs that start with the driver's configured prefix.
// This package must never touch another NVMe-oF subsystem on the node (other
// drivers, the host's boot disk, anything the operator connected by hand),
// and never disconnect a subsystem that a staged volume still uses: the
// caller must answer that question on every Disconnect. The one exception
// is the rule above: a controller of an earlier attachment goes when a new
// attachment of the same volume connects, mounted or not, because the
// volume is no longer that attachment's to write.
package nvme
