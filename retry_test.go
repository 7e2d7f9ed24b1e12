package sluice

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/sluice-go/sluice/internal/upstream"
)

// TestRetryReplaysIdenticalBody: a 503'd POST with GetBody is retried with
// the same bytes; the last response comes back with a nil error; discarded
// responses release their slots.
func TestRetryReplaysIdenticalBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := upstream.New(upstream.Config{Handler: failFirst(2, http.StatusServiceUnavailable)})
		defer srv.Close()
		tr := mustNew(t, srv.Transport(), WithRetry(3))
		payload := []byte(`{"prompt":"hello"}`)
		req, _ := http.NewRequest("POST", srv.URL()+"/v1", bytes.NewReader(payload))
		resp, err := tr.RoundTrip(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("got %v, %v; want 200", resp, err)
		}
		resp.Body.Close()
		sum := sha256.Sum256(payload)
		arr := srv.Arrivals()
		if len(arr) != 3 {
			t.Fatalf("%d attempts, want 3", len(arr))
		}
		for i, a := range arr {
			if a.BodyHash != hex.EncodeToString(sum[:]) {
				t.Errorf("attempt %d sent different bytes", i)
			}
		}
		s, _ := tr.Stats().Lane(req.URL.Host)
		if s.Retries != 2 || s.InFlight != 0 {
			t.Errorf("retries %d in flight %d, want 2 and 0", s.Retries, s.InFlight)
		}
	})
}

// TestRetrySafety: what must not be retried is sent once.
func TestRetrySafety(t *testing.T) {
	tests := []struct {
		name     string
		method   string
		body     func() io.Reader // nil: no body
		noGet    bool             // strip GetBody
		status   int
		attempts int
	}{
		{"GET 500 retried", "GET", nil, false, 500, 3},
		{"POST 500 not retried", "POST", func() io.Reader { return strings.NewReader("x") }, false, 500, 1},
		{"POST 503 retried", "POST", func() io.Reader { return strings.NewReader("x") }, false, 503, 3},
		{"PUT without GetBody sent once", "PUT", func() io.Reader { return strings.NewReader("x") }, true, 503, 1},
		{"GET 404 not retried", "GET", nil, false, 404, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := upstream.New(upstream.Config{Handler: failFirst(1<<30, tt.status)})
				defer srv.Close()
				tr := mustNew(t, srv.Transport(), WithRetry(2))
				var body io.Reader
				if tt.body != nil {
					body = tt.body()
				}
				req, _ := http.NewRequest(tt.method, srv.URL(), body)
				if tt.noGet {
					req.GetBody = nil
					req.Body = io.NopCloser(req.Body)
				}
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatalf("err = %v; when retries run out the last response comes with a nil error", err)
				}
				if resp.StatusCode != tt.status {
					t.Errorf("status %d, want %d", resp.StatusCode, tt.status)
				}
				resp.Body.Close()
				if n := len(srv.Arrivals()); n != tt.attempts {
					t.Errorf("%d attempts, want %d", n, tt.attempts)
				}
			})
		})
	}
}

// TestRetryKeepsItsPlace: a retried attempt keeps its first enqueue time, so
// it goes ahead of same-level requests that arrived after it.
func TestRetryKeepsItsPlace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{answer: answerWith(1, 500)}
		tr := mustNew(t, base, WithRate(10, time.Second), WithRetry(1), WithBackoff(func(_, _ time.Duration, _ int, _ *http.Response) time.Duration {
			return 150 * time.Millisecond
		}))
		var wg sync.WaitGroup
		wg.Go(func() { get(t.Context(), tr, "first") }) // t=0: 500, retried after 150 ms
		time.Sleep(50 * time.Millisecond)
		for range 3 { // queue behind: they arrived after "first" did
			wg.Go(func() { get(t.Context(), tr, "later") })
		}
		wg.Wait()
		var order []string
		for _, a := range base.arrivals {
			order = append(order, a.class)
		}
		// t=0 first(500); 100 ms later; 200 ms: the retry (enqueued at 150 ms
		// with its t=0 rank) beats the two later ones still waiting.
		want := "first later first later later"
		if got := strings.Join(order, " "); got != want {
			t.Errorf("order %q, want %q", got, want)
		}
	})
}

// failFirst answers status to the first n requests, then 200.
func failFirst(n int, status int) http.HandlerFunc {
	var mu sync.Mutex
	count := 0
	return func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		count++
		c := count
		mu.Unlock()
		if c <= n {
			w.WriteHeader(status)
			return
		}
		io.WriteString(w, "ok\n")
	}
}

// The Transport skips the call to go-retryablehttp's DefaultRetryPolicy for
// responses it never retries: its answer must be the policy's, for every
// status, method and context state.
func TestDefaultRetryPolicyShortcut(t *testing.T) {
	tr := mustNew(t, nopBase{})
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, ctx := range []context.Context{context.Background(), cancelled} {
		for _, method := range []string{http.MethodGet, http.MethodPost} {
			req, _ := http.NewRequestWithContext(ctx, method, "http://api.test/", nil)
			for status := -2; status < 1000; status++ {
				resp := &http.Response{StatusCode: status}
				want, _ := retryablehttp.DefaultRetryPolicy(ctx, resp, nil)
				if !idempotent(req) && status != http.StatusTooManyRequests && status != http.StatusServiceUnavailable {
					want = false // sluice's own rule comes first
				}
				if got := tr.retryable(ctx, req, resp, nil); got != want {
					t.Fatalf("%s, status %d, ctx err %v: retryable %v, policy says %v", method, status, ctx.Err(), got, want)
				}
			}
		}
	}
}

// TestRetryOnANewLaneKeepsItsPlace: a retry whose lane was forgotten
// during its backoff waits on the new lane in the place of its first
// attempt, which came before every request the new lane has: each lane
// counts time from its creation, and the retry's enqueue time is moved
// from the old lane's count to the new one's.
func TestRetryOnANewLaneKeepsItsPlace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var order []string
		release := make(chan struct{})
		failed := false
		base := rtFunc(func(req *http.Request) (*http.Response, error) {
			c := req.Header.Get("X-Class")
			mu.Lock()
			order = append(order, c)
			status := http.StatusOK
			if c == "retried" && !failed {
				failed, status = true, http.StatusInternalServerError
			}
			mu.Unlock()
			if c == "holder" {
				<-release
			}
			return &http.Response{StatusCode: status, Header: http.Header{}, Body: http.NoBody, Request: req}, nil
		})
		backoff := func(_, _ time.Duration, _ int, _ *http.Response) time.Duration { return 10 * time.Minute }
		tr := mustNew(t, base, WithConcurrency(1, 1), WithLaneIdle(time.Minute), WithBackoff(backoff), WithRetry(1))
		ctx := t.Context()
		// The first lane grows an hour old.
		for range 120 {
			if err := get(ctx, tr, "warm"); err != nil {
				t.Fatal(err)
			}
			time.Sleep(30 * time.Second)
		}
		old := tr.find("api.test")
		var wg sync.WaitGroup
		wg.Go(func() { get(ctx, tr, "retried") }) // 500, then a retry in 10 minutes
		time.Sleep(5 * time.Minute)
		if tr.find("api.test") == old {
			t.Fatal("the lane idle for 5 minutes was not forgotten")
		}
		wg.Go(func() { get(ctx, tr, "holder") }) // a new lane, its one slot held
		time.Sleep(6 * time.Minute)              // the retry waits on the new lane
		wg.Go(func() { get(ctx, tr, "later") })
		synctest.Wait()
		close(release)
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		got := order[len(order)-3:]
		if got[1] != "retried" || got[2] != "later" {
			t.Errorf("served on the new lane: %v; want the retry before the request that came after it", got)
		}
	})
}

// atBase answers every request with status, hdr and body, and records when
// each attempt came.
type atBase struct {
	status int
	hdr    http.Header
	body   string
	mu     sync.Mutex
	at     []time.Time
}

func (b *atBase) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		io.Copy(io.Discard, req.Body)
		req.Body.Close()
	}
	b.mu.Lock()
	b.at = append(b.at, time.Now())
	b.mu.Unlock()
	h := http.Header{}
	for k, v := range b.hdr {
		h[k] = v
	}
	return &http.Response{StatusCode: b.status, Header: h, Body: io.NopCloser(strings.NewReader(b.body)), Request: req}, nil
}

func (b *atBase) attempts() []time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.at)
}

// TestRetryThatCannotBeServedInTime: a 429 whose Retry-After outlasts the
// request's deadline, or its level's WithMaxWait, is not retried: the
// caller gets the server's answer, not a refusal of the retry.
func TestRetryThatCannotBeServedInTime(t *testing.T) {
	for _, c := range []struct {
		name string
		opts []Option
		dl   time.Duration // 0: none
	}{
		{"deadline", nil, 5 * time.Second},
		{"max-wait", []Option{WithMaxWait(Normal, time.Second)}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &atBase{status: 429, hdr: http.Header{"Retry-After": {"30"}}, body: "slow down"}
				tr := mustNew(t, base, c.opts...)
				ctx := context.Background()
				if c.dl > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, c.dl)
					defer cancel()
				}
				req, _ := http.NewRequestWithContext(ctx, "GET", "http://api.test/x", nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatalf("the server's 429 was replaced by %v", err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 429 || string(b) != "slow down" {
					t.Errorf("got %d %q, want the server's 429 and its body", resp.StatusCode, b)
				}
				if n := len(base.attempts()); n != 1 {
					t.Errorf("%d attempts, want 1", n)
				}
			})
		})
	}
}

// rtResult is what a RoundTrip returned.
type rtResult struct {
	resp *http.Response
	err  error
}

// goRoundTrip sends req through rt in a goroutine, and returns where its
// result comes.
func goRoundTrip(rt http.RoundTripper, req *http.Request) <-chan rtResult {
	done := make(chan rtResult, 1)
	go func() {
		resp, err := rt.RoundTrip(req)
		done <- rtResult{resp, err}
	}()
	return done
}

// TestRetryRefusedLeavesTheAnswer: a retry that is not sent (here, the
// Transport closed during its backoff) leaves the caller the answer that
// caused it, body and all, with a nil error; and neither Stats.Retries,
// which counts the retries sent, nor the retry budget counts it.
func TestRetryRefusedLeavesTheAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &atBase{status: 500, body: "upstream failed"}
		tr := mustNew(t, base)
		req, _ := http.NewRequest("GET", "http://api.test/x", nil)
		done := goRoundTrip(tr, req)
		synctest.Wait() // in the retry's backoff
		tr.Close()
		r := <-done
		if r.err != nil {
			t.Fatalf("the server's 500 was replaced by %v", r.err)
		}
		b, _ := io.ReadAll(r.resp.Body)
		r.resp.Body.Close()
		if r.resp.StatusCode != 500 || string(b) != "upstream failed" {
			t.Errorf("got %d %q, want the server's 500 and its body", r.resp.StatusCode, b)
		}
		s, _ := tr.Stats().Lane("api.test")
		if n := len(base.attempts()); n != 1 || s.Retries != 0 {
			t.Errorf("%d attempts, Stats.Retries %d: want 1 attempt and no retry counted", n, s.Retries)
		}
	})
}

// TestRetryWaitsForTheTimeNamed: an answer that names a time the lane does
// not pause for (a 500 with Retry-After) is retried no sooner; a
// WithBackoff is held to WithMaxRetryAfter, as the lane's pause is.
func TestRetryWaitsForTheTimeNamed(t *testing.T) {
	for _, c := range []struct {
		name     string
		status   int
		ra       string
		opts     []Option
		min, max time.Duration // between the first attempt and the second
	}{
		{"500", 500, "30", nil, 30 * time.Second, 31 * time.Second},
		{"520", 520, "30", nil, 30 * time.Second, 31 * time.Second},
		{"429 backoff", 429, "86400", []Option{WithBackoff(retryablehttp.DefaultBackoff), WithMaxRetryAfter(time.Minute)},
			time.Minute, time.Minute + time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &atBase{status: c.status, hdr: http.Header{"Retry-After": {c.ra}}}
				tr := mustNew(t, base, c.opts...)
				req, _ := http.NewRequest("GET", "http://api.test/x", nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				at := base.attempts()
				if len(at) < 2 {
					t.Fatalf("%d attempts, want a retry", len(at))
				}
				if d := at[1].Sub(at[0]); d < c.min || d > c.max {
					t.Errorf("retry %v after the first attempt, want %v to %v", d, c.min, c.max)
				}
			})
		})
	}
}

// TestPanickingRetryCallbacks: a retry policy or a backoff that panics on
// an answer lets the panic go on to the caller, and the answer's slot goes
// back at once rather than when its body is collected.
func TestPanickingRetryCallbacks(t *testing.T) {
	for _, c := range []struct {
		name string
		opt  Option
	}{
		{"WithRetryPolicy", WithRetryPolicy(func(context.Context, *http.Response, error) (bool, error) { panic("policy") })},
		{"WithBackoff", WithBackoff(func(_, _ time.Duration, _ int, _ *http.Response) time.Duration { panic("backoff") })},
	} {
		t.Run(c.name, func(t *testing.T) {
			base := rtFunc(func(req *http.Request) (*http.Response, error) {
				return &http.Response{StatusCode: 500, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("busy")), Request: req}, nil
			})
			tr := mustNew(t, base, c.opt)
			func() {
				defer func() {
					if recover() == nil {
						t.Error("the callback's panic did not reach the caller")
					}
				}()
				req, _ := http.NewRequest("GET", "http://api.test/", nil)
				tr.RoundTrip(req)
			}()
			if s, _ := tr.Stats().Lane("api.test"); s.InFlight != 0 {
				t.Errorf("%d in flight after the panic, want 0", s.InFlight)
			}
		})
	}
}

// TestRetryEstimateKeepsItsPlace: a request with a 1.5 s deadline gets a
// 500 at t=0 and is retried after 50 ms, with its first enqueue time
// (t=0), ahead of the 20 requests that queued at 10 ms: the retry is the
// next grant, at 100 ms, and is made and served. (Estimated as a new
// request, behind the 20, 2.1 s at 10/s, it was not made, and the caller
// got the 500.)
func TestRetryEstimateKeepsItsPlace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{answer: answerWith(1, 500)}
		tr := mustNew(t, base, WithRate(10, time.Second), WithBurst(1), WithRetry(1),
			WithBackoff(func(_, _ time.Duration, _ int, _ *http.Response) time.Duration { return 50 * time.Millisecond }))
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var wg sync.WaitGroup
		status := make(chan int, 1)
		wg.Go(func() {
			dctx, dcancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
			defer dcancel()
			req, _ := http.NewRequestWithContext(dctx, http.MethodGet, "http://api.test/x", nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Errorf("first: %v", err)
				status <- 0
				return
			}
			resp.Body.Close()
			status <- resp.StatusCode
		})
		time.Sleep(10 * time.Millisecond)
		for range 20 {
			wg.Go(func() { get(ctx, tr, "later") })
		}
		synctest.Wait()
		if got := <-status; got != 200 {
			t.Errorf("request with a 1.5 s deadline ended with status %d after %d attempts; want its retry, "+
				"ranked ahead of the 20 later requests and granted at 100 ms, to be made and served", got, len(base.times()))
		}
		cancel()
		wg.Wait()
	})
}
