package rds

import (
	"errors"
	"strings"
	"testing"
)

// An error about RouterOS output it could not read quotes the word it
// could not read; where that word is (a part of) an export's secret, the
// error would carry it to the CO, events and logs. Such text is withheld
// (issue 26's review: "secrets in parse errors").
func TestParseErrorsWithholdSecrets(t *testing.T) {
	const secret = "DHHC-1:00:c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3JldDE=:"
	for _, out := range []string{
		// A bare word after a quoted value: "unexpected word".
		" 0   slot=\"pvc-1\" nvme-tcp-server-secret=\"x\" " + secret + "\n",
		// The same at the end of the entry.
		" 0   slot=\"pvc-1\" " + secret,
		// A property name that is not one: "bad property name".
		" 0   slot=\"pvc-1\" " + secret + "=1\n",
	} {
		_, err := ParsePrintDetail(out)
		if err == nil || !errors.Is(err, ErrBadOutput) {
			t.Fatalf("%q: err %v, want ErrBadOutput", out, err)
		}
		if strings.Contains(err.Error(), "c2VjcmV0") || strings.Contains(strings.ToLower(err.Error()), "dhhc-") {
			t.Errorf("%q: the error quotes the secret: %v", out, err)
		}
	}
}
