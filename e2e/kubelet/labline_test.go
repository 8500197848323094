//go:build kubelet

package kubelet

import "testing"

// The tier's line of tests: the long test takes the first turn, then the
// others in the order they registered; when go test holds some of them
// back (its -parallel below the number of tests), turns go only to those
// it let through, so the line never waits for a test that cannot come.
func TestLabLineGivesTheLongTestTheFirstTurn(t *testing.T) {
	a, long, b := &labTicket{turn: labShort}, &labTicket{turn: labLong}, &labTicket{turn: labShort}
	q := &labLine{waiting: []*labTicket{a, long, b}, registered: 3}
	if got := q.next(true); got != long {
		t.Fatalf("first turn: %+v, want the long test", got)
	}
	q.waiting = []*labTicket{a, b}
	if got := q.next(true); got != a {
		t.Fatalf("second turn: %+v, want the first registered short test", got)
	}

	// go test let a and b through, held the long one back.
	a.arrived, b.arrived = true, true
	q.waiting = []*labTicket{a, long, b}
	if got := q.next(false); got != a {
		t.Fatalf("with the long test held by go test: %+v, want the first short test that arrived", got)
	}
	long.arrived = true
	if got := q.next(false); got != long {
		t.Fatalf("once the long test arrived: %+v, want it", got)
	}
}
