package claims

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

// The claims and retiring annotations are stored formats: the next
// release reads what the previous one wrote on every PV, and after a
// rollback the previous release reads what the next one wrote. These are
// the annotations as the releases up to this one write them (every field
// set; the same test passes on the previous release's pkg/informers,
// 8911e3c). Reading them must give every field, and what this code
// writes must carry the same keys, so that a renamed or dropped JSON
// field fails here. The upgrade test covers the claims end to end, but a
// retiring entry lives only between a release and the export change
// after it, so no roll there crosses one: a retiring entry left by a
// replica stopped mid-release (as a rolling update stops them) is read
// by the other build only here.
const (
	releasedClaims   = `{"node-a":{"at":"2026-11-22T12:00:00Z","uid":"u-a","cap":"block/MULTI_NODE_MULTI_WRITER","ro":true,"gen":3,"nqn":"nqn.2014-08.org.nvmexpress:uuid:0f6c2b1e-5f43-4a1b-9c3e-1d2e3f405162","n":"00112233445566778899aabbccddeeff","auth":true,"pvs":["pv-1","pv-2"]}}`
	releasedRetiring = `[{"node":"node-b","uid":"u-b","n":"ffeeddccbbaa99887766554433221100","at":"2026-11-22T11:00:00Z","pvs":["pv-1","pv-2"]}]`
)

func TestRecordsReadAndWriteAsReleasesDo(t *testing.T) {
	wantClaim := Claim{At: time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC), NodeUID: "u-a", Capability: "block/MULTI_NODE_MULTI_WRITER",
		ReadOnly: true, Gen: 3, HostNQN: "nqn.2014-08.org.nvmexpress:uuid:0f6c2b1e-5f43-4a1b-9c3e-1d2e3f405162",
		Nonce: "00112233445566778899aabbccddeeff", Auth: true, PVs: []string{"pv-1", "pv-2"}}
	wantRetiring := Retiring{Node: "node-b", NodeUID: "u-b", Nonce: "ffeeddccbbaa99887766554433221100",
		At: time.Date(2026, 11, 22, 11, 0, 0, 0, time.UTC), PVs: []string{"pv-1", "pv-2"}}

	cs, err := ParseClaims(releasedClaims)
	if err != nil {
		t.Fatal(err)
	}
	if got := cs["node-a"]; len(cs) != 1 || !got.At.Equal(wantClaim.At) || !reflect.DeepEqual(withoutTime(got), withoutTime(wantClaim)) {
		t.Errorf("a released claims annotation reads as %+v; want node-a: %+v", cs, wantClaim)
	}
	rs, err := ParseRetiring(releasedRetiring)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 || !rs[0].At.Equal(wantRetiring.At) || !reflect.DeepEqual(retiringWithoutTime(rs[0]), retiringWithoutTime(wantRetiring)) {
		t.Errorf("a released retiring annotation reads as %+v; want %+v", rs, wantRetiring)
	}

	for _, c := range []struct {
		what     string
		v        any
		released string
	}{
		{"claims", map[string]Claim{"node-a": wantClaim}, releasedClaims},
		{"retiring", []Retiring{wantRetiring}, releasedRetiring},
	} {
		b, err := json.Marshal(c.v)
		if err != nil {
			t.Fatal(err)
		}
		var got, want any
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(c.released), &want); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("the %s annotation is written as\n%s\nreleases read\n%s", c.what, b, c.released)
		}
	}
}

func withoutTime(c Claim) Claim               { c.At = time.Time{}; return c }
func retiringWithoutTime(r Retiring) Retiring { r.At = time.Time{}; return r }
