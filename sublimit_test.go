package sluice

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/internal/upstream"
)

// A group of callers in a closed loop on one path, with its figures over
// the second half of a run.
type routeGroup struct {
	path    string
	callers int
	ctx     func(context.Context) context.Context // nil: none

	accepted, refused int             // the server's answers, second half
	waits             []time.Duration // the round trips of accepted calls, second half
}

// runRoutes runs groups of callers against limiter for dur, in a synctest
// bubble, through a Transport with opts, and fills each group's figures
// from the server's arrivals. It returns the Transport's Stats at the end.
func runRoutes(t *testing.T, limiter upstream.Limiter, dur time.Duration, groups []*routeGroup, opts ...Option) Stats {
	var st Stats
	synctest.Test(t, func(t *testing.T) {
		time.Sleep(time.Until(time.Unix(1_700_000_000, 0))) // Unix resets, as in runModel
		srv := upstream.New(upstream.Config{Limiter: limiter, Latency: func(int, *http.Request) time.Duration { return 20 * time.Millisecond }})
		defer srv.Close()
		tr := mustNew(t, srv.Transport(), opts...)
		defer tr.Close()
		start := time.Now()
		ctx, cancel := context.WithTimeout(t.Context(), dur)
		defer cancel()
		var wg sync.WaitGroup
		var mu sync.Mutex
		for _, g := range groups {
			gctx := ctx
			if g.ctx != nil {
				gctx = g.ctx(ctx)
			}
			for range g.callers {
				wg.Go(func() {
					for gctx.Err() == nil {
						req, _ := http.NewRequestWithContext(gctx, "GET", srv.URL()+g.path, nil)
						sent := time.Now()
						resp, err := tr.RoundTrip(req)
						if err != nil {
							pause(gctx)
							continue
						}
						resp.Body.Close()
						if resp.StatusCode >= 400 {
							pause(gctx)
						} else if sent.Sub(start) >= dur/2 {
							mu.Lock()
							g.waits = append(g.waits, time.Since(sent))
							mu.Unlock()
						}
					}
				})
			}
		}
		wg.Wait()
		for _, a := range srv.Arrivals() {
			if a.At.Sub(start) < dur/2 {
				continue
			}
			for _, g := range groups {
				if a.Path == g.path {
					if a.Accepted {
						g.accepted++
					} else {
						g.refused++
					}
				}
			}
		}
		st = tr.Stats()
	})
	return st
}

func (g *routeGroup) rate(dur time.Duration) float64 {
	return float64(g.accepted) / (dur / 2).Seconds()
}

func (g *routeGroup) p99() time.Duration {
	if len(g.waits) == 0 {
		return 0
	}
	slices.Sort(g.waits)
	return g.waits[len(g.waits)*99/100]
}

// While search is exhausted, core is served as when search has room: its
// rate and its p99 round trip, with no core call held by search's reset.
// The lane learns the two limits from X-RateLimit-Resource alone.
func TestSublimitGitHubSearchHoldsNoCore(t *testing.T) {
	const dur = 20 * time.Second
	run := func(search int) (core, srch *routeGroup, st Stats) {
		core = &routeGroup{path: "/repos/o/r/issues/7", callers: 16}
		srch = &routeGroup{path: "/search/issues", callers: 4}
		st = runRoutes(t, upstream.NewGitHubResources(100, search, 2*time.Second), dur, []*routeGroup{core, srch}, WithRate(60, time.Second))
		return core, srch, st
	}
	idleCore, _, _ := run(1000)
	core, srch, st := run(5)
	t.Logf("core %.1f/s p99 %v (search with room: %.1f/s p99 %v); search %.1f/s, %d refused",
		core.rate(dur), core.p99(), idleCore.rate(dur), idleCore.p99(), srch.rate(dur), srch.refused)
	if core.rate(dur) < 0.95*50 {
		t.Errorf("core served at %.1f/s while search was exhausted, want at least 0.95 of 50/s", core.rate(dur))
	}
	if core.p99() > 2*idleCore.p99()+50*time.Millisecond {
		t.Errorf("core p99 %v while search was exhausted, %v with room: core waited on search", core.p99(), idleCore.p99())
	}
	if srch.rate(dur) < 0.9*2.5 || srch.refused > 2 {
		t.Errorf("search %.2f/s with %d refused, want its 2.5/s and at most 2 refused", srch.rate(dur), srch.refused)
	}
	var subs []string
	for _, l := range st.Lanes {
		if l.Sublimit != "" {
			subs = append(subs, l.Key+"/"+l.Sublimit)
		}
	}
	if len(subs) != 2 || !strings.HasSuffix(subs[0], "/core") || !strings.HasSuffix(subs[1], "/search") {
		t.Errorf("sub-limits in Stats: %v, want core and search under the host", subs)
	}
}

// Discord: the route that posts a message has one bucket, kept per
// channel, 5/s each, behind a global 50/s. Each channel is served at 0.95
// of its rate or more, as a channel alone is, a nearly idle channel's
// calls are not held by the busy ones', and refusals do not grow with the
// number of channels.
func TestSublimitDiscordBuckets(t *testing.T) {
	const dur = 20 * time.Second
	run := func(channels int) []*routeGroup {
		limits := map[string]upstream.Limiter{}
		var groups []*routeGroup
		for i := range channels {
			path := fmt.Sprintf("/channels/%d/messages", 100+i)
			limits[path] = upstream.NewDiscordBucket("41f9a2", 5, time.Second)
			groups = append(groups, &routeGroup{path: path, callers: 4})
		}
		if channels > 1 {
			groups[channels-1].callers = 1
		}
		route := func(r *http.Request) string { return r.URL.Path }
		st := runRoutes(t, &upstream.Routes{Route: route, Limits: limits, Global: upstream.NewDiscordGlobal(50)}, dur, groups)
		if channels > 1 {
			var subs []string
			for _, l := range st.Lanes {
				subs = append(subs, l.Sublimit)
			}
			if want := "[ 41f9a2@100 41f9a2@101 41f9a2@102]"; fmt.Sprint(subs) != want {
				t.Errorf("lanes in Stats: %q, want %s", subs, want)
			}
		}
		return groups
	}
	alone := run(1)[0]
	t.Logf("one channel alone: %.2f/s, %d refused, p99 %v", alone.rate(dur), alone.refused, alone.p99())
	groups := run(3)
	for i, g := range groups {
		t.Logf("channel %d of 3: %.2f/s, %d refused, p99 %v", i, g.rate(dur), g.refused, g.p99())
		if g.rate(dur) < 0.95*5 || g.rate(dur) < 0.95*alone.rate(dur) {
			t.Errorf("channel %d served at %.2f/s, alone at %.2f/s", i, g.rate(dur), alone.rate(dur))
		}
		if g.refused > alone.refused+3 {
			t.Errorf("channel %d: %d refused, alone %d", i, g.refused, alone.refused)
		}
	}
	if g := groups[2]; g.p99() > alone.p99()+100*time.Millisecond {
		t.Errorf("the idle channel's calls: p99 %v, a busy channel alone %v: held by the busy channels", g.p99(), alone.p99())
	}
}

// Two models of an LLM API on one host, each with its own request limit
// (40/s and 10/s), told apart by the caller (WithSublimit): each is served
// at its own rate, and the slow model's limit does not hold the fast one.
func TestSublimitPerModel(t *testing.T) {
	const dur = 20 * time.Second
	route := func(r *http.Request) string { return r.URL.Path }
	limits := map[string]upstream.Limiter{
		"/v1/fast": upstream.NewOpenAI(upstream.OpenAIConfig{Requests: 40, Per: time.Second}),
		"/v1/slow": upstream.NewOpenAI(upstream.OpenAIConfig{Requests: 10, Per: time.Second}),
	}
	fast := &routeGroup{path: "/v1/fast", callers: 16, ctx: func(c context.Context) context.Context { return WithSublimit(c, "fast") }}
	slow := &routeGroup{path: "/v1/slow", callers: 16, ctx: func(c context.Context) context.Context { return WithSublimit(c, "slow") }}
	runRoutes(t, &upstream.Routes{Route: route, Limits: limits}, dur, []*routeGroup{fast, slow})
	t.Logf("fast %.1f/s (%d refused), slow %.1f/s (%d refused)", fast.rate(dur), fast.refused, slow.rate(dur), slow.refused)
	for _, c := range []struct {
		g    *routeGroup
		rate float64
	}{{fast, 40}, {slow, 10}} {
		if c.g.rate(dur) < 0.95*c.rate || c.g.refused*100 > c.g.accepted+c.g.refused {
			t.Errorf("%s: %.1f/s with %d refused, want at least 0.95 of %v/s and at most 1%% refused",
				c.g.path, c.g.rate(dur), c.g.refused, c.rate)
		}
	}
}

// A server that names a new limit per request cannot grow a lane without
// bound: past maxSublimits, a named limit is read as the lane's own and
// counted in Stats; the sub-limits and routes are forgotten when idle.
func TestSublimitsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := 0
		base := rtFunc(func(r *http.Request) (*http.Response, error) {
			n++
			h := http.Header{"X-Ratelimit-Bucket": {fmt.Sprintf("b%d", n)}, "X-Ratelimit-Remaining": {"9"}, "X-Ratelimit-Limit": {"10"}}
			return &http.Response{StatusCode: 200, Header: h, Body: http.NoBody, Request: r}, nil
		})
		tr := mustNew(t, base, WithLaneIdle(time.Minute))
		defer tr.Close()
		for i := range maxSublimits + 50 {
			req, _ := http.NewRequest("GET", fmt.Sprintf("http://api.test/r%d/x", i), nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		ls, _ := tr.LaneStats("api.test")
		if got := tr.nLanes.Load(); got != 1+maxSublimits || ls.Folded < 50 {
			t.Errorf("%d lanes, %d folded; want 1 + %d and at least 50", got, ls.Folded, maxSublimits)
		}
		time.Sleep(3 * time.Minute)
		synctest.Wait()
		if got := tr.nLanes.Load(); got != 0 {
			t.Errorf("%d lanes after 3 idle minutes, want 0", got)
		}
		if _, ok := tr.routes.Load("api.test"); ok {
			t.Error("the lane's routes were kept after 3 idle minutes")
		}
	})
}

// Budgets are kept per sub-limit: with a budget of 1,000 tokens a second
// and calls of 100 tokens, two models named by the caller each get their
// own 10 calls a second, where one budget for the host would give 10 in
// all.
func TestSublimitBudgets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{latency: 10 * time.Millisecond}
		tr := mustNew(t, base, WithBudget("tokens", 1000, time.Second))
		defer tr.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		for _, model := range []string{"a", "b"} {
			mctx := WithCost(WithSublimit(ctx, model), "tokens", 100)
			for range 4 {
				wg.Go(func() {
					for get(mctx, tr, "") == nil {
					}
				})
			}
		}
		wg.Wait()
		st := tr.Stats()
		grants := map[string]uint64{}
		for _, l := range st.Lanes {
			grants[l.Sublimit] = l.Levels[Normal].Granted
		}
		t.Logf("grants: %v", grants)
		// 5 s at 10 a second, and the full budget at the start.
		for _, m := range []string{"a", "b"} {
			if g := grants[m]; g < 55 || g > 61 {
				t.Errorf("model %s: %d calls in 5 s, want 60 (its own budget)", m, g)
			}
		}
	})
}

// A deadline refusal counts every limit's wait: a request whose sub-limit
// would grant it in half a second, but whose host has a backlog past its
// deadline, is refused at once, not after the half second.
func TestSublimitDeadlineCountsHost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{answer: answerWith(1, http.StatusTooManyRequests, "Retry-After-Ms: 500")}
		tr := mustNew(t, base, WithRate(1, time.Second), WithRetry(0))
		defer tr.Close()
		sub := WithSublimit(t.Context(), "model")
		get(sub, tr, "") // a 429: the sub-limit cools for 500 ms
		// A backlog on the host: three calls with no sub-limit, at 1/s.
		for range 3 {
			go get(t.Context(), tr, "")
		}
		synctest.Wait()
		ctx, cancel := context.WithTimeout(sub, 2*time.Second)
		defer cancel()
		start := time.Now()
		err := get(ctx, tr, "")
		var rej *RejectedError
		if !errors.As(err, &rej) || rej.Reason != ReasonDeadline || time.Since(start) != 0 {
			t.Errorf("after %v: %v; want a deadline refusal at once", time.Since(start), err)
		} else if rej.Wait < 2*time.Second {
			t.Errorf("refused with an estimated wait of %v, want the host's, over 2 s", rej.Wait)
		}
		time.Sleep(5 * time.Second)
	})
}

// With WithSublimitRate, each model's sub-limit paces to its own allowance
// from the first request, against a server that states nothing (bare 429s
// past each model's strict GCRA): each model gets its rate with no
// refusal, and its sends keep within rate x T + burst + 1. Without the
// option the sub-limits learn the two rates from refusals.
func TestSublimitRate(t *testing.T) {
	const dur = 10 * time.Second
	rates := map[string]int{"a": 10, "b": 40}
	for _, configured := range []bool{true, false} {
		synctest.Test(t, func(t *testing.T) {
			limits := map[string]upstream.Limiter{}
			opts := []Option{WithRetry(0)}
			for name, r := range rates {
				limits["/v1/"+name] = upstream.NewGCRA(upstream.GCRAConfig{Rate: r, Burst: 1, NoHeaders: true})
				if configured {
					opts = append(opts, WithSublimitRate(name, r, time.Second))
				}
			}
			srv := upstream.New(upstream.Config{Limiter: &upstream.Routes{Route: func(r *http.Request) string { return r.URL.Path }, Limits: limits},
				Latency: func(int, *http.Request) time.Duration { return 20 * time.Millisecond }})
			defer srv.Close()
			tr := mustNew(t, srv.Transport(), opts...)
			defer tr.Close()
			ctx, cancel := context.WithTimeout(t.Context(), dur)
			defer cancel()
			var wg sync.WaitGroup
			for name := range rates {
				mctx := WithSublimit(ctx, name)
				for range 16 {
					wg.Go(func() {
						for mctx.Err() == nil {
							req, _ := http.NewRequestWithContext(mctx, "GET", srv.URL()+"/v1/"+name, nil)
							resp, err := tr.RoundTrip(req)
							if err != nil {
								pause(mctx) // refused early: the run's end is nearer than the wait
								continue
							}
							resp.Body.Close()
						}
					})
				}
			}
			wg.Wait()
			for name, r := range rates {
				var at []time.Time
				accepted := 0
				for _, a := range srv.Arrivals() {
					if a.Path == "/v1/"+name {
						at = append(at, a.At)
						if a.Accepted {
							accepted++
						}
					}
				}
				got := float64(accepted) / dur.Seconds() / float64(r)
				refused := len(at) - accepted
				t.Logf("configured %v, model %s at %d/s: %.3f of its rate, %d of %d refused", configured, name, r, got, refused, len(at))
				if !configured {
					if refused == 0 {
						t.Errorf("model %s: no refusal without WithSublimitRate: the server model refuses nothing", name)
					}
					continue
				}
				if got < 0.97 || refused > 0 {
					t.Errorf("model %s: %.3f of %d/s with %d refused; want at least 0.97 and none", name, got, r, refused)
				}
				for _, k := range []float64{0, 1, 10} {
					w := time.Duration(k / float64(r) * float64(time.Second))
					if n, lim := upstream.MaxInWindow(at, w+1), int(float64(r)*w.Seconds())+DefaultBurst+1; n > lim {
						t.Errorf("model %s: %d sends in %v, over rate x T + burst + 1 = %d", name, n, w, lim)
					}
				}
			}
		})
	}
}

// TestSublimitCrawlerKeepsCore: a crawler calls a repository it has not
// called before at every request, so each route is new to the lane; the
// first call of each goes under the limit GitHub's routes are filed under
// (core), not past it: nothing is sent once core is exhausted, where
// each new route's first call was, 1,100 403s in 20 s. Without a limit
// named by the host's responses, no route has a fallback.
func TestSublimitCrawlerKeepsCore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		time.Sleep(time.Until(time.Unix(1_700_000_000, 0)))
		srv := upstream.New(upstream.Config{Limiter: upstream.NewGitHubResources(10, 10, 2*time.Second),
			Latency: func(int, *http.Request) time.Duration { return 20 * time.Millisecond }})
		defer srv.Close()
		tr := mustNew(t, srv.Transport(), WithRate(60, time.Second))
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		var n atomic.Int64
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for ctx.Err() == nil {
					repo := strconv.FormatInt(n.Add(1), 26) // no digit from 10 on: a route of its own
					repo = strings.Map(func(r rune) rune {
						if r >= '0' && r <= '9' {
							return 'a' + (r - '0') + 16
						}
						return r
					}, repo)
					req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL()+"/repos/o/"+repo+"/issues", nil)
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
		accepted, refused := 0, 0
		for _, a := range srv.Arrivals() {
			if a.Accepted {
				accepted++
			} else {
				refused++
			}
		}
		t.Logf("accepted %d, refused %d", accepted, refused)
		if accepted < 90 || refused > 5 {
			t.Errorf("accepted %d (core allows 100 in 20 s), refused %d: want about 100 and few refusals", accepted, refused)
		}
	})
}

// TestRoutesFallback: the fallback is the limit most routes are filed
// under; none for buckets kept per major parameter, and none within
// unnamedFor of a response that named no limit.
func TestRoutesFallback(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	rs := newRoutes()
	if got := rs.fallback(now); got != "" {
		t.Errorf("no route filed: fallback %q", got)
	}
	rs.file("GET /channels/{}/messages", filed{name: "abc", major: true, at: now})
	if got := rs.fallback(now); got != "" {
		t.Errorf("a bucket per channel: fallback %q, want none", got)
	}
	for i, name := range []string{"core", "core", "search"} {
		rs.file(fmt.Sprintf("GET /r%c", 'a'+i), filed{name: name, at: now})
	}
	if got := rs.fallback(now); got != "core" {
		t.Errorf("fallback %q, want core", got)
	}
	rs.file("GET /ra", filed{name: "search", at: now}) // refiled: core 1, search 2
	if got := rs.fallback(now); got != "search" {
		t.Errorf("after a route was filed anew: fallback %q, want search", got)
	}
	rs.sawUnnamed(now)
	if got := rs.fallback(now.Add(unnamedFor - time.Second)); got != "" {
		t.Errorf("within unnamedFor of an answer that named no limit: fallback %q", got)
	}
	if got := rs.fallback(now.Add(unnamedFor)); got != "search" {
		t.Errorf("unnamedFor after it: fallback %q, want search", got)
	}
}
