package sluice

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
// it; one on a fixed grid, as sethvargo/go-limiter's, earlier). The
// period is the step between the stated instants of two windows in a
// row.
//
// It is told a window that refills at once, not a bucket, when nothing
// remained over a span (the zero run) and, the instant then moving on,
// the next answer stated half the limit or more remaining: a bucket that
// gained so much so soon would have gained more than twice what the lane
// took over the zero run (its accepted attempts), and so would not have
// stated nothing remaining through it.
type windowEdge struct {
	told bool // a window refilled at once was seen

	// The zero run: answers stating nothing remaining, to attempts sent
	// from zeroFrom to zeroLast, all in the current window; zeros of them
	// were accepted (a refused attempt takes nothing from a bucket).
	zero               bool
	zeroFrom, zeroLast time.Duration
	zeros              int64

	// The current window: its stated instant (cur, 0: none yet; stated:
	// cur was stated, not yet passed, so a step to the next is exact),
	// when the first attempt it answered was sent, and the least any of
	// its answers stated remaining, to the attempt sent at leastAt.
	cur, from time.Duration
	stated    bool
	least     int64
	leastAt   time.Duration

	period time.Duration // the step from one window to the next; 0: unknown
	exact  bool          // period is a step between two stated instants
	// end is when the current window ends, at the latest (see windowEdge);
	// valid once told.
	end time.Duration
}

// edgeGuard is how far past the latest attempt the current window
// answered its end is put, when that attempt was sent after the end
// thought to be the latest (transit between the lane's clock and the
// server's), as a share of the period.
const edgeGuard = 32

// observe reads q, stated at now by the answer to an attempt sent at sent
// (accepted, or refused), and reports whether it told the window apart
// just now.
//
// A later window answered when the stated instant moved on, or when the
// answer stated half the limit or more above the least remaining the
// current window stated to an attempt sent before (a window counts only
// down): a truncated instant passes before its window ends, and reads as
// 0 from then on, in the window after it as well.
func (e *windowEdge) observe(now, sent time.Duration, q headers.Quota, accepted bool) (told bool) {
	if !q.Instant || q.Limit <= 0 || q.Remaining < 0 {
		return false
	}
	inst, stated := e.cur, q.Reset > 0
	if stated || inst == 0 {
		inst = now + q.Reset
	}
	rose := 2*(q.Remaining-e.least) >= q.Limit && sent > e.leastAt
	switch {
	case e.cur == 0:
		e.cur, e.stated, e.from, e.least, e.leastAt = inst, stated, sent, q.Remaining, sent
	case inst > e.cur+resetSlack || rose && inst >= e.cur-resetSlack:
		// A later window answered: the one before ended before sent.
		if e.zero && sent > e.zeroLast && !e.told && q.Remaining >= 1 && 2*q.Remaining >= q.Limit {
			gain := float64(q.Remaining + 1)
			dt, span := (sent - e.zeroLast).Seconds(), (e.zeroLast - e.zeroFrom).Seconds()
			e.told = gain*span > 2*float64(e.zeros+2)*dt
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
		case e.period == 0:
			// From the first attempt the window before answered: at most
			// its length, to the second when its instants are.
			e.period = sent - e.from
			if q.Coarse {
				e.period = max(time.Second, e.period.Round(time.Second))
			}
		}
		e.end = sent + e.period
		if !stated {
			inst = max(inst, now) // a passed instant: the next stated one is later
		}
		e.cur, e.stated, e.from, e.zero = inst, stated, sent, false
		e.least, e.leastAt = q.Remaining, sent
		return told
	case inst < e.cur-resetSlack:
		return false // an answer from a window before, out of order
	}
	if q.Remaining < e.least || q.Remaining == e.least && sent > e.leastAt {
		e.least, e.leastAt = q.Remaining, sent
	}
	if q.Remaining == 0 {
		if !e.zero {
			e.zero, e.zeroFrom, e.zeroLast, e.zeros = true, sent, sent, 0
		}
		e.zeroLast = max(e.zeroLast, sent)
		if accepted {
			e.zeros++
		}
	} else if e.zero && sent > e.zeroLast {
		e.zero = false // it gained within the window: not all at once
	}
	if e.told && sent >= e.end {
		e.end = sent + e.period/edgeGuard
	}
	return false
}

// until returns how long after now the current window ends; valid once
// told.
func (e *windowEdge) until(now time.Duration) time.Duration {
	return max(0, e.end-now)
}
