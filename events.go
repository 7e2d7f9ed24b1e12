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

// A queuedEvent is an event waiting for the Observers. A grant, the event
// every request makes, is kept in the few words it is made of, and built
// whole by the deliverer (see pushGrant): copying a whole Event into the
// queue cost as much as the rest of a request that waits for nothing, and
// the collector scans every word the queue holds. Any other event is kept
// whole, out of line.
type queuedEvent struct {
	ctx    context.Context
	e      *Event // nil for a grant
	l      *lane  // the grant's
	tenant string
	at     time.Duration // on l's clock
	wait   time.Duration
	p      Priority
	n      int // attempt
}

// event returns qe's event whole.
func (qe *queuedEvent) event() Event {
	if qe.e != nil {
		return *qe.e
	}
	e := Event{Kind: EventGranted, Time: qe.l.clk.timeOf(qe.at), Priority: qe.p, Tenant: qe.tenant, Attempt: qe.n, Wait: qe.wait}
	e.Lane, e.Sublimit = splitKey(qe.l.key)
	return e
}

func newEvents(obs []Observer, logger *slog.Logger) *events {
	if len(obs) == 0 {
		return nil
	}
	return &events{obs: obs, logger: logger}
}

// push queues e for delivery, stamped with the time now unless it has a
// time, or drops it if eventCap are waiting. The caller gives e up.
func (q *events) push(ctx context.Context, e *Event) {
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	e.Lane, e.Sublimit = splitKey(e.Lane)
	q.queue(queuedEvent{ctx: ctx, e: e})
}

// pushGrant queues the event of a grant on l at at, on l's clock, to an
// attempt n at level p of tenant that waited wait.
func (q *events) pushGrant(ctx context.Context, l *lane, at time.Duration, p Priority, tenant string, n int, wait time.Duration) {
	q.queue(queuedEvent{ctx: ctx, l: l, at: at, p: p, tenant: tenant, n: n, wait: wait})
}

func (q *events) queue(qe queuedEvent) {
	if qe.ctx == nil {
		qe.ctx = context.Background()
	}
	q.mu.Lock()
	if len(q.queued)+q.taken >= eventCap {
		q.mu.Unlock()
		q.dropped.Add(1)
		return
	}
	q.queued = append(q.queued, qe)
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
			e := batch[i].event()
			for _, o := range q.obs {
				q.call(o, batch[i].ctx, &e)
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
func (q *events) call(o Observer, ctx context.Context, e *Event) {
	defer func() {
		if r := recover(); r != nil && q.panicked.CompareAndSwap(false, true) {
			q.logger.ErrorContext(ctx, "sluice: an Observer panicked; its event was lost (later panics are not logged)",
				"observer", fmt.Sprintf("%T", o), "event", e.Kind, "panic", r)
		}
	}()
	o.Observe(ctx, *e)
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
