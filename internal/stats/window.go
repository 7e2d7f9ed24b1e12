package stats

import "time"

// windowBuckets is the resolution of a Window: a count is forgotten within
// 1/windowBuckets of the window's length after it falls out.
const windowBuckets = 10

// Window counts events over a sliding window of fixed length, in
// windowBuckets buckets. It never allocates. The zero value is not usable:
// create one with NewWindow. It is not safe for concurrent use.
type Window struct {
	width  int64 // bucket width in nanoseconds
	counts [windowBuckets]uint64
	epoch  [windowBuckets]int64 // the bucket number each count belongs to
	// The bucket the last Add went to, and the span of Unix nanoseconds it
	// covers: most Adds land there, and skip a 64-bit division.
	cur      int
	from, to int64
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
	if ns >= w.from && ns < w.to {
		w.counts[w.cur] += n
		return
	}
	b := ns / w.width
	i := int(uint64(b) % windowBuckets)
	if w.epoch[i] != b {
		w.epoch[i], w.counts[i] = b, 0
	}
	w.counts[i] += n
	w.cur, w.from, w.to = i, b*w.width, (b+1)*w.width
}

// Sum returns the events counted in the window that ends at now.
func (w *Window) Sum(now time.Time) uint64 {
	cur := now.UnixNano() / w.width
	var n uint64
	for i, c := range w.counts {
		if d := cur - w.epoch[i]; d >= 0 && d < windowBuckets {
			n += c
		}
	}
	return n
}

// Length returns the window's length.
func (w *Window) Length() time.Duration { return time.Duration(w.width * windowBuckets) }
