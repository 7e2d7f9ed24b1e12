package lanegroup

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
)

func lane(key string, granted, retries uint64, queued int) sluice.LaneStats {
	ls := sluice.LaneStats{Key: key, Rate: 2, InFlight: 1, Limit: 4, Retries: retries}
	ls.Levels[sluice.Normal].Granted = granted
	ls.Levels[sluice.Normal].Queued = queued
	return ls
}

func groups(g *Grouper, s sluice.Stats) []Group {
	gs, _ := g.Groups(func() sluice.Stats { return s })
	return gs
}

func find(t *testing.T, gs []Group, label string) Group {
	t.Helper()
	for _, g := range gs {
		if g.Label == label {
			return g
		}
	}
	t.Fatalf("no group %q in %+v", label, gs)
	return Group{}
}

func TestCapAndMap(t *testing.T) {
	g := New(func(k string) string { return strings.TrimSuffix(k, ":443") }, 2)
	s := sluice.Stats{Lanes: []sluice.LaneStats{
		lane("a:443", 1, 0, 1), lane("a:8443", 10, 0, 2), lane("b:443", 100, 0, 3), lane("c:443", 1000, 0, 4),
	}}
	gs := groups(g, s)
	if len(gs) != 3 {
		t.Fatalf("groups %+v, want a, a:8443 and other", gs)
	}
	if a := find(t, gs, "a"); a.Lanes != 1 || a.Level[sluice.Normal].Granted != 1 {
		t.Errorf("a = %+v", a)
	}
	o := find(t, gs, Other)
	if o.Lanes != 2 || o.Level[sluice.Normal].Granted != 1100 || o.Queue[sluice.Normal].Queued != 7 || o.Rate != 4 || o.Limit != 8 {
		t.Errorf("other = %+v, want the sums of b and c", o)
	}
	if l := g.Label("d:443"); l != Other {
		t.Errorf("Label(d) past the cap = %q", l)
	}
	if l := g.Label("a:443"); l != "a" {
		t.Errorf("Label(a:443) = %q", l)
	}
}

// A lane that goes, or comes back from zero, leaves its group's counters
// where they were; gauges follow the lanes now.
func TestCountersStayMonotonic(t *testing.T) {
	g := New(func(string) string { return "all" }, 0)
	groups(g, sluice.Stats{Lanes: []sluice.LaneStats{lane("x", 5, 1, 2), lane("y", 7, 2, 3)}})
	// y forgotten; x forgotten and made anew with 2 granted.
	gs := groups(g, sluice.Stats{Lanes: []sluice.LaneStats{lane("x", 2, 0, 0)}})
	all := find(t, gs, "all")
	if got := all.Level[sluice.Normal].Granted; got != 5+7+2 {
		t.Errorf("granted = %d, want 14", got)
	}
	if all.Retries != 3 {
		t.Errorf("retries = %d, want 3", all.Retries)
	}
	if all.Lanes != 1 || all.Queue[sluice.Normal].Queued != 0 {
		t.Errorf("gauges %+v, want the one live lane's", all.Gauges)
	}
	// No lane at all: the group and its counters remain.
	gs = groups(g, sluice.Stats{})
	if all := find(t, gs, "all"); all.Level[sluice.Normal].Granted != 14 || all.Lanes != 0 {
		t.Errorf("after every lane went: %+v", all)
	}
}

func TestCooldownLeft(t *testing.T) {
	g := New(nil, 0)
	now := time.Now()
	ls := lane("x", 0, 0, 0)
	ls.Cooldown = now.Add(3 * time.Second)
	gs := groups(g, sluice.Stats{Lanes: []sluice.LaneStats{ls, lane("y", 0, 0, 0)}})
	if c := find(t, gs, "x").Cooldown; c > 3*time.Second || c < 2*time.Second {
		t.Errorf("cooldown = %v, want a little under 3s", c)
	}
	if c := find(t, gs, "y").Cooldown; c != 0 {
		t.Errorf("cooldown of y = %v, want 0", c)
	}
}

// Two collections at once fold their snapshots in the order they were
// taken: a later one read first would look like a lane made anew, and be
// counted twice.
func TestConcurrentGroups(t *testing.T) {
	g := New(nil, 0)
	var n atomic.Uint64
	stats := func() sluice.Stats {
		return sluice.Stats{Lanes: []sluice.LaneStats{lane("x", n.Add(1), 0, 0)}}
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for range 500 {
				g.Groups(stats)
			}
		})
	}
	wg.Wait()
	gs, _ := g.Groups(stats)
	if got, want := find(t, gs, "x").Level[sluice.Normal].Granted, n.Load(); got != want {
		t.Errorf("granted = %d after concurrent reads, want the last snapshot's %d", got, want)
	}
}

// A sub-limit is a group of its own under its lane's label, and its
// counters are not added to its lane's: a request granted by both is
// counted once in each.
func TestSublimitGroups(t *testing.T) {
	g := New(func(k string) string { return strings.TrimSuffix(k, ":443") }, 0)
	sub := lane("api:443", 5, 0, 0)
	sub.Sublimit = "search"
	gs := groups(g, sluice.Stats{Lanes: []sluice.LaneStats{lane("api:443", 7, 0, 0), sub}})
	if len(gs) != 2 {
		t.Fatalf("groups %+v, want api and api/search", gs)
	}
	if a := find(t, gs, "api"); a.Level[sluice.Normal].Granted != 7 {
		t.Errorf("api = %+v, want its own 7 grants", a)
	}
	if s := find(t, gs, "api/search"); s.Level[sluice.Normal].Granted != 5 {
		t.Errorf("api/search = %+v, want its 5 grants", s)
	}
}

// A lane whose key has a "/" and a sub-limit that shares its name (key
// "a/b"; sub-limit "b" of "a") are two lanes: each counts once, and
// neither reads as the other made anew.
func TestSlashKeyBesideSublimit(t *testing.T) {
	g := New(nil, 0)
	read := func(slash, sub uint64) uint64 {
		s := lane("a", sub, 0, 0)
		s.Sublimit = "b"
		gs := groups(g, sluice.Stats{Lanes: []sluice.LaneStats{lane("a", 1, 0, 0), s, lane("a/b", slash, 0, 0)}})
		return find(t, gs, "a/b").Level[sluice.Normal].Granted
	}
	if got := read(7, 5); got != 12 {
		t.Errorf("first read: a/b counts %d grants, want 7 + 5", got)
	}
	if got := read(8, 6); got != 14 {
		t.Errorf("second read: a/b counts %d grants, want 8 + 6", got)
	}
}

// TestCountersOfALaneMadeAgain: a lane forgotten and made again between
// two reads, whose new counters already passed the old ones, is told by
// its Made: its old counts are kept, not lost.
func TestCountersOfALaneMadeAgain(t *testing.T) {
	g := New(func(string) string { return "all" }, 0)
	a := lane("x", 3, 0, 0)
	a.Made = time.Unix(1000, 0)
	groups(g, sluice.Stats{Lanes: []sluice.LaneStats{a}})
	b := lane("x", 5, 0, 0)
	b.Made = time.Unix(1095, 0)
	gs := groups(g, sluice.Stats{Lanes: []sluice.LaneStats{b}})
	if got := find(t, gs, "all").Level[sluice.Normal].Granted; got != 3+5 {
		t.Errorf("granted = %d, want 8", got)
	}
}

// TestSublimitsLeaveLabelsToHosts: sixty sub-limits of one host (a Discord
// bot's channel buckets) take at most half the cap of 50 labels, and a
// host seen after them keeps a label of its own.
func TestSublimitsLeaveLabelsToHosts(t *testing.T) {
	g := New(nil, 50)
	var lanes []sluice.LaneStats
	lanes = append(lanes, lane("discord.com:443", 1, 0, 0))
	for i := range 60 {
		ls := lane("discord.com:443", 1, 0, 0)
		ls.Sublimit = fmt.Sprintf("bucket@%d", i)
		lanes = append(lanes, ls)
	}
	groups(g, sluice.Stats{Lanes: lanes})
	lanes = append(lanes, lane("api.openai.com:443", 1, 0, 0))
	gs := groups(g, sluice.Stats{Lanes: lanes})
	find(t, gs, "api.openai.com:443")
	subs := 0
	for _, gr := range gs {
		if strings.HasPrefix(gr.Label, "discord.com:443/bucket@") {
			subs++
		}
	}
	if subs > 25 {
		t.Errorf("%d sub-limit labels, want at most half the cap (25)", subs)
	}
}
