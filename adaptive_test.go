package sluice

import (
	"context"
	"fmt"
	"github.com/sluice-go/sluice/internal/pace"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/internal/stats"
	"github.com/sluice-go/sluice/internal/upstream"
)

// load is a closed-loop load on one lane, through the real Transport and the
// test upstream: workers send as fast as the lane lets them, for dur of
// virtual time.
type load struct {
	opts    []Option
	up      upstream.Config
	latency func(elapsed time.Duration) time.Duration // service time by time since start
	workers int
	dur     time.Duration
	warm    time.Duration // in-flight is checked against the limit after warm
}

type laneSample struct {
	at time.Duration
	s  LaneStats
}

type loadResult struct {
	arrivals   []upstream.Arrival
	start      time.Time
	samples    []laneSample // every 100 ms
	rejected   int
	maxOut     int // most accepted requests in the upstream at once
	checked    int // sends checked against the limit
	violations int // sends with more in flight than the limit
	logs       int // debug records of limit changes
}

// checkBase checks, as each attempt enters it, that the lane has no more
// attempts in flight than its limit.
type checkBase struct {
	base   http.RoundTripper
	tr     *Transport
	after  time.Time
	mu     sync.Mutex
	n, bad int
}

func (c *checkBase) RoundTrip(req *http.Request) (*http.Response, error) {
	if time.Now().After(c.after) {
		s, _ := c.tr.LaneStats(req.URL.Host)
		over := s.InFlight > s.Limit
		c.mu.Lock()
		c.n++
		if over {
			c.bad++
		}
		c.mu.Unlock()
	}
	return c.base.RoundTrip(req)
}

// countHandler counts debug records of in-flight limit changes.
type countHandler struct{ n *atomic.Int64 }

func (h countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "in-flight limit changed") {
		h.n.Add(1)
	}
	return nil
}
func (h countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countHandler) WithGroup(string) slog.Handler      { return h }

// run runs the load; it must be called inside a synctest bubble.
func (ld load) run(t *testing.T) loadResult {
	var res loadResult
	res.start = time.Now()
	cfg := ld.up
	if ld.latency != nil {
		cfg.Latency = func(int, *http.Request) time.Duration { return ld.latency(time.Since(res.start)) }
	}
	srv := upstream.New(cfg)
	defer srv.Close()
	u, _ := url.Parse(srv.URL())
	cb := &checkBase{base: srv.Transport(), after: res.start.Add(ld.warm)}
	var logs atomic.Int64
	opts := append([]Option{WithRetry(0), WithLogger(slog.New(countHandler{&logs}))}, ld.opts...)
	tr := mustNew(t, cb, opts...)
	cb.tr = tr

	// A deadline would make the lane refuse requests it cannot serve in
	// time, at once, and the workers spin: cancel at dur instead.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	time.AfterFunc(ld.dur, cancel)
	var wg sync.WaitGroup
	for range ld.workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL()+"/x", nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	wg.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				s, _ := tr.Stats().Lane(u.Host)
				res.samples = append(res.samples, laneSample{time.Since(res.start), s})
			}
		}
	})
	wg.Wait()
	res.arrivals = srv.Arrivals()
	_, res.rejected = srv.Counts()
	res.maxOut = srv.MaxOutstanding()
	res.checked, res.violations = cb.n, cb.bad
	res.logs = int(logs.Load())
	return res
}

// rate returns accepted arrivals per second in [from, to).
func (r loadResult) rate(from, to time.Duration) float64 {
	n := 0
	for _, a := range r.arrivals {
		if d := a.At.Sub(r.start); a.Accepted && d >= from && d < to {
			n++
		}
	}
	return float64(n) / (to - from).Seconds()
}

// doneRate returns responses written per second in [from, to).
func (r loadResult) doneRate(from, to time.Duration) float64 {
	n := 0
	for _, a := range r.arrivals {
		if d := a.Done.Sub(r.start); a.Status == http.StatusOK && d >= from && d < to {
			n++
		}
	}
	return float64(n) / (to - from).Seconds()
}

// at returns the last stats sample taken at or before d.
func (r loadResult) at(d time.Duration) LaneStats {
	var s LaneStats
	for _, x := range r.samples {
		if x.at > d {
			break
		}
		s = x.s
	}
	return s
}

// limits returns the mean and the largest limit sampled in [from, to).
func (r loadResult) limits(from, to time.Duration) (mean float64, most int) {
	n := 0
	for _, x := range r.samples {
		if x.at >= from && x.at < to {
			mean += float64(x.s.Limit)
			most = max(most, x.s.Limit)
			n++
		}
	}
	return mean / float64(max(n, 1)), most
}

// latencies returns the client-seen latency quantile q (send to response
// written) of the accepted requests that arrived in [from, to).
func (r loadResult) latency(from, to time.Duration, q float64) time.Duration {
	var ds []time.Duration
	for _, a := range r.arrivals {
		if d := a.At.Sub(r.start); a.Accepted && !a.Done.IsZero() && d >= from && d < to {
			ds = append(ds, a.Done.Sub(a.At))
		}
	}
	return stats.Quantile(ds, q)
}

// timeline formats one row per second: sent/s over λ, limit, in flight,
// smoothed latency and baseline at the end of the second.
func (r loadResult) timeline(lambda float64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%6s %8s %6s %9s %9s %9s %4s\n", "t", "sent/λ", "limit", "in flight", "latency", "baseline", "sat")
	for s := time.Duration(0); s < r.samples[len(r.samples)-1].at; s += time.Second {
		st := r.at(s + time.Second - 1)
		sat := ""
		if st.Saturated {
			sat = "yes"
		}
		fmt.Fprintf(&b, "%5ds %8.3f %6d %9d %9v %9v %4s\n", int(s/time.Second), r.rate(s, s+time.Second)/lambda,
			st.Limit, st.InFlight, st.Latency.Round(time.Millisecond), st.Baseline.Round(time.Millisecond), sat)
	}
	return b.String()
}

func fixedLatency(d time.Duration) func(time.Duration) time.Duration {
	return func(time.Duration) time.Duration { return d }
}

// shift returns a latency of before until at, then after.
func shift(before time.Duration, at time.Duration, after time.Duration) func(time.Duration) time.Duration {
	return func(el time.Duration) time.Duration {
		if el < at {
			return before
		}
		return after
	}
}

// TestAdaptiveLittleTable reproduces the table of seeds/004: 500 requests a
// minute at four latencies. The limit settles at ceil(1.1·λ·W), the rate
// stays the binding constraint (>= 98% of λ), and no attempt is sent with
// more in flight than the limit. 800 ms with 0.8 headroom gives 5-6.
func TestAdaptiveLittleTable(t *testing.T) {
	rows := []struct {
		latency  time.Duration
		headroom float64
	}{
		{250 * time.Millisecond, 1},
		{800 * time.Millisecond, 1},
		{2500 * time.Millisecond, 1},
		{9 * time.Second, 1},
		{800 * time.Millisecond, 0.8},
	}
	var table strings.Builder
	fmt.Fprintf(&table, "\n500/min, strict upstream\n%9s %8s %6s %8s %6s %8s %10s %8s %5s\n",
		"latency", "headroom", "λ/s", "λ·W", "limit", "sent/λ", "max in fl", "checked", "429s")
	for _, row := range rows {
		lambda := 500.0 / 60 * row.headroom
		lw := lambda * row.latency.Seconds()
		dur := max(60*time.Second, 10*row.latency)
		var res loadResult
		synctest.Test(t, func(t *testing.T) {
			res = load{
				opts:    []Option{WithRate(500, time.Minute), WithHeadroom(row.headroom)},
				up:      upstream.Config{Rate: 500.0 / 60, Burst: 1},
				latency: fixedLatency(row.latency),
				workers: 150,
				dur:     dur,
				warm:    2*row.latency + 5*time.Second,
			}.run(t)
		})
		final := res.at(dur).Limit
		got := res.rate(0, dur) / lambda
		fmt.Fprintf(&table, "%9v %8.1f %6.2f %8.2f %6d %8.3f %10d %8d %5d\n",
			row.latency, row.headroom, lambda, lw, final, got, res.maxOut, res.checked, res.rejected)
		if lo, hi := int(math.Ceil(lw)), int(math.Ceil(1.1*lw))+1; final < lo || final > hi {
			t.Errorf("%v: limit %d, want in [%d, %d] (λ·W = %.2f)", row.latency, final, lo, hi, lw)
		}
		if row.headroom == 0.8 && (final < 5 || final > 6) {
			t.Errorf("%v at headroom 0.8: limit %d, want 5-6", row.latency, final)
		}
		if got < 0.98 {
			t.Errorf("%v: throughput %.3f of λ, want >= 0.98", row.latency, got)
		}
		if res.violations > 0 || res.checked == 0 {
			t.Errorf("%v: %d of %d sends had more in flight than the limit", row.latency, res.violations, res.checked)
		}
		if res.rejected > 0 {
			t.Errorf("%v: %d requests refused by the upstream", row.latency, res.rejected)
		}
		if s := res.at(dur); s.Latency != row.latency || s.Baseline != row.latency {
			t.Errorf("%v: stats latency %v baseline %v", row.latency, s.Latency, s.Baseline)
		}
	}
	t.Log(table.String())
}

// TestAdaptiveLatencyShift: R = 50/s against a strict upstream that serves
// every call in parallel, latency 400 ms for 6 s then 40 ms, and the
// reverse. The adaptive limit keeps the rate binding in both phases; a fixed
// semaphore of 16, sized for neither, caps the 400 ms phase at 16/0.4 s =
// 40/s.
func TestAdaptiveLatencyShift(t *testing.T) {
	const r = 50.0
	const at, dur = 6 * time.Second, 12 * time.Second
	slow, fast := 400*time.Millisecond, 40*time.Millisecond
	var summary strings.Builder
	fmt.Fprintf(&summary, "\nR = 50/s, strict upstream; sent/R per phase (phase 2 also from shift+1s and shift+2s)\n%-22s %-9s %8s %8s %8s %8s %6s %5s\n",
		"latency", "limit", "phase 1", "phase 2", "2: +1s", "2: +2s", "limit", "429s")
	for _, sc := range []struct {
		name          string
		before, after time.Duration
	}{
		{"400ms then 40ms", slow, fast},
		{"40ms then 400ms", fast, slow},
	} {
		for _, fixed := range []bool{false, true} {
			opts := []Option{WithRate(r, time.Second)}
			name := "adaptive"
			if fixed {
				opts = append(opts, WithConcurrency(16, 16))
				name = "fixed 16"
			}
			var res loadResult
			synctest.Test(t, func(t *testing.T) {
				res = load{
					opts:    opts,
					up:      upstream.Config{Rate: r, Burst: 1},
					latency: shift(sc.before, at, sc.after),
					workers: 100,
					dur:     dur,
				}.run(t)
			})
			p1, p2 := res.rate(0, at)/r, res.rate(at, dur)/r
			p2a, p2b := res.rate(at+time.Second, dur)/r, res.rate(at+2*time.Second, dur)/r
			final := res.at(dur).Limit
			fmt.Fprintf(&summary, "%-22s %-9s %8.3f %8.3f %8.3f %8.3f %6d %5d\n", sc.name, name, p1, p2, p2a, p2b, final, res.rejected)
			if !fixed {
				t.Logf("%s, adaptive: per second\n%s", sc.name, res.timeline(r))
			}
			if res.rejected > 0 {
				t.Errorf("%s, %s: %d requests refused by the upstream", sc.name, name, res.rejected)
			}
			if w := upstream.MaxInWindow(upstream.Times(res.arrivals), time.Second); w > int(r) {
				t.Errorf("%s, %s: %d sent within one second, over R", sc.name, name, w)
			}
			if fixed {
				// The comparison must be real: 16 slots at 400 ms are 40/s.
				if slowPhase := min(p1, p2); slowPhase > 0.85 {
					t.Errorf("%s, fixed 16: slow phase at %.3f R, expected the semaphore to bind", sc.name, slowPhase)
				}
				continue
			}
			if p1 < 0.95 {
				t.Errorf("%s: phase 1 at %.3f R, want >= 0.95", sc.name, p1)
			}
			if p2b < 0.95 {
				t.Errorf("%s: phase 2 from shift+2s at %.3f R, want >= 0.95", sc.name, p2b)
			}
			// Per second, from 5 s after the shift at the latest.
			for s := at + 5*time.Second; s < dur; s += time.Second {
				if x := res.rate(s, s+time.Second) / r; x < 0.95 {
					t.Errorf("%s: %v-%v at %.3f R, want >= 0.95", sc.name, s, s+time.Second, x)
				}
			}
			need := int(math.Ceil(r * sc.after.Seconds()))
			if final < need || final > 2*need+2 {
				t.Errorf("%s: final limit %d, want near λ·W = %d", sc.name, final, need)
			}
			if sc.after < sc.before {
				// The limit follows latency down within a few seconds.
				if l := res.at(at + 3*time.Second).Limit; l > 2*need+2 {
					t.Errorf("%s: limit %d 3 s after the shift, want near %d", sc.name, l, need)
				}
			}
			if res.logs == 0 {
				t.Errorf("%s: no limit change logged", sc.name)
			}
			for _, x := range res.samples {
				if x.s.Saturated {
					t.Errorf("%s: reported saturated at %v; the upstream serves every call in parallel", sc.name, x.at)
					break
				}
			}
		}
	}
	t.Log(summary.String())
}

// TestAdaptiveSaturation: the upstream serves at most K calls at a time
// and queues the rest, and its capacity K/service is under the lane's rate.
// Little's law alone would follow the queue's latency up to the maximum
// limit (shown by a limit pinned there); the gradient holds the limit near
// K, at about the same throughput and a fraction of the latency. The runs
// last a minute so that a baseline drifting up with the queue would show.
func TestAdaptiveSaturation(t *testing.T) {
	const dur = 60 * time.Second
	var summary strings.Builder
	fmt.Fprintf(&summary, "\nupstream serves K at a time and queues the rest; over the last 50 s\n%-28s %-9s %8s %10s %9s %9s %9s %9s %9s\n",
		"scenario", "limit", "done/cap", "mean limit", "max limit", "p50 lat", "p99 lat", "baseline", "max queue")
	for _, sc := range []struct {
		r       float64
		k       int
		service time.Duration
	}{
		{50, 4, 100 * time.Millisecond},
		{100, 16, 200 * time.Millisecond},
	} {
		capacity := float64(sc.k) / sc.service.Seconds()
		name := fmt.Sprintf("R %.0f/s, K %d x %v (%.0f/s)", sc.r, sc.k, sc.service, capacity)
		for _, fixed := range []bool{false, true} {
			opts := []Option{WithRate(int(sc.r), time.Second)}
			limit := "adaptive"
			if fixed {
				opts = append(opts, WithConcurrency(DefaultMaxConcurrency, DefaultMaxConcurrency))
				limit = "fixed 256"
			}
			var res loadResult
			synctest.Test(t, func(t *testing.T) {
				res = load{
					opts:    opts,
					up:      upstream.Config{MaxConcurrent: sc.k},
					latency: fixedLatency(sc.service),
					workers: 300,
					dur:     dur,
				}.run(t)
			})
			from := 10 * time.Second
			x := res.doneRate(from, dur) / capacity
			mean, most := res.limits(from, dur)
			p50, p99 := res.latency(from, dur-5*time.Second, 0.5), res.latency(from, dur-5*time.Second, 0.99)
			base := res.at(dur).Baseline
			fmt.Fprintf(&summary, "%-28s %-9s %8.3f %10.1f %9d %9v %9v %9v %9d\n", name, limit, x, mean, most,
				p50.Round(time.Millisecond), p99.Round(time.Millisecond), base.Round(time.Millisecond), res.maxOut-sc.k)
			if fixed {
				if p50 < 10*sc.service {
					t.Errorf("%s, fixed: p50 latency %v; expected the queue to build", name, p50)
				}
				continue
			}
			t.Logf("%s, adaptive, per second (first 20 s)\n%s", name,
				strings.Join(strings.SplitAfterN(res.timeline(capacity), "\n", 22)[:21], ""))
			if x < 0.85 {
				t.Errorf("%s: throughput %.3f of capacity, want >= 0.85", name, x)
			}
			if mean > 1.5*float64(sc.k) || most > 2*sc.k {
				t.Errorf("%s: limit mean %.1f max %d, want near K = %d", name, mean, most, sc.k)
			}
			if p50 > sc.service*3/2 {
				t.Errorf("%s: p50 latency %v, want under 1.5x service time %v", name, p50, sc.service)
			}
			if base > sc.service*5/4 {
				t.Errorf("%s: baseline %v after %v (service %v)", name, base, dur, sc.service)
			}
			if !res.at(dur).Saturated {
				t.Errorf("%s: stats do not report the lane saturated", name)
			}
		}
	}
	t.Log(summary.String())
}

// TestAdaptiveUnpaced: with no rate, slow start and the gradient set the
// limit. An upstream that serves everything in parallel lets it grow to the
// maximum while requests wait; one that serves K at a time holds it near K.
func TestAdaptiveUnpaced(t *testing.T) {
	const dur = 40 * time.Second
	const service = 100 * time.Millisecond
	var summary strings.Builder
	fmt.Fprintf(&summary, "\nno rate, WithConcurrency(1, 64), %v calls; over the last 20 s\n%-14s %8s %10s %9s %9s %9s\n",
		service, "upstream", "done/s", "mean limit", "max limit", "p50 lat", "baseline")
	for _, k := range []int{0, 8} {
		var res loadResult
		synctest.Test(t, func(t *testing.T) {
			res = load{
				opts:    []Option{WithConcurrency(1, 64)},
				up:      upstream.Config{MaxConcurrent: k},
				latency: fixedLatency(service),
				workers: 100,
				dur:     dur,
			}.run(t)
		})
		from := dur - 20*time.Second
		mean, most := res.limits(from, dur)
		p50 := res.latency(from, dur-time.Second, 0.5)
		name := "parallel"
		if k > 0 {
			name = fmt.Sprintf("K = %d", k)
		}
		fmt.Fprintf(&summary, "%-14s %8.1f %10.1f %9d %9v %9v\n", name, res.doneRate(from, dur), mean, most,
			p50.Round(time.Millisecond), res.at(dur).Baseline.Round(time.Millisecond))
		// From initialUnpaced, slow start at most doubles the limit in the
		// first round trip (the first sample is taken at its end).
		if first := res.samples[0].s; first.Limit < initialUnpaced || first.Limit > 2*initialUnpaced {
			t.Errorf("%s: first limit %d, want %d to %d", name, first.Limit, initialUnpaced, 2*initialUnpaced)
		}
		if k == 0 {
			if mean < 64 {
				t.Errorf("%s: limit mean %.1f, want 64 (the maximum)", name, mean)
			}
			continue
		}
		t.Logf("%s, per second (first 20 s)\n%s", name,
			strings.Join(strings.SplitAfterN(res.timeline(float64(k)/service.Seconds()), "\n", 22)[:21], ""))
		if mean > 1.5*float64(k) || most > 2*k || mean < 0.75*float64(k) {
			t.Errorf("%s: limit mean %.1f max %d, want near %d", name, mean, most, k)
		}
		if x := res.doneRate(from, dur) / (float64(k) / service.Seconds()); x < 0.85 {
			t.Errorf("%s: throughput %.3f of capacity, want >= 0.85", name, x)
		}
	}
	t.Log(summary.String())
}

// TestLimitResizeLive: raising the limit grants waiters in priority order,
// one per new slot; lowering it cancels nothing, and no grant is made until
// in-flight work has drained under the new limit.
func TestLimitResizeLive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{latency: time.Hour}
		tr := mustNew(t, base, WithConcurrency(1, 8))
		l := tr.lane("api.test")
		setLimit := func(n int) { pinLimit(l, n) } // no completion moves it
		setLimit(1)
		var wg sync.WaitGroup
		stop := map[string]context.CancelFunc{}
		send := func(p Priority, class string) {
			ctx, cancel := context.WithCancel(t.Context())
			stop[class] = cancel
			wg.Go(func() { get(WithPriority(ctx, p), tr, class) })
			synctest.Wait()
		}
		sent := func() []string {
			base.mu.Lock()
			defer base.mu.Unlock()
			var cs []string
			for _, a := range base.arrivals {
				cs = append(cs, a.class)
			}
			return cs
		}
		send(Normal, "first")
		send(Batch, "batch")
		send(Normal, "normal")
		send(Interactive, "interactive")
		for n, want := range []string{"interactive", "normal", "batch"} {
			setLimit(n + 2)
			synctest.Wait()
			if got := sent(); len(got) != n+2 || got[n+1] != want {
				t.Fatalf("limit %d: sent %v, want %s next", n+2, got, want)
			}
		}
		// Lower to 2 with 4 in flight: nothing is cancelled, and the next
		// request goes out only once two of the four have finished.
		setLimit(2)
		send(Interactive, "late")
		for i, class := range []string{"first", "batch", "normal"} {
			if s, _ := tr.Stats().Lane("api.test"); s.InFlight != 4-i || len(sent()) != 4 {
				t.Fatalf("limit 2: %d in flight, sent %v; want %d in flight and nothing new", s.InFlight, sent(), 4-i)
			}
			stop[class]() // this one's attempt ends (with an error) and frees its slot
			synctest.Wait()
			if i < 2 && len(sent()) != 4 {
				t.Fatalf("sent %v with %d in flight and a limit of 2", sent(), 3-i)
			}
		}
		if got := sent(); len(got) != 5 || got[4] != "late" {
			t.Errorf("sent %v, want late last once the lane drained under the limit", got)
		}
		for _, cancel := range stop {
			cancel()
		}
		wg.Wait()
	})
}

// TestAdaptiveJitter: latencies spread uniformly over [W/2, 3W/2] (and a
// heavy tail: 5% of calls take 4W). The limit allows for the spread, so the
// rate stays binding, and the spread is not mistaken for queueing. The
// upstream enforces no rate: a strict one at exactly R refuses a send that
// float rounding puts a nanosecond early, and the lane's answer to a 429
// (a cooldown) would hide what this measures.
func TestAdaptiveJitter(t *testing.T) {
	const r = 50.0
	const dur = 30 * time.Second
	var summary strings.Builder
	fmt.Fprintf(&summary, "\nR = 50/s, jittered latency; after 5 s\n%-22s %8s %10s %9s %9s %9s %6s\n", "latency", "sent/R", "mean limit", "max limit", "λ·W", "saturated", "429s")
	for _, w := range []time.Duration{40 * time.Millisecond, 400 * time.Millisecond} {
		for _, tail := range []bool{false, true} {
			var n atomic.Uint64
			lat := func(time.Duration) time.Duration {
				// A fixed-seed LCG: deterministic, and no lock (the
				// upstream calls this from many goroutines).
				x := n.Add(1) * 6364136223846793005
				u := float64(x>>11) / (1 << 53)
				if tail && x>>8%20 == 0 {
					return 4 * w
				}
				return time.Duration(float64(w) * (0.5 + u))
			}
			var res loadResult
			synctest.Test(t, func(t *testing.T) {
				res = load{
					opts:    []Option{WithRate(r, time.Second)},
					up:      upstream.Config{}, // see the comment above
					latency: lat,
					workers: 150,
					dur:     dur,
				}.run(t)
			})
			from := 5 * time.Second
			x := res.rate(from, dur) / r
			mean, most := res.limits(from, dur)
			sat := 0
			for _, s := range res.samples {
				if s.s.Saturated {
					sat++
				}
			}
			name := fmt.Sprintf("%v ±50%%", w)
			if tail {
				name += ", 5% at 4x"
			}
			fmt.Fprintf(&summary, "%-22s %8.3f %10.1f %9d %9.1f %9d %6d\n", name, x, mean, most, r*w.Seconds(), sat, res.rejected)
			if x < 0.98 {
				t.Errorf("%s: throughput %.3f of R, want >= 0.98", name, x)
			}
			if sat > 0 {
				t.Errorf("%s: reported saturated in %d samples", name, sat)
			}
		}
	}
	t.Log(summary.String())
}

// TestTimeNextSamples: below sampleAbove requests a second every attempt is
// timed; above it, one in sampleEvery, and at least one every sampleGap, so
// that a lane paced fast but used little still times every attempt.
func TestTimeNextSamples(t *testing.T) {
	for _, tc := range []struct {
		name    string
		rate    float64
		spacing time.Duration // between grants
		want    int           // timed of 800
	}{
		{"unpaced", 0, 0, 800},
		{"slow lane", sampleAbove - 1, 0, 800},
		{"fast lane, grants at once", sampleAbove, 0, 800 / sampleEvery},
		{"fast lane, grants at once ", 1e9, 0, 800 / sampleEvery},
		{"fast lane, a grant every 200µs", 1e9, 200 * time.Microsecond, 800 / 5},
		{"fast lane, used little", 1e9, 2 * sampleGap, 800},
	} {
		l := &lane{pace: pace.New(tc.rate, 1, time.Minute, true, 0)}
		got := 0
		for i := range 800 {
			if l.timeNextLocked(time.Hour + time.Duration(i)*tc.spacing) {
				got++
			}
		}
		if got != tc.want {
			t.Errorf("%s: %d of 800 timed, want %d", tc.name, got, tc.want)
		}
	}
}

// TestSampledLaneFollowsSlowerCalls: at 4,000/s, where attempts are
// sampled, calls that get three times slower are answered by three times
// the concurrency, and the lane keeps its rate in both phases; it is never
// taken for saturated.
func TestSampledLaneFollowsSlowerCalls(t *testing.T) {
	const r = 4000.0
	const at, dur = 3 * time.Second, 6 * time.Second
	var res loadResult
	synctest.Test(t, func(t *testing.T) {
		res = load{
			opts:    []Option{WithRate(r, time.Second), WithConcurrency(1, 2000)},
			latency: shift(40*time.Millisecond, at, 120*time.Millisecond),
			workers: 1500,
			dur:     dur,
		}.run(t)
	})
	for _, sm := range res.samples {
		if sm.s.Saturated {
			t.Fatalf("at %v the lane was taken for saturated (limit %d)", sm.at, sm.s.Limit)
		}
	}
	for _, span := range [][2]time.Duration{{time.Second, at}, {at, dur}} {
		if got := res.rate(span[0], span[1]) / r; got < 0.97 {
			t.Errorf("from %v to %v: %.3f of the rate, want >= 0.97", span[0], span[1], got)
		}
	}
}

// TestSampledLaneStillLearns: a lane at 4,000/s times one release in eight,
// yet its latency is the calls' (40 ms), its limit is Little's law's, and
// every response, timed or not, is counted for feedback.
func TestSampledLaneStillLearns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{latency: 40 * time.Millisecond}
		tr := mustNew(t, base, WithRate(4000, time.Second), WithConcurrency(1, 1000))
		const workers, each = 200, 10
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for range each {
					if err := get(context.Background(), tr, ""); err != nil {
						t.Error(err)
					}
				}
			})
		}
		wg.Wait()
		l := tr.lane("api.test")
		l.lock()
		accepted := l.pace.Accepted(l.clk.tick())
		l.unlock()
		if accepted != workers*each {
			t.Errorf("feedback counted %d responses, want %d", accepted, workers*each)
		}
		s := tr.Stats().Lanes[0]
		if s.Latency != base.latency {
			t.Errorf("latency %v, want %v", s.Latency, base.latency)
		}
		// ceil(1.1 · 4000 · 0.04) = 176 with no deviation.
		if s.Limit != 176 {
			t.Errorf("limit %d, want 176", s.Limit)
		}
	})
}

// TestAdaptiveRareSlowCalls: one call in twenty takes 30 s, the others
// 200 ms, and 60 callers keep a lane at 10/s backed up. By Little's law
// about 17 calls are in flight at the rate; a limit sized by the recent
// latency alone left the slow calls every slot, and the lane served half
// its rate. It serves its rate.
func TestAdaptiveRareSlowCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n, served atomic.Int64
		base := rtFunc(func(req *http.Request) (*http.Response, error) {
			d := 200 * time.Millisecond
			if n.Add(1)%20 == 0 {
				d = 30 * time.Second
			}
			time.Sleep(d)
			served.Add(1)
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), Request: req}, nil
		})
		tr := mustNew(t, base, WithRetry(0), WithRate(600, time.Minute))
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		for range 60 {
			wg.Go(func() {
				for ctx.Err() == nil {
					get(ctx, tr, "")
				}
			})
		}
		time.Sleep(time.Minute) // the slow calls' first round
		from := served.Load()
		const d = 4 * time.Minute
		time.Sleep(d)
		got := float64(served.Load()-from) / d.Seconds()
		cancel()
		wg.Wait()
		s, _ := tr.Stats().Lane("api.test")
		t.Logf("served %.2f/s of 10/s; limit %d", got, s.Limit)
		if got < 9 {
			t.Errorf("served %.2f/s, want the rate (10/s) within 10%%", got)
		}
	})
}
