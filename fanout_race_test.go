//go:build race

package sluice

// raceEnabled reports whether the tests run under the race detector.
const raceEnabled = true
