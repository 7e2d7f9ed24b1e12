package sluiceredis

import (
	"math"
	"slices"
)

// levels is the number of priority levels a want is given for.
const levels = 3

// apportion divides capacity c among wants, as share.lua divides a budget
// among processes, and a process's share among its lanes: level by level
// (every want at level 0 is met before any at level 1), max-min fairly
// within a level (the smallest wants are met in full, and the others share
// equally what is left), then what nobody wants evenly among all. The
// parts add up to c (to rounding) when there is at least one want.
func apportion(c float64, wants [][levels]float64) []float64 {
	give := make([]float64, len(wants))
	if len(wants) == 0 || !(c > 0) {
		return give
	}
	left := c
	idx := make([]int, 0, len(wants))
	for l := range levels {
		if left <= 0 {
			break
		}
		idx = idx[:0]
		for i, w := range wants {
			if w[l] > 0 {
				idx = append(idx, i)
			}
		}
		slices.SortStableFunc(idx, func(a, b int) int {
			switch {
			case wants[a][l] < wants[b][l]:
				return -1
			case wants[a][l] > wants[b][l]:
				return 1
			}
			return 0
		})
		for k, i := range idx {
			g := min(wants[i][l], left/float64(len(idx)-k))
			give[i] += g
			left -= g
		}
	}
	if left > 0 {
		for i := range give {
			give[i] += left / float64(len(give))
		}
	}
	return give
}

// apportionWhole is apportion in whole units (attempts in flight): within a
// level, one unit at a time to the want with the least given at the level
// that still wants a whole unit more (the first among equals); what is left,
// one at a time to whoever holds least.
func apportionWhole(c int, wants [][levels]int) []int {
	give := make([]int, len(wants))
	if len(wants) == 0 || c <= 0 {
		return give
	}
	left := c
	at := make([]int, len(wants)) // given at the level
	for l := range levels {
		clear(at)
		for left > 0 {
			best := -1
			for i, w := range wants {
				if w[l]-at[i] >= 1 && (best < 0 || at[i] < at[best]) {
					best = i
				}
			}
			if best < 0 {
				break
			}
			at[best]++
			give[best]++
			left--
		}
	}
	for ; left > 0; left-- {
		best := 0
		for i := range give {
			if give[i] < give[best] {
				best = i
			}
		}
		give[best]++
	}
	return give
}

// burstOf is the burst of a share of rate r out of a budget of rate and
// burst: the same fraction of the burst, at least one token. Shares that
// add up to the rate so have bursts that add up to at most burst plus one
// token per share.
func burstOf(r, rate float64, burst int) int {
	if !(rate > 0) || math.IsInf(r, 1) {
		return max(burst, 1)
	}
	return max(1, int(math.Floor(float64(burst)*r/rate)))
}
