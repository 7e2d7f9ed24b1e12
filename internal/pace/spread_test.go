package pace

import (
	"math"
	"testing"
	"time"
)

// TestPacerSpreadAt: a lane with no rate spreads its sends at the pace slow
// start gives it, letting what two timer grains make, at least two, go at
// once, then one a token's time; +Inf lets everything through for now, and
// 0 ends the spreading.
func TestPacerSpreadAt(t *testing.T) {
	p := New(0, 1, time.Minute, true, 0)
	p.SpreadAt(0, math.Inf(1))
	for i := range 100 {
		if !p.Take(0, false) {
			t.Fatalf("a spread of +Inf: send %d at once refused", i+1)
		}
	}
	const r = 100.0 // a token each 10 ms; two in two grains
	p.SpreadAt(0, r)
	for i := range 2 {
		if !p.Take(0, false) {
			t.Fatalf("send %d at once refused", i+1)
		}
	}
	if p.Take(0, false) {
		t.Error("a third send at once granted")
	}
	if d := p.TokenDelay(0); d != 10*time.Millisecond {
		t.Errorf("next send due in %v, want 10ms", d)
	}
	if !p.Take(10*time.Millisecond, false) || p.Take(10*time.Millisecond, false) {
		t.Error("want one send a token's time later, and one only")
	}
	p.SpreadAt(10*time.Millisecond, math.Inf(1))
	for i := range 100 {
		if !p.Take(10*time.Millisecond, false) {
			t.Fatalf("paused spread: send %d refused", i+1)
		}
	}
	p.SpreadAt(10*time.Millisecond, 0)
	for i := range 100 {
		if !p.Take(10*time.Millisecond, false) {
			t.Fatalf("a spread of 0: send %d refused", i+1)
		}
	}
	p.SpreadAt(10*time.Millisecond, r)
	granted := 0
	for range 3 {
		if p.Take(10*time.Millisecond, false) {
			granted++
		}
	}
	if granted != 2 {
		t.Errorf("a spread set again after 0: %d of 3 sends at once granted, want a full bucket of two", granted)
	}
}
