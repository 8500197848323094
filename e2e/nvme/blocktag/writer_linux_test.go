package blocktag

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// Two writers on one file (buffered here: the temporary directory may not
// support O_DIRECT); the image they leave passes the check, and a write
// to a closed file is recorded as a failure, not retried.
func TestWriters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(path, make([]byte, 8*BlockSize), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx := context.Background()
	a := &Writer{Host: 1, FirstSlot: 0, Slots: 4, Limit: 10}
	b := &Writer{Host: 2, FirstSlot: 4, Slots: 4, Limit: 6}
	a.Start(ctx, f)
	b.Start(ctx, f)
	ra, rb := a.Wait(), b.Wait()
	if len(ra) != 10 || len(rb) != 6 {
		t.Fatalf("writes: %d and %d, want 10 and 6", len(ra), len(rb))
	}
	for _, r := range append(append([]Record(nil), ra...), rb...) {
		if !r.OK() || r.CompleteNS < r.SubmitNS {
			t.Fatalf("record %+v", r)
		}
	}
	img, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	st, problems := CheckImage(img, 0, History{Host: 1, Records: ra}, History{Host: 2, Records: rb})
	if len(problems) > 0 || st.Blocks[1] != 4 || st.Blocks[2] != 4 {
		t.Errorf("image: %+v %q", st, problems)
	}

	closed, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	c := &Writer{Host: 3, Slots: 1, Limit: 2}
	c.Start(ctx, closed)
	rc := c.Wait()
	if len(rc) != 2 || rc[0].OK() || rc[1].OK() || rc[1].Seq != 2 {
		t.Errorf("writes to a closed file: %+v", rc)
	}
}
