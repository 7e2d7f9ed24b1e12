// Package lanegroup groups a Transport's lanes under a bounded set of labels
// for the metric exporters (sluiceprom, sluiceotel), and keeps each group's
// counters monotonic while its lanes come and go.
//
// A lane's counters count since the lane was created, and a lane forgotten
// when idle (WithLaneIdle) comes back from zero. Exported as they are, a
// group of several lanes would see its sums fall when one of them goes, which
// a metrics backend reads as a counter reset and counts as a burst. A Grouper
// keeps what the lanes that went had counted, so a group's counters only
// grow. Counts a lane made between two reads and lost before the second are
// not seen.
package lanegroup

import (
	"strings"
	"sync"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/laneid"
)

// maxCache bounds the cache of labels by lane key.
const maxCache = 4096

// Other is the label of the lanes beyond the cap of a Grouper.
const Other = "other"

// Levels and Reasons are how many priority levels and refusal reasons
// LaneStats reports.
const (
	Levels  = len(sluice.LaneStats{}.Levels)
	Reasons = len(sluice.LevelStats{}.Refused)
)

// Counters are the figures of a group that only grow.
type Counters struct {
	Retries, RetriesDenied, Cooldowns uint64
	Level                             [Levels]LevelCounters
}

// LevelCounters are the figures of one priority level of a group that only
// grow.
type LevelCounters struct {
	Granted, Cancelled, Throttled uint64
	Refused                       [Reasons]uint64
}

// Gauges are the figures of a group read as they are now: sums over its
// lanes, except Cooldown, Latency, Baseline and OldestWait, which are the
// largest of them, and Saturated, true if any is.
type Gauges struct {
	Lanes             int     // lanes in the group
	Rate, Ceiling     float64 // per second
	InFlight, Limit   int
	Cooldown          time.Duration // left of the longest cooldown; 0 if none
	Latency, Baseline time.Duration
	Saturated         bool
	Queue             [Levels]LevelGauges
}

// LevelGauges are the figures of one priority level of a group, now.
type LevelGauges struct {
	Queued     int
	OldestWait time.Duration
	Tenants    int
}

// A Group is one label's figures.
type Group struct {
	Label string
	Gauges
	Counters
}

// A Grouper names each lane's group: Map(key), or Other once Max distinct
// labels are taken (first come, first kept, for the Grouper's life). Its
// zero value is not usable: see New. It is safe for concurrent use.
type Grouper struct {
	mapf func(string) string
	max  int // 0: no cap

	// collecting orders collections (see Groups); mu guards the rest, and
	// is not held while a collection reads the Transport.
	collecting sync.Mutex
	mu         sync.Mutex
	labels     map[string]bool        // labels given out, Other aside
	subs       int                    // of them, sub-limits' (see subLabelLocked)
	last       map[laneid.ID]laneMemo // the lane's counters at the last read
	retired    map[string]*Counters   // by label: counted by lanes gone
	byKey      map[laneid.ID]string   // the lane's label, a cache for Label
}

type laneMemo struct {
	label string
	made  time.Time // the lane's LaneStats.Made
	c     Counters
}

// New returns a Grouper that labels a lane by mapf(key) (the key itself if
// mapf is nil) and gives out at most max labels besides Other (no cap if max
// is 0).
func New(mapf func(string) string, max int) *Grouper {
	if mapf == nil {
		mapf = func(k string) string { return k }
	}
	return &Grouper{
		mapf:    mapf,
		max:     max,
		labels:  make(map[string]bool),
		last:    make(map[laneid.ID]laneMemo),
		retired: make(map[string]*Counters),
		byKey:   make(map[laneid.ID]string),
	}
}

// Label returns the label of the lane of key.
func (g *Grouper) Label(key string) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.labelLocked(key)
}

// subLabelLocked returns the label of a sub-limit named sub of a lane
// labelled label; id is the sub-limit's. A sub-limit has a series of its
// own under its lane's label, within the cap on labels, of which the
// sub-limits take at most half (a Discord bot has a bucket per channel,
// and would leave no label to the hosts that come later); past it, the
// lane's sub-limits share label + "/other".
func (g *Grouper) subLabelLocked(id laneid.ID, label string) string {
	if l, ok := g.byKey[id]; ok {
		return l
	}
	// A sub-limit's name may come from a request's path (a bucket kept
	// per major parameter), in any bytes.
	l := label + "/" + strings.ToValidUTF8(id.Sub, "\uFFFD")
	if !g.labels[l] {
		if label == Other || g.max > 0 && (len(g.labels) >= g.max || g.subs >= g.max/2) {
			// label + "/other" is a label too, within the cap: past it,
			// the sub-limit is Other's.
			l = label + "/" + Other
			if !g.labels[l] {
				if label == Other || g.max > 0 && len(g.labels) >= g.max {
					l = Other
				} else {
					g.labels[l] = true
				}
			}
		} else {
			g.labels[l] = true
			g.subs++
		}
	}
	if len(g.byKey) >= maxCache {
		clear(g.byKey)
	}
	g.byKey[id] = l
	return l
}

func (g *Grouper) labelLocked(key string) string {
	if l, ok := g.byKey[laneid.ID{Key: key}]; ok {
		return l
	}
	// A key is whatever a request or a server named; an exporter takes
	// only valid UTF-8.
	l := strings.ToValidUTF8(g.mapf(key), "\uFFFD")
	if !g.labels[l] {
		if g.max > 0 && len(g.labels) >= g.max {
			l = Other
		} else {
			g.labels[l] = true
		}
	}
	// Groups drops the keys of lanes gone; this bound holds for an
	// Observer whose Transport nobody reads. Labels given stay given, so
	// clearing the cache changes no label.
	if len(g.byKey) >= maxCache {
		clear(g.byKey)
	}
	g.byKey[laneid.ID{Key: key}] = l
	return l
}

// Groups calls stats and returns its figures by label, in the order of its
// lanes' first appearance (Stats are sorted by key), with every label that
// has had a lane, so a group's counters do not vanish with its lanes; and
// the snapshot itself. Two collections at once (two scrapers) take turns:
// they must not fold their snapshots in the other order, which would read
// as lanes made anew. Label does not wait for a collection's call of
// stats, which visits every lane.
func (g *Grouper) Groups(stats func() sluice.Stats) ([]Group, sluice.Stats) {
	g.collecting.Lock()
	defer g.collecting.Unlock()
	s := stats()
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	var out []Group
	idx := make(map[string]int)
	group := func(label string) *Group {
		i, ok := idx[label]
		if !ok {
			i = len(out)
			idx[label] = i
			out = append(out, Group{Label: label})
		}
		return &out[i]
	}
	live := make(map[laneid.ID]bool, len(s.Lanes))
	for i := range s.Lanes {
		ls := &s.Lanes[i]
		id, label := laneid.Of(ls), g.labelLocked(ls.Key)
		if ls.Sublimit != "" {
			label = g.subLabelLocked(id, label)
		}
		live[id] = true
		c := counters(ls)
		if m, ok := g.last[id]; ok && (m.label != label || !m.made.Equal(ls.Made) || !m.c.le(&c)) {
			// The lane was forgotten and made anew since the last read.
			g.retire(m)
		}
		g.last[id] = laneMemo{label, ls.Made, c}
		gr := group(label)
		gr.Counters.add(&c)
		gr.Gauges.add(ls, now)
	}
	for key, m := range g.last {
		if !live[key] {
			g.retire(m)
			delete(g.last, key)
		}
	}
	for key := range g.byKey {
		if !live[key] {
			delete(g.byKey, key)
		}
	}
	for label, c := range g.retired {
		group(label).Counters.add(c)
	}
	return out, s
}

func (g *Grouper) retire(m laneMemo) {
	r := g.retired[m.label]
	if r == nil {
		r = new(Counters)
		g.retired[m.label] = r
	}
	r.add(&m.c)
}

func counters(ls *sluice.LaneStats) Counters {
	c := Counters{Retries: ls.Retries, RetriesDenied: ls.RetriesDenied, Cooldowns: ls.Cooldowns}
	for p := range ls.Levels {
		lv := &ls.Levels[p]
		c.Level[p] = LevelCounters{Granted: lv.Granted, Cancelled: lv.Cancelled, Throttled: lv.Throttled, Refused: lv.Refused}
	}
	return c
}

func (c *Counters) add(d *Counters) {
	c.Retries += d.Retries
	c.RetriesDenied += d.RetriesDenied
	c.Cooldowns += d.Cooldowns
	for p := range c.Level {
		a, b := &c.Level[p], &d.Level[p]
		a.Granted += b.Granted
		a.Cancelled += b.Cancelled
		a.Throttled += b.Throttled
		for r := range a.Refused {
			a.Refused[r] += b.Refused[r]
		}
	}
}

// le reports whether every counter of c is at most d's.
func (c *Counters) le(d *Counters) bool {
	if c.Retries > d.Retries || c.RetriesDenied > d.RetriesDenied || c.Cooldowns > d.Cooldowns {
		return false
	}
	for p := range c.Level {
		a, b := &c.Level[p], &d.Level[p]
		if a.Granted > b.Granted || a.Cancelled > b.Cancelled || a.Throttled > b.Throttled {
			return false
		}
		for r := range a.Refused {
			if a.Refused[r] > b.Refused[r] {
				return false
			}
		}
	}
	return true
}

func (gg *Gauges) add(ls *sluice.LaneStats, now time.Time) {
	gg.Lanes++
	gg.Rate += ls.Rate
	gg.Ceiling += ls.Ceiling
	gg.InFlight += ls.InFlight
	gg.Limit += ls.Limit
	if !ls.Cooldown.IsZero() {
		gg.Cooldown = max(gg.Cooldown, ls.Cooldown.Sub(now))
	}
	gg.Latency = max(gg.Latency, ls.Latency)
	gg.Baseline = max(gg.Baseline, ls.Baseline)
	gg.Saturated = gg.Saturated || ls.Saturated
	for p := range gg.Queue {
		a, b := &gg.Queue[p], &ls.Levels[p]
		a.Queued += b.Queued
		a.OldestWait = max(a.OldestWait, b.OldestWait)
		a.Tenants += b.Tenants
	}
}
