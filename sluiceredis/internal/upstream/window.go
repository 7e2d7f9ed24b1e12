package upstream

import (
	"slices"
	"time"
)

// MaxInWindow returns the largest number of times that fall in any
// half-open window [t, t+w) of length w, sliding over all t. times need
// not be sorted and are not modified. It returns 0 for w <= 0 or no times.
//
// With a limit of rate r and burst b, a correctly paced client never has
// more than b + ceil(r·w) - 1 requests in a window of length w; for
// strict pacing (b = 1) and w = 1s that is r.
func MaxInWindow(times []time.Time, w time.Duration) int {
	if w <= 0 || len(times) == 0 {
		return 0
	}
	sorted := slices.Clone(times)
	slices.SortFunc(sorted, func(a, b time.Time) int { return a.Compare(b) })
	best, lo := 0, 0
	for hi, t := range sorted {
		// Count the times in (t-w, t]: a window [s, s+w) whose latest time
		// is t holds exactly these, with s just after the first of them.
		for !sorted[lo].After(t.Add(-w)) {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return best
}

// Times returns the At instant of every arrival, in order.
func Times(arrivals []Arrival) []time.Time {
	out := make([]time.Time, len(arrivals))
	for i, a := range arrivals {
		out[i] = a.At
	}
	return out
}

// Accepted returns the arrivals that the server's limiters admitted, in order.
func Accepted(arrivals []Arrival) []Arrival {
	var out []Arrival
	for _, a := range arrivals {
		if a.Accepted {
			out = append(out, a)
		}
	}
	return out
}

// Rate returns the number of accepted arrivals with At in [from, to),
// divided by the length of that interval in seconds. It returns 0 if
// to is not after from.
func Rate(arrivals []Arrival, from, to time.Time) float64 {
	if !to.After(from) {
		return 0
	}
	n := 0
	for _, a := range arrivals {
		if a.Accepted && !a.At.Before(from) && a.At.Before(to) {
			n++
		}
	}
	return float64(n) / to.Sub(from).Seconds()
}
