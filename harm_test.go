package sluice

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/internal/upstream"
)

// The servers of the do-no-harm tests, in virtual time: each enforces its
// limit as a real middleware does and sends that middleware's headers (see
// bench/middleware.go for the real packages these stand for).

// fixedWindow is a window of limit requests per per that refills all at
// once, its first window starting at the first request: ulule/limiter's
// memory store (each window starting at the first request after the last
// one ended, reset the Unix time the window ends, truncated to the
// second, and no Retry-After) or, with date set, sethvargo/go-limiter's
// memorystore (reset and Retry-After the window's end as time.RFC1123 in
// UTC).
type fixedWindow struct {
	limit int
	per   time.Duration
	date  bool

	mu    sync.Mutex
	start time.Time
	n     int
}

func (w *fixedWindow) Rate() float64 { return float64(w.limit) / w.per.Seconds() }

func (w *fixedWindow) Admit(now time.Time, _ *http.Request) upstream.Decision {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.start.IsZero() || now.Sub(w.start) >= w.per {
		if w.start.IsZero() {
			w.start = now
		}
		for now.Sub(w.start) >= w.per {
			w.start = w.start.Add(w.per)
		}
		if !w.date {
			// ulule's memory store starts a window at the first
			// request after the last one expired.
			w.start = now
		}
		w.n = 0
	}
	end := w.start.Add(w.per)
	ok := w.n < w.limit
	if ok {
		w.n++
	}
	h := http.Header{}
	h.Set("X-RateLimit-Limit", strconv.Itoa(w.limit))
	h.Set("X-RateLimit-Remaining", strconv.Itoa(w.limit-w.n))
	if w.date {
		d := end.UTC().Format(time.RFC1123)
		h.Set("X-RateLimit-Reset", d)
		if !ok {
			h.Set("Retry-After", d)
		}
	} else {
		h.Set("X-RateLimit-Reset", strconv.FormatInt(end.Unix(), 10))
	}
	return upstream.Decision{Accepted: ok, Header: h}
}

// draftWindow is express-rate-limit's memory store with its standard
// headers: a fixed window of limit requests per per on a grid set a third
// of a window before the first request, RateLimit-Limit, -Remaining and
// -Reset (draft-07: whole seconds until the window's end, rounded up, so
// "1" all through a window of a second) and, on a refusal, Retry-After the
// same.
type draftWindow struct {
	limit int
	per   time.Duration

	mu    sync.Mutex
	start time.Time
	idx   int64
	n     int
}

func (w *draftWindow) Rate() float64 { return float64(w.limit) / w.per.Seconds() }

func (w *draftWindow) Admit(now time.Time, _ *http.Request) upstream.Decision {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.start.IsZero() {
		w.start = now.Add(-w.per / 3)
	}
	if idx := int64(now.Sub(w.start) / w.per); idx != w.idx {
		w.idx, w.n = idx, 0
	}
	end := w.start.Add(time.Duration(w.idx+1) * w.per)
	ok := w.n < w.limit
	if ok {
		w.n++
	}
	reset := strconv.FormatInt(int64(math.Ceil(end.Sub(now).Seconds())), 10)
	h := http.Header{}
	h.Set("RateLimit-Limit", strconv.Itoa(w.limit))
	h.Set("RateLimit-Remaining", strconv.Itoa(w.limit-w.n))
	h.Set("RateLimit-Reset", reset)
	if !ok {
		h.Set("Retry-After", reset)
	}
	return upstream.Decision{Accepted: ok, Header: h}
}

// gcraStyle names the headers a gcra sends.
type gcraStyle int

const (
	// throttled's: X-RateLimit-Limit the burst, -Remaining, -Reset whole
	// seconds until full, rounded up.
	styleThrottled gcraStyle = iota
	// redis_rate's, as its README's handler sends them: X-RateLimit-Limit
	// the rate, -Remaining, -Reset the Unix time it is full, rounded up.
	styleRedisRate
	// both families: IETF RateLimit-Policy and RateLimit (t whole seconds
	// until full, rounded up) and X-RateLimit-* as styleRedisRate.
	styleBoth
)

// gcra is a GCRA of rate requests a second and burst, that refuses with
// 429 and Retry-After in whole seconds, rounded up, and sends style's
// headers on every response.
type gcra struct {
	rate, burst int
	style       gcraStyle

	mu  sync.Mutex
	tat time.Time
}

func (g *gcra) Rate() float64 { return float64(g.rate) }

func (g *gcra) Admit(now time.Time, _ *http.Request) upstream.Decision {
	g.mu.Lock()
	defer g.mu.Unlock()
	T := time.Second / time.Duration(g.rate)
	tol := time.Duration(g.burst-1) * T
	tat := g.tat
	if tat.Before(now) {
		tat = now
	}
	ok := !now.Before(tat.Add(-tol))
	var resetAfter, retryAfter time.Duration
	if ok {
		g.tat = tat.Add(T)
		resetAfter = g.tat.Sub(now)
	} else {
		resetAfter = tat.Sub(now)
		retryAfter = tat.Add(-tol).Sub(now)
	}
	remaining := max(0, int((time.Duration(g.burst)*T-resetAfter)/T))
	ceil := func(d time.Duration) string { return strconv.FormatInt(int64(math.Ceil(d.Seconds())), 10) }
	epoch := strconv.FormatInt(int64(math.Ceil(float64(now.Add(resetAfter).UnixNano())/1e9)), 10)
	h := http.Header{}
	switch g.style {
	case styleThrottled:
		h.Set("X-RateLimit-Limit", strconv.Itoa(g.burst))
		h.Set("X-RateLimit-Remaining", strconv.Itoa(remaining))
		h.Set("X-RateLimit-Reset", ceil(resetAfter))
	case styleRedisRate, styleBoth:
		h.Set("X-RateLimit-Limit", strconv.Itoa(g.rate))
		h.Set("X-RateLimit-Remaining", strconv.Itoa(remaining))
		h.Set("X-RateLimit-Reset", epoch)
		if g.style == styleBoth {
			h.Set("RateLimit-Policy", `"default";q=`+strconv.Itoa(g.rate)+`;w=1`)
			h.Set("RateLimit", `"default";r=`+strconv.Itoa(remaining)+`;t=`+ceil(resetAfter))
		}
	}
	if !ok {
		h.Set("Retry-After", ceil(retryAfter))
	}
	return upstream.Decision{Accepted: ok, Header: h}
}

// stripLimits is a base RoundTripper that removes every rate-limit field
// from base's responses, keeping the status and Retry-After: what a lane
// that ignores the headers sees.
type stripLimits struct{ base http.RoundTripper }

func (s stripLimits) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := s.base.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	for k := range resp.Header {
		l := strings.ToLower(k)
		if strings.HasPrefix(l, "x-ratelimit") || strings.HasPrefix(l, "x-rate-limit") || strings.HasPrefix(l, "ratelimit") {
			delete(resp.Header, k)
		}
	}
	return resp, nil
}

// harmRun is one lane against one server in virtual time: callers in a
// closed loop, 20 ms service time.
type harmRun struct {
	half, whole float64 // accepted/s ÷ the server's rate: second half, whole run
	refused     float64 // share of attempts refused, second half
	perSecond   []int   // accepted in each second of the run
}

// add adds a run's shares to r, as one of n.
func (r *harmRun) add(a harmRun, n uint64) {
	r.half += a.half / float64(n)
	r.whole += a.whole / float64(n)
	r.refused += a.refused / float64(n)
}

func (r harmRun) String() string {
	return fmt.Sprintf("%.2f, %.1f%% (whole %.2f)", r.half, 100*r.refused, r.whole)
}

// jittered delays each request on its way to base by up to max, drawn
// from a fixed sequence: what a loaded host and its loopback add between
// a grant and the server's clock read.
type jittered struct {
	base http.RoundTripper
	max  time.Duration
	mu   sync.Mutex
	rng  *rand.Rand
}

func (j *jittered) RoundTrip(r *http.Request) (*http.Response, error) {
	j.mu.Lock()
	d := time.Duration(j.rng.Int64N(int64(j.max)))
	j.mu.Unlock()
	time.Sleep(d)
	return j.base.RoundTrip(r)
}

// runHarm runs callers in a closed loop against mod for dur from a cold
// lane made with opts, its base stripping the rate-limit headers if strip
// says so and delaying each request by up to jitter (drawn from seed). The
// run starts phase after a whole second of the Unix clock.
func runHarm(t *testing.T, mod upstream.Model, callers int, jitter time.Duration, seed uint64, phase, dur time.Duration, strip bool, opts ...Option) harmRun {
	var res harmRun
	synctest.Test(t, func(t *testing.T) {
		// Past the 1e9 seconds that tell a Unix time from a delay.
		time.Sleep(time.Until(time.Unix(1_700_000_000, int64(phase))))
		srv := upstream.New(upstream.Config{Limiter: mod, Latency: func(int, *http.Request) time.Duration { return 20 * time.Millisecond }})
		defer srv.Close()
		var base http.RoundTripper = srv.Transport()
		if jitter > 0 {
			base = &jittered{base: base, max: jitter, rng: rand.New(rand.NewPCG(seed, 2))}
		}
		if strip {
			base = stripLimits{base}
		}
		tr := mustNew(t, base, opts...)
		start := time.Now()
		ctx, cancel := context.WithTimeout(t.Context(), dur)
		defer cancel()
		var wg sync.WaitGroup
		for range callers {
			wg.Go(func() {
				for ctx.Err() == nil {
					req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL()+"/", nil)
					resp, err := tr.RoundTrip(req)
					if err != nil {
						pause(ctx)
						continue
					}
					resp.Body.Close()
				}
			})
		}
		wg.Wait()
		res.perSecond = make([]int, int(dur/time.Second))
		var acc, ref, all int
		for _, a := range srv.Arrivals() {
			at := a.At.Sub(start)
			if a.Accepted {
				all++
				if s := int(at / time.Second); s < len(res.perSecond) {
					res.perSecond[s]++
				}
			}
			if at < dur/2 {
				continue
			}
			if a.Accepted {
				acc++
			} else {
				ref++
			}
		}
		res.half = float64(acc) / (dur / 2).Seconds() / mod.Rate()
		res.whole = float64(all) / dur.Seconds() / mod.Rate()
		res.refused = float64(ref) / float64(max(1, acc+ref))
	})
	return res
}

// harmServers are the servers TestHeadersDoNoHarm compares on: each
// real middleware's behaviour and headers.
func harmServers() []struct {
	name    string
	make    func() upstream.Model
	callers int
	jitter  time.Duration
} {
	return []struct {
		name    string
		make    func() upstream.Model
		callers int
		jitter  time.Duration
	}{
		{"ulule fixed window 50 per 1 s", func() upstream.Model { return &fixedWindow{limit: 50, per: time.Second} }, 32, 0},
		{"go-limiter window 50 per 1 s, dates", func() upstream.Model { return &fixedWindow{limit: 50, per: time.Second, date: true} }, 32, 0},
		{"ulule fixed window 10 per 1 s", func() upstream.Model { return &fixedWindow{limit: 10, per: time.Second} }, 32, 0},
		{"go-limiter window 10 per 1 s, dates", func() upstream.Model { return &fixedWindow{limit: 10, per: time.Second, date: true} }, 32, 0},
		{"ulule fixed window 10 per 1 s, 2 ms jitter", func() upstream.Model { return &fixedWindow{limit: 10, per: time.Second} }, 32, 2 * time.Millisecond},
		{"go-limiter window 10 per 1 s, dates, 2 ms jitter", func() upstream.Model { return &fixedWindow{limit: 10, per: time.Second, date: true} }, 32, 2 * time.Millisecond},
		{"ulule fixed window 300 per 6 s", func() upstream.Model { return &fixedWindow{limit: 300, per: 6 * time.Second} }, 32, 0},
		{"throttled GCRA 50/s burst 6", func() upstream.Model { return &gcra{rate: 50, burst: 6, style: styleThrottled} }, 32, 0},
		{"redis_rate GCRA 50/s burst 50", func() upstream.Model { return &gcra{rate: 50, burst: 50, style: styleRedisRate} }, 32, 0},
		{"redis_rate GCRA 50/s burst 1", func() upstream.Model { return &gcra{rate: 50, burst: 1, style: styleRedisRate} }, 32, 0},
		{"strict GCRA 100/s, both families, 64 callers", func() upstream.Model { return &gcra{rate: 100, burst: 1, style: styleBoth} }, 64, 0},
		{"strict GCRA 100/s, both families, 64 callers, 2 ms jitter", func() upstream.Model { return &gcra{rate: 100, burst: 1, style: styleBoth} }, 64, 2 * time.Millisecond},
		{"redis_rate GCRA 50/s burst 1, 2 ms jitter", func() upstream.Model { return &gcra{rate: 50, burst: 1, style: styleRedisRate} }, 32, 2 * time.Millisecond},
	}
}

// TestHeadersDoNoHarm compares, on every server of harmServers, a lane
// reading the rate-limit headers with the same lane whose base strips
// them, with no WithRate and at the published rate R, over 20 s from a
// cold lane in virtual time: reading them must serve the lane at least as
// well (within 0.02 of R, second half, up to R, and whole run; within a tenth of
// the whole run where the stripped lane is refused more than 1% and the
// reading one is not) and refuse no more (within half a point).
func TestHeadersDoNoHarm(t *testing.T) {
	for _, s := range harmServers() {
		for _, c := range []struct {
			name string
			opts []Option
		}{{"no WithRate", nil}, {"at R", []Option{WithRate(int(s.make().Rate()), time.Second)}}} {
			t.Run(s.name+"/"+c.name, func(t *testing.T) {
				// With jitter, a strict server's refusals fall by chance,
				// and one run's share depends on where: the mean of several,
				// each with its own sequence, is compared (twelve with no
				// WithRate, whose first seconds vary most; two at R).
				seeds := uint64(1)
				if s.jitter > 0 {
					seeds = 12
					if c.opts != nil {
						seeds = 2
					}
				}
				var on, off harmRun
				for seed := range seeds {
					a := runHarm(t, s.make(), s.callers, s.jitter, seed, 0, 20*time.Second, false, c.opts...)
					b := runHarm(t, s.make(), s.callers, s.jitter, seed, 0, 20*time.Second, true, c.opts...)
					t.Logf("seed %d: headers read %v; stripped %v\nper second read %v\nper second stripped %v", seed, a, b, a.perSecond, b.perSecond)
					on.add(a, seeds)
					off.add(b, seeds)
				}
				// A stripped lane that is refused more than 1% of its
				// attempts pushes its way to what it gets: beside a lane
				// that is not, its share is no yardstick, only a bound a
				// tenth away.
				pushed := off.refused > 0.01 && on.refused <= 0.01
				const slack = 0.02
				// Over R in the second half is a bucket's burst, taken
				// after a lull the stripped lane's refusals made: no share
				// a lane at R falls short of.
				lower := on.half < min(off.half, 1)-slack || on.whole < off.whole-slack
				if pushed {
					lower = on.whole < 0.9*off.whole
				}
				if lower || on.refused > off.refused+0.005 {
					t.Errorf("headers read %v, stripped %v: reading them does harm", on, off)
				}
			})
		}
	}
}

// TestDraftWindowAtRate: against a fixed window whose reset is draft-07's
// delay rounded up to the second (express-rate-limit's, see draftWindow),
// a lane at the published rate R that reads the headers is served within
// 0.05 of R, second half and whole run, of the same lane with them
// stripped, which is served all of R: the window may end up to a second
// before its stated reset, a whole window of a second, and a lane that
// spreads what remains until the reset, or waits for it, is served as
// little as three quarters of R. Its end is measured (see pace.windowEdge).
func TestDraftWindowAtRate(t *testing.T) {
	for _, c := range []struct {
		name  string
		limit int
		per   time.Duration
	}{
		{"5 per 1 s", 5, time.Second},
		{"10 per 1 s", 10, time.Second},
		{"50 per 1 s", 50, time.Second},
		{"50 per 5 s", 50, 5 * time.Second},
		{"600 per 60 s", 600, time.Minute},
	} {
		t.Run(c.name, func(t *testing.T) {
			opt := WithRate(c.limit, c.per)
			on := runHarm(t, &draftWindow{limit: c.limit, per: c.per}, 32, 0, 0, 0, 20*time.Second, false, opt)
			off := runHarm(t, &draftWindow{limit: c.limit, per: c.per}, 32, 0, 0, 0, 20*time.Second, true, opt)
			t.Logf("headers read %v, per second %v\nstripped %v, per second %v", on, on.perSecond, off, off.perSecond)
			if on.whole < off.whole-0.05 || on.half < min(off.half, 1)-0.05 || on.refused > off.refused+0.005 {
				t.Errorf("headers read %v, stripped %v: reading them does harm", on, off)
			}
		})
	}
}

// TestColdWindowStart: from a cold lane with no WithRate, against a
// fixed window of 10 a second that starts at its first request, its reset
// a Unix time truncated to the second (ulule/limiter), a 20 s run is served
// at least 0.95 of the rate over the whole run, wherever the run starts in
// the second. The attempt sent at the first window's truncated reset is
// refused, the window not over; that refusal says when, not how fast.
func TestColdWindowStart(t *testing.T) {
	for phase := 100 * time.Millisecond; phase < time.Second; phase += 200 * time.Millisecond {
		for run := range 2 {
			r := runHarm(t, &fixedWindow{limit: 10, per: time.Second}, 32, 0, 1, phase, 20*time.Second, false)
			if r.whole < 0.95 || r.refused > 0.01 {
				t.Errorf("run starting %v into a second, #%d: %v; accepted each second %v; want at least 0.95 of the rate over the whole run", phase, run, r, r.perSecond)
			}
		}
	}
}

// TestColdStrictStart guards the first seconds against a strict server:
// from a cold lane with no WithRate, a 20 s run against a GCRA of burst
// 1 that states its rate as its limit (redis_rate's handler) is served at
// least 0.85 of its rate over the whole run, the first refusals' cooldown
// included. The lane's first estimate is the quotas' limit per second
// (they never showed a burst), where its own acceptances, one per
// Retry-After, said one request a second.
func TestColdStrictStart(t *testing.T) {
	r := runHarm(t, &gcra{rate: 50, burst: 1, style: styleRedisRate}, 32, 0, 0, 0, 20*time.Second, false)
	t.Logf("%v; accepted each second: %v", r, r.perSecond)
	if r.whole < 0.85 || r.refused > 0.01 {
		t.Errorf("%v over the whole run; want at least 0.85 of the rate, at most 1%% refused in the second half", r)
	}
}

// TestWindowOffTheSecond guards a lane against a window refilled all at
// once whose reset is stated to the second, its windows starting off the
// whole second as a real server's do: ulule/limiter's memory store (a
// Unix time truncated to the second, which comes before the window ends,
// by up to a second) and sethvargo/go-limiter's (a date, read as the end
// of its second, after the window ends; Retry-After the same date). From
// a cold lane with no WithRate and at 2R, the lane's first fill spends
// the window early and is refused for its tail; read as a bucket, each
// refusal of the tail cut the pace again, down to a few requests a
// second, and each Retry-After held the lane past the refill. Told apart,
// the lane measures the window's end and spreads what remains until then:
// over the second half of a 20 s run it is served at least 0.95 of the
// rate, with at most 1% of its attempts refused. So it is by a minute's
// window scaled to 300 per 6 s, whose runs must also end: each is a
// synctest bubble, where a timer never armed or a wait never woken
// deadlocks.
func TestWindowOffTheSecond(t *testing.T) {
	for _, w := range []struct {
		limit int
		per   time.Duration
	}{{50, time.Second}, {300, 6 * time.Second}, {60, 6 * time.Second}} {
		for _, date := range []bool{false, true} {
			for _, phase := range []time.Duration{300 * time.Millisecond, 600 * time.Millisecond, 900 * time.Millisecond} {
				for _, c := range []struct {
					name string
					opts []Option
				}{{"no WithRate", nil}, {"at 2R", []Option{WithRate(2*w.limit, w.per)}}} {
					name := "ulule"
					if date {
						name = "go-limiter"
					}
					t.Run(fmt.Sprintf("%s/%d per %v/%v/%s", name, w.limit, w.per, phase, c.name), func(t *testing.T) {
						r := runHarm(t, &fixedWindow{limit: w.limit, per: w.per, date: date}, 32, 0, 0, phase, 20*time.Second, false, c.opts...)
						t.Logf("%v; accepted each second: %v", r, r.perSecond)
						if r.half < 0.95 || r.refused > 0.01 {
							t.Errorf("%v; want at least 0.95 of the rate in the second half, at most 1%% refused", r)
						}
					})
				}
			}
		}
	}
}

// TestWindowTailCount: a lane with no WithRate spends ulule/limiter's
// window of 1,200 per 6 s (a minute's, scaled) in its first second and is
// refused for the tail; the answers still on their way then state a few
// remaining over the seconds to the reset, which count a refill of a
// request or two a second. That count paces the lane until the reset the
// quotas state at most, not for the quarter of an hour a bucket refilling
// so slowly would take to fill: held at it, the lane sent its next
// window's first request a second or more late, and paced that window
// over a period a second too long. The refused lane's tries past the
// truncated reset go shortly before the second after it is out, not at
// its end, for the same reason (a period 7 s long, and the second half
// served at 0.96, from a quarter of the phases). From every phase of the
// window against the second, the whole 20 s run is served at least 0.93
// of the rate, its second half 0.98.
func TestWindowTailCount(t *testing.T) {
	for phase := time.Duration(0); phase < time.Second; phase += 50 * time.Millisecond {
		r := runHarm(t, &fixedWindow{limit: 1200, per: 6 * time.Second}, 32, 0, 0, phase, 20*time.Second, false)
		t.Logf("phase %v: %v; accepted each second: %v", phase, r, r.perSecond)
		if r.whole < 0.93 || r.half < 0.98 || r.refused > 0.01 {
			t.Errorf("phase %v: %v; want at least 0.93 of the rate over the whole run and 0.98 over its second half, at most 1%% refused", phase, r)
		}
	}
}

// TestWindowEndKeepsCount: a lane paced to what remains of a window whose
// end it measured (ulule/limiter's 50 a second, a window starting at its
// first request) spreads it over as many intervals and one more, but a
// token it holds when the last answer comes goes at once: one grant more
// than remains went before the end, and was refused, every few windows
// (0.6% of attempts at 2R, 0.3% with no WithRate). The lane now makes no
// more grants before the end than the last answer left it.
func TestWindowEndKeepsCount(t *testing.T) {
	for _, c := range []struct {
		name string
		opts []Option
		date bool
	}{
		{"no WithRate", nil, false},
		{"at 2R", []Option{WithRate(100, time.Second)}, false},
		{"no WithRate, dates", nil, true},
		{"at 2R, dates", []Option{WithRate(100, time.Second)}, true},
	} {
		for phase := time.Duration(0); phase < time.Second; phase += 200 * time.Millisecond {
			r := runHarm(t, &fixedWindow{limit: 50, per: time.Second, date: c.date}, 32, 2*time.Millisecond, 1, phase, 20*time.Second, false, c.opts...)
			if r.refused > 0 || r.half < 0.98 {
				t.Errorf("%s, phase %v: %v; want no refusal in the second half, and 0.98 of the rate", c.name, phase, r)
			}
		}
	}
}

// TestColdBurstStart guards the first seconds against a GCRA whose quotas
// show a burst (throttled's: burst 6, X-RateLimit-Reset whole seconds
// until full, Retry-After: 1), from a cold lane, at 50 and 200/s. With no
// WithRate, the first refusals' Retry-After and the probe up from the
// first estimate cost the first seconds, and a probe grown on while the
// quotas showed the bucket emptying spent the burst and was refused into
// another second's Retry-After. At 2R, the lane spends the burst in a
// tenth of a second, and each refusal cut a tenth off the pace: at 200/s,
// four refusals and four seconds of Retry-After in a row (0.80 of the rate
// over the whole run). throttled rounds its waits up to the second: a
// Retry-After of one second, with a quota of six full again within a
// second, now pauses the lane for a sixth of it, and the lane honours
// the whole second once a refusal follows such a pause. A 20 s run is
// served at least 0.90 of the rate over the whole run, and nothing is
// refused after the first seconds.
func TestColdBurstStart(t *testing.T) {
	for _, rate := range []int{50, 200} {
		for _, c := range []struct {
			name string
			x    int // WithRate's multiple of the rate; 0: none
		}{{"no WithRate", 0}, {"at 2R", 2}} {
			t.Run(fmt.Sprintf("%d per second/%s", rate, c.name), func(t *testing.T) {
				var opts []Option
				if c.x > 0 {
					opts = append(opts, WithRate(c.x*rate, time.Second))
				}
				r := runHarm(t, &gcra{rate: rate, burst: 6, style: styleThrottled}, 32, 0, 0, 0, 20*time.Second, false, opts...)
				t.Logf("%v; accepted each second: %v", r, r.perSecond)
				if r.whole < 0.90 || r.refused > 0 {
					t.Errorf("%v over the whole run; want at least 0.90 of the rate, nothing refused in the second half", r)
				}
			})
		}
	}
}

// TestSlidingWindowOffTheSecond guards a lane against go-chi/httprate's
// sliding window, whose windows start where the limiter was made: its
// reset, the window's end as a Unix time truncated to the second, passes
// before the window ends, for up to the whole window. From a cold lane
// with no WithRate, at R and at 2R, with the windows 0 to 0.9 s off the
// second and the run starting on it or 0.45 s after, a window refilled at
// once told apart from one of its windows (the lane, held a second by a
// Retry-After, came back to a window whose count of the one before had
// mostly gone) held the lane at half the rate until a window that did not
// refill at once said otherwise; and a sliding window was told apart only
// from two steps of its instant alike, which a lane held across a window
// did not see for seconds. Over the 20 runs of 10 s each: every run's
// second half at least 0.85 of the rate with at most 1% of its attempts
// refused, and the whole runs at least 0.92 of it on average (0.90 at
// 2R, whose first fill goes at twice the rate).
func TestSlidingWindowOffTheSecond(t *testing.T) {
	for _, c := range []struct {
		name  string
		opts  []Option
		whole float64
	}{
		{"no WithRate", nil, 0.92},
		{"at R", []Option{WithRate(50, time.Second)}, 0.92},
		{"at 2R", []Option{WithRate(100, time.Second)}, 0.90},
	} {
		t.Run(c.name, func(t *testing.T) {
			var whole float64
			n := 0
			for off := time.Duration(0); off < time.Second; off += 100 * time.Millisecond {
				for _, phase := range []time.Duration{0, 450 * time.Millisecond} {
					mod := upstream.NewSlidingWindow(upstream.SlidingWindowConfig{Limit: 50, Window: time.Second, Offset: off})
					r := runHarm(t, mod, 32, 0, 0, phase, 10*time.Second, false, c.opts...)
					if r.half < 0.85 || r.refused > 0.01 {
						t.Errorf("windows %v off the second, run %v off: %v; accepted each second %v; want at least 0.85 of the rate in the second half, at most 1%% refused", off, phase, r, r.perSecond)
					}
					whole += r.whole
					n++
				}
			}
			if whole /= float64(n); whole < c.whole {
				t.Errorf("whole runs %.3f of the rate on average; want at least %.2f", whole, c.whole)
			}
			t.Logf("whole runs %.3f of the rate on average", whole)
		})
	}
}

// TestSlidingWindowOfAMinute guards a lane against go-chi/httprate's
// sliding window over a long window: a minute, and a minute scaled down to
// 6 s as the bench scales it, with its windows starting 0.3 s into the run
// or with it. Each was lost a way of its own: the count of a window falls
// to a reset that stays put, as a fixed window's does, and that undid what
// had told it apart as sliding (the lane then paced the start of each
// window to what little the count of the window before left); a lane at
// R sends the limit in the first window and is refused at the second's
// first request, before any accepted answer told the kind (the refusal's
// quota tells it now); answers sent before that refusal came after it and
// read as an instant that moved; and the refusal of an exhausted count cut
// the throttle rate to the pace the lane kept then; and the Retry-After
// of the whole window that answers every refusal stopped the lane a window
// where the count fell within its stated reset. From a cold lane, with
// 5 ms of jitter in transit: the second half of three windows (as the
// bench measures its 18 s runs) at least 0.95 of the rate with at most 1%
// of attempts refused, with no WithRate, at R and at 2R, and never below
// the same lane with the rate-limit headers stripped by more than 0.02.
func TestSlidingWindowOfAMinute(t *testing.T) {
	for _, w := range []time.Duration{6 * time.Second, time.Minute} {
		// The windows start 0.3 s into the run, or with it (where a
		// lane at R sends the limit in the first window and is refused
		// at the second's first request), or 0.6 s after it, or 0.3 s
		// after a second the run starts 0.4 s into, or 2.5 s after it
		// (where a lane with no WithRate, refused 0.2 s in, is told to
		// retry after the whole window though the count falls 2.3 s
		// later).
		aligned := time.Duration(1_700_000_000%int64(w.Seconds())) * time.Second
		type start struct{ off, phase time.Duration }
		starts := []start{{300 * time.Millisecond, 0}, {aligned, 0}}
		if w < time.Minute {
			starts = append(starts, start{aligned + 600*time.Millisecond, 0}, start{aligned + 300*time.Millisecond, 400 * time.Millisecond},
				start{aligned + 2500*time.Millisecond, 0})
		}
		for _, st := range starts {
			for _, c := range []struct {
				name string
				opts []Option
			}{
				{"no WithRate", nil},
				{"at R", []Option{WithRate(50, time.Second)}},
				{"at 2R", []Option{WithRate(100, time.Second)}},
			} {
				t.Run(fmt.Sprintf("%v/offset %v, run %v off the second/%s", w, st.off, st.phase, c.name), func(t *testing.T) {
					run := func(strip bool) harmRun {
						mod := upstream.NewSlidingWindow(upstream.SlidingWindowConfig{Limit: int(50 * w.Seconds()), Window: w, Offset: st.off})
						return runHarm(t, mod, 32, 5*time.Millisecond, 1, st.phase, 3*w, strip, c.opts...)
					}
					r, s := run(false), run(true)
					t.Logf("headers read %v, stripped %v", r, s)
					if r.half < 0.95 || r.refused > 0.01 {
						t.Errorf("%v; accepted each second %v; want at least 0.95 of the rate in the second half, at most 1%% refused", r, r.perSecond)
					}
					if r.half < s.half-0.02 {
						t.Errorf("headers read %.2f of the rate, stripped %.2f: reading them did harm", r.half, s.half)
					}
				})
			}
		}
	}
}

// penaltyBox is a window of limit requests per per, aligned to the Unix
// clock, whose server, once a request exceeds a window, refuses everything
// for penalty and means it: every refusal states Retry-After until the
// penalty ends, with remaining 0 and the window's end (a Unix time) as its
// reset, which comes far sooner. It counts what it accepted and refused.
type penaltyBox struct {
	limit        int
	per, penalty time.Duration

	mu                 sync.Mutex
	start, until       time.Time
	n                  int
	accepted, refusals int
}

func (b *penaltyBox) Rate() float64 { return float64(b.limit) / b.per.Seconds() }

func (b *penaltyBox) Admit(now time.Time, _ *http.Request) upstream.Decision {
	b.mu.Lock()
	defer b.mu.Unlock()
	if start := now.Truncate(b.per); !start.Equal(b.start) {
		b.start, b.n = start, 0
	}
	ok := !now.Before(b.until) && b.n < b.limit
	if ok {
		b.n++
		b.accepted++
	} else {
		b.refusals++
		if !now.Before(b.until) {
			b.until = now.Add(b.penalty)
		}
	}
	h := http.Header{}
	h.Set("X-RateLimit-Limit", strconv.Itoa(b.limit))
	h.Set("X-RateLimit-Remaining", strconv.Itoa(b.limit-b.n))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(b.start.Add(b.per).Unix(), 10))
	if !ok {
		h.Set("X-RateLimit-Remaining", "0")
		h.Set("Retry-After", strconv.Itoa(int((b.until.Sub(now)+time.Second-1)/time.Second)))
	}
	return upstream.Decision{Accepted: ok, Header: h}
}

// TestRetryAfterMeant guards the other side of reading a Retry-After
// against its quota's reset: a server whose Retry-After (a 30 s penalty)
// outlasts the reset it states (the end of a window of a second) means it.
// A lane at twice its rate waits for the reset once, is refused for the
// attempts it sends then, and honours every Retry-After after: over two
// minutes it is served as much as the same lane with the rate-limit
// headers stripped (which honours every Retry-After), and is refused at
// most a pace's worth of attempts more.
func TestRetryAfterMeant(t *testing.T) {
	run := func(strip bool) (accepted, refused int) {
		box := &penaltyBox{limit: 10, per: time.Second, penalty: 30 * time.Second}
		runHarm(t, box, 4, 0, 0, 300*time.Millisecond, 2*time.Minute, strip, WithRate(20, time.Second))
		return box.accepted, box.refusals
	}
	ra, rr := run(false)
	sa, sr := run(true)
	t.Logf("headers read: %d accepted, %d refused; stripped: %d accepted, %d refused", ra, rr, sa, sr)
	if ra < sa-10 || rr > sr+4 {
		t.Errorf("headers read: %d accepted, %d refused; stripped: %d accepted, %d refused; want as many accepted, within a window's, and at most 4 more refused", ra, rr, sa, sr)
	}
}

// oddRemaining answers as its model does but for its at-th answer, which
// states Remaining v: an exempt route's count, or another limiter's.
type oddRemaining struct {
	upstream.Model
	mu    sync.Mutex
	n, at int
	v     string
}

func (o *oddRemaining) Admit(now time.Time, r *http.Request) upstream.Decision {
	d := o.Model.Admit(now, r)
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n++; o.n == o.at {
		d.Header.Set("X-RateLimit-Remaining", o.v)
	}
	return d
}

// TestOddRemainingDoesNoHarm: one answer of a throttled GCRA (50/s, a
// burst of 6) states a Remaining at or above its limit. The lane, with no
// WithRate, is served as it is without that answer: a count no bucket of
// that limit holds does not make every later one look like a bucket
// draining, which kept the lane at a seventh of the rate for good.
func TestOddRemainingDoesNoHarm(t *testing.T) {
	for _, v := range []string{"6", "1000000"} {
		t.Run(v, func(t *testing.T) {
			r := runHarm(t, &oddRemaining{Model: &gcra{rate: 50, burst: 6, style: styleThrottled}, at: 5, v: v},
				32, 0, 0, 300*time.Millisecond, 60*time.Second, false)
			t.Logf("5th answer states remaining %s: %v", v, r)
			if r.half < 0.9 {
				t.Errorf("served %.2f of the rate over the second half, want at least 0.90", r.half)
			}
		})
	}
}
