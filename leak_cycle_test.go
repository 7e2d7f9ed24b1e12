package sluice

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
	"weak"
)

// TestHoldsFreedByTheCollector: the holds the pool drops after a burst
// are freed. A hold and its leak token must never point at each other
// (see leakToken): the token carries a finalizer, and the collector never
// frees a cycle through an object with one.
func TestHoldsFreedByTheCollector(t *testing.T) {
	base := rtFunc(func(req *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Header: http.Header{}, Request: req,
			Body: io.NopCloser(strings.NewReader("ok"))}, nil
	})
	tr, err := New(base, WithConcurrency(128, 128))
	if err != nil {
		t.Fatal(err)
	}
	const n = 64
	var ws []weak.Pointer[hold]
	var bodies []io.ReadCloser
	for range n { // n bodies out at once: n holds
		req, _ := http.NewRequest("GET", "http://api.example/x", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, weak.Make(resp.Body.(*body).tok.h))
		bodies = append(bodies, resp.Body)
	}
	for _, b := range bodies {
		b.Close() // each hold goes back to the pool with its token
	}
	bodies = nil
	alive := aliveAfterGC(ws)
	if alive > 0 {
		t.Fatalf("%d of %d holds still alive after the pool dropped them: the hold<->token cycle through a finalizer is never collected", alive, n)
	}
}

type ctxPayload struct{ _ [1 << 10]byte }

type payloadKey struct{}

// TestWatchedHoldKeepsNoContext: a watched hold (its context is watched
// because the lane needed its slot) whose context ends as its owner closes
// the body: the owner wins the claim, the watch has started so it cannot
// be stopped, and release leaves the hold to the collector, with its
// context still set. The collector frees it, and the request's context
// with it; in a hold-token cycle they were kept for the life of the
// process.
func TestWatchedHoldKeepsNoContext(t *testing.T) {
	base := rtFunc(func(req *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Header: http.Header{}, Request: req,
			Body: io.NopCloser(strings.NewReader("ok"))}, nil
	})
	tr, err := New(base, WithConcurrency(8, 8))
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	ws := make([]weak.Pointer[ctxPayload], 0, n)
	for range n {
		pl := new(ctxPayload)
		ws = append(ws, weak.Make(pl))
		ctx, cancel := context.WithCancel(context.WithValue(context.Background(), payloadKey{}, pl))
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://api.example/x", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		l := resp.Body.(*body).tok.h.l
		l.lock()
		l.reclaimLocked(true) // as the dispatcher does when it waits for a slot
		l.unlock()
		// The interleaving a contended lane lock produces: the owner's
		// Close waits for the lock, then the context ends (its watch
		// starts, and waits for the lock too), then the lock is let go.
		l.mu.Lock()
		closed := make(chan struct{})
		go func() { resp.Body.Close(); close(closed) }()
		time.Sleep(time.Millisecond)
		cancel()
		time.Sleep(time.Millisecond)
		l.mu.Unlock()
		<-closed
	}
	time.Sleep(100 * time.Millisecond) // let the last AfterFuncs finish
	alive := aliveAfterGC(ws)
	if alive > 0 {
		t.Fatalf("%d of %d request contexts (with their values) still reachable after every body was closed", alive, n)
	}
}

// TestRetryDrainOfTrickledBody: a response that will be retried is read
// before the retry (see keep) for a second at most: a 429 whose body
// trickles (100 bytes a minute apart) holds neither RoundTrip nor the
// attempt's slot, where it held both for 99 minutes.
func TestRetryDrainOfTrickledBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int32
		base := &fakeBase{answer: func(req *http.Request) *http.Response {
			if calls.Add(1) == 1 {
				parts := make([]string, 100)
				for i := range parts {
					parts[i] = "x"
				}
				return &http.Response{StatusCode: 429, Header: http.Header{"Content-Type": {"text/plain"}},
					Body: &slowBody{parts: parts, pause: time.Minute}}
			}
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok"))}
		}}
		tr := mustNew(t, base) // default: 2 retries
		start := time.Now()
		req, _ := http.NewRequestWithContext(t.Context(), "GET", "http://api.test/v1/x", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if d := time.Since(start); d > 30*time.Second {
			t.Fatalf("RoundTrip returned after %v: the retry waited for the whole of a trickled 429 body", d)
		}
		// This body's Read does not end at Close: the read of it ends
		// with the trickle.
		time.Sleep(2 * time.Hour)
	})
}

// TestClosedTransportCollected: a closed Transport whose bodies are all
// closed is collected, also one whose busy lane laid out holds for its
// prepaid grants, each pointing to the lane (and through its options to
// the Transport). In a hold-token cycle they kept it, its base and every
// lane, for the life of the process.
func TestClosedTransportCollected(t *testing.T) {
	for _, c := range []struct {
		name    string
		perSec  int
		prepays bool
	}{
		{"slow lane (control)", 10, false},
		{"busy lane", 100000, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			prepaid := countPrepaid(t)
			w, n := func() (weak.Pointer[Transport], int) {
				base := rtFunc(func(req *http.Request) (*http.Response, error) {
					return &http.Response{StatusCode: 200, Header: http.Header{}, Request: req,
						Body: io.NopCloser(strings.NewReader("ok"))}, nil
				})
				// WithLaneIdle(0): no sweep timer, whose lazily removed entry
				// could keep a closed Transport reachable for a while.
				tr, err := New(base, WithRate(c.perSec, time.Second), WithBurst(c.perSec), WithLaneIdle(0))
				if err != nil {
					t.Fatal(err)
				}
				// A busy lane prepays once it grants fast enough, which a
				// loaded machine may delay: until it has, up to a bound.
				for i := 0; i < min(c.perSec, 3000) || c.prepays && prepaid.Load() == 0 && i < 100000; i++ {
					req, _ := http.NewRequest("GET", "http://api.test/x", nil)
					resp, err := tr.RoundTrip(req)
					if err != nil {
						t.Fatal(err)
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				tr.Close()
				return weak.Make(tr), int(prepaid.Load())
			}()
			if (n > 0) != c.prepays {
				t.Fatalf("%d prepayments, want some: %v", n, c.prepays)
			}
			if aliveAfterGC([]weak.Pointer[Transport]{w}) > 0 {
				t.Fatalf("Transport still reachable after Close and every body closed (%d prepayments)", n)
			}
		})
	}
}

// TestForgottenBusyLaneCollected: the same for a live Transport that
// forgets idle lanes (WithLaneIdle, as a service with a lane per tenant or
// per host relies on): every busy lane it forgets is freed, where memory
// grew with the number of keys ever used.
func TestForgottenBusyLaneCollected(t *testing.T) {
	prepaid := countPrepaid(t)
	base := rtFunc(func(req *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Header: http.Header{}, Request: req,
			Body: io.NopCloser(strings.NewReader("ok"))}, nil
	})
	tr, err := New(base, WithRate(100000, time.Second), WithBurst(100000), WithLaneIdle(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	const hosts = 20
	var ws []weak.Pointer[lane]
	for i := range hosts {
		host := fmt.Sprintf("h%d.test", i)
		for range 1000 {
			req, _ := http.NewRequest("GET", "http://"+host+"/x", nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		ws = append(ws, weak.Make(tr.find(host)))
	}
	if prepaid.Load() == 0 {
		t.Fatal("no prepayment: the test measures nothing")
	}
	deadline := time.Now().Add(5 * time.Second)
	for tr.nLanes.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := tr.nLanes.Load(); n > 0 {
		t.Fatalf("%d lanes not forgotten", n)
	}
	alive := aliveAfterGC(ws)
	if alive > 0 {
		t.Fatalf("%d of %d forgotten lanes still in memory", alive, hosts)
	}
}

// aliveAfterGC returns how many of ws still point to something after ten
// collections (sync.Pool drops what it holds within two).
func aliveAfterGC[T any](ws []weak.Pointer[T]) int {
	for range 10 {
		runtime.GC()
	}
	alive := 0
	for _, w := range ws {
		if w.Value() != nil {
			alive++
		}
	}
	return alive
}
