package sluice

import (
	"context"
	"io"
	"net/http"
	"testing"
	"testing/synctest"
	"time"
)

// TestLeaserCooldownCapped: a Leaser passes a cooldown far in the future,
// a time no process set (something else wrote it in the Leaser's store).
// The lane holds it no longer than a server's Retry-After
// (WithMaxRetryAfter, ten minutes by default), as it does a Backend's
// wait: once the Leaser stops passing it, the lane sends again.
func TestLeaserCooldownCapped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeLeaser{memBackend: *newMemBackend()}
		base := &okBase{}
		tr, err := New(base, WithRate(100, time.Second), WithBackend(f), WithRetry(0))
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		send := func() error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", "http://api.test/", nil)
			resp, err := tr.RoundTrip(req)
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			return err
		}
		done := make(chan error, 1)
		go func() { done <- send() }()
		synctest.Wait()
		f.grantAll(Share{Rate: 100, Burst: 1, InFlight: -1, Cool: time.Now().Add(100 * 365 * 24 * time.Hour)})
		synctest.Wait()
		// The Leaser's next refreshes pass no cooldown: its key was fixed.
		for range 20 {
			time.Sleep(time.Minute)
			f.grantAll(Share{Rate: 100, Burst: 1, InFlight: -1})
		}
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("request: %v", err)
			}
		default:
			t.Errorf("request not sent 20 minutes after a cooldown of a century was passed (WithMaxRetryAfter: %v)", DefaultMaxRetryAfter)
			<-done
		}
	})
}
