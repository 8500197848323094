package storagefence

import (
	"testing"

	"github.com/srvlab/rds-csi/pkg/rds"
)

// parkedFrom accepts a park only of its own volume and from its
// own host, and nothing that is not a park.
func TestParkedFromRejectsNonParks(t *testing.T) {
	key := []byte("a test attachment key of 32 bytes or more")
	const vol, other = "pvc-2f000000-0000-4000-8000-000000000009", "pvc-2f000000-0000-4000-8000-00000000000a"
	from := attachmentNQN(key, vol, "node-a", "00112233445566778899aabbccddeeff")
	p, err := parkedNQN(key, vol, from)
	if err != nil {
		t.Fatal(err)
	}
	if err := rds.ValidateNQN(p); err != nil {
		t.Fatalf("park %s: %v", p, err)
	}
	if !parkedFrom(key, vol, p, from) {
		t.Fatalf("%s is not seen as a park from %s", p, from)
	}
	tomb, err := tombstoneNQN()
	if err != nil {
		t.Fatal(err)
	}
	otherKey := []byte("another attachment key of 32 bytes or more")
	for what, c := range map[string]struct {
		key             []byte
		vol, host, from string
	}{
		"another volume":       {key, other, p, from},
		"another host":         {key, vol, p, attachmentNQN(key, vol, "node-b", "00112233445566778899aabbccddeeff")},
		"another key":          {otherKey, vol, p, from},
		"the holder's own NQN": {key, vol, from, from},
		"a tombstone":          {key, vol, tomb, from},
		"any host":             {key, vol, "", from},
		"not a uuid NQN":       {key, vol, "nqn.2014-08.org.example:" + p[len(attachmentNQNPrefix):], from},
		"a short uuid":         {key, vol, p[:len(p)-2], from},
	} {
		if parkedFrom(c.key, c.vol, c.host, c.from) {
			t.Errorf("%s: %q taken for a park of %s from %s", what, c.host, c.vol, c.from)
		}
	}
}
