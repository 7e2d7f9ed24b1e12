package main

import (
	"net/http"
	"testing"
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
