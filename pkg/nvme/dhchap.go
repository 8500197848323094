package nvme

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
	"strings"
)

// DHCHAPSecret is an NVMe in-band authentication (DH-HMAC-CHAP, NVMe TP
// 8006) secret in the representation that the kernel's dhchap_secret
// connect option and nvmet's dhchap_key attribute take:
//
//	DHHC-1:<hh>:<base64 of the key followed by its CRC-32, little-endian>:
//
// where hh is 00 (the key is used as it is) or 01, 02, 03 (the key is
// first transformed with SHA-256, -384, -512 and the host NQN), and the
// key is 32, 48 or 64 bytes (exactly the hash's length when hh is not 00).
//
// The secret is what proves that a host is the attachment it claims to be:
// String and GoString never show it, so a logged value or a %v in an error
// cannot leak it. Only Reveal gives it, for the kernel. The value sits
// behind a pointer: fmt prints a struct's unexported fields by reflection
// without calling String, and a pointer below the top level as an
// address, so a struct holding a secret in an unexported field prints no
// secret either.
type DHCHAPSecret struct{ repr *string }

const dhchapPrefix = "DHHC-1:"

// dhchapKeyLengths by the hh field: 00 takes any of the three.
var dhchapKeyLengths = map[string][]int{
	"00": {32, 48, 64},
	"01": {32},
	"02": {48},
	"03": {64},
}

// ParseDHCHAPSecret validates s. The error says what is wrong and never
// repeats the value.
func ParseDHCHAPSecret(s string) (DHCHAPSecret, error) {
	bad := func(why string, args ...any) (DHCHAPSecret, error) {
		return DHCHAPSecret{}, fmt.Errorf("%w: %s (want DHHC-1:<hh>:<base64 key and CRC-32>:)", ErrMalformedSecret, fmt.Sprintf(why, args...))
	}
	rest, ok := strings.CutPrefix(s, dhchapPrefix)
	if !ok {
		return bad("it does not start with %q", dhchapPrefix)
	}
	hh, b64, ok := strings.Cut(rest, ":")
	if !ok {
		return bad("no key after the hash field")
	}
	lengths, ok := dhchapKeyLengths[hh]
	if !ok {
		return bad("hash field %q is none of 00, 01, 02, 03", truncate(hh, 4))
	}
	b64, ok = strings.CutSuffix(b64, ":")
	if !ok || strings.Contains(b64, ":") {
		return bad("the key must end with one ':'")
	}
	// Go's decoder skips \r and \n, even Strict; the kernel splits its
	// connect options at them, so they must not pass.
	raw, err := base64.StdEncoding.Strict().DecodeString(b64)
	if err != nil || strings.ContainsAny(b64, "\r\n") {
		return bad("the key is not standard base64")
	}
	key := len(raw) - 4
	if !slices.Contains(lengths, key) {
		return bad("a %d-byte key with hash field %s; it takes %v bytes", max(key, 0), hh, lengths)
	}
	if crc32.ChecksumIEEE(raw[:key]) != binary.LittleEndian.Uint32(raw[key:]) {
		return bad("the key's CRC-32 does not match")
	}
	return DHCHAPSecret{repr: &s}, nil
}

// NewDHCHAPSecret makes a fresh secret of 32 random bytes read from r
// (crypto/rand.Reader outside tests), used untransformed (hh 00): the
// key is random already, and 00 lets any host NQN present it.
func NewDHCHAPSecret(r io.Reader) (DHCHAPSecret, error) {
	raw := make([]byte, 32, 36)
	if _, err := io.ReadFull(r, raw); err != nil {
		return DHCHAPSecret{}, fmt.Errorf("reading random bytes for a DH-HMAC-CHAP secret: %w", err)
	}
	raw = binary.LittleEndian.AppendUint32(raw, crc32.ChecksumIEEE(raw))
	repr := dhchapPrefix + "00:" + base64.StdEncoding.EncodeToString(raw) + ":"
	return DHCHAPSecret{repr: &repr}, nil
}

// IsZero reports whether the secret is unset.
func (s DHCHAPSecret) IsZero() bool { return s.repr == nil || *s.repr == "" }

// Reveal returns the secret's representation, for the kernel and the RDS
// only.
func (s DHCHAPSecret) Reveal() string {
	if s.repr == nil {
		return ""
	}
	return *s.repr
}

// Equal compares two secrets without revealing either.
func (s DHCHAPSecret) Equal(o DHCHAPSecret) bool { return s.Reveal() == o.Reveal() }

// String never shows the secret.
func (s DHCHAPSecret) String() string {
	if s.IsZero() {
		return "<no DH-HMAC-CHAP secret>"
	}
	return "<DH-HMAC-CHAP secret>"
}

// GoString never shows the secret either (%#v).
func (s DHCHAPSecret) GoString() string { return s.String() }

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
