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

// A request's event delivered after another kind of event carries none of
// the other's fields, and every event reaches the Observer as it was made:
// the deliverer reuses one Event and sets only a request's fields when it
// can.
func TestEventsDeliveredWhole(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		q := newEvents([]Observer{rec}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		l := newLane("api.test", &config{})
		at := time.Duration(42)
		other := Event{Kind: EventRetried, Time: time.Unix(1, 0), Lane: "api.test", Priority: Batch,
			Tenant: "t", Attempt: 3, Wait: time.Second, Queued: 9, Reason: ReasonDeadline, Err: io.ErrUnexpectedEOF,
			Status: 503, Cause: "x", Until: time.Unix(2, 0), From: 1, To: 2}
		granted := Event{Kind: EventGranted, Time: l.clk.timeOf(at), Lane: "api.test", Priority: Normal, Tenant: "u", Attempt: 2, Wait: time.Millisecond}
		queued := Event{Kind: EventQueued, Time: l.clk.timeOf(at), Lane: "api.test", Priority: Interactive, Queued: 7}
		var want []Event
		for range 3 {
			e := other
			q.push(context.Background(), &e)
			q.pushRequest(context.Background(), EventGranted, l, at, Normal, "u", 2, time.Millisecond)
			q.pushRequest(context.Background(), EventQueued, l, at, Interactive, "", 7, 0)
			q.pushRequest(context.Background(), EventGranted, l, at, Normal, "u", 2, time.Millisecond)
			want = append(want, other, granted, queued, granted)
		}
		if err := q.wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		rec.mu.Lock()
		defer rec.mu.Unlock()
		if len(rec.events) != len(want) {
			t.Fatalf("%d events delivered, want %d", len(rec.events), len(want))
		}
		for i, e := range rec.events {
			if e != want[i] {
				t.Errorf("event %d:\n got %+v\nwant %+v", i, e, want[i])
			}
		}
	})
}

// An Observer that panics loses the event it panicked on, for itself
// only: the Observers after it get that event, and every Observer gets
// the events after it, in order.
func TestEventsAfterAPanic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var seen [3][]int
		obs := make([]Observer, 3)
		for i := range obs {
			obs[i] = ObserverFunc(func(_ context.Context, e Event) {
				seen[i] = append(seen[i], e.Attempt)
				// 2, 3 and 5: a panic in the first, in the middle
				// (also while finishing an event broken off, at 6), and
				// in the last.
				if e.Attempt%[]int{2, 3, 5}[i] == 0 {
					panic("observer bug")
				}
			})
		}
		q := newEvents(obs, slog.New(slog.NewTextHandler(io.Discard, nil)))
		l := newLane("api.test", &config{})
		const n = 100
		for i := range n {
			q.pushRequest(context.Background(), EventGranted, l, 0, Normal, "", i, 0)
		}
		if err := q.wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		for i, s := range seen {
			if len(s) != n {
				t.Fatalf("Observer %d got %d events, want %d", i, len(s), n)
			}
			for j, a := range s {
				if a != j {
					t.Fatalf("Observer %d got event %d where %d was due", i, a, j)
				}
			}
		}
		if !q.panicked.Load() {
			t.Error("no panic recorded")
		}
	})
}

// BenchmarkEventsHandOut measures what the deliverer spends an event: a
// grant's event built and handed to a no-op Observer, in batches of half
// the ring (the pushes are not timed).
func BenchmarkEventsHandOut(b *testing.B) {
	q := newEvents([]Observer{ObserverFunc(func(context.Context, Event) {})}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	l := newLane("api.test", &config{})
	q.running.Store(true) // the pushes start no deliverer: the loop is it
	var d delivery
	for i := 0; i < b.N; i += eventCap / 2 {
		b.StopTimer()
		h := q.tail.Load()
		for range eventCap / 2 {
			q.pushRequest(context.Background(), EventGranted, l, time.Millisecond, Normal, "tenant", 1, 0)
		}
		b.StartTimer()
		for h != q.tail.Load() {
			h = q.handOut(q.ring.Load(), h, q.tail.Load(), &d)
		}
	}
}

// An Observer stalled on an event holds up no slot of the events it was
// handed before: the ring drops events only once eventCap wait.
func TestEventsStalledObserverFreesDelivered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		const stall = eventCap - 100 // the event the Observer stalls on
		obs := ObserverFunc(func(_ context.Context, e Event) {
			if e.Attempt == stall {
				<-release
			}
		})
		q := newEvents([]Observer{obs}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		l := newLane("api.test", &config{})
		for i := range eventCap {
			q.pushRequest(context.Background(), EventGranted, l, 0, Normal, "", i, 0)
		}
		time.Sleep(2 * deliverEvery)
		// Stalled on event stall, taken out of the ring: eventCap-stall-1
		// wait, and stall+1 more fill it.
		synctest.Wait()
		for i := range stall + 1 {
			q.pushRequest(context.Background(), EventGranted, l, 0, Normal, "", eventCap+i, 0)
		}
		d := q.dropped.Load()
		q.pushRequest(context.Background(), EventGranted, l, 0, Normal, "", 2*eventCap, 0)
		over := q.dropped.Load() - d
		close(release)
		if err := q.wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		if d != 0 || over != 1 {
			t.Errorf("%d of %d events dropped with room for them, and %d of the one past eventCap; want 0 and 1", d, stall+1, over)
		}
	})
}

// A push that finds the ring half full wakes the deliverer from its sleep:
// the events are delivered with no time passing.
func TestEventsWakeWhenHalfFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		q := newEvents([]Observer{rec}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		l := newLane("api.test", &config{})
		start := time.Now()
		push := func(n int) {
			for i := range n {
				q.pushRequest(context.Background(), EventGranted, l, 0, Normal, "", i, 0)
			}
			synctest.Wait()
		}
		delivered := func() int {
			rec.mu.Lock()
			defer rec.mu.Unlock()
			return len(rec.events)
		}
		push(eventCap/2 - 1)
		if n := delivered(); n != 0 {
			t.Fatalf("%d events delivered before the deliverer's sleep ended, with the ring under half full", n)
		}
		push(1)
		if n, d := delivered(), time.Since(start); n != eventCap/2 || d != 0 {
			t.Errorf("%d events delivered %v after the push that filled half the ring, want %d at once", n, d, eventCap/2)
		}
		if err := q.wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// A Transport made outside a testing/synctest bubble, and used in one
// bubble after another, delivers its events on each bubble's clock: each
// deliverer makes its channels on its own goroutine, so that the bubble
// finds it durably blocked between turns and can move its time on.
func TestEventsTransportMadeOutsideABubble(t *testing.T) {
	rec := &recorder{}
	tr := mustNew(t, nopBase{}, WithRate(1e6, time.Second), WithBurst(1<<20), WithObserver(rec))
	const n = 10
	for round := 1; round <= 2; round++ {
		synctest.Test(t, func(t *testing.T) {
			for range n {
				if err := get(context.Background(), tr, ""); err != nil {
					t.Fatal(err)
				}
			}
			if err := tr.WaitEvents(t.Context()); err != nil {
				t.Fatal(err)
			}
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if len(rec.events) != round*n {
				t.Errorf("bubble %d: %d events delivered, want %d", round, len(rec.events), round*n)
			}
		})
	}
}
