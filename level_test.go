package sluice

import (
	"fmt"
	"testing"
	"time"
)

// queueOne files a waiter of tenant id at level p of q, as a lane does at
// enqueue time t.
func queueOne(q *waitQueue, p Priority, id string, t int) *waiter {
	w := &waiter{level: p, tn: q.levels[p].tenant(id), enq: time.Duration(t) * time.Millisecond, ready: make(chan struct{})}
	q.push(w, 1)
	return w
}

// serveAll grants every waiter of q one at a time, with a limit of one,
// finishing each attempt before the next grant, as a lane with one slot does.
func serveAll(q *waitQueue) int {
	n := 0
	for w := q.pop(1, nil); w != nil; w = q.pop(1, nil) {
		lv := &q.levels[w.level]
		lv.started(w.tn, 1)
		lv.finished(w.tn, 1)
		n++
	}
	return n
}

// An idle tenant's record is kept for the next tenant, but not the queue a
// flood grew in it.
func TestLevelRecordsReused(t *testing.T) {
	var q waitQueue
	q.init([numLevels]float64{})
	for i := range 200 { // one tenant's flood: its queue grows past spareWaiters
		queueOne(&q, Normal, "flood", i)
	}
	if n := serveAll(&q); n != 200 {
		t.Fatalf("served %d of the flood, want 200", n)
	}
	lv := &q.levels[Normal]
	if len(lv.named.spare) != 1 || lv.named.spare[0].id != "" || lv.named.spare[0].waiters != nil || lv.named.m["flood"] != nil {
		t.Fatalf("after the flood: %d spare, %+v", len(lv.named.spare), lv.named.spare)
	}
	rec := lv.named.spare[0]
	queueOne(&q, Normal, "next", 200)
	if lv.named.m["next"] != rec {
		t.Errorf("the next tenant got a new record, not the spare one")
	}
	serveAll(&q)
	if len(lv.named.spare) != 1 || lv.named.spare[0] != rec || rec.inFlight != 0 || len(lv.named.m) != 0 {
		t.Errorf("the next tenant did not reuse the record cleanly: %d spare, record %+v, %d named", len(lv.named.spare), rec, len(lv.named.m))
	}
}

// Tenants that come and go leave nothing behind: the map that held 10,000
// of them goes (a Go map keeps the buckets of its largest size), and only a
// few records are kept for reuse.
func TestLevelForgetsIdleTenants(t *testing.T) {
	var q waitQueue
	q.init([numLevels]float64{})
	for i := range 10_000 {
		queueOne(&q, Batch, fmt.Sprint("t", i), i)
	}
	var s LevelStats
	q.levels[Batch].tenantStats(&s)
	if s.Tenants != 10_000 || len(s.Top) != TopTenants {
		t.Fatalf("while queued: %d tenants, top %d; want 10000, %d", s.Tenants, len(s.Top), TopTenants)
	}
	if n := serveAll(&q); n != 10_000 {
		t.Fatalf("served %d, want 10000", n)
	}
	nt := q.levels[Batch].named
	if nt.m != nil || len(nt.spare) > spareTenants {
		t.Errorf("after all went idle: map of %d (want none: it held 10,000), %d spare records (want at most %d)", len(nt.m), len(nt.spare), spareTenants)
	}
	// A level under the size that pins buckets keeps its map.
	for i := range 10 {
		queueOne(&q, Normal, fmt.Sprint("u", i), i)
	}
	serveAll(&q)
	if q.levels[Normal].named.m == nil {
		t.Errorf("a small level's map was dropped; it is kept for reuse")
	}
}
