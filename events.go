package sluice

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"sync/atomic"
	"time"
)

// eventCap bounds the events waiting for the Observers: past it, new
// events are dropped and counted, so an Observer that blocks costs memory
// up to here and nothing more. A power of 2.
const eventCap = 4096

// deliverEvery is how long the deliverer waits before it takes the events
// pushed meanwhile, so that it wakes once a batch, not once an event. It
// bounds how late an Observer hears of an event (the runtime's timers may
// stretch it to about a millisecond).
const deliverEvery = 200 * time.Microsecond

// wakeCheck is how often, in events, a push looks whether the ring is half
// full, and wakes the deliverer if it is: a client fast enough to fill the
// ring within a sleep of the deliverer (see deliverEvery) would otherwise
// lose events that a core left idle could have delivered.
const wakeCheck = eventCap / 8

// events delivers a Transport's events to its Observers, in order, from a
// goroutine that runs while there are events to deliver and exits when
// there are none. Pushing one takes no lock and never waits, so it may be
// done with a lane's lock held.
//
// The events wait in a ring of eventCap slots, made at the first event: a
// bounded queue of many producers and one consumer. A push reserves the
// next position (tail), fills the slot and then marks it filled; the
// deliverer takes the slots in order of position, each once it is filled,
// and moves head on past the slots it has emptied. A lock here would be
// taken by every request, and the runtime parks a goroutine that finds a
// lock held while others are runnable.
type events struct {
	obs    []Observer
	logger *slog.Logger

	ring atomic.Pointer[[eventCap]eventSlot]

	// The pushes write tail and, rarely, room; the deliverer writes head.
	// They are kept on lines of their own so that neither side's writes
	// take the other's line away.
	_    [64]byte
	tail atomic.Uint64 // the next position to reserve
	room atomic.Uint64 // head + eventCap, as a push last read head
	_    [48]byte
	head atomic.Uint64 // the next position to deliver; written by the deliverer only
	// delivered is the position before which every event has been handed
	// to every Observer (head moves before an event is handed out).
	delivered atomic.Uint64

	running atomic.Bool // a deliverer goroutine runs, or is starting

	// wake ends the running deliverer's sleep (see wakeCheck); buffered,
	// 1. Each deliverer makes its own, on its goroutine, as a lane's
	// dispatcher does its kick: a Transport used in a testing/synctest
	// bubble then wakes its deliverer with a channel of that bubble,
	// wherever the Transport was made and whichever bubble used it before.
	wake atomic.Pointer[chan struct{}]

	dropped  atomic.Uint64
	panicked atomic.Bool // a panic was logged; later ones are not
}

// An eventSlot holds one event of the ring; filled is its position plus
// one once it is filled.
type eventSlot struct {
	filled atomic.Uint64
	qe     queuedEvent
}

// A queuedEvent is an event waiting for the Observers. The events a
// request makes on its way, queued and granted, are kept in the few words
// they are made of, and built whole by the deliverer (see pushRequest):
// copying a whole Event into the queue cost as much as the rest of a
// request that waits for nothing, and the collector scans every word the
// queue holds. Any other event is kept whole, out of line.
type queuedEvent struct {
	ctx    context.Context
	e      *Event // nil for a request's
	kind   EventKind
	l      *lane
	tenant string
	at     time.Duration // on l's clock
	wait   time.Duration
	p      Priority
	n      int // Attempt of a grant, Queued of a queued event
}

// fill sets *e to qe's event whole, in place: an Event is large, and
// copying it costs more than setting the fields a request's event has. If
// whole is false, e holds a request's event, or none: the fields such an
// event leaves zero are zero already. fill reports whether e may now hold
// more.
func (qe *queuedEvent) fill(e *Event, whole bool) bool {
	if qe.e != nil {
		*e = *qe.e
		return true
	}
	if whole {
		*e = Event{}
	}
	e.Kind, e.Time, e.Priority, e.Tenant, e.Wait = qe.kind, qe.l.clk.timeOf(qe.at), qe.p, qe.tenant, qe.wait
	e.Queued, e.Attempt = 0, 0
	if qe.kind == EventQueued {
		e.Queued = qe.n
	} else {
		e.Attempt = qe.n
	}
	e.Lane, e.Sublimit = splitKey(qe.l.key)
	return false
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

// pushRequest queues an event of kind EventGranted or EventQueued on l at
// at, on l's clock, of a request at level p of tenant: n is a grant's
// attempt, or the requests queued; wait is how long a grant waited.
func (q *events) pushRequest(ctx context.Context, kind EventKind, l *lane, at time.Duration, p Priority, tenant string, n int, wait time.Duration) {
	q.queue(queuedEvent{ctx: ctx, kind: kind, l: l, at: at, p: p, tenant: tenant, n: n, wait: wait})
}

func (q *events) queue(qe queuedEvent) {
	if qe.ctx == nil {
		qe.ctx = context.Background()
	}
	ring := q.ring.Load()
	if ring == nil {
		q.ring.CompareAndSwap(nil, new([eventCap]eventSlot))
		ring = q.ring.Load()
	}
	var t uint64
	for {
		t = q.tail.Load()
		if t >= q.room.Load() {
			// Reading head costs a line the deliverer writes: a push reads
			// it once a lap.
			h := q.head.Load()
			if h > t {
				continue // t is stale: the deliverer is past it
			}
			if t-h >= eventCap {
				q.dropped.Add(1)
				return
			}
			q.room.Store(h + eventCap)
		}
		if q.tail.CompareAndSwap(t, t+1) {
			break
		}
	}
	// The slot's last event, at t-eventCap, is delivered: head is past it.
	s := &ring[t%eventCap]
	s.qe = qe
	s.filled.Store(t + 1)
	if !q.running.Load() && q.running.CompareAndSwap(false, true) {
		go q.deliver()
	} else if (t+1)%wakeCheck == 0 {
		if h := q.head.Load(); h < t+1 && t+1-h >= eventCap/2 {
			if w := q.wake.Load(); w != nil {
				select {
				case *w <- struct{}{}:
				default: // a wake is pending already
				}
			}
		}
	}
}

// deliver hands the queued events to the Observers, those pushed each
// deliverEvery or since a push woke it, until a wait finds none.
func (q *events) deliver() {
	ring := q.ring.Load()
	var d delivery
	busy := false
	sleep := time.NewTimer(deliverEvery)
	defer sleep.Stop()
	wake := make(chan struct{}, 1)
	q.wake.Store(&wake)
	// A deliverer that starts once this one has let running go may have
	// stored its own.
	defer q.wake.CompareAndSwap(&wake, nil)
	for {
		if !busy {
			sleep.Reset(deliverEvery)
			select {
			case <-sleep.C:
			case <-wake:
			}
		}
		h, t := q.head.Load(), q.tail.Load()
		// A turn that found the ring an eighth full takes the next at
		// once: a sleep may last a millisecond, longer than the ring
		// holds a busy client's events.
		busy = t-h >= eventCap/8
		if h == t {
			q.running.Store(false)
			// A push that reserved a position before the store may have
			// found running set and started no deliverer: this one goes
			// on, unless a push after the store started another.
			if q.tail.Load() == h || !q.running.CompareAndSwap(false, true) {
				return
			}
			continue
		}
		for h != t || d.i > 0 {
			h = q.handOut(ring, h, t, &d)
		}
	}
}

// A delivery is an event whose handing out an Observer's panic broke off:
// the Observers from i on have yet to get it. Zero when there is none.
type delivery struct {
	ctx context.Context
	e   Event
	i   int
}

// handOut hands d's event, if any, to the Observers left, then the events
// at positions [h, t) to all, in order. A slot is emptied, and head moved
// past it, before its event is handed out. An Observer that panics loses
// that event only: handOut returns the position to go on from, with the
// event left in d for the Observers after it, and logs the first panic.
// One recover for the batch costs less than one for each call.
func (q *events) handOut(ring *[eventCap]eventSlot, h, t uint64, d *delivery) (next uint64) {
	next = h
	var e Event
	var ctx context.Context
	whole, i := false, 0
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		if q.panicked.CompareAndSwap(false, true) {
			q.logger.ErrorContext(ctx, "sluice: an Observer panicked; its event was lost (later panics are not logged)",
				"observer", fmt.Sprintf("%T", q.obs[i]), "event", e.Kind, "panic", r)
		}
		if i+1 < len(q.obs) {
			*d = delivery{ctx: ctx, e: e, i: i + 1}
		} else {
			q.delivered.Store(next)
		}
	}()
	if d.i > 0 {
		ctx, e, i, whole = d.ctx, d.e, d.i, true
		*d = delivery{}
		for ; i < len(q.obs); i++ {
			q.obs[i].Observe(ctx, e)
		}
		q.delivered.Store(next)
	}
	for next != t {
		s := &ring[next%eventCap]
		for s.filled.Load() != next+1 {
			runtime.Gosched() // reserved and being filled
		}
		whole = s.qe.fill(&e, whole)
		ctx = s.qe.ctx
		s.qe = queuedEvent{} // drop the references
		next++
		// A push reads head once a lap (see room): moving it for each
		// event costs the pushes nothing, and a slow Observer holds up
		// no slot it is done with.
		q.head.Store(next)
		for i = 0; i < len(q.obs); i++ {
			q.obs[i].Observe(ctx, e)
		}
		q.delivered.Store(next)
	}
	return next
}

// wait returns when every event pushed so far has been delivered and,
// unless more were pushed since, the deliverer has found no more and
// exited; or when ctx ends. A client that goes on making events keeps the
// deliverer running: wait does not wait for it then.
func (q *events) wait(ctx context.Context) error {
	t := q.tail.Load()
	for q.delivered.Load() < t || q.running.Load() && q.tail.Load() == t {
		select {
		case <-time.After(deliverEvery):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
