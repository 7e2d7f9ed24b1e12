package sluice

import (
	"context"
	"github.com/sluice-go/sluice/internal/pace"
	"time"
)

// wakeLocked makes a running dispatcher re-examine the lane.
func (l *lane) wakeLocked() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// dispatch hands out grants while the queue is non-empty, and exits when it
// drains, so an idle lane runs no goroutine. It chooses the waiter at the
// moment a grant is possible, not before it sleeps, so a high-priority
// request that arrives during the sleep gets the next token.
//
// Grants follow the token schedule, not the wake-ups: after sleeping until
// a token was due, the token is charged at the instant it was due (up to
// one token's time back), and as many waiters as tokens are due are served
// at one wake-up. Go's timers cannot wake a goroutine sooner than about a
// millisecond; where a token's time is shorter than that, the dispatcher
// sleeps precisely until the token is due instead of arming a timer (see
// timerGrain).
func (l *lane) dispatch() { l.run(context.Background(), nil) }

// run is the dispatcher's loop (see dispatch). own, if not nil, is the
// waiter of the goroutine running it, whose context is ctx: run returns
// once own is served or failed, or ctx ends, and starts a dispatcher
// goroutine for the waiters left.
func (l *lane) run(ctx context.Context, own *waiter) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	late := false // the last sleep was for a token, and nothing else bound
	for {
		l.lock()
		if l.q.len() == 0 {
			l.dispatching = false
			l.flags.And(^laneWatching)
			l.unlock()
			return
		}
		if own != nil && (own.h != nil || own.err != nil || ctx.Err() != nil) {
			go l.dispatch() // still dispatching: the loop changes goroutine
			l.unlock()
			return
		}
		tick := l.clk.tick()
		// Nobody the gate may serve (every tenant with waiters is at its
		// cap): only a release can change that.
		next, skipped := l.q.pick(l.slot.limit, l.payable)
		servable := next != nil
		if servable && l.perToken() && l.slot.free() && tick >= l.pace.NotBefore() && l.budgets.canPay(tick, next.charge) {
			l.slot.take() // held for the token the Backend may give
			r := l.currentRateLocked()
			l.unlock()
			l.takeShared(r)
			continue
		}
		if servable && !l.perToken() && l.tryTakeLocked(tick, late, next.charge) {
			// The waiter picked, whose charge was just paid: picked
			// again, the low share's waiter may no longer be payable.
			l.grantLocked(tick, l.q.take(next, l.slot.limit, skipped), nil)
			l.unlock()
			continue
		}
		// A slot or a tenant's turn held by a response its caller gave up
		// on comes back now, and the others are watched from here on (see
		// reclaimLocked).
		if (!servable || !l.slot.free()) && !l.watching() && len(l.held) > 0 && l.reclaimLocked(true) {
			l.unlock()
			continue
		}
		// The slots held by attempts long in flight raise the limit (see
		// limiter.long).
		if servable && !l.slot.free() {
			if l.markLongLocked(tick); l.slot.free() {
				l.unlock()
				continue
			}
		}
		// Sleep until the cooldown ends or the token is due. When the
		// token is there but no slot is free, only a release, a larger
		// limit or an attempt that turns long can help: wait for a kick,
		// or for that.
		l.stalled = !servable
		var d time.Duration = -1
		late = false
		switch {
		case !servable:
		case tick < l.pace.Cooldown():
			d = l.pace.Cooldown() - tick
		case l.perToken() && l.slot.free() && (tick < l.pace.BackendWait() || !l.budgets.canPay(tick, next.charge)):
			// Taking each token from a Backend, the budgets are the
			// lane's own: the first waiter waits for them too.
			d = max(l.pace.BackendWait()-tick, l.budgets.payDelay(tick, next.charge))
		case !l.perToken() && l.slot.free():
			d = max(l.pace.TokenDelay(tick), l.budgets.payDelay(tick, next.charge))
			late = l.pace.PaceRate() > 0
		case !l.slot.free() && l.slot.longAt > tick:
			d = l.slot.longAt - tick
		}
		precise := late && d < timerGrain && pace.TokenTime(l.pace.PaceRate()) < preciseLag
		l.unlock()

		switch {
		case d < 0:
			select {
			case <-l.kick:
			case <-ctx.Done():
			}
		case precise && l.sleepUntil(tick+d):
		default:
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-l.kick:
			case <-ctx.Done():
			}
		}
	}
}

const (
	// A timer armed for less than timerGrain fires about a millisecond
	// late on Linux (the runtime's poller sleeps in whole milliseconds).
	// A lane whose token's time is under preciseLag could not charge that
	// lateness back (see pace.Pacer.Take), so its dispatcher sleeps
	// precisely until the token is due instead (see sleepUntil).
	timerGrain = time.Millisecond
	preciseLag = timerGrain + timerGrain/5
)

// sleepUntil returns when the lane's clock reaches until or the lane is
// kicked, sleeping precisely (see preciseSleep) in between. It reports
// false, having waited for nothing, if the clock stands still meanwhile:
// time that moves only when every goroutine is blocked (a testing/synctest
// bubble) must be waited for with a timer.
func (l *lane) sleepUntil(until time.Duration) bool {
	for prev := l.clk.read(); prev < until; {
		select {
		case <-l.kick:
			return true
		default:
		}
		preciseSleep(until - prev)
		now := l.clk.read()
		if now == prev {
			return false
		}
		prev = now
	}
	return true
}

// grantLocked hands w its grant at now, on the lane's clock, or fails it
// with err.
func (l *lane) grantLocked(now time.Duration, w *waiter, err error) {
	l.budgets.queue(w.level, w.charge, -1)
	if err != nil {
		w.err = err
		l.q.levels[w.level].forget(w.tn) // it may have been its last waiter
	} else {
		l.q.levels[w.level].started(w.tn, l.slot.limit)
		l.grantedLocked(now, w.level, w.first, now-w.start)
		w.h = l.holdLocked(w.ctx, w.tn, w.charge, now, now-w.start)
	}
	close(w.ready)
}

// tryTakeLocked takes a token and a slot at once if both are available at now
// (on the lane's clock) and the lane is not cooling down. late says the
// dispatcher slept until a token was due: the token is then charged when it
// was due, up to one token's time before now (see pace.Pacer.Take).
func (l *lane) tryTakeLocked(now time.Duration, late bool, ch *charge) bool {
	if !l.pace.Ready(now) || !l.slot.free() || !l.budgets.canPay(now, ch) || !l.pace.Take(now, late) {
		return false
	}
	l.slot.take()
	l.budgets.pay(now, ch)
	return true
}
