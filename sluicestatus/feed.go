package sluicestatus

import (
	"math"
	"net/url"
	"strconv"
	"time"

	"github.com/sluice-go/sluice"
)

// The JSON feed the page polls. Times are Unix milliseconds, durations and
// rates are in seconds and per second.

type feedJSON struct {
	Now      int64      `json:"now"`       // when the feed was made
	Sampled  int64      `json:"sampled"`   // the latest sample
	Interval float64    `json:"interval"`  // between samples
	History  float64    `json:"history"`   // how far back the history goes
	MaxLanes int        `json:"max_lanes"` // lanes shown at most
	Lanes    int        `json:"lanes"`     // lanes of the Transport at the latest sample
	Shown    []laneJSON `json:"shown"`     // the lanes shown, by key
}

type laneJSON struct {
	// ID tells the lane from every other, sub-limits included; Key is
	// its name (see sluice.LaneStats.Name), which may be another's.
	ID  string `json:"id"`
	Key string `json:"key"`
	// Figures now: from LaneStats at the request, but achieved, which is
	// the latest sample's.
	Achieved     float64 `json:"achieved"`
	Rate         float64 `json:"rate"`
	Ceiling      float64 `json:"ceiling"`
	InFlight     int     `json:"in_flight"`
	Limit        int     `json:"limit"`
	CooldownLeft float64 `json:"cooldown_left"`
	Latency      float64 `json:"latency"`
	Baseline     float64 `json:"baseline"`
	Saturated    bool    `json:"saturated"`
	// Counts since the lane was created.
	Throttled     uint64 `json:"throttled"`
	Cooldowns     uint64 `json:"cooldowns"`
	Retries       uint64 `json:"retries"`
	RetriesDenied uint64 `json:"retries_denied"`
	// Counts over the history kept (Recent seconds of it).
	RecentThrottled uint64  `json:"recent_throttled"`
	RecentCooldowns uint64  `json:"recent_cooldowns"`
	Recent          float64 `json:"recent"`

	Levels  []levelJSON `json:"levels"`
	History historyJSON `json:"history"`
}

type levelJSON struct {
	Name       string            `json:"name"`
	Queued     int               `json:"queued"`
	OldestWait float64           `json:"oldest_wait"`
	WaitP50    float64           `json:"wait_p50"`
	WaitP99    float64           `json:"wait_p99"`
	Granted    uint64            `json:"granted"`
	Cancelled  uint64            `json:"cancelled"`
	Throttled  uint64            `json:"throttled"`
	Refused    map[string]uint64 `json:"refused"`
	Tenants    int               `json:"tenants"`
}

// historyJSON holds the samples as columns, oldest first: with ?since=T,
// only those after T.
type historyJSON struct {
	T         []int64           `json:"t"`
	Achieved  []float64         `json:"achieved"`
	Rate      []float64         `json:"rate"`
	InFlight  []int             `json:"in_flight"`
	Limit     []int             `json:"limit"`
	Queued    [levels][]int     `json:"queued"`
	WaitP99   [levels][]float64 `json:"wait_p99"`
	Throttled []uint64          `json:"throttled"`
	Cooldowns []uint64          `json:"cooldowns"`
	Cooling   []bool            `json:"cooling"`
}

// round3 rounds a rate to a thousandth: enough for a chart, and a third of
// the bytes of a float64's shortest form.
func round3(x float64) float64 { return math.Round(x*1e3) / 1e3 }

// secs is d in seconds, to the microsecond.
func secs(d time.Duration) float64 { return math.Round(d.Seconds()*1e6) / 1e6 }

func ms(t time.Time) int64 { return t.UnixMilli() }

// feed builds the JSON feed. q's since (Unix ms) limits each history to the
// samples after it.
func (h *Handler) feed(q url.Values) feedJSON {
	since := int64(math.MinInt64)
	if s := q.Get("since"); s != "" {
		if n, err := strconv.ParseInt(s, 10, 64); err == nil { // a bad one sends everything
			since = n
		}
	}
	lanes, total, at := h.hist.snapshot(since, h.cfg.interval)
	now := h.now()
	f := feedJSON{
		Now:      ms(now),
		Sampled:  ms(at),
		Interval: h.cfg.interval.Seconds(),
		History:  (time.Duration(h.cfg.samples()) * h.cfg.interval).Seconds(),
		MaxLanes: h.cfg.maxLanes,
		Lanes:    total,
		Shown:    make([]laneJSON, 0, len(lanes)),
	}
	for _, lh := range lanes {
		// Live figures where the lane is still there; what the sampler saw
		// last where it was forgotten since.
		// A sub-limit has no live read.
		ls, ok := h.t.LaneStats(lh.id.Key)
		if !ok || lh.id.Sub != "" {
			ls = lh.last
		}
		f.Shown = append(f.Shown, laneFeed(now, lh, ls))
	}
	return f
}

func laneFeed(now time.Time, lh laneHistory, ls sluice.LaneStats) laneJSON {
	j := laneJSON{
		ID:            lh.id.String(),
		Key:           ls.Name(),
		Rate:          round3(ls.Rate),
		Ceiling:       round3(ls.Ceiling),
		InFlight:      ls.InFlight,
		Limit:         ls.Limit,
		Latency:       secs(ls.Latency),
		Baseline:      secs(ls.Baseline),
		Saturated:     ls.Saturated,
		Throttled:     ls.Throttled,
		Cooldowns:     ls.Cooldowns,
		Retries:       ls.Retries,
		RetriesDenied: ls.RetriesDenied,
		Levels:        make([]levelJSON, levels),
	}
	if left := ls.Cooldown.Sub(now); !ls.Cooldown.IsZero() && left > 0 {
		j.CooldownLeft = secs(left)
	}
	for p := range ls.Levels {
		lv := &ls.Levels[p]
		refused := make(map[string]uint64, len(lv.Refused))
		for r, n := range lv.Refused {
			refused[sluice.Reason(r).String()] = n
		}
		j.Levels[p] = levelJSON{
			Name:       sluice.Priority(p).String(),
			Queued:     lv.Queued,
			OldestWait: secs(lv.OldestWait),
			WaitP50:    secs(lv.WaitP50),
			WaitP99:    secs(lv.WaitP99),
			Granted:    lv.Granted,
			Cancelled:  lv.Cancelled,
			Throttled:  lv.Throttled,
			Refused:    refused,
			Tenants:    lv.Tenants,
		}
	}
	j.Achieved = round3(lh.achieved)
	j.RecentThrottled, j.RecentCooldowns = lh.throttled, lh.cooldowns
	j.Recent = lh.span.Seconds()
	// Empty columns, not null, when no sample is new.
	hj := &j.History
	hj.T, hj.Achieved, hj.Rate = []int64{}, []float64{}, []float64{}
	hj.InFlight, hj.Limit = []int{}, []int{}
	for l := range levels {
		hj.Queued[l], hj.WaitP99[l] = []int{}, []float64{}
	}
	hj.Throttled, hj.Cooldowns, hj.Cooling = []uint64{}, []uint64{}, []bool{}
	for _, p := range lh.pts {
		hj.T = append(hj.T, ms(p.at))
		hj.Achieved = append(hj.Achieved, round3(p.achieved))
		hj.Rate = append(hj.Rate, round3(p.rate))
		hj.InFlight = append(hj.InFlight, p.inFlight)
		hj.Limit = append(hj.Limit, p.limit)
		for l := range levels {
			hj.Queued[l] = append(hj.Queued[l], p.queued[l])
			hj.WaitP99[l] = append(hj.WaitP99[l], secs(p.waitP99[l]))
		}
		hj.Throttled = append(hj.Throttled, p.throttled)
		hj.Cooldowns = append(hj.Cooldowns, p.cooldowns)
		hj.Cooling = append(hj.Cooling, p.cooling)
	}
	return j
}
