package stats

import (
	"math"
	"math/rand/v2"
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

// TestWindowCacheChangesNothing: a Window is a ring of buckets that skips
// the division for times inside its latest bucket. Whatever the order of
// the times it is given, it must count as a plain model does: every Add
// kept by bucket number, those older than the ten latest buckets seen
// dropped, and Sum adding the kept buckets in the ten that end at now.
func TestWindowCacheChangesNothing(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	w := NewWindow(time.Second)
	width := int64(100 * time.Millisecond)
	kept := map[int64]uint64{}
	maxB := int64(math.MinInt64 / 2)
	now := time.Unix(1000, 0).UnixNano()
	for i := range 20000 {
		// Mostly forward by a little, sometimes back, sometimes far ahead.
		switch r := rnd.IntN(100); {
		case r < 80:
			now += rnd.Int64N(width / 10)
		case r < 95:
			now -= rnd.Int64N(width)
		default:
			now += rnd.Int64N(3 * int64(time.Second))
		}
		n := uint64(1 + rnd.IntN(3))
		w.Add(time.Unix(0, now), n)
		b := now / width
		if b > maxB-windowBuckets {
			kept[b] += n
			maxB = max(maxB, b)
		}
		var want uint64
		for k, c := range kept {
			if b-k >= 0 && b-k < windowBuckets && maxB-k < windowBuckets {
				want += c
			}
		}
		if got := w.Sum(time.Unix(0, now)); got != want {
			t.Fatalf("event %d: Sum = %d, want %d", i, got, want)
		}
	}
}
