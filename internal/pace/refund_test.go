package pace

import (
	"testing"
	"time"
)

// TestRefundKeepsBound: a token given back after later grants, one of them
// charged late (a dispatcher that woke a token's time late hands out two at
// once), would let a third grant into a window of a millisecond at 500/s
// with burst 1, where rate x T + burst + 1 allows two. A token given back
// with no grant after it is restored.
func TestRefundKeepsBound(t *testing.T) {
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	p := New(500, 1, time.Minute, true, 0)
	if !p.Take(ms(8), false) {
		t.Fatal("first take refused")
	}
	a := p.Granted()
	// Due at 10 ms, handed out at 12 ms: charged at 10, and the next one,
	// due at 12, at once.
	for i := range 2 {
		if !p.Take(ms(12), true) {
			t.Fatalf("late take %d refused", i+1)
		}
	}
	p.Refund(ms(12.5), true, a)
	if p.Take(ms(12.5), false) {
		t.Error("a third grant within 0.5 ms at 500/s, burst 1: bound is 2")
	}
	// Given back with nothing granted after it, a token is there again.
	if !p.Take(ms(14), false) {
		t.Fatal("take on time refused")
	}
	p.Refund(ms(14.5), true, p.Granted())
	if !p.Take(ms(14.5), false) {
		t.Error("a token given back with no grant after it was lost")
	}
}
