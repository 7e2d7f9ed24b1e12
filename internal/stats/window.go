package stats

import "time"

// windowBuckets is the resolution of a Window: a count is forgotten within
// 1/windowBuckets of the window's length after it falls out.
const windowBuckets = 10

// Window counts events over a sliding window of fixed length, in
// windowBuckets buckets. It never allocates. The zero value is not usable:
// create one with NewWindow. It is not safe for concurrent use.
//
// The buckets are a ring that holds the bucket numbers top-windowBuckets+1
// through top, top being the latest bucket counted: moving top forward
// clears the buckets it passes, and an Add older than the ring is dropped.
// A lane holds a few of these, so they are kept small.
type Window struct {
	width  int64 // bucket width in nanoseconds
	top    int64 // the latest bucket number counted
	from   int64 // top*width: most Adds land in top, and skip a division
	cur    int   // top's slot in counts
	counts [windowBuckets]uint64
}

// NewWindow returns a Window of the given length (at least windowBuckets ns).
func NewWindow(length time.Duration) Window {
	return Window{width: max(1, int64(length)/windowBuckets)}
}

// Add counts n events at time now.
func (w *Window) Add(now time.Time, n uint64) {
	w.AddNano(now.UnixNano(), n)
}

// AddNano counts n events at ns nanoseconds since the Unix epoch.
func (w *Window) AddNano(ns int64, n uint64) {
	if uint64(ns-w.from) < uint64(w.width) { // from <= ns < from+width
		w.counts[w.cur] += n
		return
	}
	w.addOther(ns, n)
}

// addOther is AddNano outside the current bucket.
func (w *Window) addOther(ns int64, n uint64) {
	b := floorDiv(ns, w.width)
	switch d := b - w.top; {
	case d > 0:
		for i := range min(d, windowBuckets) {
			w.counts[slot(w.top+1+i)] = 0
		}
		w.top, w.from, w.cur = b, b*w.width, slot(b)
		w.counts[w.cur] += n
	case d > -windowBuckets:
		w.counts[slot(b)] += n
	}
}

// Sum returns the events counted in the window that ends at now.
func (w *Window) Sum(now time.Time) uint64 {
	return w.SumNano(now.UnixNano())
}

// SumNano returns the events counted in the window that ends at ns
// nanoseconds since the Unix epoch.
func (w *Window) SumNano(ns int64) uint64 {
	cur := floorDiv(ns, w.width)
	var n uint64
	for i, c := range w.counts {
		// The bucket number slot i holds: the one in (top-windowBuckets, top].
		k := w.top - int64(slot(w.top-int64(i)))
		if d := cur - k; d >= 0 && d < windowBuckets {
			n += c
		}
	}
	return n
}

// Length returns the window's length.
func (w *Window) Length() time.Duration { return time.Duration(w.width * windowBuckets) }

// slot returns bucket number b's place in the ring.
func slot(b int64) int {
	s := int(b % windowBuckets)
	if s < 0 {
		s += windowBuckets
	}
	return s
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}
