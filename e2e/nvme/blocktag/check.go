package blocktag

import (
	"errors"
	"fmt"
	"sort"
	"time"
)

// History is every write of one host, in submission order.
type History struct {
	Host    uint32
	Records []Record
	// FencedAt, when not zero, is the CLOCK_MONOTONIC time the host was
	// fenced (the storage answered the command that cut it off): every
	// write it submitted from then on must fail, none may be acknowledged
	// after it, and no block it submitted from then on may be in the
	// image.
	FencedAt int64
}

// FenceStats summarises a fenced host's history.
type FenceStats struct {
	Writes          int   // all writes
	OKBefore        int   // acknowledged before the fence
	FailedAfter     int   // submitted at or after the fence, failed
	LastOKComplete  int64 // completion of the last acknowledged write; 0 if none
	FirstErrorAfter int64 // completion of the first failure that completed after the fence; 0 if none
	FirstError      error // that failure
	// LateAcks are writes submitted before the fence and acknowledged
	// after it: in flight when the connection was cut, answered when the
	// host gave up on the controller. They must have landed before the
	// fence (CheckImage checks that an acknowledged write is in the
	// image); whether they may exist at all is the caller's to judge.
	LateAcks []Record
}

// CheckFenced judges a fenced host's answers: a write submitted at or
// after FencedAt that was acknowledged is a violation (the fenced host
// wrote after the fence). Completion times are taken when the write
// returns.
func CheckFenced(h History) (FenceStats, []string) {
	var st FenceStats
	var problems []string
	if h.FencedAt == 0 {
		return st, []string{fmt.Sprintf("host %d has no fence time", h.Host)}
	}
	for _, r := range h.Records {
		st.Writes++
		after := r.SubmitNS >= h.FencedAt
		switch {
		case r.OK() && after:
			problems = append(problems, fmt.Sprintf("host %d: write seq %d (slot %d) submitted %v after the fence was acknowledged", h.Host, r.Seq, r.Slot, ns(r.SubmitNS-h.FencedAt)))
		case r.OK() && r.CompleteNS > h.FencedAt:
			st.LateAcks = append(st.LateAcks, r)
		case r.OK():
			st.OKBefore++
			st.LastOKComplete = max(st.LastOKComplete, r.CompleteNS)
		case after:
			st.FailedAfter++
		}
		if !r.OK() && r.CompleteNS >= h.FencedAt && st.FirstErrorAfter == 0 {
			st.FirstErrorAfter, st.FirstError = r.CompleteNS, r.Err
		}
	}
	return st, problems
}

// DescribeLateAck says when a late acknowledgement was submitted and
// answered, relative to the fence.
func DescribeLateAck(r Record, fencedAt int64) string {
	return fmt.Sprintf("host %d: write seq %d (slot %d) submitted %v before the fence, acknowledged %v after it", r.Host, r.Seq, r.Slot, ns(fencedAt-r.SubmitNS), ns(r.CompleteNS-fencedAt))
}

// ImageStats counts the blocks of an image per host.
type ImageStats struct {
	Blocks     map[uint32]int   // intact tagged blocks per host
	LastSubmit map[uint32]int64 // the latest submission time among a host's blocks
	Empty      int
}

// CheckImage judges the final image (the disk's backing file, read on the
// target) against the writers' histories:
//   - every block is empty or an intact tagged block at its own slot,
//     written by one of the hosts with a write of that very tag;
//   - a slot holds its writer's last acknowledged write to it, or a later
//     write of the same writer whose answer was a failure (it may have
//     landed before the connection went): an acknowledged write is never
//     lost or overwritten by another host;
//   - a fenced host has no block submitted at or after its FencedAt;
//   - a fenced host has no block submitted at or after notAfter (the new
//     host's first acknowledged write; 0: not checked).
func CheckImage(image []byte, notAfter int64, hosts ...History) (ImageStats, []string) {
	st := ImageStats{Blocks: map[uint32]int{}, LastSubmit: map[uint32]int64{}}
	var problems []string
	type write struct {
		rec  Record
		host *History
	}
	byTag := map[[2]uint64]write{} // (host, seq)
	lastOK := map[uint32]write{}   // slot -> last acknowledged write
	owner := map[uint32]uint32{}   // slot -> the host that writes it
	for i := range hosts {
		h := &hosts[i]
		for _, r := range h.Records {
			if r.Seq == 0 {
				continue // a writer that could not start
			}
			byTag[[2]uint64{uint64(h.Host), r.Seq}] = write{r, h}
			if o, ok := owner[r.Slot]; ok && o != h.Host {
				problems = append(problems, fmt.Sprintf("slot %d is written by hosts %d and %d; each host must have its own slots", r.Slot, o, h.Host))
			}
			owner[r.Slot] = h.Host
			if r.OK() {
				lastOK[r.Slot] = write{r, h}
			}
		}
	}
	if len(image)%BlockSize != 0 {
		problems = append(problems, fmt.Sprintf("image size %d is not a multiple of %d", len(image), BlockSize))
	}
	blocks := len(image) / BlockSize
	for slot := 0; slot < blocks; slot++ {
		s := uint32(slot)
		t, err := Decode(image[slot*BlockSize : (slot+1)*BlockSize])
		last, acked := lastOK[s]
		switch {
		case errors.Is(err, ErrEmpty):
			st.Empty++
			if acked {
				problems = append(problems, fmt.Sprintf("slot %d is empty; host %d's write seq %d to it was acknowledged", s, last.host.Host, last.rec.Seq))
			}
			continue
		case err != nil:
			problems = append(problems, fmt.Sprintf("slot %d: %v", s, err))
			continue
		}
		w, known := byTag[[2]uint64{uint64(t.Host), t.Seq}]
		switch {
		case !known:
			problems = append(problems, fmt.Sprintf("slot %d holds host %d seq %d, a write no history has", s, t.Host, t.Seq))
			continue
		case t.Slot != s || w.rec.Slot != s || w.rec.SubmitNS != t.SubmitNS:
			problems = append(problems, fmt.Sprintf("slot %d holds host %d seq %d tagged for slot %d submitted at %d; the history says slot %d at %d", s, t.Host, t.Seq, t.Slot, t.SubmitNS, w.rec.Slot, w.rec.SubmitNS))
			continue
		}
		st.Blocks[t.Host]++
		st.LastSubmit[t.Host] = max(st.LastSubmit[t.Host], t.SubmitNS)
		if acked {
			switch {
			case last.host.Host != t.Host:
				problems = append(problems, fmt.Sprintf("slot %d: host %d's acknowledged write seq %d was overwritten by host %d seq %d", s, last.host.Host, last.rec.Seq, t.Host, t.Seq))
			case t.Seq < last.rec.Seq:
				problems = append(problems, fmt.Sprintf("slot %d holds host %d seq %d; the later seq %d to it was acknowledged and is lost", s, t.Host, t.Seq, last.rec.Seq))
			case t.Seq > last.rec.Seq && w.rec.OK():
				// Impossible: last is the last acknowledged write.
				problems = append(problems, fmt.Sprintf("slot %d: history of host %d is out of order", s, t.Host))
			}
		}
		if f := w.host.FencedAt; f != 0 && t.SubmitNS >= f {
			problems = append(problems, fmt.Sprintf("slot %d holds host %d seq %d, submitted %v after host %d was fenced", s, t.Host, t.Seq, ns(t.SubmitNS-f), t.Host))
		}
		if notAfter != 0 && w.host.FencedAt != 0 && t.SubmitNS >= notAfter {
			problems = append(problems, fmt.Sprintf("slot %d holds host %d seq %d, submitted %v after the new host's first acknowledged write", s, t.Host, t.Seq, ns(t.SubmitNS-notAfter)))
		}
	}
	for slot, w := range lastOK {
		if int(slot) >= blocks {
			problems = append(problems, fmt.Sprintf("host %d's acknowledged write seq %d is to slot %d, beyond the image's %d blocks", w.host.Host, w.rec.Seq, slot, blocks))
		}
	}
	sort.Strings(problems)
	return st, problems
}

// FirstOK returns the submission time of the first acknowledged write, 0
// if there is none.
func FirstOK(records []Record) int64 {
	for _, r := range records {
		if r.OK() {
			return r.SubmitNS
		}
	}
	return 0
}

// ns prints a nanosecond interval as a duration.
func ns(d int64) string { return fmt.Sprint(time.Duration(d)) }
