package sluice

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestRetryNilBody: a base may answer with a nil Body (net/http's Client
// accepts it and puts http.NoBody in): a retryable status with no body is
// retried, and the answer kept meanwhile crashes nothing.
func TestRetryNilBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int32
		base := rtFunc(func(r *http.Request) (*http.Response, error) {
			if n.Add(1) == 1 {
				return &http.Response{StatusCode: 503, Header: http.Header{}, Request: r}, nil // Body nil
			}
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), Request: r}, nil
		})
		tr := mustNew(t, base, WithBackoff(noWait))
		req, _ := http.NewRequest("GET", "http://api.test/x", nil)
		var resp *http.Response
		var err error
		func() {
			defer func() {
				if v := recover(); v != nil {
					t.Fatalf("RoundTrip panicked on a 503 with a nil Body: %v", v)
				}
			}()
			resp, err = tr.RoundTrip(req)
		}()
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || n.Load() != 2 {
			t.Errorf("status %d after %d attempts, want 200 after 2", resp.StatusCode, n.Load())
		}
	})
}

// TestRetryFoldedRefusalWaits: past maxSublimits a response that names a
// limit pauses no lane (see TestSublimitFoldedRefusalSparesHost), so the
// default backoff waits out a 429's Retry-After itself, where it trusted
// a pause that never began and retried at once, twice, against
// "Retry-After: 60".
func TestRetryFoldedRefusalWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		refused := fmt.Sprintf("/channels/%d/messages", 100+maxSublimits+1)
		var mu sync.Mutex
		var at []time.Time
		inner := discordBase(refused, "user")
		base := rtFunc(func(r *http.Request) (*http.Response, error) {
			if r.URL.Path == refused {
				mu.Lock()
				at = append(at, time.Now())
				mu.Unlock()
			}
			return inner(r)
		})
		tr := mustNew(t, base) // default retries and backoff
		defer tr.Close()
		for ch := 101; ch <= 100+maxSublimits; ch++ {
			call(t.Context(), tr, fmt.Sprintf("http://api.test/channels/%d/messages", ch))
		}
		call(t.Context(), tr, "http://api.test"+refused)
		mu.Lock()
		defer mu.Unlock()
		for i := 1; i < len(at); i++ {
			if d := at[i].Sub(at[i-1]); d < time.Minute {
				t.Errorf("attempt %d came %v after a 429 with Retry-After: 60 (%d attempts)", i+1, d, len(at))
			}
		}
	})
}

// TestRetryKeepsItsPlaceOnSublimit: TestRetryKeepsItsPlace on a
// sub-limit: the retry is paced by the sub-limit named "m" (an LLM model),
// and goes ahead of the requests that came after its first attempt there
// too, not queued as a new arrival.
func TestRetryKeepsItsPlaceOnSublimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{answer: answerWith(1, 500)}
		tr := mustNew(t, base, WithSublimitRate("m", 10, time.Second), WithRetry(1),
			WithBackoff(func(_, _ time.Duration, _ int, _ *http.Response) time.Duration { return 150 * time.Millisecond }))
		defer tr.Close()
		ctx := WithSublimit(t.Context(), "m")
		var wg sync.WaitGroup
		wg.Go(func() { get(ctx, tr, "first") }) // t=0: 500, retried after 150 ms
		time.Sleep(50 * time.Millisecond)
		for range 3 {
			wg.Go(func() { get(ctx, tr, "later") })
		}
		wg.Wait()
		var order []string
		for _, a := range base.arrivals {
			order = append(order, a.class)
		}
		want := "first later first later later" // as on a lane (TestRetryKeepsItsPlace)
		if got := strings.Join(order, " "); got != want {
			t.Errorf("order %q, want %q", got, want)
		}
	})
}

// TestRetryPanickingGetBody: as TestPanickingRetryCallbacks, for the
// caller's other code the retry runs while it holds the answer: a GetBody
// that panics gives the answer's slot back at once, not when the garbage
// collector finds its body.
func TestRetryPanickingGetBody(t *testing.T) {
	base := rtFunc(func(req *http.Request) (*http.Response, error) {
		if req.Body != nil {
			io.Copy(io.Discard, req.Body)
			req.Body.Close()
		}
		return &http.Response{StatusCode: 503, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("busy")), Request: req}, nil
	})
	tr := mustNew(t, base, WithBackoff(noWait))
	func() {
		defer func() {
			if recover() == nil {
				t.Error("GetBody's panic did not reach the caller")
			}
		}()
		req, _ := http.NewRequest("PUT", "http://api.test/", strings.NewReader("x"))
		req.GetBody = func() (io.ReadCloser, error) { panic("GetBody") }
		tr.RoundTrip(req)
	}()
	if s, _ := tr.Stats().Lane("api.test"); s.InFlight != 0 {
		t.Errorf("%d in flight after the panic, want 0", s.InFlight)
	}
}
