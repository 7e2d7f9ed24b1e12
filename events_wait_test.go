package sluice

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestWaitEventsUnderSteadyTraffic: WaitEvents returns once the events
// pushed before it was called are delivered, even while a busy client goes
// on making events: it does not wait for a moment when no event at all is
// on its way, which a client of 10,000 requests a second never has.
func TestWaitEventsUnderSteadyTraffic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var seen atomic.Int64
		obs := ObserverFunc(func(context.Context, Event) { seen.Add(1) })
		q := newEvents([]Observer{obs}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		l := newLane("api.test", &config{})
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() { // one event every 100 µs, as a client of 10,000 requests a second
			defer close(done)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Microsecond):
				}
				q.pushRequest(context.Background(), EventGranted, l, 0, Normal, "", 1, 0)
			}
		}()
		time.Sleep(10 * time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		start := time.Now()
		err := q.wait(ctx)
		took := time.Since(start)
		close(stop)
		<-done
		_ = q.wait(context.Background()) // the deliverer exits: no goroutine is left in the bubble
		if err != nil || took > 10*time.Millisecond {
			t.Fatalf("wait: %v after %v, with the events before it delivered within a few deliverEvery", err, took)
		}
	})
}
