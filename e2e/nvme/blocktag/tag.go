package blocktag

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// BlockSize is the size of one tagged block and of one write.
const BlockSize = 4096

// magic starts every tagged block.
const magic = "RDSTAG01"

// Layout of a block (little endian): magic, host, slot, seq, submit time,
// a filler derived from (host, seq), and the CRC32C of everything before
// it in the last four bytes.
const (
	offHost   = 8
	offSlot   = 12
	offSeq    = 16
	offSubmit = 24
	offFill   = 32
	offCRC    = BlockSize - 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Tag identifies one write.
type Tag struct {
	Host     uint32
	Slot     uint32 // the block's index on the disk
	Seq      uint64 // the writer's sequence number, from 1
	SubmitNS int64  // CLOCK_MONOTONIC at submission
}

// ErrEmpty: the block was never written (all zero).
var ErrEmpty = errors.New("empty block")

// ErrCorrupt: the block is not a whole tagged block (torn, foreign or
// damaged).
var ErrCorrupt = errors.New("not an intact tagged block")

// Encode fills b (BlockSize bytes) with t's block.
func Encode(b []byte, t Tag) {
	_ = b[BlockSize-1]
	copy(b, magic)
	binary.LittleEndian.PutUint32(b[offHost:], t.Host)
	binary.LittleEndian.PutUint32(b[offSlot:], t.Slot)
	binary.LittleEndian.PutUint64(b[offSeq:], t.Seq)
	binary.LittleEndian.PutUint64(b[offSubmit:], uint64(t.SubmitNS))
	fill(b[offFill:offCRC], t.Host, t.Seq)
	binary.LittleEndian.PutUint32(b[offCRC:], crc32.Checksum(b[:offCRC], castagnoli))
}

// Decode reads the tag of a block, checking the magic, the checksum and
// the filler.
func Decode(b []byte) (Tag, error) {
	if len(b) != BlockSize {
		return Tag{}, fmt.Errorf("%w: %d bytes", ErrCorrupt, len(b))
	}
	if allZero(b) {
		return Tag{}, ErrEmpty
	}
	if string(b[:len(magic)]) != magic {
		return Tag{}, fmt.Errorf("%w: no magic", ErrCorrupt)
	}
	if got, want := binary.LittleEndian.Uint32(b[offCRC:]), crc32.Checksum(b[:offCRC], castagnoli); got != want {
		return Tag{}, fmt.Errorf("%w: checksum %08x, computed %08x", ErrCorrupt, got, want)
	}
	t := Tag{
		Host:     binary.LittleEndian.Uint32(b[offHost:]),
		Slot:     binary.LittleEndian.Uint32(b[offSlot:]),
		Seq:      binary.LittleEndian.Uint64(b[offSeq:]),
		SubmitNS: int64(binary.LittleEndian.Uint64(b[offSubmit:])),
	}
	want := make([]byte, offCRC-offFill)
	fill(want, t.Host, t.Seq)
	if string(want) != string(b[offFill:offCRC]) {
		return Tag{}, fmt.Errorf("%w: filler does not match host %d seq %d", ErrCorrupt, t.Host, t.Seq)
	}
	return t, nil
}

// fill writes a xorshift stream seeded by (host, seq), so that every
// write's block differs from every other's in almost every byte.
func fill(b []byte, host uint32, seq uint64) {
	x := uint64(host)<<40 ^ seq ^ 0x9e3779b97f4a7c15
	var word [8]byte
	for i := 0; i < len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(word[:], x)
		copy(b[i:], word[:])
	}
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
