package sluice

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// TestSignalEvents: each signal sluice recognises, as the server named in
// its case sends it, is an Event the Observer sees, with the status the
// response had (0 for a stream's first event about overload; a stream's
// first event about a rate limit is taken as a 429 without headers).
// docs/design.md, "Signals and the servers that send them", lists them.
func TestSignalEvents(t *testing.T) {
	reset := func() string { return strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10) }
	sse := http.Header{"Content-Type": {"text/event-stream"}}
	json := http.Header{"Content-Type": {"application/json"}}
	for _, c := range []struct {
		name   string
		path   string
		answer func() (int, http.Header, string)
		kind   EventKind
		status int
		cause  string // of the event, if it has one
	}{
		{"429 Retry-After (any server)", "/x", func() (int, http.Header, string) {
			return 429, http.Header{"Retry-After": {"2"}}, ""
		}, EventCooldown, 0, "retry-after"},
		{"429 (any server)", "/x", func() (int, http.Header, string) { return 429, nil, "" }, EventThrottled, 429, ""},
		{"503 Retry-After (any server)", "/x", func() (int, http.Header, string) {
			return 503, http.Header{"Retry-After": {"1"}}, ""
		}, EventThrottled, 503, ""},
		{"GitHub primary limit, 403 remaining 0", "/x", func() (int, http.Header, string) {
			return 403, http.Header{"X-Ratelimit-Limit": {"5000"}, "X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {reset()}}, ""
		}, EventThrottled, 403, ""},
		{"GitHub secondary limit in a 403's body", "/x", func() (int, http.Header, string) {
			return 403, json, `{"message":"You have exceeded a secondary rate limit. Please wait a few minutes before you try again."}`
		}, EventThrottled, 403, ""},
		{"GitHub GraphQL RATE_LIMITED in a 200", "/graphql", func() (int, http.Header, string) {
			return 200, json, `{"errors":[{"type":"RATE_LIMITED","message":"API rate limit exceeded"}]}`
		}, EventThrottled, 200, ""},
		{"Linear GraphQL RATELIMITED in a 400", "/graphql", func() (int, http.Header, string) {
			return 400, json, `{"errors":[{"message":"Rate limit exceeded","extensions":{"code":"RATELIMITED"}}]}`
		}, EventThrottled, 400, ""},
		{"Shopify GraphQL THROTTLED in a 200", "/admin/api/2025-01/graphql.json", func() (int, http.Header, string) {
			return 200, json, `{"errors":[{"message":"Throttled","extensions":{"code":"THROTTLED"}}]}`
		}, EventThrottled, 200, ""},
		{"Anthropic 529 overloaded_error", "/v1/messages", func() (int, http.Header, string) {
			return 529, json, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`
		}, EventOverloaded, 529, OverloadStatus},
		{"gateway 502", "/x", func() (int, http.Header, string) { return 502, nil, "" }, EventOverloaded, 502, OverloadStatus},
		{"gateway 504", "/x", func() (int, http.Header, string) { return 504, nil, "" }, EventOverloaded, 504, OverloadStatus},
		{"503 without Retry-After", "/x", func() (int, http.Header, string) { return 503, nil, "" }, EventOverloaded, 503, OverloadStatus},
		{"Anthropic stream error: overloaded", "/v1/messages", func() (int, http.Header, string) {
			return 200, sse, sseOverloaded
		}, EventOverloaded, 0, OverloadStream},
		{"Anthropic stream error: rate limit", "/v1/messages", func() (int, http.Header, string) {
			return 200, sse, sseRateLimited
		}, EventThrottled, 429, ""},
		{"OpenAI x-ratelimit-*-requests", "/v1/chat/completions", func() (int, http.Header, string) {
			return 200, http.Header{"X-Ratelimit-Limit-Requests": {"10"}, "X-Ratelimit-Remaining-Requests": {"2"},
				"X-Ratelimit-Reset-Requests": {"800ms"}}, "{}"
		}, EventRateChanged, 0, RateHeader},
		{"IETF RateLimit", "/x", func() (int, http.Header, string) {
			return 200, http.Header{"Ratelimit-Policy": {`"default";q=60;w=60`}, "Ratelimit": {`"default";r=59;t=60`}}, "{}"
		}, EventRateChanged, 0, RateHeader},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &fakeBase{answer: func(req *http.Request) *http.Response {
					status, h, body := c.answer()
					if h == nil {
						h = http.Header{}
					}
					return &http.Response{StatusCode: status, Header: h, Request: req, Body: io.NopCloser(strings.NewReader(body))}
				}}
				rec := &recorder{}
				tr := mustNew(t, base, WithRate(100, time.Second), WithRetry(0), WithObserver(rec))
				// A few calls: a quota in headers paces the lane once a
				// response or two have shown what kind it is.
				for range 3 {
					req, _ := http.NewRequestWithContext(t.Context(), "POST", "http://api.test"+c.path, nil)
					resp, err := tr.RoundTrip(req)
					if err != nil {
						t.Fatal(err)
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					time.Sleep(10 * time.Millisecond)
				}
				tr.WaitEvents(context.Background())
				es := rec.of(c.kind)
				if len(es) == 0 {
					t.Fatalf("no %v event; events: %+v", c.kind, rec.events)
				}
				e := es[0]
				if e.Lane != "api.test" || e.Status != c.status || e.Cause != c.cause {
					t.Errorf("%v event %+v, want status %d, cause %q", c.kind, e, c.status, c.cause)
				}
			})
		})
	}
}
