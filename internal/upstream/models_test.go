package upstream

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
)

// The bubble's clock starts at 2000-01-01 00:00:00 UTC, Unix 946684800.
const bubbleEpoch = 946684800

// wantHeaders checks that r has the status and each header (name, value
// pairs; value "<none>" means absent).
func wantHeaders(t *testing.T, what string, r result, status int, kv ...string) {
	t.Helper()
	wantStatus(t, what, r, status)
	for i := 0; i+1 < len(kv); i += 2 {
		got, ok := r.header[http.CanonicalHeaderKey(kv[i])]
		if kv[i+1] == "<none>" {
			if ok {
				t.Fatalf("%s: %s = %q, want absent", what, kv[i], got)
			}
			continue
		}
		if len(got) != 1 || got[0] != kv[i+1] {
			t.Fatalf("%s: %s = %q, want %q", what, kv[i], got, kv[i+1])
		}
	}
}

// getWith sends a GET with headers (name, value pairs).
func getWith(t *testing.T, s *Server, kv ...string) result {
	t.Helper()
	return send(t, s, http.MethodGet, "/", "", kv...)
}

// hammer sends sequential GETs every `every` from now until d has passed
// and returns how many were accepted.
func hammer(t *testing.T, s *Server, every, d time.Duration) int {
	t.Helper()
	end := time.Now().Add(d)
	n := 0
	for time.Now().Before(end) {
		if get(t, s).status == http.StatusOK {
			n++
		}
		time.Sleep(every)
	}
	return n
}

func TestGitHubPrimary(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Config{Limiter: NewGitHub(GitHubConfig{Limit: 3, Window: 2 * time.Second})})
		defer s.Close()
		reset := itoa(bubbleEpoch + 2)
		for i, rem := range []string{"2", "1", "0"} {
			wantHeaders(t, "in quota", get(t, s), 200,
				"X-RateLimit-Limit", "3", "X-RateLimit-Remaining", rem, "X-RateLimit-Used", itoa(int64(i+1)),
				"X-RateLimit-Reset", reset, "X-RateLimit-Resource", "core")
		}
		over := get(t, s)
		wantHeaders(t, "over", over, 403, "X-RateLimit-Remaining", "0", "X-RateLimit-Used", "3",
			"X-RateLimit-Reset", reset, "Retry-After", "<none>")
		if !strings.Contains(over.body, "API rate limit exceeded") {
			t.Fatalf("body %q", over.body)
		}
		time.Sleep(1999 * time.Millisecond)
		wantHeaders(t, "1ms before the reset", get(t, s), 403, "X-RateLimit-Reset", reset)
		time.Sleep(time.Millisecond)
		wantHeaders(t, "new window", get(t, s), 200, "X-RateLimit-Remaining", "2", "X-RateLimit-Used", "1",
			"X-RateLimit-Reset", itoa(bubbleEpoch+4))
		if acc, rej := s.Counts(); acc != 4 || rej != 2 {
			t.Fatalf("Counts() = %d, %d; want 4, 2", acc, rej)
		}
	})
}

func TestGitHubPrimary429AndEnforcement(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewGitHub(GitHubConfig{Limit: 10, Window: time.Second, Status: 429, Resource: "search"})
		s := New(Config{Limiter: g})
		defer s.Close()
		if n := hammer(t, s, time.Millisecond, 5*time.Second); n != 50 {
			t.Fatalf("accepted %d in 5 one-second windows of 10, want 50", n)
		}
		wantHeaders(t, "t=5s: a new window", get(t, s), 200, "X-RateLimit-Resource", "search", "X-RateLimit-Remaining", "9")
		for range 9 {
			get(t, s)
		}
		wantHeaders(t, "status", get(t, s), 429, "X-RateLimit-Remaining", "0")
		if g.Rate() != 10 {
			t.Fatalf("Rate() = %v", g.Rate())
		}
	})
}

func TestGitHubSecondaryTrigger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewGitHub(GitHubConfig{Limit: 100, Window: time.Minute})
		s := New(Config{Limiter: g})
		defer s.Close()
		wantStatus(t, "before", get(t, s), 200)
		time.Sleep(500 * time.Millisecond)
		g.Trigger(3 * time.Second)
		r := get(t, s)
		wantHeaders(t, "penalty", r, 403, "Retry-After", "3", "X-RateLimit-Remaining", "99", "X-RateLimit-Used", "1")
		if !strings.Contains(r.body, "secondary rate limit") {
			t.Fatalf("body %q", r.body)
		}
		time.Sleep(2400 * time.Millisecond) // 0.6s left
		wantHeaders(t, "late in the penalty", get(t, s), 403, "Retry-After", "1", "X-RateLimit-Remaining", "99")
		time.Sleep(600 * time.Millisecond)
		wantHeaders(t, "after", get(t, s), 200, "Retry-After", "<none>", "X-RateLimit-Remaining", "98")
		if n, p := g.PenaltyArrivals(), g.Penalties(); n != 2 || p != 1 {
			t.Fatalf("PenaltyArrivals, Penalties = %d, %d; want 2, 1", n, p)
		}
	})
}

func TestGitHubSecondaryConcurrency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewGitHub(GitHubConfig{Limit: 100, Window: time.Minute, MaxConcurrent: 2, Penalty: 5 * time.Second})
		s := New(Config{Limiter: g, Latency: func(int, *http.Request) time.Duration { return time.Second }})
		defer s.Close()
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() { goGet(t, s) })
		}
		synctest.Wait()
		start := time.Now()
		wantHeaders(t, "third at once", get(t, s), 403, "Retry-After", "5", "X-RateLimit-Remaining", "98")
		if n, p := g.PenaltyArrivals(), g.Penalties(); n != 0 || p != 1 {
			t.Fatalf("after the trigger: PenaltyArrivals, Penalties = %d, %d; want 0, 1", n, p)
		}
		wg.Wait() // the two finish at +1s
		wantHeaders(t, "during", get(t, s), 403, "Retry-After", "4")
		time.Sleep(time.Until(start.Add(5 * time.Second)))
		wantStatus(t, "after", get(t, s), 200)
		if n := g.PenaltyArrivals(); n != 1 {
			t.Fatalf("PenaltyArrivals = %d, want 1", n)
		}
	})
}

func TestOpenAIHeaders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// 1 request/s with a burst of 3; 100 tokens per 3s: one token per 30ms.
		m := NewOpenAI(OpenAIConfig{Requests: 3, Tokens: 100, Per: 3 * time.Second})
		s := New(Config{Limiter: m})
		defer s.Close()
		wantHeaders(t, "40 tokens", getWith(t, s, CostTokensHeader, "40"), 200,
			"x-ratelimit-limit-requests", "3", "x-ratelimit-remaining-requests", "2", "x-ratelimit-reset-requests", "1s",
			"x-ratelimit-limit-tokens", "100", "x-ratelimit-remaining-tokens", "60", "x-ratelimit-reset-tokens", "1.2s")
		wantHeaders(t, "50 tokens", getWith(t, s, CostTokensHeader, "50"), 200,
			"x-ratelimit-remaining-requests", "1", "x-ratelimit-reset-requests", "2s",
			"x-ratelimit-remaining-tokens", "10", "x-ratelimit-reset-tokens", "2.7s")
		// 20 tokens: 10 short, 300ms away. Nothing is consumed.
		r := getWith(t, s, CostTokensHeader, "20")
		wantHeaders(t, "tokens short", r, 429, "retry-after-ms", "300", "retry-after", "1",
			"x-ratelimit-remaining-requests", "1", "x-ratelimit-remaining-tokens", "10")
		if !strings.Contains(r.body, `"type":"tokens"`) {
			t.Fatalf("body %q", r.body)
		}
		time.Sleep(300 * time.Millisecond)
		wantHeaders(t, "on time", getWith(t, s, CostTokensHeader, "20"), 200,
			"x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "2.7s",
			"x-ratelimit-remaining-tokens", "0", "x-ratelimit-reset-tokens", "3s")
		// No cost header: 0 tokens, but no request left for 700ms.
		r = get(t, s)
		wantHeaders(t, "requests short", r, 429, "retry-after-ms", "700", "retry-after", "1")
		if !strings.Contains(r.body, `"type":"requests"`) {
			t.Fatalf("body %q", r.body)
		}
		wantHeaders(t, "too large", getWith(t, s, CostTokensHeader, "101"), 429, "retry-after", "<none>", "retry-after-ms", "<none>")
		wantStatus(t, "bad cost", getWith(t, s, CostTokensHeader, "-1"), 400)
		time.Sleep(700*time.Millisecond - time.Nanosecond)
		wantStatus(t, "1ns early", get(t, s), 429)
		time.Sleep(time.Nanosecond)
		wantStatus(t, "on time", get(t, s), 200)
	})
}

func TestOpenAIRequestsOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hour := New(Config{Limiter: NewOpenAI(OpenAIConfig{Requests: 10, Per: time.Hour})})
		defer hour.Close()
		wantHeaders(t, "10/h", getWith(t, hour, CostTokensHeader, "5"), 200, "x-ratelimit-reset-requests", "6m0s",
			"x-ratelimit-limit-tokens", "<none>", "x-ratelimit-remaining-tokens", "<none>")

		m := NewOpenAI(OpenAIConfig{Requests: 50, Per: time.Second})
		s := New(Config{Limiter: m})
		defer s.Close()
		wantHeaders(t, "50/s", get(t, s), 200, "x-ratelimit-reset-requests", "20ms", "x-ratelimit-remaining-requests", "49")
		// Sustained: the burst of 50 (49 left) then 50/s.
		if n := hammer(t, s, time.Millisecond, 4*time.Second); n < 49+200-1 || n > 49+200+1 {
			t.Fatalf("accepted %d in 4s at 50/s after 1 of a burst of 50, want 249±1", n)
		}
	})
}

func TestOpenAIDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                          "0s",
		time.Nanosecond:            "1ms",
		20 * time.Millisecond:      "20ms",
		6 * time.Minute:            "6m0s",
		7660 * time.Millisecond:    "7.66s",
		59544*time.Millisecond + 1: "59.545s",
	} {
		if got := openAIDuration(d); got != want {
			t.Errorf("openAIDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestAnthropicHeaders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := NewAnthropic(AnthropicConfig{Requests: 2, InputTokens: 1000, OutputTokens: 100, Per: 10 * time.Second})
		s := New(Config{Limiter: m})
		defer s.Close()
		time.Sleep(500 * time.Millisecond)
		wantHeaders(t, "first", getWith(t, s, CostInputTokensHeader, "200", CostOutputTokensHeader, "50"), 200,
			"anthropic-ratelimit-requests-limit", "2", "anthropic-ratelimit-requests-remaining", "1",
			"anthropic-ratelimit-requests-reset", "2000-01-01T00:00:06Z", // full at 5.5s, rounded up
			"anthropic-ratelimit-input-tokens-limit", "1000", "anthropic-ratelimit-input-tokens-remaining", "800",
			"anthropic-ratelimit-input-tokens-reset", "2000-01-01T00:00:03Z",
			"anthropic-ratelimit-output-tokens-limit", "100", "anthropic-ratelimit-output-tokens-remaining", "50",
			"anthropic-ratelimit-output-tokens-reset", "2000-01-01T00:00:06Z",
			// Output has the smaller fraction left: 50/100 < 800/1000.
			"anthropic-ratelimit-tokens-limit", "100", "anthropic-ratelimit-tokens-remaining", "50",
			"anthropic-ratelimit-tokens-reset", "2000-01-01T00:00:06Z",
			"retry-after", "<none>")
		r := getWith(t, s, CostOutputTokensHeader, "60")
		wantHeaders(t, "output short", r, 429, "retry-after", "1",
			"anthropic-ratelimit-requests-remaining", "1", "anthropic-ratelimit-output-tokens-remaining", "50")
		if !strings.Contains(r.body, "rate_limit_error") || !strings.Contains(r.body, "output-tokens") {
			t.Fatalf("body %q", r.body)
		}
		time.Sleep(time.Second)
		wantHeaders(t, "output on time", getWith(t, s, CostOutputTokensHeader, "60"), 200,
			"anthropic-ratelimit-requests-remaining", "0", "anthropic-ratelimit-requests-reset", "2000-01-01T00:00:11Z",
			"anthropic-ratelimit-output-tokens-remaining", "0", "anthropic-ratelimit-output-tokens-reset", "2000-01-01T00:00:12Z",
			"anthropic-ratelimit-input-tokens-remaining", "900", "anthropic-ratelimit-tokens-remaining", "0")
		wantHeaders(t, "requests short", get(t, s), 429, "retry-after", "4")
		wantHeaders(t, "too large", getWith(t, s, CostInputTokensHeader, "1001"), 429, "retry-after", "<none>")
		wantStatus(t, "bad cost", getWith(t, s, CostOutputTokensHeader, "x"), 400)
		if acc, rej := s.Counts(); acc != 2 || rej != 4 {
			t.Fatalf("Counts() = %d, %d; want 2, 4", acc, rej)
		}
	})
}

func TestAnthropicRequestsOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Config{Limiter: NewAnthropic(AnthropicConfig{Requests: 20, Per: time.Second})})
		defer s.Close()
		wantHeaders(t, "no token budgets", getWith(t, s, CostInputTokensHeader, "999999"), 200,
			"anthropic-ratelimit-requests-remaining", "19", "anthropic-ratelimit-tokens-limit", "<none>",
			"anthropic-ratelimit-input-tokens-limit", "<none>")
		if n := hammer(t, s, time.Millisecond, 3*time.Second); n < 19+60-1 || n > 19+60+1 {
			t.Fatalf("accepted %d in 3s at 20/s after 1 of a burst of 20, want 79±1", n)
		}
	})
}

func TestIETFBucket(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// 20/s, burst 10: one request every 50ms.
		s := New(Config{Limiter: NewIETF(IETFConfig{Quota: 20, Window: time.Second, Burst: 10})})
		defer s.Close()
		for i := range 10 {
			wantHeaders(t, "burst", get(t, s), 200,
				"RateLimit-Policy", `"default";q=20;w=1`, "RateLimit", `"default";r=`+itoa(int64(9-i))+`;t=1`)
		}
		wantHeaders(t, "empty", get(t, s), 429, "Retry-After", "1", "RateLimit", `"default";r=0;t=1`)
		time.Sleep(49 * time.Millisecond)
		wantStatus(t, "1ms early", get(t, s), 429)
		time.Sleep(time.Millisecond)
		wantHeaders(t, "next token", get(t, s), 200, "RateLimit", `"default";r=0;t=1`)
		// 10 s later the bucket is full: 10 at once, then 20/s.
		time.Sleep(10 * time.Second)
		if n := hammer(t, s, time.Millisecond, 2*time.Second); n < 10+40-1 || n > 10+40+1 {
			t.Fatalf("accepted %d in 2s at 20/s from a full bucket of 10, want 50±1", n)
		}

		slow := New(Config{Limiter: NewIETF(IETFConfig{Quota: 6000, Window: time.Minute, Name: "api"})})
		defer slow.Close()
		wantHeaders(t, "burst 1", get(t, slow), 200, "RateLimit-Policy", `"api";q=6000;w=60`, "RateLimit", `"api";r=0;t=1`)
		wantHeaders(t, "burst 1 refused", get(t, slow), 429, "Retry-After", "1")
		time.Sleep(10 * time.Millisecond)
		wantStatus(t, "burst 1 on time", get(t, slow), 200)
	})
}

func TestBucketUntilNext(t *testing.T) {
	t0 := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	b := newBucket(10, 500*time.Millisecond) // a token per 50ms
	if got := b.untilNext(t0); got != 0 {
		t.Fatalf("full: untilNext = %v, want 0", got)
	}
	for range 3 {
		b.take(t0, 1)
	}
	if r, n := b.remaining(t0), b.untilNext(t0); r != 7 || n != 50*time.Millisecond {
		t.Fatalf("after 3: remaining %d, untilNext %v; want 7, 50ms", r, n)
	}
	t1 := t0.Add(25 * time.Millisecond)
	if r, n := b.remaining(t1), b.untilNext(t1); r != 7 || n != 25*time.Millisecond {
		t.Fatalf("25ms on: remaining %d, untilNext %v; want 7, 25ms", r, n)
	}
	if w := b.wait(t1, 11); w != -1 {
		t.Fatalf("wait for more than the capacity = %v, want -1", w)
	}
}

func TestGCRAStrict(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Config{Limiter: NewGCRA(GCRAConfig{Rate: 50})})
		defer s.Close()
		// Burst 1: remaining 0 and reset 1 (20ms rounded up) after every accepted request.
		wantHeaders(t, "first", get(t, s), 200, "X-RateLimit-Limit", "1", "X-RateLimit-Remaining", "0",
			"X-RateLimit-Reset", "1", "Retry-After", "<none>")
		time.Sleep(20*time.Millisecond - time.Nanosecond)
		wantHeaders(t, "1ns early", get(t, s), 429, "Retry-After", "1", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "1")
		time.Sleep(time.Nanosecond)
		wantStatus(t, "on time", get(t, s), 200)
		time.Sleep(20*time.Millisecond - time.Millisecond)
		if n := hammer(t, s, time.Millisecond, 2*time.Second); n != 100 {
			t.Fatalf("accepted %d in 2s at strict 50/s, want 100", n)
		}
	})
}

func TestGCRAModelBurst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// 1/s, burst 10: throttled's PerSec(1) with MaxBurst 9.
		s := New(Config{Limiter: NewGCRA(GCRAConfig{Rate: 1, Burst: 10})})
		defer s.Close()
		for i := range 10 {
			wantHeaders(t, "burst", get(t, s), 200, "X-RateLimit-Limit", "10",
				"X-RateLimit-Remaining", itoa(int64(9-i)), "X-RateLimit-Reset", itoa(int64(i+1)))
		}
		wantHeaders(t, "empty", get(t, s), 429, "Retry-After", "1", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "10")
		time.Sleep(2500 * time.Millisecond)
		// 2.5 tokens back: 2 whole; the bucket is full in 7.5s.
		wantHeaders(t, "refilled", get(t, s), 200, "X-RateLimit-Remaining", "1", "X-RateLimit-Reset", "9")
	})
}

func TestGCRANoHeaders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Config{Limiter: NewGCRA(GCRAConfig{Rate: 2, Burst: 1, NoHeaders: true})})
		defer s.Close()
		wantHeaders(t, "accepted", get(t, s), 200, "X-RateLimit-Limit", "<none>", "X-RateLimit-Remaining", "<none>",
			"X-RateLimit-Reset", "<none>", "Retry-After", "<none>")
		wantHeaders(t, "refused", get(t, s), 429, "Retry-After", "1", "X-RateLimit-Remaining", "<none>")
	})
}

// TestSlidingWindowOffset: windows that start 0.3 s after the second
// state their end truncated to it, which passes 0.3 s before the window
// ends, and count until then.
func TestSlidingWindowOffset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := NewSlidingWindow(SlidingWindowConfig{Limit: 10, Window: time.Second, Offset: 300 * time.Millisecond})
		s := New(Config{Limiter: m})
		defer s.Close()
		// The bubble starts on a whole second: in the window that began
		// 0.7 s before, which ends 0.3 s in.
		for i := range 10 {
			wantHeaders(t, "first window", get(t, s), 200, "X-RateLimit-Remaining", itoa(int64(9-i)), "X-RateLimit-Reset", itoa(bubbleEpoch))
		}
		wantStatus(t, "full", get(t, s), 429)
		time.Sleep(200 * time.Millisecond)
		wantHeaders(t, "still full", get(t, s), 429, "X-RateLimit-Reset", itoa(bubbleEpoch))
		// At 0.3 s the next window: the one before weighs 10 at its start.
		time.Sleep(100 * time.Millisecond)
		wantHeaders(t, "next window", get(t, s), 429, "X-RateLimit-Reset", itoa(bubbleEpoch+1))
		// Half way through it, 5 weigh.
		time.Sleep(500 * time.Millisecond)
		wantHeaders(t, "half way", get(t, s), 200, "X-RateLimit-Remaining", "4", "X-RateLimit-Reset", itoa(bubbleEpoch+1))
	})
}

func TestSlidingWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := NewSlidingWindow(SlidingWindowConfig{Limit: 10, Window: time.Second})
		s := New(Config{Limiter: m})
		defer s.Close()
		for i := range 10 {
			wantHeaders(t, "first window", get(t, s), 200, "X-RateLimit-Limit", "10",
				"X-RateLimit-Remaining", itoa(int64(9-i)), "X-RateLimit-Reset", itoa(bubbleEpoch+1))
		}
		wantHeaders(t, "full", get(t, s), 429, "X-RateLimit-Remaining", "0", "Retry-After", "1")
		// At 1.5s the previous window weighs 10·0.5 = 5: 5 more are accepted.
		time.Sleep(1500 * time.Millisecond)
		for i := range 5 {
			wantHeaders(t, "half way", get(t, s), 200, "X-RateLimit-Remaining", itoa(int64(4-i)),
				"X-RateLimit-Reset", itoa(bubbleEpoch+2))
		}
		wantHeaders(t, "half way, full", get(t, s), 429, "X-RateLimit-Remaining", "0")
		// At 1.9s it weighs 1: estimate round(6) = 6, 4 more.
		time.Sleep(400 * time.Millisecond)
		for i := range 4 {
			wantHeaders(t, "1.9s", get(t, s), 200, "X-RateLimit-Remaining", itoa(int64(3-i)))
		}
		wantStatus(t, "1.9s, full", get(t, s), 429)
		// Two windows later nothing weighs.
		time.Sleep(2100 * time.Millisecond)
		wantHeaders(t, "fresh", get(t, s), 200, "X-RateLimit-Remaining", "9")

		// Sustained: about Limit per Window.
		time.Sleep(2 * time.Second)
		n := hammer(t, s, time.Millisecond, 10*time.Second)
		if n < 95 || n > 110 {
			t.Fatalf("accepted %d in 10s at 10/s, want about 100", n)
		}
	})
}

func TestConfigLimiterExclusive(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("New with Limiter and Rate did not panic")
		}
	}()
	New(Config{Rate: 1, Limiter: NewGCRA(GCRAConfig{Rate: 1})}).Close()
}

func TestModelValidation(t *testing.T) {
	for name, f := range map[string]func(){
		"github limit":    func() { NewGitHub(GitHubConfig{Window: time.Second}) },
		"github window":   func() { NewGitHub(GitHubConfig{Limit: 1}) },
		"github status":   func() { NewGitHub(GitHubConfig{Limit: 1, Window: time.Second, Status: 500}) },
		"openai requests": func() { NewOpenAI(OpenAIConfig{}) },
		"anthropic":       func() { NewAnthropic(AnthropicConfig{Requests: 1, InputTokens: -1}) },
		"ietf":            func() { NewIETF(IETFConfig{Quota: 1}) },
		"gcra":            func() { NewGCRA(GCRAConfig{}) },
		"sliding":         func() { NewSlidingWindow(SlidingWindowConfig{Limit: 1}) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}

// TestModelsTCP runs every model once over real loopback, concurrently.
func TestModelsTCP(t *testing.T) {
	defer goleak.VerifyNone(t)
	models := []Model{
		NewGitHub(GitHubConfig{Limit: 5, Window: time.Hour}),
		NewOpenAI(OpenAIConfig{Requests: 5}),
		NewAnthropic(AnthropicConfig{Requests: 5}),
		NewIETF(IETFConfig{Quota: 5, Window: time.Hour, Burst: 5}),
		NewGCRA(GCRAConfig{Rate: 5, Per: time.Hour, Burst: 5}),
		NewSlidingWindow(SlidingWindowConfig{Limit: 5, Window: time.Hour}),
	}
	for _, m := range models {
		s := NewTCP(Config{Limiter: m})
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				if _, err := trySend(s, http.MethodGet, "/", ""); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if acc, rej := s.Counts(); acc != 5 || rej != 3 {
			t.Errorf("%T: Counts() = %d, %d; want 5, 3", m, acc, rej)
		}
		s.Close()
	}
}
