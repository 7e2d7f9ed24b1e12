package sluice

import (
	"context"
	"net/http"
	"testing"
	"testing/synctest"
	"time"
)

// abandon sends a request with a context of its own through tr and keeps
// the response without reading or closing its body, as a caller that gave
// up would; it returns the response and the context's cancel.
func abandon(t *testing.T, tr http.RoundTripper) (*http.Response, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://api.test/", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp, cancel
}

// closeIdle closes resp's body, whose slot went back already, and fails t
// unless tr's lane has nothing in flight.
func closeIdle(t *testing.T, tr *Transport, resp *http.Response) {
	t.Helper()
	resp.Body.Close()
	if s, _ := tr.LaneStats("api.test"); s.InFlight != 0 {
		t.Errorf("in flight %d, want 0", s.InFlight)
	}
}

// TestContextEndServesWaiter: a request waiting for the slot of a response
// its caller abandoned is served when that response's context ends, at
// once, with nobody reading the lane's state: the dispatcher that waits for
// the slot watches the contexts of the responses out.
func TestContextEndServesWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, &fakeBase{}, WithConcurrency(1, 1))
		resp, cancel := abandon(t, tr)
		done := make(chan error, 1)
		go func() { done <- get(t.Context(), tr, "") }()
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("the second request went with the only slot held: %v", err)
		default:
		}
		cancel()
		synctest.Wait()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatal("the abandoned response's context ended, and the waiter still waits")
		}
		closeIdle(t, tr, resp) // late: gives back nothing more
	})
}

// TestContextEndedBeforeWaiter: a response whose context ended before
// anyone needed its slot gives it to the next request that does.
func TestContextEndedBeforeWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, &fakeBase{}, WithConcurrency(1, 1))
		resp, cancel := abandon(t, tr)
		cancel()
		ctx, stop := context.WithTimeout(t.Context(), time.Second)
		defer stop()
		if err := get(ctx, tr, ""); err != nil {
			t.Fatalf("the slot of a response whose context ended was not given back: %v", err)
		}
		closeIdle(t, tr, resp) // late: gives back nothing more
	})
}

// TestWatchedBodyClosed: a response whose context was watched (a waiter
// needed its slot) and whose body is then closed gives its slot back once,
// stops the watch, and a later end of its context gives back nothing more.
func TestWatchedBodyClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, &fakeBase{}, WithConcurrency(1, 1))
		resp, cancel := abandon(t, tr)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- get(t.Context(), tr, "") }()
		synctest.Wait() // the waiter's dispatcher watches resp's context
		resp.Body.Close()
		synctest.Wait()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		cancel()
		synctest.Wait()
		s, _ := tr.LaneStats("api.test")
		if s.InFlight != 0 {
			t.Errorf("in flight %d, want 0", s.InFlight)
		}
		// Both slots went back once: two more requests go one after the
		// other, and a third waits for nothing.
		for range 3 {
			if err := get(t.Context(), tr, ""); err != nil {
				t.Fatal(err)
			}
		}
		if s, _ := tr.LaneStats("api.test"); s.InFlight != 0 || s.Limit != 1 {
			t.Errorf("in flight %d of %d, want 0 of 1", s.InFlight, s.Limit)
		}
	})
}

// TestContextEndAfterWaiterQueued: the waiter queues while the only
// slot's attempt is still at the base (its hold not yet out, so the
// dispatcher's reclaim arms no watch on it). The response then comes, its
// caller cancels the context and keeps the body. The waiter must be served.
func TestContextEndAfterWaiterQueued(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, &fakeBase{latency: time.Second}, WithConcurrency(1, 1))
		ctx, cancel := context.WithCancel(t.Context())
		type res struct {
			resp *http.Response
			err  error
		}
		got := make(chan res, 1)
		go func() {
			req, _ := http.NewRequestWithContext(ctx, "GET", "http://api.test/", nil)
			resp, err := tr.RoundTrip(req)
			got <- res{resp, err}
		}()
		synctest.Wait() // A is at the base
		done := make(chan error, 1)
		go func() { done <- get(t.Context(), tr, "") }()
		synctest.Wait() // B waits for the slot; its dispatcher sleeps for a kick
		r := <-got      // A's response comes at 1s
		if r.err != nil {
			t.Fatal(r.err)
		}
		cancel() // A's caller gives up on the response, body unread
		synctest.Wait()
		time.Sleep(time.Minute)
		synctest.Wait()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		default:
			t.Error("the abandoned response's context ended a minute ago and the waiter still waits")
			s, _ := tr.LaneStats("api.test") // reclaims: frees the waiter
			t.Logf("stats: in flight %d", s.InFlight)
			synctest.Wait()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
		r.resp.Body.Close()
	})
}

// TestGrantedThenAbandoned: with one slot and two waiters, the
// dispatcher grants the first waiter (B) and goes on waiting for a slot for
// the second (C). B's response comes, its caller gives up on it. C must be
// served; with a Backend too (the dispatcher on a goroutine of its own).
func TestGrantedThenAbandoned(t *testing.T) {
	for _, name := range []string{"local", "backend"} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				opts := []Option{WithConcurrency(1, 1)}
				if name == "backend" {
					opts = append(opts, WithBackend(newMemBackend()))
				}
				tr := mustNew(t, &fakeBase{latency: time.Second}, opts...)
				first := make(chan error, 1)
				go func() { first <- get(t.Context(), tr, "") }() // A: holds the slot for 1s
				synctest.Wait()
				bctx, bcancel := context.WithCancel(t.Context())
				bresp := make(chan *http.Response, 1)
				go func() {
					req, _ := http.NewRequestWithContext(bctx, "GET", "http://api.test/", nil)
					resp, err := tr.RoundTrip(req)
					if err != nil {
						t.Error(err)
					}
					bresp <- resp
				}()
				synctest.Wait()
				done := make(chan error, 1)
				go func() { done <- get(t.Context(), tr, "") }() // C
				synctest.Wait()
				if err := <-first; err != nil {
					t.Fatal(err)
				}
				resp := <-bresp // B's response at 2s
				bcancel()       // B gives up on it
				time.Sleep(time.Minute)
				synctest.Wait()
				select {
				case err := <-done:
					if err != nil {
						t.Fatal(err)
					}
				default:
					t.Error("B's context ended a minute ago and C still waits for its slot")
					tr.Stats() // reclaims
					synctest.Wait()
					<-done
				}
				resp.Body.Close()
				synctest.Wait()
			})
		})
	}
}
