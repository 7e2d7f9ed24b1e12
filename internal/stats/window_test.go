package stats

import (
	"testing"
	"time"
)

func TestWindowSlides(t *testing.T) {
	w := NewWindow(time.Second)
	t0 := time.Unix(1000, 0)
	for i := range 10 {
		w.Add(t0.Add(time.Duration(i)*100*time.Millisecond), 1)
	}
	if got := w.Sum(t0.Add(999 * time.Millisecond)); got != 10 {
		t.Errorf("within the window: %d, want 10", got)
	}
	// The window is the current bucket and the nine before it: at 1.5 s,
	// the buckets from 0.6 s on.
	if got := w.Sum(t0.Add(1500 * time.Millisecond)); got != 4 {
		t.Errorf("half slid out: %d, want 4", got)
	}
	if got := w.Sum(t0.Add(time.Hour)); got != 0 {
		t.Errorf("long after: %d, want 0", got)
	}
	w.Add(t0.Add(time.Hour), 3) // reuses a stale bucket
	if got := w.Sum(t0.Add(time.Hour)); got != 3 {
		t.Errorf("after reuse: %d, want 3", got)
	}
	if w.Length() != time.Second {
		t.Errorf("Length = %v", w.Length())
	}
}
