package stats

import (
	"math"
	"slices"
	"time"
)

// Quantile returns the q-quantile of ds by nearest rank (the smallest value
// with at least q of the samples at or below it), or 0 if ds is empty. It
// sorts a copy: it is for reports over kept samples, not the hot path, where
// Histogram is.
func Quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	i := int(math.Ceil(q*float64(len(ds)))) - 1
	return ds[max(0, min(i, len(ds)-1))]
}
