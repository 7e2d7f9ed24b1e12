package sluice

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// TestLearnNoRateFromStrictGCRA: a lane with no configured rate, against a
// strict GCRA upstream (burst 1, 429 + Retry-After in whole seconds, no
// quota headers), learns a rate from its first refusals, though the server
// accepts about one request per cooldown, and settles near the limit, where
// a lane that took every refusal as a second's cooldown would not.
func TestLearnNoRateFromStrictGCRA(t *testing.T) {
	const r = 50
	res := runGCRA(t, r, 30*time.Second, 200*time.Microsecond, 1, func(base http.RoundTripper) http.RoundTripper {
		return mustNew(t, base)
	})
	var table strings.Builder
	fmt.Fprintf(&table, gcraTableHead, "client", "rate/R", "5-60s", "last30", "429s", "429%", "retries", "cools")
	gcraRow(&table, "sluice, no WithRate", res)
	t.Logf("accepted per second: %v\n%s", res.perSecond, table.String())
	if res.steady < 0.85 {
		t.Errorf("%.3f of R over the last half, want >= 0.85", res.steady)
	}
	if frac := res.refusedShare(); frac > 0.02 {
		t.Errorf("%.2f%% of attempts refused, want <= 2%%", 100*frac)
	}
}

// TestRemainingZeroOnAcceptedDoesNotStall: a strict GCRA middleware says
// "limit 1, remaining 0, reset 1" on every accepted response; that is the
// last token for now, not a second's pause (which would hold the lane at
// one request a second).
func TestRemainingZeroOnAcceptedDoesNotStall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{answer: answerWith(1<<30, 200, "X-RateLimit-Limit: 1", "X-RateLimit-Remaining: 0", "X-RateLimit-Reset: 1")}
		tr := mustNew(t, base, WithRate(50, time.Second))
		start := time.Now()
		for range 100 {
			if err := get(t.Context(), tr, ""); err != nil {
				t.Fatal(err)
			}
		}
		if d := time.Since(start); d > 2500*time.Millisecond {
			t.Errorf("100 requests at 50/s took %v, want about 2 s", d)
		}
		if s, _ := tr.Stats().Lane("api.test"); s.Cooldowns != 0 {
			t.Errorf("%d cooldowns for accepted responses", s.Cooldowns)
		}
	})
}

// TestSecondaryLimit403: GitHub's secondary limit answers 403 with
// Retry-After while the quota is far from used: the lane pauses for it, and
// sends nothing more into the penalty.
func TestSecondaryLimit403(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{latency: 10 * time.Millisecond, answer: answerWith(1, http.StatusForbidden,
			"Retry-After: 3", "X-RateLimit-Limit: 5000", "X-RateLimit-Remaining: 4990", "X-RateLimit-Resource: core",
			"X-RateLimit-Reset: "+fmt.Sprint(time.Now().Add(time.Hour).Unix()))}
		tr := mustNew(t, base, WithRetry(0))
		start := time.Now()
		if err := get(t.Context(), tr, ""); err != nil {
			t.Fatal(err)
		}
		penaltyFrom := time.Since(start)
		for range 30 {
			get(t.Context(), tr, "")
		}
		for _, a := range base.arrivals[1:] {
			if d := a.at.Sub(start); d < penaltyFrom+3*time.Second {
				t.Errorf("request sent at %v, inside the 3 s penalty that began at %v", d, penaltyFrom)
			}
		}
		if s, _ := tr.Stats().Lane("api.test"); s.Throttled != 1 || s.Rate != 0 {
			t.Errorf("Throttled %d, Rate %v; want 1 and 0 (a penalty is not a pace)", s.Throttled, s.Rate)
		}
	})
}

// TestTokenBudget429: a 429 whose token budget ran out (OpenAI's
// x-ratelimit-remaining-tokens: 0) pauses the lane until the tokens reset,
// and does not cut the request rate: requests were not the problem.
func TestTokenBudget429(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{answer: answerWith(1, 429,
			"X-Ratelimit-Limit-Requests: 500", "X-Ratelimit-Remaining-Requests: 480", "X-Ratelimit-Reset-Requests: 2.4s",
			"X-Ratelimit-Limit-Tokens: 30000", "X-Ratelimit-Remaining-Tokens: 0", "X-Ratelimit-Reset-Tokens: 1.5s")}
		tr := mustNew(t, base, WithRate(10, time.Second))
		start := time.Now()
		if err := get(t.Context(), tr, ""); err != nil {
			t.Fatal(err)
		}
		// The retry went after the token reset, and succeeded.
		if n := len(base.arrivals); n != 2 {
			t.Fatalf("%d attempts, want 2", n)
		}
		if d := base.arrivals[1].at.Sub(start); d < 1500*time.Millisecond {
			t.Errorf("retry sent after %v, inside the token budget's 1.5 s", d)
		}
		if s, _ := tr.Stats().Lane("api.test"); s.Rate != 10 {
			t.Errorf("rate %v after a token-budget 429, want the configured 10", s.Rate)
		}
	})
}
