package nvme

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"strings"
	"testing"
)

// Vectors from outside this project: a key used by Ceph's nvmeof gateway
// tests (valid), and one blktests (nvme/045) uses as an invalid key (its
// CRC-32 does not match, which the kernel refuses).
const (
	externalValidSecret  = "DHHC-1:00:MWPqcx1Ug1debg8fPIGpkqbQhLcYUt39k7UWirkblaKEH1kE:"
	externalBadCRCSecret = "DHHC-1:00:Jc/My1o0qtLCWRp+sHhAVafdfaS7YQOMYhk9zSmlatobqB8C:"
)

func TestParseDHCHAPSecretAcceptsAnExternalKey(t *testing.T) {
	s, err := ParseDHCHAPSecret(externalValidSecret)
	if err != nil {
		t.Fatal(err)
	}
	if s.Reveal() != externalValidSecret {
		t.Fatalf("Reveal changed the value")
	}
}

func TestParseDHCHAPSecretRefuses(t *testing.T) {
	gen, err := NewDHCHAPSecret(bytes.NewReader(bytes.Repeat([]byte{7}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	good := gen.Reveal()
	for _, tc := range []struct{ name, in, why string }{
		{"empty", "", "does not start"},
		{"other prefix", "DHHC-2:00:" + good[10:], "does not start"},
		{"no key", "DHHC-1:00", "no key"},
		{"bad hash field", "DHHC-1:04:" + good[10:], "none of 00"},
		{"no trailing colon", strings.TrimSuffix(good, ":"), "end with one ':'"},
		{"extra colon", good + ":", "end with one ':'"},
		{"not base64", "DHHC-1:00:!!!!:", "not standard base64"},
		{"short key", "DHHC-1:00:" + b64WithCRC(make([]byte, 16)) + ":", "16-byte key"},
		{"sha384 field with a 32-byte key", "DHHC-1:02:" + good[10:], "32-byte key with hash field 02"},
		{"bad crc (blktests)", externalBadCRCSecret, "CRC-32"},
		{"a comma (option injection)", "DHHC-1:00:" + good[10:len(good)-1] + ",nqn=x:", "base64"},
		// Go's base64 skips \n and \r, even Strict; the kernel splits its
		// connect options at ",\n", so a newline would start a new option.
		{"a newline (option injection)", "DHHC-1:00:" + good[10:30] + "\n" + good[30:len(good)-1] + ":", "not standard base64"},
		{"a carriage return", "DHHC-1:00:" + good[10:30] + "\r" + good[30:len(good)-1] + ":", "not standard base64"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseDHCHAPSecret(tc.in)
			if !errors.Is(err, ErrMalformedSecret) {
				t.Fatalf("err = %v, want ErrMalformedSecret", err)
			}
			if !strings.Contains(err.Error(), tc.why) {
				t.Fatalf("err = %q, want it to say %q", err, tc.why)
			}
			if len(tc.in) > 12 && strings.Contains(err.Error(), tc.in[10:len(tc.in)-1]) {
				t.Fatalf("the error repeats the secret: %q", err)
			}
		})
	}
}

func TestNewDHCHAPSecretRoundTrips(t *testing.T) {
	a, err := NewDHCHAPSecret(bytes.NewReader(bytes.Repeat([]byte{1}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewDHCHAPSecret(bytes.NewReader(bytes.Repeat([]byte{2}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	if a.Equal(b) {
		t.Fatal("two keys from different bytes are equal")
	}
	p, err := ParseDHCHAPSecret(a.Reveal())
	if err != nil || !p.Equal(a) {
		t.Fatalf("a generated secret does not parse back: %v", err)
	}
	if _, err := NewDHCHAPSecret(bytes.NewReader(make([]byte, 31))); err == nil {
		t.Fatal("a short random source gave a secret")
	}
}

func TestDHCHAPSecretNeverPrints(t *testing.T) {
	s, err := ParseDHCHAPSecret(externalValidSecret)
	if err != nil {
		t.Fatal(err)
	}
	// A struct that keeps the secret in an unexported field (as the
	// controller's exportResult does) is printed by reflection: fmt cannot
	// call String on such a field.
	type holder struct {
		host   string
		secret DHCHAPSecret
	}
	h := holder{"h", s}
	for _, out := range []string{fmt.Sprint(s), fmt.Sprintf("%v %+v %#v %s", s, s, s, s), fmt.Sprintf("%v", struct{ S DHCHAPSecret }{s}),
		fmt.Sprintf("%v %+v %#v", h, h, h), fmt.Sprintf("%+v", &h), fmt.Sprintf("%v", []any{h})} {
		if strings.Contains(out, "MWPq") {
			t.Fatalf("printed: %s", out)
		}
	}
	if (DHCHAPSecret{}).String() == s.String() || !(DHCHAPSecret{}).IsZero() {
		t.Fatal("an unset secret is not told apart")
	}
}

// b64WithCRC encodes key of any length as the secret's middle field.
func b64WithCRC(key []byte) string {
	return base64.StdEncoding.EncodeToString(binary.LittleEndian.AppendUint32(slices.Clone(key), crc32.ChecksumIEEE(key)))
}
