//go:build nvmevm

package nvme

// userHost is a minimal NVMe/TCP host in user space: one admin and one
// I/O queue, each its own TCP connection, no digests, in-capsule data for
// writes (NVMe/TCP transport specification 1.0; the fabrics Connect and
// Property Get/Set commands of the NVMe over Fabrics specification).
//
// It stands for a host on ANOTHER machine. Two host NQNs in one kernel
// share that kernel's NVMe subsystem of a subsystem NQN (fence_vm_test.go):
// while a fenced host's controller is still there (reconnecting, its
// writes held, which is the case fence_return_vm_test.go makes on
// purpose), the kernel refuses a second host's controller of the same
// subsystem ("Duplicate cntlid", "IDs don't match for shared namespace"),
// or, on a target that keeps the namespace's identity, would put it under
// the same multipath head, where the fenced host's held writes would be
// sent down the new host's path. Two machines share none of this. A host
// in user space has its own TCP connections and nothing in the kernel's
// NVMe state, so the fenced host's controller lives on, untouched, while
// the other host holds the volume.

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
)

// PDU types (NVMe/TCP).
const (
	pduICReq      = 0x00
	pduICResp     = 0x01
	pduC2HTermReq = 0x03
	pduCapsuleCmd = 0x04
	pduCapsuleRsp = 0x05
	pduC2HData    = 0x07
	pduR2T        = 0x09

	c2hDataSuccess = 0x08 // C2HData flag: no response capsule follows

	cmdHdrLen = 8 + 64 // common header + SQE
)

// Status codes this test names (status field without phase; SCT in bits
// 8-10, DNR in bit 14).
const (
	scConnectInvalidParam = 0x182 // e.g. no such subsystem on the port
	scConnectInvalidHost  = 0x184 // host not allowed
)

// nvmeStatus is a completion's status field (phase bit dropped).
type nvmeStatus uint16

func (s nvmeStatus) code() uint16 { return uint16(s) & 0x7ff } // SCT and SC
func (s nvmeStatus) Error() string {
	what := ""
	switch s.code() {
	case scConnectInvalidHost:
		what = " (connect: host not allowed)"
	case scConnectInvalidParam:
		what = " (connect: invalid parameters, e.g. no such subsystem)"
	}
	return fmt.Sprintf("NVMe status %#x%s", uint16(s), what)
}

type completion struct {
	result uint64
	status nvmeStatus
}

// tcpQueue is one NVMe/TCP connection; commands on it run one at a time.
type tcpQueue struct {
	mu   sync.Mutex
	conn net.Conn
	cid  uint16
}

func dialQueue(ctx context.Context, addr string) (*tcpQueue, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	req := make([]byte, 128)
	req[0], req[2] = pduICReq, 128
	binary.LittleEndian.PutUint32(req[4:], 128)
	// pfv 0 (1.0), hpda 0, no digests, maxr2t 0: all zero.
	if _, err := conn.Write(req); err != nil {
		conn.Close()
		return nil, fmt.Errorf("ICReq: %w", err)
	}
	typ, _, pdu, err := readPDU(conn)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("ICResp: %w", err)
	}
	if typ != pduICResp || len(pdu) != 128 {
		conn.Close()
		return nil, fmt.Errorf("ICResp: got PDU type %#x of %d bytes", typ, len(pdu))
	}
	if cpda := pdu[10]; cpda != 0 {
		conn.Close()
		return nil, fmt.Errorf("ICResp: the target asks for data alignment %d, which this host does not do", cpda)
	}
	return &tcpQueue{conn: conn}, nil
}

// readPDU reads one whole PDU.
func readPDU(r io.Reader) (typ, flags byte, pdu []byte, err error) {
	hdr := make([]byte, 8)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return 0, 0, nil, err
	}
	plen := binary.LittleEndian.Uint32(hdr[4:])
	if plen < 8 || plen > 1<<20 {
		return 0, 0, nil, fmt.Errorf("PDU type %#x with length %d", hdr[0], plen)
	}
	pdu = make([]byte, plen)
	copy(pdu, hdr)
	if _, err := io.ReadFull(r, pdu[8:]); err != nil {
		return 0, 0, nil, err
	}
	return hdr[0], hdr[1], pdu, nil
}

// exec runs one command: sqe (opcode, nsid, cdw10-15 filled in by the
// caller), with in (in-capsule data, a write) or out (data the target
// sends, a read), and returns its completion. A non-zero status is
// returned as the completion and an nvmeStatus error.
func (q *tcpQueue) exec(sqe []byte, in, out []byte) (completion, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.cid++
	cid := q.cid
	binary.LittleEndian.PutUint16(sqe[2:], cid)
	sqe[1] = 0x40 // PSDT: SGL (NVME_CMD_SGL_METABUF), as every NVMe/TCP command
	switch {
	case len(in) > 0:
		binary.LittleEndian.PutUint64(sqe[24:], 0) // offset into the capsule's data
		binary.LittleEndian.PutUint32(sqe[32:], uint32(len(in)))
		sqe[39] = 0x01 // data block descriptor, subtype offset: in-capsule
	case len(out) > 0:
		binary.LittleEndian.PutUint32(sqe[32:], uint32(len(out)))
		sqe[39] = 0x5a // transport data block, transport-specific subtype
	}
	pdu := make([]byte, cmdHdrLen+len(in))
	pdu[0], pdu[2] = pduCapsuleCmd, cmdHdrLen
	if len(in) > 0 {
		pdu[3] = cmdHdrLen // PDO: data right after the header (no digest, CPDA 0)
	}
	binary.LittleEndian.PutUint32(pdu[4:], uint32(len(pdu)))
	copy(pdu[8:], sqe)
	copy(pdu[cmdHdrLen:], in)
	if _, err := q.conn.Write(pdu); err != nil {
		return completion{}, err
	}
	for {
		typ, flags, p, err := readPDU(q.conn)
		if err != nil {
			return completion{}, err
		}
		switch typ {
		case pduCapsuleRsp:
			if len(p) < 24 {
				return completion{}, fmt.Errorf("response capsule of %d bytes", len(p))
			}
			cqe := p[8:24]
			if got := binary.LittleEndian.Uint16(cqe[12:]); got != cid {
				return completion{}, fmt.Errorf("response for command %d, waiting for %d", got, cid)
			}
			c := completion{result: binary.LittleEndian.Uint64(cqe[0:]), status: nvmeStatus(binary.LittleEndian.Uint16(cqe[14:]) >> 1)}
			if c.status != 0 {
				return c, c.status
			}
			return c, nil
		case pduC2HData:
			if len(p) < 24 {
				return completion{}, fmt.Errorf("C2HData PDU of %d bytes", len(p))
			}
			pdo := int(p[3])
			off := binary.LittleEndian.Uint32(p[12:])
			n := binary.LittleEndian.Uint32(p[16:])
			if pdo < 24 || pdo+int(n) > len(p) || int(off)+int(n) > len(out) {
				return completion{}, fmt.Errorf("C2HData: offset %d, %d bytes at %d of a %d-byte PDU, for a %d-byte buffer", off, n, pdo, len(p), len(out))
			}
			copy(out[off:], p[pdo:pdo+int(n)])
			if flags&c2hDataSuccess != 0 {
				return completion{}, nil
			}
		case pduC2HTermReq:
			return completion{}, fmt.Errorf("the target terminated the connection (C2HTermReq, error status %#x)", binary.LittleEndian.Uint16(p[8:]))
		default:
			return completion{}, fmt.Errorf("unexpected PDU type %#x (R2T is %#x: in-capsule data was refused)", typ, pduR2T)
		}
	}
}

func (q *tcpQueue) close() { q.conn.Close() }

// userHost is one host NQN's controller of one subsystem.
type userHost struct {
	admin, io *tcpQueue
	cntlid    uint16
	lbaSize   int
	nsze      uint64
}

// connectUserHost connects hostNQN (host ID hostID, a UUID) to subsystem
// nqn at addr as a dynamic controller, enables it, reads namespace 1 and
// opens one I/O queue. A refusal is an nvmeStatus error.
func connectUserHost(ctx context.Context, addr, nqn, hostNQN, hostID string) (_ *userHost, err error) {
	id, err := hex.DecodeString(strings.ReplaceAll(hostID, "-", ""))
	if err != nil || len(id) != 16 {
		return nil, fmt.Errorf("host ID %q is not a UUID", hostID)
	}
	h := &userHost{}
	defer func() {
		if err != nil {
			h.close()
		}
	}()
	if h.admin, err = dialQueue(ctx, addr); err != nil {
		return nil, fmt.Errorf("admin queue: %w", err)
	}
	c, err := h.admin.exec(connectSQE(0, 31), connectData(id, 0xffff, nqn, hostNQN), nil)
	if err != nil {
		return nil, fmt.Errorf("admin connect as %s: %w", hostNQN, err)
	}
	h.cntlid = uint16(c.result)
	// CC: EN, I/O SQ entry 2^6, CQ entry 2^4 bytes, NVM command set.
	if _, err := h.admin.exec(propertySetSQE(0x14, 0x00460001), nil, nil); err != nil {
		return nil, fmt.Errorf("enabling the controller (CC): %w", err)
	}
	c, err = h.admin.exec(propertyGetSQE(0x1c), nil, nil)
	if err != nil {
		return nil, fmt.Errorf("reading CSTS: %w", err)
	}
	if csts := uint32(c.result); csts&1 == 0 || csts&2 != 0 {
		return nil, fmt.Errorf("the controller is not ready after enabling it (CSTS %#x)", csts)
	}
	idns := make([]byte, 4096)
	sqe := make([]byte, 64)
	sqe[0] = 0x06 // Identify
	binary.LittleEndian.PutUint32(sqe[4:], 1)
	// CDW10 CNS 0: the namespace.
	if _, err := h.admin.exec(sqe, nil, idns); err != nil {
		return nil, fmt.Errorf("identify namespace 1: %w", err)
	}
	h.nsze = binary.LittleEndian.Uint64(idns[0:])
	lbaf := idns[128+4*int(idns[26]&0x0f):]
	h.lbaSize = 1 << lbaf[2]
	if h.nsze == 0 || h.lbaSize < 512 || h.lbaSize > 4096 {
		return nil, fmt.Errorf("namespace 1: %d blocks of %d bytes", h.nsze, h.lbaSize)
	}
	if h.io, err = dialQueue(ctx, addr); err != nil {
		return nil, fmt.Errorf("I/O queue: %w", err)
	}
	if _, err := h.io.exec(connectSQE(1, 31), connectData(id, h.cntlid, nqn, hostNQN), nil); err != nil {
		return nil, fmt.Errorf("I/O queue connect: %w", err)
	}
	return h, nil
}

// writeAt writes b (a multiple of the block size) at byte offset off with
// FUA: acknowledged means on the target's medium.
func (h *userHost) writeAt(b []byte, off int64) error {
	if len(b)%h.lbaSize != 0 || off%int64(h.lbaSize) != 0 {
		return fmt.Errorf("write of %d bytes at %d: not whole %d-byte blocks", len(b), off, h.lbaSize)
	}
	sqe := make([]byte, 64)
	sqe[0] = 0x01 // Write
	binary.LittleEndian.PutUint32(sqe[4:], 1)
	binary.LittleEndian.PutUint64(sqe[40:], uint64(off/int64(h.lbaSize)))
	binary.LittleEndian.PutUint32(sqe[48:], uint32(len(b)/h.lbaSize-1)|1<<30)
	_, err := h.io.exec(sqe, b, nil)
	return err
}

func (h *userHost) close() {
	for _, q := range []*tcpQueue{h.io, h.admin} {
		if q != nil {
			q.close()
		}
	}
}

func connectSQE(qid, sqsize uint16) []byte {
	sqe := make([]byte, 64)
	sqe[0], sqe[4] = 0x7f, 0x01 // fabrics, Connect
	binary.LittleEndian.PutUint16(sqe[42:], qid)
	binary.LittleEndian.PutUint16(sqe[44:], sqsize) // 0's based
	// KATO 2 min: traffic resets it, and the host is gone long before.
	binary.LittleEndian.PutUint32(sqe[48:], 120_000)
	return sqe
}

func connectData(hostID []byte, cntlid uint16, nqn, hostNQN string) []byte {
	d := make([]byte, 1024)
	copy(d[0:16], hostID)
	binary.LittleEndian.PutUint16(d[16:], cntlid)
	copy(d[256:512], nqn)
	copy(d[512:768], hostNQN)
	return d
}

func propertySetSQE(offset uint32, value uint64) []byte {
	sqe := make([]byte, 64)
	sqe[0], sqe[4] = 0x7f, 0x00 // fabrics, Property Set
	sqe[40] = 0                 // 4 bytes
	binary.LittleEndian.PutUint32(sqe[44:], offset)
	binary.LittleEndian.PutUint64(sqe[48:], value)
	return sqe
}

func propertyGetSQE(offset uint32) []byte {
	sqe := make([]byte, 64)
	sqe[0], sqe[4] = 0x7f, 0x04 // fabrics, Property Get
	binary.LittleEndian.PutUint32(sqe[44:], offset)
	return sqe
}

// isStatus reports whether err is an NVMe completion with status code
// (SCT and SC) code.
func isStatus(err error, code uint16) bool {
	var s nvmeStatus
	return errors.As(err, &s) && s.code() == code
}
