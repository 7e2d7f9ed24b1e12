package sluice

import (
	"slices"
	"strings"
	"time"
)

// Stats is a snapshot of a Transport's lanes, sorted by key.
type Stats struct {
	Lanes []LaneStats
	// EventsDropped counts the events the Observers missed because they
	// fell behind by more than a few thousand (see WithObserver).
	EventsDropped uint64
}

// Lane returns the stats of the lane with the given key, and whether it
// exists, by binary search of the sorted Lanes. Transport.LaneStats finds
// one lane without taking a snapshot of all.
func (s Stats) Lane(key string) (LaneStats, bool) {
	i, ok := slices.BinarySearchFunc(s.Lanes, key, func(l LaneStats, k string) int { return strings.Compare(l.Key, k) })
	if !ok {
		return LaneStats{}, false
	}
	return s.Lanes[i], true
}

// Name returns the lane's key, and for a sub-limit its key, "/" and the
// sub-limit's name ("api.github.com/search"): a name unique in a Stats.
func (ls *LaneStats) Name() string {
	if ls.Sublimit == "" {
		return ls.Key
	}
	return ls.Key + "/" + ls.Sublimit
}

// LaneStats is a snapshot of one lane. Counters count since the lane was
// created.
type LaneStats struct {
	Key string
	// Sublimit names one of several limits behind the lane's host (see
	// WithSublimit): the lane's sub-limits follow it in Stats, with its
	// Key and their names. It is "" for the lane itself.
	Sublimit string
	// Made is when the lane was made. A lane forgotten (see WithLaneIdle)
	// and made again for the same key has a later Made, and its counters
	// start again from zero.
	Made time.Time
	// Folded counts the responses that named a limit past the lane's cap
	// of sub-limits: no lane learned from them.
	Folded   uint64
	Rate     float64   // tokens per second the lane paces to now; 0 if not paced
	Ceiling  float64   // the most Rate can be: WithRate x WithHeadroom; 0 if none
	InFlight int       // attempts sent and not finished
	Limit    int       // the in-flight limit
	Cooldown time.Time // nothing is sent before this; zero if not cooling down

	// Latency is the smoothed attempt latency (send to body done) and
	// Baseline its no-load estimate, as the concurrency controller sees them;
	// zero until observed. A lane granting over 1,000 requests a second
	// times a sample of its attempts (one in 32, and at least one a
	// millisecond), not every one.
	Latency, Baseline time.Duration
	// Saturated reports that the concurrency controller found the upstream
	// queueing this lane's requests (latency up at a flat completion rate)
	// within its last 8 windows (about 8 s), and holds the limit near what
	// the upstream serves rather than at rate x latency.
	Saturated bool

	// What the server said, and what sluice did about it.
	Throttled     uint64 // responses that said "too many requests" (429, GitHub's 403)
	Cooldowns     uint64 // pauses of the whole lane (Retry-After, remaining 0)
	Retries       uint64 // retries sent
	RetriesDenied uint64 // retries the retry budget refused

	// Levels is indexed by Priority.
	Levels [numLevels]LevelStats
}

// LevelStats is a snapshot of one priority level of a lane.
type LevelStats struct {
	Queued    int    // waiting now
	Granted   uint64 // attempts granted a token and a slot
	Cancelled uint64 // waiters whose context ended before they were sent
	Throttled uint64 // attempts answered "too many requests" (429, GitHub's 403)
	// Refused counts early refusals, indexed by Reason.
	Refused [numReasons]uint64
	// WaitP50 and WaitP99 are quantiles of the time from enqueue to grant
	// of the attempts granted over the last one to two minutes (within
	// about 6%); 0 if none was.
	WaitP50, WaitP99 time.Duration
	// OldestWait is how long the longest-waiting queued request has waited
	// (since its first attempt), or 0.
	OldestWait time.Duration

	// Tenants is how many tenants (see WithTenant) have attempts queued or
	// in flight at this level, the anonymous one included; Top lists the
	// busiest of them, at most TopTenants, by in-flight plus queued.
	Tenants int
	Top     []TenantStats
}

// Stats returns a snapshot of every lane. It takes each lane's lock briefly,
// one at a time, and no lock of the Transport, so requests and new lanes
// go on while it copies; a lane created or forgotten meanwhile may or may
// not be in it. It allocates only the result: calling it every second is
// cheap with a few lanes. With very many, Transport.LaneStats reads one.
func (t *Transport) Stats() Stats {
	// The lanes are sorted before they are copied: a LaneStats is hundreds
	// of bytes, a pointer eight, and a key never changes.
	ls := make([]*lane, 0, max(t.nLanes.Load(), 0))
	t.lanes.Range(func(_, v any) bool {
		if l := v.(*lane); !l.isDead() {
			ls = append(ls, l)
		}
		return true
	})
	// The key of a sub-limit's lane is its host's, then subSep: it sorts
	// right after its host's lane.
	slices.SortFunc(ls, func(a, b *lane) int { return strings.Compare(a.key, b.key) })
	s := Stats{Lanes: make([]LaneStats, len(ls))}
	for i, l := range ls {
		s.Lanes[i] = t.laneStats(l)
	}
	if ev := t.cfg.events; ev != nil {
		s.EventsDropped = ev.dropped.Load()
	}
	return s
}

// LaneStats returns a snapshot of the lane of key, and whether the
// Transport has one (a lane is created by its key's first request, and
// forgotten when idle; see WithLaneIdle). It creates no lane and reads no
// other.
func (t *Transport) LaneStats(key string) (LaneStats, bool) {
	l := t.find(key)
	if l == nil {
		return LaneStats{}, false
	}
	return t.laneStats(l), true
}

// laneStats returns l's stats, with what the Transport keeps of it.
func (t *Transport) laneStats(l *lane) LaneStats {
	ls := l.stats()
	if t.learned.Load() && ls.Sublimit == "" {
		if rs := t.routesOf(l.key, false); rs != nil {
			rs.mu.Lock()
			ls.Folded = rs.folded
			rs.mu.Unlock()
		}
	}
	return ls
}

func (l *lane) stats() LaneStats {
	l.lock()
	defer l.unlock()
	l.reclaimLocked(false)
	tick := l.clk.peek()
	l.revokeLocked(tick) // prepaid grants are not in flight
	host, sub := splitKey(l.key)
	ls := LaneStats{
		Key:      host,
		Sublimit: sub,
		Made:     l.clk.epoch,
		InFlight: l.slot.inUse,
		Limit:    l.slot.limit,
	}
	ps := l.pace.Stats()
	ls.Rate, ls.Ceiling = ps.Rate, ps.Ceiling
	ls.Throttled, ls.Cooldowns = ps.Throttled, ps.Cooldowns
	if until := l.pace.Cooldown(); tick < until {
		ls.Cooldown = l.clk.timeOf(until)
	}
	l.slot.fill(&ls)
	ls.Retries, ls.RetriesDenied = l.budget.made, l.budget.refused
	for p := range ls.Levels {
		c := &l.levels[p]
		lv := &ls.Levels[p]
		lv.Queued = l.q.levels[p].n
		l.q.levels[p].tenantStats(lv)
		lv.Granted, lv.Cancelled = c.granted, c.cancelled
		if l.refused != nil {
			lv.Refused = l.refused[p]
		}
		lv.Throttled = c.throttled
		lv.WaitP50, lv.WaitP99 = c.wait.Quantile(tick, waitPeriod, 0.5), c.wait.Quantile(tick, waitPeriod, 0.99)
		if enq, ok := l.q.oldest(Priority(p)); ok {
			lv.OldestWait = tick - enq
		}
	}
	return ls
}

// TopTenants is how many tenants LevelStats.Top lists.
const TopTenants = 5

// TenantStats is a snapshot of one tenant's work at one level of a lane.
type TenantStats struct {
	ID       string // "" for the anonymous tenant
	InFlight int
	Queued   int
}
