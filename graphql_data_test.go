package sluice

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// TestGraphQLDataIsNoThrottle: a GraphQL endpoint's successful answer
// whose data merely holds the string "THROTTLED" (or "RATE_LIMITED") as a
// value, such as a job's status or a label's name, is an ordinary answer:
// only an entry of its errors says the query was throttled. Read as a
// throttle, every such answer counts as a 429 and cuts the lane's rate.
func TestGraphQLDataIsNoThrottle(t *testing.T) {
	for _, body := range []string{
		`{"data":{"jobs":[{"id":"1","status":"THROTTLED"},{"id":"2","status":"DONE"}]}}`,
		`{"data":{"repository":{"labels":{"nodes":[{"name":"RATE_LIMITED"},{"name":"bug"}]}}}}`,
		`{"data":{"issues":{"nodes":[{"title":"RATELIMITED"}]}}}`,
	} {
		t.Run(body[:30], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &fakeBase{answer: func(req *http.Request) *http.Response {
					return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
						Body: io.NopCloser(strings.NewReader(body))}
				}}
				tr := mustNew(t, base, WithRetry(0))
				defer tr.Close()
				for range 3 {
					req, _ := http.NewRequestWithContext(t.Context(), "POST", "http://api.test/graphql", strings.NewReader(`{"query":"{jobs{id status}}"}`))
					resp, err := tr.RoundTrip(req)
					if err != nil {
						t.Fatal(err)
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				if s, _ := tr.LaneStats("api.test"); s.Throttled != 0 {
					t.Errorf("throttled %d, want 0: the answers were served, their data only holds the word", s.Throttled)
				}
			})
		})
	}
}

// TestGraphQLDataMentioningSecondaryLimit: GitHub's secondary rate
// limit is stated in a 403's or a 429's body. A GraphQL 200 whose data
// merely mentions it (an issue titled after it, as many are) is an
// ordinary answer: read as the limit, it would pause the whole lane a
// minute, then two, then four.
func TestGraphQLDataMentioningSecondaryLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const body = `{"data":{"search":{"nodes":[{"number":1,"title":"Retries ignore the secondary rate limit"},{"number":2,"title":"You have triggered an abuse detection mechanism"}]}}}`
		base := &fakeBase{answer: func(req *http.Request) *http.Response {
			return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json; charset=utf-8"}},
				Body: io.NopCloser(strings.NewReader(body))}
		}}
		tr := mustNew(t, base, WithRetry(0))
		defer tr.Close()
		start := time.Now()
		for range 3 {
			req, _ := http.NewRequestWithContext(t.Context(), "POST", "http://api.github.test/graphql", strings.NewReader(`{"query":"{search{nodes{title}}}"}`))
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		s, _ := tr.LaneStats("api.github.test")
		if d := time.Since(start); d > time.Second || s.Throttled != 0 {
			t.Errorf("3 served queries took %v, %d throttled; want no pause and none throttled", d, s.Throttled)
		}
	})
}
