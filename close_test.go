package sluice

import (
	"errors"
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
