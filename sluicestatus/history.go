package sluicestatus

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/laneid"
)

// levels is the number of priority levels a LaneStats reports.
const levels = len(sluice.LaneStats{}.Levels)

// scoreWeight is the weight of the newest sample in a lane's activity
// score: about the last five samples count.
const scoreWeight = 0.2

// point is one sample of one lane.
type point struct {
	at       time.Time
	achieved float64 // attempts granted per second since the previous sample
	rate     float64 // the pace the lane kept (LaneStats.Rate)
	inFlight int
	limit    int
	queued   [levels]int
	waitP99  [levels]time.Duration
	// throttled and cooldowns count the 429s and cooldowns since the
	// previous sample; cooling reports a cooldown in force at the sample.
	throttled, cooldowns uint64
	cooling              bool
}

// series is the history of one lane shown: a ring of its latest samples,
// and its latest LaneStats.
type series struct {
	pts  []point // ring, len == cap once full
	next int     // where the next point goes once full
	last sluice.LaneStats
}

func (s *series) add(p point) {
	if len(s.pts) < cap(s.pts) {
		s.pts = append(s.pts, p)
		return
	}
	s.pts[s.next] = p
	s.next = (s.next + 1) % len(s.pts)
}

// seen is what the history keeps of every lane of the latest sample, shown
// or not: its counters, to take differences, and its activity score.
type seen struct {
	made                          time.Time // the lane's LaneStats.Made
	granted, throttled, cooldowns uint64
	score                         float64
}

// history is the sampler's record. It keeps a series for at most maxLanes
// lanes, the busiest by score, and forgets a lane's series when the lane
// drops out of them.
type history struct {
	size     int // samples per series
	maxLanes int

	mu    sync.Mutex
	last  time.Time // of the latest sample; zero before the first
	seen  map[laneid.ID]seen
	shown map[laneid.ID]*series
	total int // lanes in the latest sample
}

func newHistory(size, maxLanes int) *history {
	return &history{size: size, maxLanes: maxLanes, seen: map[laneid.ID]seen{}, shown: map[laneid.ID]*series{}}
}

// delta is cur - prev for a counter, or cur if the counter restarted (the
// lane was forgotten and created again).
func delta(cur, prev uint64) uint64 {
	if cur < prev {
		return cur
	}
	return cur - prev
}

// record adds a sample taken at now.
func (h *history) record(now time.Time, s sluice.Stats) {
	h.mu.Lock()
	defer h.mu.Unlock()
	dt := now.Sub(h.last).Seconds()
	first := h.last.IsZero() || dt <= 0

	type candidate struct {
		ls *sluice.LaneStats
		p  point
		sc float64
	}
	cands := make([]candidate, 0, len(s.Lanes))
	next := make(map[laneid.ID]seen, len(s.Lanes))
	for i := range s.Lanes {
		ls := &s.Lanes[i]
		cur := seen{made: ls.Made, throttled: ls.Throttled, cooldowns: ls.Cooldowns}
		p := point{at: now, rate: ls.Rate, inFlight: ls.InFlight, limit: ls.Limit, cooling: !ls.Cooldown.IsZero()}
		queued := 0
		for l := range ls.Levels {
			lv := &ls.Levels[l]
			cur.granted += lv.Granted
			p.queued[l], p.waitP99[l] = lv.Queued, lv.WaitP99
			queued += lv.Queued
		}
		prev, known := h.seen[laneid.Of(ls)]
		again := known && !prev.made.Equal(ls.Made) // forgotten and made anew since
		switch {
		case known && !again && !first:
			p.achieved = float64(delta(cur.granted, prev.granted)) / dt
			p.throttled = delta(cur.throttled, prev.throttled)
			p.cooldowns = delta(cur.cooldowns, prev.cooldowns)
		case !first:
			// A lane made since the previous sample: all it counted
			// happened since.
			p.achieved = float64(cur.granted) / dt
			p.throttled, p.cooldowns = cur.throttled, cur.cooldowns
		}
		activity := p.achieved + float64(ls.InFlight+queued)
		cur.score = activity
		if known {
			cur.score = prev.score + scoreWeight*(activity-prev.score)
		}
		next[laneid.Of(ls)] = cur
		cands = append(cands, candidate{ls, p, cur.score})
	}
	// The busiest first; among equals the lane already shown, then by key,
	// so that the choice does not flap.
	slices.SortFunc(cands, func(a, b candidate) int {
		if c := cmp.Compare(b.sc, a.sc); c != 0 {
			return c
		}
		_, as := h.shown[laneid.Of(a.ls)]
		_, bs := h.shown[laneid.Of(b.ls)]
		if as != bs {
			if as {
				return -1
			}
			return 1
		}
		return laneid.Of(a.ls).Compare(laneid.Of(b.ls))
	})
	shown := make(map[laneid.ID]*series, min(len(cands), h.maxLanes))
	for _, c := range cands[:min(len(cands), h.maxLanes)] {
		ser := h.shown[laneid.Of(c.ls)]
		if ser == nil {
			ser = &series{pts: make([]point, 0, h.size)}
		}
		ser.add(c.p)
		ser.last = *c.ls
		shown[laneid.Of(c.ls)] = ser
	}
	h.seen, h.shown, h.total, h.last = next, shown, len(s.Lanes), now
}

// laneHistory is a copy of one series, for a reader: its samples after a
// time, and figures over all it keeps.
type laneHistory struct {
	id   laneid.ID
	pts  []point // oldest first
	last sluice.LaneStats
	// achieved is the latest sample's; throttled and cooldowns are the
	// counts of all the samples kept, which cover span.
	achieved             float64
	throttled, cooldowns uint64
	span                 time.Duration
}

// snapshot copies the series shown, in key order, with their samples after
// since, in Unix milliseconds as the feed gives times, and returns the number of lanes in the
// latest sample and its time.
func (h *history) snapshot(since int64, interval time.Duration) (lanes []laneHistory, total int, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	lanes = make([]laneHistory, 0, len(h.shown))
	for k, s := range h.shown {
		lh := laneHistory{id: k, last: s.last}
		n := len(s.pts)
		if n == 0 {
			lanes = append(lanes, lh)
			continue
		}
		// The ring in time order: s.pts[s.next:] then s.pts[:s.next].
		at := func(i int) *point { return &s.pts[(s.next+i)%n] }
		for i := range n {
			p := at(i)
			lh.throttled += p.throttled
			lh.cooldowns += p.cooldowns
			if p.at.UnixMilli() > since {
				lh.pts = append(lh.pts, *p)
			}
		}
		lh.achieved = at(n - 1).achieved
		// Each sample counts the interval before it.
		lh.span = at(n-1).at.Sub(at(0).at) + interval
		lanes = append(lanes, lh)
	}
	slices.SortFunc(lanes, func(a, b laneHistory) int { return a.id.Compare(b.id) })
	return lanes, h.total, h.last
}
