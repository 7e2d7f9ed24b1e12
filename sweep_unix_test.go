//go:build unix

package sluice

import (
	"syscall"
	"testing"
	"time"
)

// TestTinyLaneIdleDoesNotSpin: WithLaneIdle(1ns) is legal; a lane that is not idle yet (its bucket
// refills for an hour) must not make the sweep spin.
func TestTinyLaneIdleDoesNotSpin(t *testing.T) {
	tr := mustNew(t, nopBase{}, WithRate(1, time.Hour), WithLaneIdle(time.Nanosecond))
	defer tr.Close()
	if err := get(t.Context(), tr, ""); err != nil {
		t.Fatal(err)
	}
	var before, after syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &before)
	start := time.Now()
	time.Sleep(500 * time.Millisecond)
	wall := time.Since(start)
	syscall.Getrusage(syscall.RUSAGE_SELF, &after)
	cpu := time.Duration(after.Utime.Nano()-before.Utime.Nano()) + time.Duration(after.Stime.Nano()-before.Stime.Nano())
	// A spinning sweep takes a core: near 1 of the wall time.
	if share := cpu.Seconds() / wall.Seconds(); share > 0.2 {
		t.Errorf("an idle Transport used %v of CPU in %v of wall time (%.2f)", cpu, wall, share)
	}
}
