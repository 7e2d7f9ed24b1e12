package sluice

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// Events pushed from several goroutines at once reach the Observer whole
// and, for each goroutine, in the order it pushed them, through many turns
// of the ring; the deliverer exits once they are delivered (the bubble
// fails on a goroutine left behind).
func TestEventsInOrderAroundTheRing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		q := newEvents([]Observer{rec}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		// A chunk from every producer fills a sixteenth of the ring: a
		// producer back from its sleep may push its next one before the
		// deliverer is done with the last, and the ring still has room.
		const producers, each, chunk = 4, 2 * eventCap, eventCap / 64
		l := newLane("api.test", &config{})
		var wg sync.WaitGroup
		for g := range producers {
			wg.Go(func() {
				for i := range each {
					if i%chunk == 0 {
						time.Sleep(deliverEvery) // the deliverer keeps up: nothing is dropped
					}
					if i%2 == 0 {
						q.pushRequest(context.Background(), EventGranted, l, time.Duration(i), Normal, fmt.Sprint(g), i, 0)
					} else {
						q.push(context.Background(), &Event{Kind: EventRetried, Lane: "api.test", Tenant: fmt.Sprint(g), Attempt: i})
					}
				}
			})
		}
		wg.Wait()
		if err := q.wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		if d := q.dropped.Load(); d != 0 {
			t.Fatalf("%d events dropped", d)
		}
		rec.mu.Lock()
		defer rec.mu.Unlock()
		if len(rec.events) != producers*each {
			t.Fatalf("%d events delivered, want %d", len(rec.events), producers*each)
		}
		next := map[string]int{}
		for _, e := range rec.events {
			if e.Attempt != next[e.Tenant] {
				t.Fatalf("goroutine %s: event %d delivered where %d was due", e.Tenant, e.Attempt, next[e.Tenant])
			}
			next[e.Tenant]++
			want := EventRetried
			if e.Attempt%2 == 0 {
				want = EventGranted
			}
			if e.Kind != want || e.Lane != "api.test" {
				t.Fatalf("event %+v, want kind %v on lane api.test", e, want)
			}
			if e.Kind == EventGranted && !e.Time.Equal(l.clk.timeOf(time.Duration(e.Attempt))) {
				t.Fatalf("grant %d stamped %v, want its time on the lane's clock", e.Attempt, e.Time)
			}
		}
	})
}
