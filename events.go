package sluice

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// eventCap bounds the events waiting for the Observers: past it, new
// events are dropped and counted, so an Observer that blocks costs memory
// up to here and nothing more.
const eventCap = 4096

// deliverEvery is how long the deliverer waits before it takes the events
// pushed meanwhile: an event is then appended to a buffer no other
// processor is reading, and the hand-off to the deliverer is paid once a
// batch, not once an event. It bounds how late an Observer hears of an
// event (the runtime's timers may stretch it to about a millisecond).
const deliverEvery = 200 * time.Microsecond

// events delivers a Transport's events to its Observers, in order, from a
// goroutine that runs while there are events to deliver and exits when
// there are none. Pushing one takes a short lock and never waits, so it may
// be done with a lane's lock held.
//
// Events are appended to one buffer while the deliverer hands out those of
// the other: it takes the lock once a batch (see deliverEvery), not once an
// event, so that the pushes of a busy lane and the deliverer do not take
// turns at it.
type events struct {
	obs    []Observer
	logger *slog.Logger

	mu      sync.Mutex
	queued  []queuedEvent // pushed, not yet taken by the deliverer
	spare   []queuedEvent // the other buffer, empty, or nil while being delivered
	taken   int           // events the deliverer has taken and not yet delivered
	running bool          // a deliverer goroutine runs
	idle    chan struct{}

	dropped  atomic.Uint64
	panicked atomic.Bool // a panic was logged; later ones are not
}

type queuedEvent struct {
	ctx context.Context
	e   Event
}

func newEvents(obs []Observer, logger *slog.Logger) *events {
	if len(obs) == 0 {
		return nil
	}
	return &events{obs: obs, logger: logger}
}

// push queues a copy of e for delivery, stamped with the time now unless
// it has a time, or drops it if eventCap are waiting. A nil *events drops
// nothing and does nothing.
func (q *events) push(ctx context.Context, e *Event) {
	if ctx == nil {
		ctx = context.Background()
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	e.Lane, e.Sublimit = splitKey(e.Lane)
	q.mu.Lock()
	if len(q.queued)+q.taken >= eventCap {
		q.mu.Unlock()
		q.dropped.Add(1)
		return
	}
	q.queued = append(q.queued, queuedEvent{ctx, *e})
	start := !q.running
	q.running = true
	q.mu.Unlock()
	if start {
		go q.deliver()
	}
}

// deliver hands the queued events to the Observers, a batch every
// deliverEvery, until a wait finds none.
func (q *events) deliver() {
	for {
		time.Sleep(deliverEvery)
		q.mu.Lock()
		if len(q.queued) == 0 {
			q.running = false
			if q.idle != nil {
				close(q.idle)
				q.idle = nil
			}
			q.mu.Unlock()
			return
		}
		batch := q.queued
		q.queued, q.spare = q.spare[:0], nil
		q.taken = len(batch)
		q.mu.Unlock()
		for i := range batch {
			for _, o := range q.obs {
				q.call(o, &batch[i])
			}
			batch[i] = queuedEvent{} // drop the references
		}
		q.mu.Lock()
		q.spare, q.taken = batch[:0], 0
		q.mu.Unlock()
	}
}

// call hands one event to one Observer; a panic loses that event only, and
// the first is logged.
func (q *events) call(o Observer, qe *queuedEvent) {
	defer func() {
		if r := recover(); r != nil && q.panicked.CompareAndSwap(false, true) {
			q.logger.ErrorContext(qe.ctx, "sluice: an Observer panicked; its event was lost (later panics are not logged)",
				"observer", fmt.Sprintf("%T", o), "event", qe.e.Kind, "panic", r)
		}
	}()
	o.Observe(qe.ctx, qe.e)
}

// wait returns when every event pushed so far has been delivered, or ctx
// ends.
func (q *events) wait(ctx context.Context) error {
	q.mu.Lock()
	if !q.running {
		q.mu.Unlock()
		return nil
	}
	if q.idle == nil {
		q.idle = make(chan struct{})
	}
	idle := q.idle
	q.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
