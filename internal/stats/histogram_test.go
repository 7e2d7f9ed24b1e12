package stats

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestHistogramQuantileWithinResolution(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, scale := range []time.Duration{time.Microsecond, time.Millisecond, time.Second, time.Minute} {
		var h Histogram
		vals := make([]time.Duration, 10000)
		for i := range vals {
			vals[i] = time.Duration(r.ExpFloat64() * float64(scale))
			h.Record(vals[i])
		}
		slices.Sort(vals)
		for _, q := range []float64{0.5, 0.9, 0.99} {
			want := vals[int(q*float64(len(vals)))-1]
			got := h.Quantile(q)
			if diff := float64(got-want) / float64(want); diff > 0.07 || diff < -0.07 {
				t.Errorf("scale %v q%.2f: got %v, want %v (+-7%%)", scale, q, got, want)
			}
		}
	}
}

func TestHistogramEdges(t *testing.T) {
	var h Histogram
	if got := h.Quantile(0.5); got != 0 {
		t.Fatalf("empty histogram: got %v, want 0", got)
	}
	h.Record(-5)
	h.Record(0)
	h.Record(3)
	h.Record(1000 * time.Hour) // beyond the last bucket
	if h.Count() != 4 {
		t.Fatalf("Count = %d, want 4", h.Count())
	}
	if got := h.Quantile(0); got != 0 {
		t.Errorf("q0 = %v, want 0", got)
	}
	if got := h.Quantile(1); got < 10*time.Minute {
		t.Errorf("q1 = %v, want the overflow bucket", got)
	}
	for i := range numBuckets {
		lo, w := lower(i)
		if index(lo) != i || index(lo+w-1) != i {
			t.Fatalf("bucket %d: lower %v width %v maps to %d..%d", i, lo, w, index(lo), index(lo+w-1))
		}
	}
}

// The rows are kept sparse and in order: whatever the order durations come
// in, quantiles are those of every bucket counted in one dense array, and
// a histogram of durations within a few powers of two holds only their rows.
func TestHistogramRowsMatchDense(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var h Histogram
	var dense [numBuckets]uint64
	var zeros, total uint64
	for range 50000 {
		d := time.Duration(r.Int64N(int64(time.Minute))) >> r.IntN(40)
		if r.IntN(20) == 0 {
			d = -d
		}
		h.Record(d)
		total++
		if d <= 0 {
			zeros++
		} else {
			dense[index(d)]++
		}
	}
	for i := 1; i < len(h.rows); i++ {
		if h.rows[i-1].index >= h.rows[i].index {
			t.Fatalf("rows out of order: %d then %d", h.rows[i-1].index, h.rows[i].index)
		}
	}
	for _, q := range []float64{0, 0.01, 0.1, 0.5, 0.9, 0.99, 1} {
		rank := max(uint64(q*float64(total)+0.5), 1)
		seen, want := zeros, time.Duration(0)
		if seen >= rank {
			lo, w := lower(0)
			want = lo + w/2
		} else {
			for i, c := range dense {
				if seen += c; seen >= rank {
					lo, w := lower(i)
					want = lo + w/2
					break
				}
			}
		}
		if got := h.Quantile(q); got != want {
			t.Errorf("q%v: %v, want %v", q, got, want)
		}
	}

	var small Histogram
	for range 1000 {
		small.Record(time.Millisecond + time.Duration(r.Int64N(int64(3*time.Millisecond))))
	}
	if n := len(small.rows); n > 3 {
		t.Errorf("durations of 1-4 ms hold %d rows, want at most 3", n)
	}
}
