package pace

import (
	"time"

	"github.com/sluice-go/sluice/internal/headers"
)

// A windowEdge learns, from the quotas of a lane's responses, whether the
// server keeps a fixed window that refills all at once when it ends
// (ulule/limiter, sethvargo/go-limiter), and when the window the lane is
// in ends. Times are on the lane's clock; it holds no lock, and its zero
// value has seen nothing.
//
// Such servers state their reset as an instant to the second, truncated
// (ulule/limiter's Unix time) or read as the end of its second (a date):
// off from the window's end by up to a second either way, which is a
// whole window at one request a second or more. So the end is measured,
// not read: the stated instant only names the window a response came
// from. When it names a later one, the window before ended between the
// last attempt the old one answered and the first the new one did, and
// the new one ends a period after that, at the latest (a window that
// starts at its first request, as ulule/limiter's do, ends a period after
// it; one on a fixed grid, as sethvargo/go-limiter's, earlier), give or
// take the request's transit: the server starts the window when the
// request arrives. An attempt sent past the measured end and answered by
// the window before shows by how much; the end measured from then on
// takes a guard for it (see guardAfter). The period is the step between
// the stated instants of two windows in a row.
//
// It is told a window that refills at once apart at a refill no bucket
// could make: the answers of one window showed the server gaining little
// (what the lane took, less what remaining fell, over the span from the
// window's first answer to its least), and the next window's first answer
// stated remaining higher by more than twice as much per second, by an
// eighth of the limit or more, and three quarters of the limit or more
// remaining (a window refilled at once gains all it took, a bucket as
// much per second as before, and a sliding window what its count of the
// window before lets go). A window spent early and
// refused for its tail gained nothing over the tail; one paced through
// without a refusal, nothing over the whole window. A window spent in a
// few milliseconds shows too little of what it gained to compare: it is
// told apart when the next window's first answer states its reset more
// than twice as far as a bucket gaining what the server gained since
// would take to fill (see farReset).
//
// A sliding window may show such a refill once: a lane held a window long
// by a refusal's Retry-After comes back to a count of the window before
// that has mostly gone. Its next window shows the difference, its first
// answer stating less than half the limit remaining where a refill at
// once states nearly all of it; the window is then no longer told apart,
// and never again.
type windowEdge struct {
	told bool // a window refilled at once was seen
	// wrong: a told window's next one did not refill at once; it is
	// never told apart again.
	wrong bool

	// The current window: its stated instant (cur, 0: none yet; stated:
	// cur was stated, not yet passed, so a step to the next is exact), when
	// the first attempt it answered was sent and what that answer stated
	// remaining, the least any of its answers stated, to the attempt sent
	// at leastAt, and how many of its answers after the first were
	// acceptances (a refused attempt takes nothing from a bucket).
	cur, from    time.Duration
	stated       bool
	first, least int64
	leastAt      time.Duration
	took         int64

	period time.Duration // the step from one window to the next; 0: unknown
	exact  bool          // period is a step between two stated instants
	// end is when the current window ends, at the latest (see windowEdge);
	// valid once told.
	end time.Duration
	// guard is how much later than a period after its first attempt was
	// sent a window was found to end: a window that starts when its first
	// request arrives ends a transit later, and transits vary. It grows
	// each time an attempt sent after the measured end is answered by the
	// window before (see guardAfter), and is added to every end measured
	// after. It is period/edgeGuardMin at least from the first end
	// measured, so that the spread of a loopback's transits costs no
	// refusal.
	guard time.Duration

	// grantable is how many grants the lane may still make before
	// grantsEnd, the current window's measured end, as the last answer
	// counted them (see allow); none is counted past grantsEnd.
	grantable int64
	grantsEnd time.Duration
}

// observe reads q, stated at now by the answer to an attempt sent at sent
// (accepted, or refused), and reports whether it told the window apart
// just now.
//
// A later window answered when the stated instant moved on, or when the
// answer stated half the limit or more above the least remaining the
// current window stated to an attempt sent before (a window counts only
// down): a truncated instant passes before its window ends, and reads as
// 0 from then on, in the window after it as well.
//
// A reset stated as a delay names no instant: the window's end is within
// its grain (a second, where it is rounded up) before the attempt's send
// plus the delay, on the clock the attempts are sent by, as the server
// counted the attempt after it was sent. The current window's instant is
// then the earliest of these its answers stated, and a later window
// answered when the remaining rose as above, or by two or more (a window
// counts only down; two attempts sent close together may be counted in
// the other order), or when the answer's window ends after that instant
// whatever its rounding. A delay of 0 says nothing of the window.
func (e *windowEdge) observe(now, sent time.Duration, q headers.Quota, accepted bool) (told bool) {
	delay := !q.Instant
	if q.Limit <= 0 || q.Remaining < 0 || delay && q.Reset <= 0 {
		return false
	}
	inst, stated := e.cur, q.Reset > 0
	switch {
	case delay:
		inst = sent + q.Reset
	case stated || inst == 0:
		inst = now + q.Reset
	}
	grain := resetSlack
	if q.Coarse {
		grain = time.Second
	}
	rose := (2*(q.Remaining-e.least) >= q.Limit || delay && q.Remaining-e.least >= 2) && sent > e.leastAt
	switch {
	case e.cur == 0:
		e.start(inst, stated && !delay, sent, q.Remaining)
		return false
	case !delay && inst > e.cur+resetSlack || delay && inst-grain > e.cur+resetSlack || rose && inst >= e.cur-resetSlack:
		// A later window answered: the one before ended before sent.
		if e.told && 2*q.Remaining < q.Limit {
			// No refill at once: a sliding window's count lets the window
			// before go only in part, and a lane paced to the end it
			// measured finds half the limit or more still counted.
			e.told, e.wrong = false, true
		}
		if gain := q.Remaining - e.least + 1; !e.told && !e.wrong && gain >= 3 && 8*gain >= q.Limit && 4*q.Remaining >= 3*q.Limit && sent > e.leastAt {
			// What the server gained per second since the window's least,
			// beside what the window before gained.
			rate := float64(gain) / (sent - e.leastAt).Seconds()
			if e.leastAt > e.from {
				before := float64(max(0, e.took-(e.first-e.least))+2) / (e.leastAt - e.from).Seconds()
				e.told = rate > 2*before
			}
			e.told = e.told || stated && farReset(q, rate)
			told = e.told
		}
		switch jump := inst - e.cur; {
		case stated && e.stated && jump > 0:
			// Two windows, each stated: a step of the period, or of a
			// second more where a window starts at its first request and
			// its instant is truncated; the least is the period.
			if !e.exact || jump < e.period {
				e.period = jump
			}
			e.exact = true
		case e.period == 0 || stated && !e.exact:
			// From the first attempt the window before answered: its
			// length, to the second when its instants are, if it was
			// answered through. A window that holds sent and states its
			// end is at least as long as from sent to it; a span longer
			// than that by more than the instant's grain covered more
			// than one window (a lane held across one by a Retry-After),
			// and a shorter one was answered for a moment only (a window
			// told by its remaining rising, at its very end).
			e.period = sent - e.from
			if least := inst - sent; stated && (e.period < least || e.period > least+grain) {
				e.period = least
			}
			if q.Coarse {
				e.period = max(time.Second, e.period.Round(time.Second))
			}
		}
		e.guard = max(e.guard, e.period/edgeGuardMin)
		e.end = sent + e.period + e.guard
		if delay {
			e.end = min(e.end, inst+e.guard)
		}
		if !stated {
			inst = max(inst, now) // a passed instant: the next stated one is later
		}
		e.start(inst, stated && !delay, sent, q.Remaining)
		return told
	case !delay && inst < e.cur-resetSlack, delay && sent < e.from:
		return false // an answer from a window before, out of order
	}
	if accepted {
		e.took++
	}
	if q.Remaining < e.least || q.Remaining == e.least && sent > e.leastAt {
		e.least, e.leastAt = q.Remaining, sent
	}
	if delay && inst < e.cur {
		// A tighter bound of the window's end.
		e.cur = inst
		e.end = min(e.end, inst+e.guard)
	}
	if e.told && sent >= e.end {
		e.guard = guardAfter(e.guard, sent-e.end, e.period)
		e.end = sent + e.period/edgeGuard
	}
	return false
}

// farReset reports whether q, stated by the first answer of a window
// after the server gained rate requests a second, puts its reset further
// than a bucket could: one that gains that fast is full within a
// (limit-remaining)/rate, and states that as its reset. A window that
// refills at once states its end, a period away.
func farReset(q headers.Quota, rate float64) bool {
	grain := resetSlack
	if q.Coarse {
		grain = time.Second
	}
	return (q.Reset - grain).Seconds() > 2*float64(q.Limit-q.Remaining)/rate
}

// guardAfter returns the guard (see windowEdge) after an attempt sent late
// past a window's measured end, which included guard, was answered by that
// window: the window ended more than guard+late after a period from its
// first attempt. It takes twice that, at most period/edgeGuard; it never
// shrinks, as a transit's spread does not.
func guardAfter(guard, late, period time.Duration) time.Duration {
	return min(2*(guard+late), period/edgeGuard)
}

// start makes the window whose stated instant is inst (stated: not yet
// passed) the current one, from its first answer, to an attempt sent at
// sent, that stated left remaining.
func (e *windowEdge) start(inst time.Duration, stated bool, sent time.Duration, left int64) {
	e.cur, e.stated, e.from = inst, stated, sent
	e.first, e.least, e.leastAt, e.took = left, left, sent, 0
}

// allow records, at now, that n grants may go before end, the current
// window's measured end: what the last answer stated remaining, less the
// attempts still in flight. It reports whether that lifts a hold the last
// allowed grant set (see granted): an answer may allow more than the one
// before it counted.
func (e *windowEdge) allow(now time.Duration, n int64, end time.Duration) (lift bool) {
	_, held := e.heldTo(now)
	e.grantable, e.grantsEnd = n, end
	return n > 0 && held
}

// granted counts a grant made at now, and returns the window's end as
// when the next may go if it took the last allowed (see allow).
func (e *windowEdge) granted(now time.Duration) (next time.Duration, held bool) {
	if now >= e.grantsEnd {
		return 0, false
	}
	e.grantable--
	return e.heldTo(now)
}

// heldTo returns the window's measured end, and whether the lane's next
// grant waits for it at now: the grants the last answer allowed went.
func (e *windowEdge) heldTo(now time.Duration) (end time.Duration, held bool) {
	return e.grantsEnd, e.grantable <= 0 && now < e.grantsEnd
}

// until returns how long after now the current window ends; valid once
// told.
func (e *windowEdge) until(now time.Duration) time.Duration {
	return max(0, e.end-now)
}

// isTold reports whether a window that refills at once was told apart, and
// not contradicted since.
func (e *windowEdge) isTold() bool { return e.told }

// statedPeriod returns the step from one window to the next, and whether
// it is a step between two stated instants (exact), not a measured span.
func (e *windowEdge) statedPeriod() (period time.Duration, exact bool) {
	return e.period, e.exact
}
