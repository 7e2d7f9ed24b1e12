package main

import (
	"net/http"
	"testing"
	"time"
)

func TestStripRateLimit(t *testing.T) {
	h := http.Header{}
	for _, k := range []string{"X-RateLimit-Limit", "X-RateLimit-Reset", "X-Rate-Limit-Duration", "RateLimit", "RateLimit-Policy",
		"RateLimit-Remaining", "Anthropic-Ratelimit-Requests-Limit", "Retry-After", "Retry-After-Ms", "Date", "Content-Type"} {
		h.Set(k, "1")
	}
	base := roundTripFunc(func(*http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusTooManyRequests, Header: h.Clone(), Body: http.NoBody}, nil
	})
	resp, err := stripRateLimit{base}.RoundTrip(&http.Request{})
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for k := range resp.Header {
		kept = append(kept, k)
	}
	if resp.StatusCode != http.StatusTooManyRequests || len(kept) != 4 ||
		resp.Header.Get("Retry-After") == "" || resp.Header.Get("Retry-After-Ms") == "" || resp.Header.Get("Date") == "" || resp.Header.Get("Content-Type") == "" {
		t.Errorf("status %d, kept %v; want 429 and Retry-After, Retry-After-Ms, Date, Content-Type", resp.StatusCode, kept)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestHeadersDoNoHarmOnLoopback compares, on real loopback, sluice with
// no WithRate reading the rate-limit headers with the same client whose
// base strips them, one run after the other, on servers where reading
// them once did harm: two windows refilled all at once (ulule/limiter,
// sethvargo/go-limiter) and the strict GCRA that states its limit in both
// families. 4 s runs from a cold lane; the bounds are ratios between the
// two with slack for a loaded runner: the headers read serve at least
// what the stripped ones do less 0.1 of R, over the second half and the
// whole run, and refuse at most 3 points more of the attempts, in one of
// two pairs of runs.
func TestHeadersDoNoHarmOnLoopback(t *testing.T) {
	if testing.Short() {
		t.Skip("real-clock runs")
	}
	ms, err := matching(harmModels(), func(m model) string { return m.name }, "-model",
		`^(ulule/limiter "50-S"|sethvargo/go-limiter, 50 per 1 s|strict GCRA .*100/s, 64 callers)$`)
	if err != nil || len(ms) != 3 {
		t.Fatalf("%d models, %v", len(ms), err)
	}
	var on, off client
	for _, c := range harmClients() {
		switch c.name {
		case "sluice, no WithRate":
			on = c
		case "sluice, no WithRate, headers stripped":
			off = c
		}
	}
	if on.make == nil || off.make == nil {
		t.Fatal("no harm clients")
	}
	cfg := config{d: 4 * time.Second, workers: 32, latency: 20 * time.Millisecond}
	for _, m := range ms {
		t.Run(m.name, func(t *testing.T) {
			// A pair of 4 s runs from cold lanes on a loaded runner can
			// go either way by chance (a lane that ignores a window's
			// headers can also collapse to a few requests a second after
			// its first refusals): harm is what two pairs in a row show.
			var a, b result
			for try := range 2 {
				a, b = run(t.Context(), cfg, m, on), run(t.Context(), cfg, m, off)
				t.Logf("pair %d: headers read %v; stripped %v", try, a, b)
				if a.err != nil || b.err != nil || a.attempts == 0 || b.attempts == 0 {
					t.Fatalf("read %+v, stripped %+v", a, b)
				}
				const slack = 0.1
				if a.ratio >= b.ratio-slack && a.whole >= b.whole-slack && a.refused <= b.refused+3 {
					return
				}
			}
			t.Errorf("headers read %v, stripped %v: reading them does harm, twice in a row", a, b)
		})
	}
}
