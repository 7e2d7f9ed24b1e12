package sluice

import (
	"errors"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// TestClose: Close fails the requests waiting at once (tenants at their cap
// included), refuses later ones, leaves no goroutine behind, and lets an
// attempt already sent finish and give its slot back.
func TestClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{latency: 50 * time.Millisecond}
		tr := mustNew(t, base, WithRate(1, time.Second), WithTenantShare(Batch, 0.01))
		var wg sync.WaitGroup
		errs := make(chan error, 6)
		wg.Go(func() { errs <- get(t.Context(), tr, "sent") }) // takes the token, in flight
		synctest.Wait()
		for i := range 5 {
			ctx := WithPriority(t.Context(), Priority(i%numLevels))
			if i == 4 {
				ctx = WithTenant(WithPriority(t.Context(), Batch), "capped")
			}
			wg.Go(func() { errs <- get(ctx, tr, "waiting") })
		}
		synctest.Wait()
		start := time.Now()
		if err := tr.Close(); err != nil {
			t.Fatal(err)
		}
		if err := tr.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		wg.Wait()
		close(errs)
		var closed, ok int
		for err := range errs {
			switch {
			case errors.Is(err, ErrClosed):
				closed++
			case err == nil:
				ok++
			default:
				t.Errorf("unexpected error %v", err)
			}
		}
		if closed != 5 || ok != 1 {
			t.Errorf("%d waiters closed, %d sent ok; want 5 and 1", closed, ok)
		}
		if d := time.Since(start); d > 50*time.Millisecond {
			t.Errorf("waiters released after %v", d)
		}
		if err := get(t.Context(), tr, ""); !errors.Is(err, ErrClosed) {
			t.Errorf("request after Close: %v", err)
		}
		s, _ := tr.Stats().Lane("api.test")
		if s.InFlight != 0 || s.Levels[Normal].Queued+s.Levels[Batch].Queued+s.Levels[Interactive].Queued != 0 {
			t.Errorf("after Close: %d in flight, queued %v", s.InFlight, s.Levels)
		}
		if n := len(base.arrivals); n != 1 {
			t.Errorf("base saw %d requests, want the one sent before Close", n)
		}
	})
}

// TestCloseStopsWaitsOutsideTheQueues: a request that waits for its
// host's cooldown before its sub-limit, and a retry that waits out the
// time a 500 named, stop at Close: the first fails with ErrClosed, the
// second returns the answer that caused it; neither sleeps out the ten
// minutes.
func TestCloseStopsWaitsOutsideTheQueues(t *testing.T) {
	t.Run("sub-limit", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			base := &fakeBase{answer: answerWith(1, 429, "Retry-After: 600")}
			tr := mustNew(t, base, WithRate(10, time.Second), WithRetry(0))
			if err := get(t.Context(), tr, ""); err != nil {
				t.Fatal(err)
			}
			errc := make(chan error)
			go func() { errc <- get(WithSublimit(t.Context(), "gpt-4o"), tr, "") }()
			synctest.Wait()
			start := time.Now()
			tr.Close()
			if err := <-errc; !errors.Is(err, ErrClosed) || time.Since(start) > 0 {
				t.Errorf("returned %v, %v after Close; want ErrClosed at once", err, time.Since(start))
			}
		})
	})
	t.Run("retry", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			base := &atBase{status: 500, hdr: http.Header{"Retry-After": {"600"}}, body: "failed"}
			tr := mustNew(t, base)
			req, _ := http.NewRequestWithContext(t.Context(), "GET", "http://api.test/", nil)
			done := goRoundTrip(tr, req)
			synctest.Wait()
			start := time.Now()
			tr.Close()
			r := <-done
			if r.err != nil || r.resp.StatusCode != 500 || time.Since(start) > 0 {
				t.Fatalf("returned %v, %v after Close; want the 500 at once", r.err, time.Since(start))
			}
			r.resp.Body.Close()
		})
	})
}

// TestSublimitWaitForHostKeepsMaxWait: with the host cooling down for
// 30 s, a request on a sub-limit whose level's WithMaxWait is a second is
// refused at once, as it is without the sub-limit, not after the wait.
func TestSublimitWaitForHostKeepsMaxWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{answer: answerWith(1, 429, "Retry-After: 30")}
		tr := mustNew(t, base, WithRate(10, time.Second), WithRetry(0), WithMaxWait(Interactive, time.Second))
		if err := get(t.Context(), tr, ""); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		err := get(WithSublimit(WithPriority(t.Context(), Interactive), "gpt-4o"), tr, "")
		if !errors.Is(err, ErrRejected) || time.Since(start) > 0 {
			t.Errorf("returned %v after %v; want a refusal at once", err, time.Since(start))
		}
	})
}
