package sluice

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// eventCap bounds the events waiting for the Observers: past it, new
// events are dropped and counted, so an Observer that blocks costs memory
// up to here and nothing more.
const eventCap = 4096

// deliverSpins is how many times the deliverer yields, finding no event,
// before it exits.
const deliverSpins = 4

// events delivers a Transport's events to its Observers, in order, from a
// goroutine that runs while there are events to deliver and exits when
// there are none. Pushing one takes a short lock and never waits, so it may
// be done with a lane's lock held.
type events struct {
	obs    []Observer
	logger *slog.Logger

	mu      sync.Mutex
	ring    []queuedEvent // FIFO: head is the oldest, n of them
	head, n int
	running bool // a deliverer goroutine runs
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

// push queues e for delivery, stamped with the time now, or drops it if
// eventCap are waiting. A nil *events drops nothing and does nothing.
func (q *events) push(ctx context.Context, e Event) {
	if ctx == nil {
		ctx = context.Background()
	}
	e.Time = time.Now()
	e.Lane, e.Sublimit = splitKey(e.Lane)
	q.mu.Lock()
	if q.n == len(q.ring) {
		if len(q.ring) == eventCap {
			q.mu.Unlock()
			q.dropped.Add(1)
			return
		}
		q.grow()
	}
	q.ring[(q.head+q.n)%len(q.ring)] = queuedEvent{ctx, e}
	q.n++
	start := !q.running
	q.running = true
	q.mu.Unlock()
	if start {
		go q.deliver()
	}
}

// grow doubles the ring, keeping the order. q.mu must be held.
func (q *events) grow() {
	ring := make([]queuedEvent, min(max(2*len(q.ring), 16), eventCap))
	for i := range q.n {
		ring[i] = q.ring[(q.head+i)%len(q.ring)]
	}
	q.ring, q.head = ring, 0
}

func (q *events) deliver() {
	for spins := 0; ; {
		q.mu.Lock()
		if q.n == 0 && spins < deliverSpins {
			// Events come one a request: starting a goroutine, and waking
			// a processor for it, for each would cost more than the rest
			// of the request. A few yields first catch the next one.
			spins++
			q.mu.Unlock()
			runtime.Gosched()
			continue
		}
		if q.n == 0 {
			q.running = false
			if q.idle != nil {
				close(q.idle)
				q.idle = nil
			}
			q.mu.Unlock()
			return
		}
		spins = 0
		qe := q.ring[q.head]
		q.ring[q.head] = queuedEvent{} // drop the references
		q.head = (q.head + 1) % len(q.ring)
		q.n--
		q.mu.Unlock()
		for _, o := range q.obs {
			q.call(o, qe)
		}
	}
}

// call hands one event to one Observer; a panic loses that event only, and
// the first is logged.
func (q *events) call(o Observer, qe queuedEvent) {
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
