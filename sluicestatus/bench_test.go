package sluicestatus

import (
	"encoding/json"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
)

// synthetic returns a Stats of n busy lanes whose counters grow with tick.
func synthetic(n, tick int) sluice.Stats {
	s := sluice.Stats{Lanes: make([]sluice.LaneStats, n)}
	for i := range s.Lanes {
		l := &s.Lanes[i]
		l.Key = fmt.Sprintf("host-%05d.test", i)
		l.Rate, l.Ceiling, l.InFlight, l.Limit = 40, 50, 5, 20
		l.Throttled = uint64(tick / 30)
		for p := range l.Levels {
			l.Levels[p].Granted = uint64(tick * (i%7 + p + 1))
			l.Levels[p].Queued = (i + tick) % 9
			l.Levels[p].WaitP99 = time.Duration(p+1) * 37 * time.Millisecond
		}
	}
	return s
}

// BenchmarkRecord is one sample of the sampler: its cost per second of a
// Handler's life, for a Transport of that many lanes.
func BenchmarkRecord(b *testing.B) {
	for _, n := range []int{1, 20, 1000, 10000} {
		b.Run(fmt.Sprintf("lanes=%d", n), func(b *testing.B) {
			h := newHistory(int(DefaultHistory/DefaultInterval), DefaultMaxLanes)
			stats := [2]sluice.Stats{synthetic(n, 1), synthetic(n, 2)}
			at := time.Unix(1e9, 0)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				at = at.Add(time.Second)
				h.record(at, stats[i%2])
			}
		})
	}
}

// BenchmarkFeed is one poll of the page with a full history (20 lanes of 10
// minutes): the first (all of it) and the next ones (?since=, the latest
// sample only). It reports the JSON's size.
func BenchmarkFeed(b *testing.B) {
	tr, err := sluice.New(nil)
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Close()
	cfg := defaultConfig()
	h := &Handler{t: tr, cfg: cfg, hist: newHistory(cfg.samples(), cfg.maxLanes), now: time.Now}
	at := time.Now().Add(-time.Hour)
	for i := range cfg.samples() + 5 {
		at = at.Add(time.Second)
		h.hist.record(at, synthetic(20, i))
	}
	for _, c := range []struct{ name, since string }{{"full", ""}, {"since", fmt.Sprint(at.Add(-time.Second).UnixMilli())}} {
		b.Run(c.name, func(b *testing.B) {
			q := url.Values{}
			if c.since != "" {
				q.Set("since", c.since)
			}
			var size int
			b.ReportAllocs()
			for b.Loop() {
				j, err := json.Marshal(h.feed(q))
				if err != nil {
					b.Fatal(err)
				}
				size = len(j)
			}
			b.ReportMetric(float64(size), "bytes/feed")
		})
	}
}
