package rdssim

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"hash/crc32"
	"regexp"
)

// serverSecret is the read-only nvme-tcp-server-secret RouterOS shows for
// a disk's nvme-tcp-server-password: the DH-HMAC-CHAP key, in the
// "DHHC-1:00:<base64 of key and CRC-32>:" representation, that the
// allowed host must present. "" for no password.
//
// Assumed (docs/routeros.md): that RouterOS turns the password into such a
// key for the allowed host, and prints it so. How it derives the key is
// not known; the simulator hashes the password, and the driver never
// derives the secret itself: it reads it back.
func serverSecret(password string) string {
	if password == "" {
		return ""
	}
	sum := sha256.Sum256([]byte("rdssim nvme-tcp-server-secret\x00" + password))
	raw := binary.LittleEndian.AppendUint32(sum[:], crc32.ChecksumIEEE(sum[:]))
	return "DHHC-1:00:" + base64.StdEncoding.EncodeToString(raw) + ":"
}

// passwordArg matches a password's value in a command line, quoted (with
// escapes) or bare.
var passwordArg = regexp.MustCompile(`(nvme-tcp-server-password=)("(?:[^"\\]|\\.)*"?|\S*)`)

// redactPasswords is line as the simulator logs it: every password's
// value hidden, as RouterOS hides sensitive values.
func redactPasswords(line string) string {
	return passwordArg.ReplaceAllString(line, "${1}<hidden>")
}
