package sluicestatus

import (
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/laneid"
)

func lane(key string, granted, throttled uint64) sluice.LaneStats {
	l := sluice.LaneStats{Key: key, Throttled: throttled}
	l.Levels[sluice.Normal].Granted = granted
	return l
}

// TestHistorySince: samples taken between milliseconds are sent once, to
// the poll whose since (the feed's time of the latest sample, in whole
// milliseconds) is before them.
func TestHistorySince(t *testing.T) {
	h := newHistory(10, 5)
	t0 := time.UnixMilli(1_000_000).Add(700 * time.Microsecond)
	for i := range 5 {
		h.record(t0.Add(time.Duration(i)*time.Second), sluice.Stats{Lanes: []sluice.LaneStats{lane("a", uint64(10*i), 0)}})
	}
	_, _, at := h.snapshot(0, time.Second)
	lanes, _, _ := h.snapshot(at.UnixMilli(), time.Second)
	if len(lanes) != 1 || len(lanes[0].pts) != 0 {
		t.Errorf("since the latest sample: %d lanes, %d samples; want the lane and no sample", len(lanes), len(lanes[0].pts))
	}
	lanes, _, _ = h.snapshot(at.Add(-time.Second).UnixMilli(), time.Second)
	if len(lanes[0].pts) != 1 || !lanes[0].pts[0].at.Equal(at) {
		t.Errorf("since the one before: %v, want the latest only", lanes[0].pts)
	}
}

// TestHistoryCounters: rates and counts are differences of the counters,
// a lane created again (its counters restarted) counts from zero, and the
// figures over the history add up what it keeps.
func TestHistoryCounters(t *testing.T) {
	h := newHistory(3, 5)
	t0 := time.Unix(1000, 0)
	for i, c := range []struct{ granted, throttled uint64 }{{0, 0}, {20, 1}, {50, 1}, {5, 0}, {25, 2}} {
		h.record(t0.Add(time.Duration(i)*2*time.Second), sluice.Stats{Lanes: []sluice.LaneStats{lane("a", c.granted, c.throttled)}})
	}
	lanes, total, _ := h.snapshot(0, 2*time.Second)
	if total != 1 || len(lanes) != 1 {
		t.Fatalf("%d lanes, %d shown", total, len(lanes))
	}
	lh := lanes[0]
	var got []float64
	var th []uint64
	for _, p := range lh.pts {
		got = append(got, p.achieved)
		th = append(th, p.throttled)
	}
	// Kept: the last 3 samples, at 4, 6 and 8 s: 30 granted in 2 s, then a
	// restart with 5, then 20 more; 429s 0, 0 (restarted at 0), 2.
	want := []float64{15, 2.5, 10}
	wantTh := []uint64{0, 0, 2}
	for i := range want {
		if len(got) != 3 || got[i] != want[i] || th[i] != wantTh[i] {
			t.Fatalf("achieved %v, 429s %v; want %v and %v", got, th, want, wantTh)
		}
	}
	if lh.achieved != 10 || lh.throttled != 2 || lh.span != 6*time.Second {
		t.Errorf("latest achieved %v, 429s %d over %v; want 10, 2 over 6s", lh.achieved, lh.throttled, lh.span)
	}
}

// TestHistorySlashKey: a lane whose key has a "/" and a sub-limit with the
// same name (key "a/b"; sub-limit "b" of "a") keep series of their own,
// each counted from its own counters, under ids that tell them apart.
func TestHistorySlashKey(t *testing.T) {
	h := newHistory(3, 5)
	t0 := time.Unix(1000, 0)
	for i, c := range []struct{ slash, sub uint64 }{{0, 0}, {20, 200}, {40, 400}} {
		sub := lane("a", c.sub, 0)
		sub.Sublimit = "b"
		h.record(t0.Add(time.Duration(i)*time.Second), sluice.Stats{Lanes: []sluice.LaneStats{lane("a/b", c.slash, 0), sub}})
	}
	lanes, total, _ := h.snapshot(0, time.Second)
	if total != 2 || len(lanes) != 2 {
		t.Fatalf("%d lanes, %d shown; want 2 and 2", total, len(lanes))
	}
	want := map[laneid.ID]float64{{Key: "a/b"}: 20, {Key: "a", Sub: "b"}: 200}
	ids := map[string]bool{}
	for _, lh := range lanes {
		if lh.achieved != want[lh.id] {
			t.Errorf("%v: achieved %v, want %v", lh.id, lh.achieved, want[lh.id])
		}
		ids[lh.id.String()] = true
	}
	if len(ids) != 2 {
		t.Errorf("ids %v: want two", ids)
	}
}

// TestHistoryLaneMadeAgain: a lane forgotten and made again between two
// samples, whose new count already passed the old one, counts all of its
// new grants in the sample, not their excess over the old lane's.
func TestHistoryLaneMadeAgain(t *testing.T) {
	h := newHistory(3, 5)
	t0 := time.Unix(1000, 0)
	a := lane("a", 3, 0)
	a.Made = t0
	h.record(t0, sluice.Stats{Lanes: []sluice.LaneStats{a}})
	b := lane("a", 5, 0)
	b.Made = t0.Add(time.Second)
	h.record(t0.Add(2*time.Second), sluice.Stats{Lanes: []sluice.LaneStats{b}})
	lanes, _, _ := h.snapshot(0, 2*time.Second)
	if len(lanes) != 1 || lanes[0].achieved != 2.5 {
		t.Fatalf("achieved %+v, want 5 grants over 2 s: 2.5", lanes)
	}
}
