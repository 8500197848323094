// Package blocktag is the history-and-image checker of the storage fencing
// proof in the NVMe/TCP VM tier (e2e/nvme, fence_vm_test.go).
//
// Each writer (one per host) writes 4 KiB blocks with O_DIRECT to its own
// slots of a shared disk. Every block carries a tag: the host, the slot,
// a sequence number, the CLOCK_MONOTONIC time of submission and a CRC32C
// over the whole block, so a block in the final image names the one write
// that put it there, and a torn or foreign block is detected. The writer
// records every answer it got (submit and completion time, success or the
// error), in the manner of Jepsen histories: the checks (CheckFenced,
// CheckImage) judge that history and the image read from the target's
// backing file, separately from the system under test.
//
// All writers must run in one kernel: their timestamps are compared.
// The package must never retry a write or hide an error; a writer that
// fails records the failure and tries the next block.
package blocktag
