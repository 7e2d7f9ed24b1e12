package sluice

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/internal/verdict"
)

// chunkReader returns data in reads of the sizes given (0 included, then
// 1 byte at a time), and err after the last byte.
type chunkReader struct {
	data   []byte
	sizes  []byte
	err    error
	closed bool
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, r.err
	}
	n := 1
	if len(r.sizes) > 0 {
		n, r.sizes = int(r.sizes[0]), r.sizes[1:]
	}
	n = min(n, len(p), len(r.data))
	copy(p, r.data[:n])
	r.data = r.data[n:]
	return n, nil
}

func (r *chunkReader) Close() error { r.closed = true; return nil }

// FuzzPeek: whatever the body, however it arrives, and whatever error ends
// it, the caller reads through peek exactly the bytes and the error the
// base sent, and Close reaches the base's body.
func FuzzPeek(f *testing.F) {
	f.Add([]byte(`{"message":"You have exceeded a secondary rate limit"}`), []byte{3, 0, 200}, true)
	f.Add(bytes.Repeat([]byte("x"), 3*peekLimit), []byte{255, 255}, false)
	f.Add([]byte{}, []byte{}, true)
	f.Add([]byte(`{"data":{},"extensions":{"cost":{"requestedQueryCost":101,"actualQueryCost":46,"throttleStatus":{"maximumAvailable":1000.0,"currentlyAvailable":954,"restoreRate":50.0}}}}`), []byte{40, 1}, false)
	f.Fuzz(func(t *testing.T, data, sizes []byte, fail bool) {
		want := errors.New("cut")
		if !fail {
			want = io.EOF
		}
		rc := &chunkReader{data: bytes.Clone(data), sizes: sizes, err: want}
		prefix, body := peek(rc)
		if len(prefix) > peekLimit || !bytes.HasPrefix(data, prefix) {
			t.Fatalf("prefix of %d bytes, not the body's first (at most %d)", len(prefix), peekLimit)
		}
		// What the prefix says of a budget in points stays within its caps.
		if p := verdict.Body(prefix).Points; p.Stated {
			in := func(v float64) bool { return v >= 0 && v <= verdict.MaxPoints }
			if !in(p.Max) || !in(p.Available) || !in(p.Restore) || p.Available > p.Max ||
				!(p.Requested == -1 || in(p.Requested)) || !(p.Actual == -1 || in(p.Actual)) {
				t.Fatalf("points %+v out of bounds", p)
			}
		}
		got, err := io.ReadAll(body)
		if !bytes.Equal(got, data) {
			t.Fatalf("read %d bytes, want the %d sent", len(got), len(data))
		}
		if fail && err != want {
			t.Fatalf("read ended with %v, want %v", err, want)
		}
		if !fail && err != nil {
			t.Fatalf("read ended with %v, want EOF", err)
		}
		if body.Close(); !rc.closed {
			t.Fatal("Close did not reach the base's body")
		}
	})
}

// TestSecondaryLimitInBody: GitHub's secondary rate limit stated only in a
// 403's body (quota left, no Retry-After) pauses the lane for a minute,
// then two at the next, until an attempt is accepted; a 403 for a missing
// permission pauses nothing; the caller reads the body as sent.
func TestSecondaryLimitInBody(t *testing.T) {
	const secondary = `{"message":"You have exceeded a secondary rate limit. Please wait a few minutes before you try again.","documentation_url":"https://docs.github.com/rest/overview/rate-limits-for-the-rest-api"}`
	const permission = `{"message":"Resource not accessible by integration","status":"403"}`
	synctest.Test(t, func(t *testing.T) {
		var answers []string // bodies of 403s to come, in order; "" a 200
		base := &fakeBase{answer: func(req *http.Request) *http.Response {
			body := ""
			if len(answers) > 0 {
				body, answers = answers[0], answers[1:]
			}
			h := http.Header{"X-Ratelimit-Limit": {"5000"}, "X-Ratelimit-Remaining": {"4990"},
				"X-Ratelimit-Reset":    {strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)},
				"X-Ratelimit-Resource": {"core"}}
			if body == "" {
				return &http.Response{StatusCode: 200, Header: h, Body: io.NopCloser(strings.NewReader("ok"))}
			}
			return &http.Response{StatusCode: 403, Header: h, Body: io.NopCloser(strings.NewReader(body))}
		}}
		tr := mustNew(t, base, WithRetry(0))
		send := func() (time.Duration, string) {
			t.Helper()
			start := time.Now()
			req, _ := http.NewRequestWithContext(t.Context(), "GET", "http://api.test/x", nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return time.Since(start), string(b)
		}
		answers = []string{secondary, "", secondary, secondary, "", secondary, permission}
		if _, b := send(); b != secondary {
			t.Fatalf("the caller read %q, want the body sent", b)
		}
		// The quota left paces the lane at about 1.4 requests a second: a
		// request that waits for no penalty waits under 2 s.
		for i, want := range []time.Duration{time.Minute, 0, time.Minute, 2 * time.Minute, 0, time.Minute, 0} {
			if waited, _ := send(); waited < want || waited >= want+2*time.Second {
				t.Errorf("request %d waited %v, want %v (and under 2 s of pacing)", i+2, waited, want)
			}
		}
	})
}

// TestGraphQLThrottles: a GraphQL endpoint's JSON answer that says the
// query was throttled (GitHub's RATE_LIMITED in a 200, Linear's RATELIMITED
// in a 400, Shopify's THROTTLED in a 200) is a refusal, counted as a 429
// is; the same body from another path, or a GraphQL answer that is not
// throttled, is an ordinary answer. The caller reads every body as sent.
func TestGraphQLThrottles(t *testing.T) {
	const (
		github  = `{"errors":[{"type":"RATE_LIMITED","code":"graphql_rate_limit","message":"API rate limit exceeded for user ID 1."}]}`
		linear  = `{"errors":[{"message":"Rate limit exceeded","extensions":{"code":"RATELIMITED","type":"ratelimited"}}]}`
		shopify = `{"errors":[{"message":"Throttled","extensions":{"code":"THROTTLED","documentation":"https://shopify.dev/api/usage/rate-limits"}}],"extensions":{"cost":{"requestedQueryCost":101,"actualQueryCost":null,"throttleStatus":{"maximumAvailable":1000,"currentlyAvailable":50,"restoreRate":50}}}}`
		fine    = `{"data":{"viewer":{"login":"octocat"}}}`
	)
	for _, c := range []struct {
		name, path, body string
		status           int
		throttled        bool
	}{
		{"github", "/graphql", github, 200, true},
		{"linear", "/graphql", linear, 400, true},
		{"shopify", "/admin/api/2024-10/graphql.json", shopify, 200, true},
		{"not graphql", "/v1/things", linear, 400, false},
		{"graphql, served", "/graphql", fine, 200, false},
		{"a plain 429, for comparison", "/v1/x", fine, 429, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &fakeBase{answer: func(req *http.Request) *http.Response {
					return &http.Response{StatusCode: c.status, Header: http.Header{"Content-Type": {"application/json; charset=utf-8"}},
						Body: io.NopCloser(strings.NewReader(c.body))}
				}}
				tr := mustNew(t, base, WithRetry(0))
				for range 3 {
					req, _ := http.NewRequestWithContext(t.Context(), "POST", "http://api.test"+c.path, strings.NewReader(`{"query":"{viewer{login}}"}`))
					resp, err := tr.RoundTrip(req)
					if err != nil {
						t.Fatal(err)
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if string(b) != c.body {
						t.Fatalf("the caller read %q, want the body sent", b)
					}
				}
				want := uint64(0)
				if c.throttled {
					want = 3
				}
				if s, _ := tr.LaneStats("api.test"); s.Throttled != want {
					t.Errorf("throttled %d, want %d", s.Throttled, want)
				}
			})
		})
	}
}

// slowBody sends its parts with a pause before each but the first.
type slowBody struct {
	parts []string
	pause time.Duration
	sent  int
}

func (b *slowBody) Read(p []byte) (int, error) {
	if b.sent == len(b.parts) {
		return 0, io.EOF
	}
	if b.sent > 0 {
		time.Sleep(b.pause)
	}
	b.sent++
	return copy(p, b.parts[b.sent-1]), nil
}

func (b *slowBody) Close() error { return nil }

// TestPeekDoesNotHoldTheResponse: a body that is looked at (a 429's, a
// GraphQL answer's) but whose first 4 KiB do not come with the headers
// does not hold the response back past peekWait, and the caller reads
// each part as it comes, byte for byte.
func TestPeekDoesNotHoldTheResponse(t *testing.T) {
	for _, c := range []struct {
		name, path string
		status     int
		ct         string
	}{
		{"429", "/v1/x", 429, "application/json"},
		{"429 stream", "/v1/x", 429, "text/event-stream"},
		{"graphql", "/graphql", 200, "application/json"},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				parts := []string{`{"data":{"items":[`, `1,2,3`, `]}}`}
				base := &fakeBase{answer: func(req *http.Request) *http.Response {
					return &http.Response{StatusCode: c.status, Header: http.Header{"Content-Type": {c.ct}},
						Body: &slowBody{parts: parts, pause: 10 * time.Second}}
				}}
				tr := mustNew(t, base, WithRetry(0))
				start := time.Now()
				req, _ := http.NewRequestWithContext(t.Context(), "POST", "http://api.test"+c.path, nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				if d := time.Since(start); d > peekWait {
					t.Errorf("RoundTrip returned after %v, want at most %v", d, peekWait)
				}
				var got []string
				buf := make([]byte, 64)
				for {
					n, err := resp.Body.Read(buf)
					if n > 0 {
						got = append(got, fmt.Sprintf("%s at %v", buf[:n], time.Since(start).Round(time.Second)))
					}
					if err != nil {
						break
					}
				}
				want := []string{parts[0] + " at 0s", parts[1] + " at 10s", parts[2] + " at 20s"}
				if !slices.Equal(got, want) {
					t.Errorf("read %q, want %q", got, want)
				}
			})
		})
	}
}

// readAfterClose returns what a Read of resp's body gives after Close,
// the body's first bytes unread.
func readAfterClose(t *testing.T, rt http.RoundTripper, url string) (int, error) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.Body.Read(make([]byte, 64))
}

// TestPeekReadAfterClose: a 429's body is read ahead (peek); a Read
// after Close must give what the base's body gives (net/http: an error,
// no bytes), not the bytes read ahead.
func TestPeekReadAfterClose(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, `{"error":"slow down"}`)
	}))
	defer srv.Close()
	bt := &http.Transport{}
	defer bt.CloseIdleConnections()
	wantN, wantErr := readAfterClose(t, bt, srv.URL+"/x")
	tr := mustNew(t, bt, WithRetry(0))
	gotN, gotErr := readAfterClose(t, tr, srv.URL+"/x")
	if gotN != wantN || (gotErr == nil) != (wantErr == nil) {
		t.Errorf("Read after Close through sluice gave %d bytes, %v; the base's body gives %d, %v", gotN, gotErr, wantN, wantErr)
	}
}
