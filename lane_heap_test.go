package sluice

import (
	"runtime"
	"testing"
	"testing/synctest"
	"time"
)

// maxLaneHeap is the bound on what a lane that has served a few
// requests keeps on the heap, its entry in the Transport's map included.
// maxWaitedLaneHeap bounds a lane whose requests also waited for their
// tokens: it holds besides a row of its wait histogram, its tenant lists
// and its dispatcher's kick (7 KB before the histogram kept rows).
const (
	maxLaneHeap       = 2048
	maxWaitedLaneHeap = 2560
)

// laneHeap returns the heap, in bytes per lane, that n lanes keep after
// each has served perLane requests through tr's options on an in-memory
// base: the heap after a GC with the lanes alive, less the heap before.
// The keys' strings are made beforehand and not counted.
func laneHeap(t testing.TB, n, perLane int, opts ...Option) float64 {
	req, keys := keyedRequests(n)
	heap := func() int64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return int64(ms.HeapAlloc)
	}
	before := heap()
	tr := mustNew(t, nopBase{}, append([]Option{WithKey(byHost), WithLaneIdle(0)}, opts...)...)
	for _, k := range keys {
		req.Host = k
		for range perLane {
			if err := send(tr, req); err != nil {
				t.Fatal(err)
			}
		}
	}
	after := heap()
	if got := tr.nLanes.Load(); got != int64(n) {
		t.Fatalf("%d lanes, want %d", got, n)
	}
	runtime.KeepAlive(tr)
	runtime.KeepAlive(keys)
	tr.Close()
	return float64(after-before) / float64(n)
}

// A lane that has served a few requests keeps at most maxLaneHeap bytes,
// paced or not. The race detector adds its own shadow state to every
// allocation, so under -race the figures are logged, not held to the bound.
func TestLaneHeap(t *testing.T) {
	const n = 20_000
	for _, c := range []struct {
		name string
		opts []Option
	}{
		{"paced", []Option{WithRate(1e9, time.Second)}},
		{"unpaced", nil},
	} {
		got := laneHeap(t, n, 3, c.opts...)
		t.Logf("%s: %.0f B per lane (%d lanes, 3 requests each)", c.name, got, n)
		if got > maxLaneHeap && !raceEnabled {
			t.Errorf("%s: a lane keeps %.0f B, want at most %d", c.name, got, maxLaneHeap)
		}
		if got < 200 {
			t.Errorf("%s: %.0f B per lane: the measure missed the lanes", c.name, got)
		}
	}
	// Paced at 100/s with a burst of 1, two of each lane's three requests
	// wait 10 ms for their token: virtual time.
	synctest.Test(t, func(t *testing.T) {
		const n = 2_000
		got := laneHeap(t, n, 3, WithRate(100, time.Second), WithBurst(1))
		t.Logf("waited: %.0f B per lane (%d lanes, 3 requests each, 2 of them waited)", got, n)
		if got > maxWaitedLaneHeap && !raceEnabled {
			t.Errorf("waited: a lane keeps %.0f B, want at most %d", got, maxWaitedLaneHeap)
		}
		if got < 200 {
			t.Errorf("waited: %.0f B per lane: the measure missed the lanes", got)
		}
	})
}
