package sluice

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// githubLike answers core and search calls with their own
// X-RateLimit-Resource and quota (core 5,000 a minute, search 30 a
// minute), and a /search/forbidden call with a 403 that is no rate limit
// (a permission error), which carries search's headers with requests left,
// as GitHub's do.
func githubLike(served *atomic.Int64) http.RoundTripper {
	var mu sync.Mutex
	used := map[string]int{}
	return rtFunc(func(r *http.Request) (*http.Response, error) {
		res, limit := "core", 5000
		if strings.HasPrefix(r.URL.Path, "/search/") {
			res, limit = "search", 30
		}
		mu.Lock()
		used[res]++
		left := max(limit-used[res], 0)
		mu.Unlock()
		h := http.Header{
			"X-Ratelimit-Resource":  {res},
			"X-Ratelimit-Limit":     {strconv.Itoa(limit)},
			"X-Ratelimit-Remaining": {strconv.Itoa(left)},
			"X-Ratelimit-Reset":     {strconv.FormatInt(time.Now().Add(time.Minute).Unix(), 10)},
		}
		status, body := 200, "{}"
		if r.URL.Path == "/search/forbidden" {
			status, body = 403, `{"message":"Resource not accessible by integration"}`
		} else if res == "core" && served != nil {
			served.Add(1)
		}
		return &http.Response{StatusCode: status, Header: h, Body: io.NopCloser(strings.NewReader(body)), Request: r}, nil
	})
}

func call(ctx context.Context, tr http.RoundTripper, url string) error {
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

// A 403 that is not a rate limit (a permission error) on a search route
// carries search's quota with requests left: it is search's to read, and
// the host never takes search's 30 a minute as its own pace; core, with
// 5,000 a minute left, is served at WithRate.
func TestSublimitPermission403StaysOffHost(t *testing.T) {
	for _, forbid := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			time.Sleep(time.Until(time.Unix(1_700_000_000, 0))) // resets as Unix seconds
			var served atomic.Int64
			tr := mustNew(t, githubLike(&served), WithRate(50, time.Second))
			defer tr.Close()
			call(t.Context(), tr, "http://api.test/repos/o/r/issues/1") // core, learned
			if forbid {
				call(t.Context(), tr, "http://api.test/search/forbidden")
				for _, l := range tr.Stats().Lanes {
					t.Logf("after the 403: %s rate %.2f", l.Name(), l.Rate)
				}
			}
			served.Store(0)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			var errs atomic.Int64
			for range 8 {
				wg.Go(func() {
					for ctx.Err() == nil {
						if err := call(ctx, tr, "http://api.test/repos/o/r/issues/1"); err != nil {
							if ctx.Err() == nil && errs.Add(1) == 1 {
								t.Logf("error: %v", err)
							}
							time.Sleep(10 * time.Millisecond)
						}
					}
				})
			}
			wg.Wait()
			ls, _ := tr.LaneStats("api.test")
			t.Logf("403 on search first: %v; core served %d in 10 s (host pace %.2f/s), %d errors", forbid, served.Load(), ls.Rate, errs.Load())
			if served.Load() < 400 {
				t.Errorf("403 on search first: %v; core served %d in 10 s, want about 500 (WithRate 50/s, core has 5,000 a minute)", forbid, served.Load())
			}
		})
	}
}

// Report corrects the budget a request was charged to: a request with a
// caller's sub-limit is charged on the sub-limit's budgets, and Report
// adjusts that one, not the host's, which was never charged.
func TestSublimitReportAdjustsItsBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, &fakeBase{}, WithBudget("tokens", 1000, time.Second))
		defer tr.Close()
		model := WithSublimit(t.Context(), "a")
		req, _ := http.NewRequestWithContext(WithCost(model, "tokens", 100), "GET", "http://api.test/v1/chat", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		tr.Report(resp, "tokens", 1000) // it cost the whole budget

		waited := func(ctx context.Context) time.Duration {
			start := time.Now()
			if err := call(WithCost(ctx, "tokens", 1000), tr, "http://api.test/v1/chat"); err != nil {
				t.Fatal(err)
			}
			return time.Since(start)
		}
		host := waited(t.Context()) // no sub-limit: the host's budget, never charged
		sub := waited(model)        // the sub-limit's budget, spent by the first call
		t.Logf("a call of the whole budget waited %v on the host, %v on the sub-limit", host, sub)
		if host != 0 {
			t.Errorf("a host call waited %v: the host's budget paid for a sub-limit's call", host)
		}
		if sub < 900*time.Millisecond {
			t.Errorf("the sub-limit's next call waited %v, want about 1 s: Report did not reach its budget", sub)
		}
	})
}

// sseAnswer answers every request at once with a 200 event stream that
// holds the stream it is.
type sseAnswer string

func (s sseAnswer) RoundTrip(r *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}},
		Body: io.NopCloser(strings.NewReader(string(s))), Request: r}, nil
}

// sseRefusing is a stream whose first event is a rate-limit error, as
// Anthropic and OpenAI-compatible gateways send.
const sseRefusing = sseAnswer("event: error\ndata: {\"type\":\"rate_limit_error\"}\n\n")

// A stream's first event that says the caller is rate-limited is a refusal
// of the limit the request drew on: with a sub-limit (one model), that
// sub-limit learns it, and the host, which every model goes through, does
// not.
func TestSublimitStreamRefusalStaysOnSublimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, sseRefusing)
		defer tr.Close()
		if err := call(WithSublimit(t.Context(), "model-a"), tr, "http://api.test/v1/messages"); err != nil {
			t.Fatal(err)
		}
		for _, ls := range tr.Stats().Lanes {
			t.Logf("%s: throttled %d, rate %.2f", ls.Name(), ls.Levels[Normal].Throttled, ls.Rate)
			if ls.Sublimit == "" && ls.Levels[Normal].Throttled != 0 {
				t.Errorf("the host's lane counted model-a's stream refusal (throttled %d): every model is held by it", ls.Levels[Normal].Throttled)
			}
			if ls.Sublimit == "model-a" && ls.Levels[Normal].Throttled != 1 {
				t.Errorf("model-a's sub-limit: throttled %d, want its stream's refusal", ls.Levels[Normal].Throttled)
			}
		}
	})
}

// A sub-limit's token is taken before the request waits on its host's
// lane. While the host cools down (here after a 503 with Retry-After), the
// sub-limit grants nothing, so that the calls it paces (one a second, from
// search's quota) are not all sent at once when the host opens.
func TestSublimitNoBurstAfterHostWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		time.Sleep(time.Until(time.Unix(1_700_000_000, 0))) // resets as Unix seconds
		var mu sync.Mutex
		var searches []time.Time
		used := 0
		reset := time.Now().Add(time.Minute)
		base := rtFunc(func(r *http.Request) (*http.Response, error) {
			h := http.Header{}
			status := 200
			if r.URL.Path == "/status" {
				status = 503
				h.Set("Retry-After", "5")
			} else {
				mu.Lock()
				used++
				searches = append(searches, time.Now())
				h.Set("X-Ratelimit-Resource", "search")
				h.Set("X-Ratelimit-Limit", "60")
				h.Set("X-Ratelimit-Remaining", strconv.Itoa(60-used))
				h.Set("X-Ratelimit-Reset", strconv.FormatInt(reset.Unix(), 10))
				mu.Unlock()
			}
			return &http.Response{StatusCode: status, Header: h, Body: http.NoBody, Request: r}, nil
		})
		tr := mustNew(t, base, WithRetry(0))
		defer tr.Close()
		for range 2 { // search's route is filed, its pace read: about 1/s
			call(t.Context(), tr, "http://api.test/search/issues")
		}
		call(t.Context(), tr, "http://api.test/status") // the host cools for 5 s
		mu.Lock()
		searches = nil
		mu.Unlock()
		var wg sync.WaitGroup
		for range 5 {
			wg.Go(func() { call(t.Context(), tr, "http://api.test/search/issues") })
		}
		wg.Wait()
		for _, ls := range tr.Stats().Lanes {
			t.Logf("%s: rate %.2f/s", ls.Name(), ls.Rate)
		}
		mu.Lock()
		defer mu.Unlock()
		at := make([]time.Duration, len(searches))
		for i, s := range searches {
			at[i] = s.Sub(searches[0])
		}
		t.Logf("search calls sent at %v after the first", at)
		for i := 1; i < len(searches); i++ {
			if gap := searches[i].Sub(searches[i-1]); gap < 500*time.Millisecond {
				t.Errorf("search calls %d and %d sent %v apart, under search's pace of about 1/s", i-1, i, gap)
			}
		}
	})
}

// quotaBase answers as GitHub does: a quota on every response, with or
// without the name of the limit it counted against.
type quotaBase struct{ named bool }

func (b quotaBase) RoundTrip(req *http.Request) (*http.Response, error) {
	h := http.Header{
		"Content-Type":          {"application/json"},
		"X-Ratelimit-Limit":     {"1000000000"},
		"X-Ratelimit-Remaining": {"999999999"},
		"X-Ratelimit-Reset":     {"4102444800"},
	}
	if b.named {
		h["X-Ratelimit-Resource"] = []string{"core"}
	}
	return &http.Response{StatusCode: 200, Header: h, Body: &replyBody{r: strings.NewReader(`{"ok":true}`)},
		ContentLength: 11, Request: req}, nil
}

// What the fast path costs: a plain server; the same once some code in
// the process has called WithSublimit (a process-wide flag: every
// Transport then looks for a sub-limit on every request); a GitHub-like
// server's quota, without and with X-RateLimit-Resource.
func BenchmarkSublimitCost(b *testing.B) {
	req := costRequests(b, 1, false)[0]
	for _, c := range []struct {
		name  string
		base  http.RoundTripper
		named bool
	}{
		{"plain", replyBase{}, false},
		{"plain, WithSublimit called elsewhere", replyBase{}, true},
		{"quota", quotaBase{}, false},
		{"quota named core", quotaBase{named: true}, false},
	} {
		b.Run(c.name, func(b *testing.B) {
			was := sublimitsNamed.Load()
			sublimitsNamed.Store(c.named)
			defer sublimitsNamed.Store(was)
			cl := &http.Client{Transport: mustNew(b, c.base, WithRate(1e9, time.Second), WithBurst(1<<30))}
			b.ReportAllocs()
			for b.Loop() {
				if err := drain(cl.Do(req)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// maxSublimits caps a lane's sub-limit lanes, not only the names in use: a
// sub-limit that cools down (up to WithMaxRetryAfter) outlives its idle
// time and still counts, so a server that refuses each call with a bucket
// of its own and a long Retry-After (or a Discord bot that writes to many
// channels, a bucket each) cannot grow the Transport past it.
func TestSublimitLanesCapped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := rtFunc(func(r *http.Request) (*http.Response, error) {
			h := http.Header{"X-Ratelimit-Bucket": {"b"}, "X-Ratelimit-Scope": {"user"},
				"X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Limit": {"5"}, "Retry-After": {"600"}}
			return &http.Response{StatusCode: 429, Header: h, Body: http.NoBody, Request: r}, nil
		})
		tr := mustNew(t, base, WithLaneIdle(time.Second), WithRetry(0))
		defer tr.Close()
		ch := 100
		for range 8 {
			for range maxSublimits {
				ch++
				call(t.Context(), tr, fmt.Sprintf("http://api.test/channels/%d/messages", ch))
			}
			time.Sleep(2 * time.Second) // the names go idle; their lanes still cool
		}
		t.Logf("%d lanes after %d channels", tr.nLanes.Load(), ch-100)
		if n := tr.nLanes.Load(); n > 1+maxSublimits {
			t.Errorf("%d lanes, want at most 1 + %d", n, maxSublimits)
		}
		time.Sleep(11 * time.Minute)
	})
}

// Past maxSublimits, a response that names a limit teaches no lane: a
// Discord bot that has written to 256 channels in the last WithLaneIdle
// and is refused on the 257th goes on writing to the others.
func TestSublimitFoldedRefusalSparesHost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		refused := fmt.Sprintf("/channels/%d/messages", 100+maxSublimits+1)
		base := discordBase(refused, "user")
		tr := mustNew(t, base, WithRetry(0))
		defer tr.Close()
		for ch := 101; ch <= 100+maxSublimits+1; ch++ {
			call(t.Context(), tr, fmt.Sprintf("http://api.test/channels/%d/messages", ch))
		}
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		start := time.Now()
		err := call(ctx, tr, "http://api.test/channels/101/messages")
		t.Logf("channel 101 after channel %d's refusal: %v after %v", 100+maxSublimits+1, err, time.Since(start))
		if err != nil {
			t.Errorf("channel 101, with its own bucket and room in it, held by another channel's refusal: %v", err)
		}
	})
}

// A refusal at a sub-limit names the lane's key and the sub-limit apart
// (RejectedError.Key and Sublimit), never the internal key that joins
// them with a NUL byte.
func TestSublimitRejectedKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{answer: answerWith(1, http.StatusTooManyRequests, "Retry-After: 60")}
		tr := mustNew(t, base, WithRetry(0))
		defer tr.Close()
		model := WithSublimit(t.Context(), "model")
		get(model, tr, "") // the sub-limit cools for a minute
		ctx, cancel := context.WithTimeout(model, time.Second)
		defer cancel()
		err := get(ctx, tr, "")
		var rej *RejectedError
		if !errors.As(err, &rej) {
			t.Fatalf("got %v, want a refusal", err)
		}
		if strings.Contains(rej.Key, "\x00") || strings.Contains(err.Error(), "\x00") {
			t.Errorf("RejectedError.Key %q, message %q: the internal key, NUL byte and all", rej.Key, err.Error())
		}
	})
}

// Discord's 429 with X-RateLimit-Scope "shared" is a limit of one
// resource (a busy channel) that did not count against the caller's
// bucket, whose headers show requests left: it holds that channel, never
// the host's other channels.
func TestSublimitDiscordSharedScope(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := discordBase("/channels/101/messages", "shared")
		tr := mustNew(t, base, WithRetry(0))
		defer tr.Close()
		for _, ch := range []int{102, 101} {
			call(t.Context(), tr, fmt.Sprintf("http://api.test/channels/%d/messages", ch))
		}
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		if err := call(ctx, tr, "http://api.test/channels/102/messages"); err != nil {
			t.Errorf("channel 102 after a shared-resource 429 on channel 101: %v", err)
		}
	})
}

// A route not yet seen is sent under the host's limit alone until its
// first response names its limit: a new Discord route of a channel
// (/channels/101/pins, its own bucket) is not held behind the cooldown of
// another route's bucket on that channel (/channels/101/messages).
func TestSublimitUnseenRouteUnderHost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := rtFunc(func(r *http.Request) (*http.Response, error) {
			h := http.Header{"X-Ratelimit-Limit": {"5"}, "X-Ratelimit-Remaining": {"4"}, "X-Ratelimit-Reset-After": {"1"}}
			status := 200
			if strings.HasSuffix(r.URL.Path, "/pins") {
				h.Set("X-Ratelimit-Bucket", "pins")
			} else {
				h.Set("X-Ratelimit-Bucket", "messages")
				status = 429
				h.Set("X-Ratelimit-Scope", "user")
				h.Set("X-Ratelimit-Remaining", "0")
				h.Set("Retry-After", "60")
			}
			return &http.Response{StatusCode: status, Header: h, Body: http.NoBody, Request: r}, nil
		})
		tr := mustNew(t, base, WithRetry(0))
		defer tr.Close()
		call(t.Context(), tr, "http://api.test/channels/101/messages") // messages@101 cools a minute
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		if err := call(ctx, tr, "http://api.test/channels/101/pins"); err != nil {
			t.Errorf("a route never seen, of another bucket, held by messages' cooldown: %v", err)
		}
	})
}

// Nothing is left held on the host or the sub-limit when a request is
// cancelled while it waits on the host after its sub-limit's grant, when
// the base panics, and when the base returns a nil response.
func TestSublimitPathsLeaveNothingHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mode atomic.Int32 // 0: 200, 1: panic, 2: nil response
		base := rtFunc(func(r *http.Request) (*http.Response, error) {
			switch mode.Load() {
			case 1:
				panic("base")
			case 2:
				return nil, nil
			}
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
		})
		tr := mustNew(t, base, WithRate(1, time.Minute), WithRetry(0), WithLaneIdle(time.Minute))
		defer tr.Close()
		model := WithSublimit(t.Context(), "m")
		call(model, tr, "http://api.test/x") // the host's one token a minute
		ctx, cancel := context.WithTimeout(model, time.Second)
		call(ctx, tr, "http://api.test/x") // granted by the sub-limit, waits on the host, cancelled
		cancel()
		time.Sleep(time.Minute)
		mode.Store(1)
		func() {
			defer func() { recover() }()
			call(model, tr, "http://api.test/x")
		}()
		time.Sleep(time.Minute)
		mode.Store(2)
		call(model, tr, "http://api.test/x")
		for _, ls := range tr.Stats().Lanes {
			if ls.InFlight != 0 {
				t.Errorf("%s: %d in flight after every call returned", ls.Name(), ls.InFlight)
			}
		}
		time.Sleep(5 * time.Minute)
		if n := tr.nLanes.Load(); n != 0 {
			t.Errorf("%d lanes left after 5 idle minutes", n)
		}
	})
}

// Discord's API lives under /api/v10/: the major parameter is the
// channel's id, never the version, so each channel's bucket is a
// sub-limit of its own.
func TestSublimitDiscordVersionedPath(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := discordBase("", "")
		tr := mustNew(t, base)
		defer tr.Close()
		for _, ch := range []int{101, 102} {
			call(t.Context(), tr, fmt.Sprintf("http://discord.test/api/v10/channels/%d/messages", ch))
		}
		var subs []string
		for _, ls := range tr.Stats().Lanes {
			if ls.Sublimit != "" {
				subs = append(subs, ls.Sublimit)
			}
		}
		if len(subs) != 2 {
			t.Errorf("sub-limits %q for two channels of one bucket, want one per channel", subs)
		}
	})
}

// A request whose route the server's answers filed under a limit draws on
// that limit even when the caller names a sub-limit: with GitHub's core
// exhausted until its reset, such requests wait for it, and are not sent
// into refusals.
func TestSublimitCallerAndNamedLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		time.Sleep(time.Until(time.Unix(1_700_000_000, 0))) // resets as Unix seconds
		reset := time.Now().Add(time.Minute)
		var sent atomic.Int32
		base := rtFunc(func(r *http.Request) (*http.Response, error) {
			sent.Add(1)
			h := http.Header{"X-Ratelimit-Resource": {"core"}, "X-Ratelimit-Limit": {"5000"},
				"X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {strconv.FormatInt(reset.Unix(), 10)}}
			return &http.Response{StatusCode: 403, Header: h, Body: http.NoBody, Request: r}, nil
		})
		tr := mustNew(t, base, WithRetry(0))
		defer tr.Close()
		call(t.Context(), tr, "http://api.test/repos/o/r") // core: nothing left for a minute
		ctx, cancel := context.WithTimeout(WithSublimit(t.Context(), "o/r"), 10*time.Second)
		defer cancel()
		for range 5 {
			call(ctx, tr, "http://api.test/repos/o/r")
		}
		if n := sent.Load(); n > 1 {
			t.Errorf("%d calls sent while core had nothing left until its reset, want only the first", n)
		}
	})
}

// discordBase answers as Discord does on bucket "b", with room in it,
// except on path refused, answered 429 with a minute's Retry-After in the
// given scope ("user": the bucket is spent; "shared": a busy resource).
func discordBase(refused, scope string) rtFunc {
	return rtFunc(func(r *http.Request) (*http.Response, error) {
		h := http.Header{"X-Ratelimit-Bucket": {"b"}, "X-Ratelimit-Limit": {"5"}, "X-Ratelimit-Remaining": {"4"},
			"X-Ratelimit-Reset-After": {"1"}}
		status := 200
		if r.URL.Path == refused {
			status = 429
			h.Set("X-Ratelimit-Scope", scope)
			if scope == "user" {
				h.Set("X-Ratelimit-Remaining", "0")
			}
			h.Set("Retry-After", "60")
		}
		return &http.Response{StatusCode: status, Header: h, Body: http.NoBody, Request: r}, nil
	})
}

// A route is not forgotten while the sub-limit it is filed under still
// cools down: idle past WithLaneIdle, a call on it is still held back by
// what the server said, for GitHub's 429 on core as for its 403 with none
// left until a reset half an hour away; with a major parameter, for
// Discord's bucket of one channel.
func TestSublimitRouteKeptWhileCooling(t *testing.T) {
	for _, c := range []struct {
		name, path string
		status     int
		header     func() http.Header
	}{
		{"429 Retry-After", "/repos/o/r", 429, func() http.Header {
			return http.Header{"X-Ratelimit-Resource": {"core"}, "X-Ratelimit-Remaining": {"0"}, "Retry-After": {"1800"}}
		}},
		{"403 none left", "/repos/o/r", 403, func() http.Header {
			return http.Header{"X-Ratelimit-Resource": {"core"}, "X-Ratelimit-Limit": {"5000"}, "X-Ratelimit-Remaining": {"0"},
				"X-Ratelimit-Reset": {strconv.FormatInt(time.Now().Add(30*time.Minute).Unix(), 10)}}
		}},
		{"Discord bucket", "/api/v10/channels/42/messages", 429, func() http.Header {
			return http.Header{"X-Ratelimit-Bucket": {"abcd1234"}, "X-Ratelimit-Remaining": {"0"},
				"X-Ratelimit-Scope": {"user"}, "Retry-After": {"1800"}}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				time.Sleep(time.Until(time.Unix(1_700_000_000, 0))) // resets as Unix seconds
				var sent atomic.Int64
				base := rtFunc(func(r *http.Request) (*http.Response, error) {
					sent.Add(1)
					return &http.Response{StatusCode: c.status, Header: c.header(), Body: http.NoBody, Request: r}, nil
				})
				tr := mustNew(t, base, WithLaneIdle(time.Minute), WithRetry(0), WithMaxRetryAfter(time.Hour))
				url := "http://api.test" + c.path
				if err := call(t.Context(), tr, url); err != nil {
					t.Fatal(err)
				}
				// Idle past WithLaneIdle and past the sweep that follows.
				time.Sleep(3 * time.Minute)
				ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
				defer cancel()
				err := call(ctx, tr, url)
				if n := sent.Load(); n != 1 {
					t.Errorf("idle 3 minutes in a 30-minute wait: %d calls reached the server (the last: %v), want 1", n, err)
				}
				if !errors.Is(err, ErrRejected) {
					t.Errorf("a call in the wait: %v, want a refusal", err)
				}
			})
		})
	}
}

// A sub-limit lane that a response names, forgotten by the sweep between
// the moment the response found it and the moment it reads the response,
// does not take what the response says with it: the sub-limit's live lane
// holds the wait a 429 asks for, and the next call on a route filed under
// it is refused.
func TestSublimitNamedLaneForgottenWhileRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var sent atomic.Int64
		base := rtFunc(func(r *http.Request) (*http.Response, error) {
			h := http.Header{"X-Ratelimit-Resource": {"core"}, "X-Ratelimit-Limit": {"5000"}, "X-Ratelimit-Remaining": {"4999"}}
			status := http.StatusOK
			if sent.Add(1) == 2 {
				status = http.StatusTooManyRequests
				h.Set("X-Ratelimit-Remaining", "0")
				h.Set("Retry-After", "600")
			}
			return &http.Response{StatusCode: status, Header: h, Body: http.NoBody, Request: r}, nil
		})
		tr := mustNew(t, base, WithRetry(0))
		if err := call(t.Context(), tr, "http://api.test/repos/o/r"); err != nil { // files the route under core
			t.Fatal(err)
		}
		var once sync.Once
		testHookNamed = func(on *lane) {
			once.Do(func() { // the sweep forgets it, as it does an idle lane
				on.lock()
				on.flags.Or(laneDead)
				on.unlock()
				tr.lanes.CompareAndDelete(on.key, on)
			})
		}
		defer func() { testHookNamed = nil }()
		// A route not filed yet, whose 429 names core.
		if err := call(t.Context(), tr, "http://api.test/users/u"); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		err := call(ctx, tr, "http://api.test/repos/o/r")
		if n := sent.Load(); n != 2 || !errors.Is(err, ErrRejected) {
			t.Errorf("a call on core in the wait its 429 asked for: %v, %d calls sent; want a refusal and 2", err, n)
		}
	})
}
