// Package stats holds the small, fixed-size statistics sluice keeps per lane.
package stats

import (
	"math/bits"
	"slices"
	"time"
)

// Buckets are log-linear: each power of two of nanoseconds is split into
// subBuckets equal parts, so a reported quantile is within 1/subBuckets (about
// 6%) of the true value, whatever its magnitude. 40 powers of two reach
// 2^40 ns, about 18 minutes; longer durations land in the last bucket. The
// buckets are kept by rows of subBuckets, one row a power of two, and a row
// is allocated at the first duration recorded in it (zero and negative ones
// are only counted): the durations a lane sees span a few powers of two,
// so it holds a few rows, not all of them, and memory never grows with
// traffic once they are there.
const (
	subBits    = 4
	subBuckets = 1 << subBits
	maxExp     = 40
	numBuckets = (maxExp - subBits + 1) * subBuckets
)

// Histogram counts durations. The zero value is empty and ready to use. It is
// not safe for concurrent use; callers hold their own lock.
type Histogram struct {
	rows  []row  // by increasing index; nil until a positive duration is recorded
	zeros uint64 // durations <= 0: bucket 0, kept apart
	total uint64
}

// A row counts the buckets index*subBuckets through index*subBuckets +
// subBuckets - 1.
type row struct {
	index  int
	counts [subBuckets]uint64
}

func index(d time.Duration) int {
	if d < subBuckets {
		if d < 0 {
			return 0
		}
		return int(d)
	}
	v := uint64(d)
	exp := bits.Len64(v) - 1 // v in [2^exp, 2^(exp+1))
	if exp > maxExp {
		return numBuckets - 1
	}
	sub := int(v>>(exp-subBits)) & (subBuckets - 1)
	i := (exp-subBits+1)*subBuckets + sub
	if i >= numBuckets {
		return numBuckets - 1
	}
	return i
}

// lower returns the smallest duration that falls in bucket i, and its width.
func lower(i int) (time.Duration, time.Duration) {
	if i < subBuckets {
		return time.Duration(i), 1
	}
	exp := i/subBuckets + subBits - 1
	sub := i % subBuckets
	width := uint64(1) << (exp - subBits)
	return time.Duration(uint64(1)<<exp + uint64(sub)*width), time.Duration(width)
}

// Record adds one observation. It allocates at the first d of each power
// of two.
func (h *Histogram) Record(d time.Duration) {
	h.total++
	if d <= 0 {
		h.zeros++
		return
	}
	i := index(d)
	r, sub := i/subBuckets, i%subBuckets
	// Rows are few: a linear search, from the top, where the latest
	// durations usually are, is as quick as any.
	j := len(h.rows)
	for j > 0 && h.rows[j-1].index > r {
		j--
	}
	if j == 0 || h.rows[j-1].index != r {
		h.rows = slices.Insert(h.rows, j, row{index: r})
		j++
	}
	h.rows[j-1].counts[sub]++
}

// Count reports the number of observations.
func (h *Histogram) Count() uint64 { return h.total }

// Quantile returns an estimate of the q-quantile (0 <= q <= 1): the midpoint
// of the bucket holding it. It returns 0 for an empty histogram.
func (h *Histogram) Quantile(q float64) time.Duration {
	return quantile2(h, &Histogram{}, q)
}
