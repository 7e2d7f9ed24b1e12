package stats

import "time"

// Recent counts durations over the latest one to two periods: each is
// recorded in the current period's histogram, which becomes the previous
// one when the period ends, and quantiles read both. Older observations
// are forgotten. The zero value is empty and ready to use; like Histogram,
// it is not safe for concurrent use. Times are on the caller's clock, which
// must not run backwards.
type Recent struct {
	cur   Histogram
	prev  *Histogram    // nil until a period ends with records: most lanes never wait that long
	start time.Duration // when cur's period began
}

// Record adds d, observed at now, for periods of length period.
func (r *Recent) Record(now, period, d time.Duration) {
	r.roll(now, period)
	r.cur.Record(d)
}

// RecordZero is Record(now, period, 0), small enough to inline: most
// records are of requests that did not wait.
func (r *Recent) RecordZero(now, period time.Duration) {
	if now-r.start >= period {
		r.roll(now, period)
	}
	r.cur.total++
	r.cur.zeros++
}

// RecordZeros is RecordZero n times.
func (r *Recent) RecordZeros(now, period time.Duration, n uint64) {
	if now-r.start >= period {
		r.roll(now, period)
	}
	r.cur.total += n
	r.cur.zeros += n
}

// roll starts a new period if the current one has ended at now.
func (r *Recent) roll(now, period time.Duration) {
	if now-r.start < period {
		return
	}
	switch {
	case now-r.start >= 2*period || r.cur.total == 0:
		if r.prev != nil {
			r.prev.reset()
		}
		r.cur.reset()
	case r.prev == nil:
		prev := r.cur
		r.prev, r.cur = &prev, Histogram{}
	default:
		*r.prev, r.cur = r.cur, *r.prev // reuse prev's rows
		r.cur.reset()
	}
	r.start = now
}

// Quantile returns the q-quantile of what was recorded over the current
// and previous periods at now, as Histogram.Quantile does, or 0 if
// nothing was.
func (r *Recent) Quantile(now, period time.Duration, q float64) time.Duration {
	if now-r.start >= 2*period {
		return 0
	}
	if now-r.start >= period {
		// The current period ended with no record since: it is the
		// previous one now, alone.
		return r.cur.Quantile(q)
	}
	if r.prev == nil {
		return r.cur.Quantile(q)
	}
	return quantile2(&r.cur, r.prev, q)
}

// reset empties h, keeping the room its rows had.
func (h *Histogram) reset() {
	h.rows = h.rows[:0]
	h.zeros, h.total = 0, 0
}

// quantile2 is Quantile over the sum of a and b: the midpoint of the
// bucket holding the q-quantile, or 0 if both are empty.
func quantile2(a, b *Histogram, q float64) time.Duration {
	total := a.total + b.total
	if total == 0 {
		return 0
	}
	q = min(max(q, 0), 1)
	rank := max(uint64(q*float64(total)+0.5), 1)
	seen := a.zeros + b.zeros
	if seen >= rank {
		lo, w := lower(0)
		return lo + w/2
	}
	// Both hold rows by increasing index: walk them as one.
	i, j := 0, 0
	for i < len(a.rows) || j < len(b.rows) {
		var idx int
		var ca, cb *[subBuckets]uint64
		switch {
		case j == len(b.rows) || i < len(a.rows) && a.rows[i].index < b.rows[j].index:
			idx, ca = a.rows[i].index, &a.rows[i].counts
			i++
		case i == len(a.rows) || b.rows[j].index < a.rows[i].index:
			idx, cb = b.rows[j].index, &b.rows[j].counts
			j++
		default:
			idx, ca, cb = a.rows[i].index, &a.rows[i].counts, &b.rows[j].counts
			i++
			j++
		}
		for sub := range subBuckets {
			if ca != nil {
				seen += ca[sub]
			}
			if cb != nil {
				seen += cb[sub]
			}
			if seen >= rank {
				lo, w := lower(idx*subBuckets + sub)
				return lo + w/2
			}
		}
	}
	lo, w := lower(numBuckets - 1)
	return lo + w/2
}
