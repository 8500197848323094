package blocktag

import (
	"errors"
	"reflect"
	"strings"
	"syscall"
	"testing"
)

func TestEncodeDecode(t *testing.T) {
	b := make([]byte, BlockSize)
	want := Tag{Host: 2, Slot: 300, Seq: 77, SubmitNS: 123456789}
	Encode(b, want)
	got, err := Decode(b)
	if err != nil || got != want {
		t.Fatalf("Decode = %+v, %v; want %+v", got, err, want)
	}
	// Encoding over an older block leaves nothing of it.
	Encode(b, Tag{Host: 1, Slot: 300, Seq: 5})
	Encode(b, want)
	if got, err := Decode(b); err != nil || got != want {
		t.Errorf("re-encoded: %+v, %v", got, err)
	}

	torn := make([]byte, BlockSize)
	Encode(torn, Tag{Host: 1, Slot: 300, Seq: 9})
	copy(torn[BlockSize/2:], b[BlockSize/2:]) // half of one write, half of another
	for name, blk := range map[string][]byte{
		"torn":      torn,
		"flipped":   flip(b, 1000),
		"foreign":   []byte(strings.Repeat("x", BlockSize)),
		"truncated": b[:100],
	} {
		if _, err := Decode(blk); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: Decode = %v, want ErrCorrupt", name, err)
		}
	}
	if _, err := Decode(make([]byte, BlockSize)); !errors.Is(err, ErrEmpty) {
		t.Errorf("zero block: %v, want ErrEmpty", err)
	}
}

func flip(b []byte, i int) []byte {
	c := append([]byte(nil), b...)
	c[i] ^= 1
	return c
}

// image builds an image of n blocks holding the given writes.
func image(n int, writes ...Record) []byte {
	img := make([]byte, n*BlockSize)
	for _, w := range writes {
		Encode(img[int(w.Slot)*BlockSize:], w.Tag)
	}
	return img
}

func rec(host, slot uint32, seq uint64, submit, complete int64, err error) Record {
	return Record{Tag: Tag{Host: host, Slot: slot, Seq: seq, SubmitNS: submit}, CompleteNS: complete, Err: err}
}

var eio = syscall.EIO

func TestCheckImage(t *testing.T) {
	const fence = 1000
	// Host 1 (fenced at 1000) writes slots 0-1, host 2 writes slots 2-3
	// from 2000 on.
	a1 := rec(1, 0, 1, 100, 110, nil)
	a2 := rec(1, 1, 2, 200, 210, nil)
	a3 := rec(1, 0, 3, 990, 1005, eio)  // in flight at the fence: may have landed
	a4 := rec(1, 1, 4, 1010, 1011, eio) // after the fence
	a5 := rec(1, 0, 5, 2500, 2501, eio) // after the new host's first write
	b1 := rec(2, 2, 1, 2000, 2010, nil)
	b2 := rec(2, 3, 2, 2100, 2110, nil)
	b3 := rec(2, 2, 3, 2200, 2210, nil)
	hist := func() []History {
		return []History{
			{Host: 1, FencedAt: fence, Records: []Record{a1, a2, a3, a4, a5}},
			{Host: 2, Records: []Record{b1, b2, b3}},
		}
	}
	tests := []struct {
		name  string
		img   []byte
		wants []string // substrings of the problems, in order; none: clean
	}{
		{"clean", image(4, a1, a2, b1, b2, b3), nil},
		{"the write in flight at the fence landed", image(4, a3, a2, b2, b3), nil},
		{"a write after the fence landed", image(4, a1, a4, b2, b3), []string{"after host 1 was fenced"}},
		{"a write after the new host's first landed", image(4, a5, a2, b2, b3), []string{"after host 1 was fenced", "after the new host's first acknowledged write"}},
		{"an acknowledged write was lost", image(4, a1, a2, b1, b2), []string{"seq 3 to it was acknowledged and is lost"}},
		{"the new host's block was overwritten", func() []byte {
			img := image(4, a1, a2, b3, b2)
			copy(img[2*BlockSize:], img[0:BlockSize]) // a1, misdirected
			return img
		}(), []string{"slot 2 holds host 1 seq 1 tagged for slot 0"}},
		{"an acknowledged slot is empty", image(4, a1, a2, b3), []string{"slot 3 is empty"}},
		{"a torn block", func() []byte { img := image(4, a1, a2, b3, b2); img[2*BlockSize+9] ^= 1; return img }(), []string{"slot 2: not an intact tagged block"}},
		{"a write nobody made", image(4, a1, a2, b3, b2, rec(3, 1, 1, 5, 6, nil)), []string{"a write no history has"}},
		{"a block at the wrong slot", func() []byte {
			img := image(4, a1, a2, b3, b2)
			copy(img[3*BlockSize:], img[2*BlockSize:3*BlockSize])
			return img
		}(), []string{"slot 3 holds host 2 seq 3 tagged for slot 2"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, problems := CheckImage(tc.img, b1.SubmitNS, hist()...)
			if len(problems) != len(tc.wants) {
				t.Fatalf("problems %q, want %d matching %q", problems, len(tc.wants), tc.wants)
			}
			for i, w := range tc.wants {
				if !strings.Contains(problems[i], w) {
					t.Errorf("problem %d = %q, want it to say %q", i, problems[i], w)
				}
			}
		})
	}

	st, _ := CheckImage(image(4, a1, a2, b1, b2, b3), 0, hist()...)
	if st.Blocks[1] != 2 || st.Blocks[2] != 2 || st.LastSubmit[2] != 2200 {
		t.Errorf("stats %+v", st)
	}
	_, problems := CheckImage(image(4), 0, History{Host: 1, Records: []Record{a1}}, History{Host: 2, Records: []Record{rec(2, 0, 1, 5, 6, nil)}})
	if len(problems) == 0 || !strings.Contains(strings.Join(problems, "\n"), "written by hosts 1 and 2") {
		t.Errorf("shared slots: %q", problems)
	}
}

func TestCheckFenced(t *testing.T) {
	const fence = 1000
	tests := []struct {
		name    string
		records []Record
		wants   []string
		stats   FenceStats
	}{
		{"fails from the fence on", []Record{
			rec(1, 0, 1, 100, 200, nil),
			rec(1, 1, 2, 900, 1200, eio), // in flight: failed later
			rec(1, 0, 3, 1300, 1301, eio),
		}, nil, FenceStats{Writes: 3, OKBefore: 1, FailedAfter: 1, LastOKComplete: 200, FirstErrorAfter: 1200}},
		{"acknowledged after the fence", []Record{
			rec(1, 0, 1, 100, 200, nil),
			rec(1, 1, 2, 900, 1200, nil),
		}, nil, FenceStats{Writes: 2, OKBefore: 1, LastOKComplete: 200, LateAcks: []Record{rec(1, 1, 2, 900, 1200, nil)}}},
		{"submitted after the fence and acknowledged", []Record{
			rec(1, 0, 1, 1100, 1200, nil),
		}, []string{"submitted 100ns after the fence was acknowledged"}, FenceStats{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, problems := CheckFenced(History{Host: 1, FencedAt: fence, Records: tc.records})
			if len(problems) != len(tc.wants) {
				t.Fatalf("problems %q, want %q", problems, tc.wants)
			}
			for i, w := range tc.wants {
				if !strings.Contains(problems[i], w) {
					t.Errorf("problem %d = %q, want %q", i, problems[i], w)
				}
			}
			if tc.wants == nil {
				st.FirstError = nil
				if !reflect.DeepEqual(st, tc.stats) {
					t.Errorf("stats %+v, want %+v", st, tc.stats)
				}
			}
		})
	}
	if _, problems := CheckFenced(History{Host: 1}); len(problems) != 1 {
		t.Errorf("no fence time: %q", problems)
	}
}
