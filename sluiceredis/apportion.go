package sluiceredis

import (
	"cmp"
	"math"
	"slices"
)

// levels is the number of priority levels a want is given for.
const levels = 3

// apportion divides capacity c among wants, as share.lua divides a budget
// among processes, and a process's share among its lanes: level by level
// (every want at level 0 is met before any at level 1), max-min fairly
// within a level (the smallest wants are met in full, and the others share
// equally what is left), then what nobody wants evenly among all. But
// while a level below another wants some, the levels below the highest
// that wants are given up to c/lowShare first (lowShare >= 2; 0: strict
// priority), as sluice.WithLowShare keeps a lane's levels below the first
// waiting one at 1/lowShare of its grants: in equal parts, what a level
// does not want going to the others, since which has waited longest is
// not known here. The parts add up to c (to rounding) when there is at
// least one want.
func apportion(c float64, wants [][levels]float64, lowShare int) []float64 {
	give := make([]float64, len(wants))
	if len(wants) == 0 || !(c > 0) {
		return give
	}
	left := c
	var given [levels][]float64 // given at a level, by want
	if low := lowLevels(wants); len(low) > 0 && lowShare >= 2 {
		floor := c / float64(lowShare)
		for k, l := range low {
			given[l] = fill(floor/float64(len(low)-k), wants, l, nil)
			for i, g := range given[l] {
				give[i] += g
				left -= g
				floor -= g
			}
		}
	}
	for l := range levels {
		if left <= 0 {
			break
		}
		for i, g := range fill(left, wants, l, given[l]) {
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

// lowLevels returns the levels with wants below the highest level with
// wants, the one that wants least first; none if fewer than two levels
// want.
func lowLevels(wants [][levels]float64) []int {
	var total [levels]float64
	var low []int
	top := -1
	for l := range levels {
		for _, w := range wants {
			total[l] += w[l]
		}
		if total[l] > 0 {
			if top < 0 {
				top = l
			} else {
				low = append(low, l)
			}
		}
	}
	slices.SortStableFunc(low, func(a, b int) int { return cmp.Compare(total[a], total[b]) })
	return low
}

// fill divides up to c among the wants at level l, less what given (nil:
// nothing) already gave each, max-min fairly.
func fill(c float64, wants [][levels]float64, l int, given []float64) []float64 {
	give := make([]float64, len(wants))
	rest := func(i int) float64 {
		if given == nil {
			return wants[i][l]
		}
		return wants[i][l] - given[i]
	}
	idx := make([]int, 0, len(wants))
	for i := range wants {
		if rest(i) > 0 {
			idx = append(idx, i)
		}
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		switch {
		case rest(a) < rest(b):
			return -1
		case rest(a) > rest(b):
			return 1
		}
		return 0
	})
	left := c
	for k, i := range idx {
		g := min(rest(i), left/float64(len(idx)-k))
		give[i] = g
		left -= g
	}
	return give
}

// apportionWhole is apportion in whole units (attempts in flight): within a
// level, one unit at a time to the want with the least given at the level
// that still wants a whole unit more (the first among equals); what is left,
// one at a time to whoever holds least. The outcome is computed at once
// (see fillWhole), in time that does not grow with c.
func apportionWhole(c int, wants [][levels]int) []int {
	give := make([]int, len(wants))
	if len(wants) == 0 || c <= 0 {
		return give
	}
	left := c
	at := make([]int, len(wants)) // given at the level
	top := make([]int, len(wants))
	for l := range levels {
		for i, w := range wants {
			at[i], top[i] = 0, max(w[l], 0)
		}
		n := fillWhole(left, at, top)
		for i := range give {
			give[i] += at[i]
		}
		left -= n
	}
	for i := range top {
		top[i] = math.MaxInt
	}
	fillWhole(left, give, top)
	return give
}

// fillWhole hands out up to left units as if one at a time, each to the
// first i with the least have[i] among those under top[i], adding them to
// have; it returns how many it handed out. Every i under the level L that
// the units reach is raised to min(top[i], L), and the units left over, fewer
// than the i at L still under their tops, go one each to the first of those.
func fillWhole(left int, have, top []int) int {
	need := func(level int) int {
		n := 0
		for i, h := range have {
			if m := min(top[i], level); m > h {
				n += m - h
				if n > left {
					return n // enough to know it is too many
				}
			}
		}
		return n
	}
	if len(have) == 0 || left <= 0 {
		return 0
	}
	lo := slices.Min(have)
	// The highest level whose need is at most left: need grows with the
	// level, and lo's is 0.
	hi := lo + left + 1
	for lo+1 < hi {
		mid := lo + (hi-lo)/2
		if need(mid) <= left {
			lo = mid
		} else {
			hi = mid
		}
	}
	given := 0
	for i, h := range have {
		if m := min(top[i], lo); m > h {
			given += m - h
			have[i] = m
		}
	}
	for i := range have {
		if given == left {
			break
		}
		if have[i] == lo && top[i] > lo {
			have[i]++
			given++
		}
	}
	return given
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
