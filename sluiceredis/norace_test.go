//go:build !race

package sluiceredis

// raceEnabled reports whether the tests run under the race detector.
const raceEnabled = false
