package sluice

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice/internal/verdict"
)

// A hold is an attempt's token and in-flight slot, from the grant that makes
// it until it is given back: by Drop if the attempt is not sent, else by
// Done when the attempt is finished (its response's body done, or at once
// for a response without one). It also carries its tenant, its charge to
// the lane's budgets and whether its latency is measured (see timeNext).
//
// Holds are recycled: a request that waits for nothing allocates none. A
// hold goes back to the pool only from its owner's Done or Drop, and only
// when nothing else can still reach it (see recycle).
type hold struct {
	l             *lane
	ctx           context.Context // the attempt's
	start         time.Duration   // on the lane's clock: latency is measured from it
	at            time.Duration   // when it was granted, on the lane's clock
	wait          time.Duration   // how long this attempt queued for it
	tn            *tenant
	ch            *charge      // what it cost the lane's budgets
	timed, spaced bool         // spaced: the lane wants to know when it is written (see lane.traceWrite)
	long          bool         // counted in the limiter's long, under the lane's lock (see lane.markLongLocked)
	look          bool         // its response's headers are looked at (see lane.reads)
	kind          verdict.Kind // the response's, once it came
	nth           int          // the pacer's count of grants just after this one (see pace.Pacer.Refund)

	// state holds the flags below, read and changed atomically but for
	// its reset by newHold, when nothing else reaches the hold. Only the
	// path that sets holdGiven gives the slot back: the owner's Done,
	// often without the lane's lock (see lane.release), or the lane for a
	// context that ended.
	state uint32

	// Under the lane's lock.
	idx  int         // its index in the lane's held, until it is settled; -1: never held (see settleOutLocked)
	stop func() bool // stops the context watch (see lane.reclaimLocked); nil if none

	// The next hold on the lane's returned list: set by the owner before
	// it lists the hold, then read by the holder of the lane's lock.
	next *hold

	// Kept while the hold is recycled.
	ended func()     // h.ctxEnded, bound once per hold
	tok   *leakToken // its body's leak token, while no body has it (see wrap)
}

// The flags of hold.state.
const (
	// holdOut: the caller has the response's body, which gives the hold
	// back (see body). Only then may the lane give it back when the
	// context ends: before, the attempt is still the base's.
	holdOut     uint32 = 1 << iota
	holdWatched        // its context is watched: stop is set
	holdGiven          // its slot's return is claimed
	// holdHeld: it is on the lane's list of holds (see held). A prepaid
	// grant is not until the lane settles it (see settleOutLocked).
	holdHeld
	// holdTaken: a prepaid grant's hold, filled in by its taker (see
	// takePrepaid).
	holdTaken
)

// claim claims h's return for the caller, and reports false if another
// path has it already.
func (h *hold) claim() bool {
	for {
		s := atomic.LoadUint32(&h.state)
		if s&holdGiven != 0 {
			return false
		}
		if atomic.CompareAndSwapUint32(&h.state, s, s|holdGiven) {
			return true
		}
	}
}

// holds recycles holds, each with its leak token: a request takes and puts
// back one object. The pool is shared by the lanes, not kept per lane: a
// million idle lanes keep no holds.
var holds sync.Pool

// newHold makes a hold for the pool, with its leak token's finalizer set.
func newHold() any {
	h := &hold{tok: new(leakToken)}
	h.ended = h.ctxEnded
	runtime.SetFinalizer(h.tok, (*leakToken).collected)
	return h
}

func init() { holds.New = newHold } // set here: the finalizer reaches back to holds

// recycle puts h, given back, in the pool with its leak token, once
// nothing but its owner can reach it. It drops what h points to outside
// the hold, so that the pool keeps no request's context or lane alive.
func (h *hold) recycle() {
	h.l, h.ctx, h.tn = nil, nil, nil
	if h.ch != nil {
		h.ch = nil
	}
	holds.Put(h)
}

// holdLocked hands out a hold on l's token and slot, which the caller has
// taken, granted at at to an attempt of ctx, and puts it on the lane's list.
func (l *lane) holdLocked(ctx context.Context, tn *tenant, ch *charge, at, wait time.Duration) *hold {
	return l.fillLocked(l.newHold(ctx, ch), tn, at, wait)
}

// newHold takes a hold from the pool for an attempt of ctx charged ch,
// and sets what needs no lock.
func (l *lane) newHold(ctx context.Context, ch *charge) *hold {
	h := holds.Get().(*hold)
	h.l, h.ctx = l, ctx
	if ch != nil { // recycle left it nil: a write would cost a barrier while the GC marks
		h.ch = ch
	}
	h.state = 0 // no atomic: nothing else reaches a hold from the pool (see recycle)
	return h
}

// fillLocked is holdLocked with a hold from newHold, which may be taken
// before the lock so that the lock is held for less.
func (l *lane) fillLocked(h *hold, tn *tenant, at, wait time.Duration) *hold {
	h.tn = tn
	h.start, h.at, h.wait = at, at, wait
	h.nth = l.pace.Granted()
	h.timed, h.spaced, h.look = l.timeNextLocked(at), l.pace.Spaces(), l.lookLocked(tn.level)
	h.idx = len(l.held)
	l.held = append(l.held, h)
	h.state |= holdHeld // no atomic: the hold is not handed out yet
	return h
}

// markLongLocked counts the holds of a paced lane in flight since before
// now less the limiter's outlier time as long (see limiter.long), which
// raises the limit by one for each, and notes when the next may be.
// Called by the dispatcher when no slot is free, at most once by then.
func (l *lane) markLongLocked(now time.Duration) {
	o, r := l.slot.outlier(), l.currentRateLocked()
	if o <= 0 || r == 0 || now < l.slot.longAt {
		return
	}
	// Held from now on, an attempt turns long no sooner than this.
	n, next := int32(0), now+o
	for _, h := range l.held {
		switch due := h.start + o; {
		case h.long:
		case due <= now:
			h.long = true
			n++
		case due < next:
			next = due
		}
	}
	l.slot.longAt = next
	if n > 0 {
		l.limitMovedLocked(l.slot.addLong(n, r))
	}
}

// unholdLocked takes h, whose return its caller claimed, off the lane's
// list.
func (l *lane) unholdLocked(h *hold) {
	if h.idx < 0 {
		return // a prepaid grant given back before it was settled
	}
	if h.long {
		h.long = false
		l.slot.long--
	}
	last := len(l.held) - 1
	if h.idx != last {
		m := l.held[last]
		l.held[h.idx], m.idx = m, h.idx
	}
	l.held[last] = nil
	l.held = l.held[:last]
}

// Done gives back the slot of an attempt that was sent and is finished as k
// (see verdict.Kind): the lane counts the response and, if the hold is
// timed, its latency. The caller owns h no more.
func (h *hold) Done(k verdict.Kind) { h.finish(k, h.timed) }

// finish is Done, with sample false where the latency is not the server's.
func (h *hold) finish(k verdict.Kind, sample bool) {
	h.l.release(h, k, sample, true)
}

// Drop gives back the token and the slot of an attempt that was granted but
// not sent, as if the grant had not been made. The caller owns h no more.
func (h *hold) Drop() { h.l.refund(h) }

// ctxEnded runs when a watched hold's context ends (see reclaimLocked): the
// caller has given up on the response, so its slot goes back. Its latency
// is not a sample: it is the caller's, not the server's.
func (h *hold) ctxEnded() { h.l.release(h, h.kind, false, false) }

// reclaimLocked gives back the slots of responses whose request's context
// has ended though their body is not done, and reports whether it gave any
// back. With watch, it also arms a watch on the context of every other
// response out, so that its end gives the slot back at once.
//
// A response's context is not watched from the start: that would cost two
// allocations a request, and its slot matters only when someone needs it.
// The lane reclaims when it reports its state (Stats, forget) and when its
// dispatcher waits for a slot or a tenant's turn, and watches from then on.
// A watch that reclaim finds armed stays set: the owner must stop it before
// the hold can be recycled. While the lane is watching (until its
// dispatcher exits), a response that goes out is watched at once (see
// wrap): the dispatcher reclaims once, when it starts waiting.
func (l *lane) reclaimLocked(watch bool) bool {
	released := false
	if watch {
		l.flags.Or(laneWatching) // before out is read: see wrap
	}
	for i := len(l.held) - 1; i >= 0; i-- {
		// Backwards: releaseLocked moves the last hold to h's index.
		h := l.held[i]
		if atomic.LoadUint32(&h.state)&(holdOut|holdGiven) == holdOut && h.ctx.Done() != nil {
			if h.ctx.Err() != nil && h.claim() {
				l.releaseLocked(h, h.kind, false, 0)
				l.backendDone()
				released = true
			} else if watch {
				h.watchLocked()
			}
		}
	}
	return released
}

// watch arms h's context watch, for a lane whose dispatcher needs the slots
// back (see wrap).
func (l *lane) watch(h *hold) {
	l.lock()
	h.watchLocked()
	l.unlock()
}

// watchLocked arms h's context watch if h is not given back nor watched yet
// and its context can end. The lane's lock is held. The flag is set first,
// so that an owner that finds none may give h back without the lock.
func (h *hold) watchLocked() {
	if h.ctx.Done() == nil {
		return
	}
	s := atomic.LoadUint32(&h.state)
	if s&(holdWatched|holdGiven) == 0 && atomic.CompareAndSwapUint32(&h.state, s, s|holdWatched) {
		h.stop = context.AfterFunc(h.ctx, h.ended)
	}
}
