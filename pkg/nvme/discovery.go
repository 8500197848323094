package nvme

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// discoveryNQN is the well-known NQN of an NVMe-oF discovery controller.
const discoveryNQN = "nqn.2014-08.org.nvmexpress.discovery"

// The kernel's refusal of a connect (EIO) does not say why: an NQN the
// target does not have and a host the target does not allow look alike.
// The discovery log page tells them apart from the node's side: it lists
// the subsystems the target offers to this host.

const (
	discoveryLogID    = 0x70
	discoveryHeader   = 1024 // generation counter, record count, format
	discoveryEntry    = 1024
	discoverySubnqnAt = 256 // offset of SUBNQN in an entry
	discoveryMaxRecs  = 1023
	adminGetLogPage   = 0x02
)

// nvmePassthruCmd is the kernel's struct nvme_passthru_cmd (linux/nvme_ioctl.h).
type nvmePassthruCmd struct {
	Opcode      uint8
	Flags       uint8
	Rsvd1       uint16
	NSID        uint32
	Cdw2        uint32
	Cdw3        uint32
	Metadata    uint64
	Addr        uint64
	MetadataLen uint32
	DataLen     uint32
	Cdw10       uint32
	Cdw11       uint32
	Cdw12       uint32
	Cdw13       uint32
	Cdw14       uint32
	Cdw15       uint32
	TimeoutMS   uint32
	Result      uint32
}

// nvmeIoctlAdminCmd is _IOWR('N', 0x41, struct nvme_passthru_cmd).
var nvmeIoctlAdminCmd = uintptr(3<<30 | uint32(unsafe.Sizeof(nvmePassthruCmd{}))<<16 | 'N'<<8 | 0x41)

var instanceReply = regexp.MustCompile(`instance=([0-9]+)`)

// offeredSubsystems connects a discovery controller to addr:port as this
// host, reads the discovery log page and deletes the controller again. It
// returns the subsystem NQNs the target offers to this host.
func (c *TCPConnector) offeredSubsystems(ctx context.Context, addr string, port int, id HostIdentity) ([]string, error) {
	opts := fmt.Sprintf("transport=tcp,traddr=%s,trsvcid=%d,nqn=%s,hostnqn=%s,hostid=%s", addr, port, discoveryNQN, id.NQN, id.ID)
	results, err := c.startFabricsWrite(ctx, opts)
	if err != nil {
		return nil, err
	}
	var r fabricsResult
	select {
	case r = <-results:
	case <-ctx.Done():
		// The write ends by itself; its controller, if any, is left to
		// the kernel (a discovery controller holds no namespace).
		return nil, ctx.Err()
	}
	if r.err != nil {
		return nil, fmt.Errorf("connecting the discovery controller: %w", r.err)
	}
	m := instanceReply.FindStringSubmatch(r.reply)
	if m == nil {
		return nil, fmt.Errorf("the kernel's reply %q names no controller", r.reply)
	}
	ctrl := "nvme" + m[1]
	defer func() {
		if got, err := c.sys.controllerNQN(ctrl); err == nil && got == discoveryNQN {
			_ = c.sys.writeControllerAttr(ctrl, "delete_controller")
		}
	}()
	return readDiscoveryLog(filepath.Join(c.cfg.DevRoot, ctrl))
}

func readDiscoveryLog(dev string) ([]string, error) {
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	page, err := getLogPage(f, discoveryHeader+3*discoveryEntry)
	if err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint64(page[8:16])
	if n > discoveryMaxRecs {
		n = discoveryMaxRecs
	}
	if need := discoveryHeader + int(n)*discoveryEntry; need > len(page) {
		if page, err = getLogPage(f, need); err != nil {
			return nil, err
		}
	}
	out := make([]string, 0, n)
	for i := 0; i < int(n); i++ {
		e := page[discoveryHeader+i*discoveryEntry:]
		nqn := string(e[discoverySubnqnAt : discoverySubnqnAt+256])
		if j := strings.IndexByte(nqn, 0); j >= 0 {
			nqn = nqn[:j]
		}
		out = append(out, strings.TrimSpace(nqn))
	}
	return out, nil
}

func getLogPage(f *os.File, size int) ([]byte, error) {
	buf := make([]byte, size)
	numd := uint32(size/4 - 1)
	cmd := nvmePassthruCmd{
		Opcode:  adminGetLogPage,
		Addr:    uint64(uintptr(unsafe.Pointer(&buf[0]))),
		DataLen: uint32(size),
		Cdw10:   discoveryLogID | (numd&0xffff)<<16,
		Cdw11:   numd >> 16,
	}
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), nvmeIoctlAdminCmd, uintptr(unsafe.Pointer(&cmd)))
	runtime.KeepAlive(buf)
	if errno != 0 {
		return nil, fmt.Errorf("reading the discovery log page from %s: %w", f.Name(), errno)
	}
	return buf, nil
}
