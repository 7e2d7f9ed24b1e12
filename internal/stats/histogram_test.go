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
