package sluice

import (
	"context"
	"github.com/sluice-go/sluice/internal/pace"
	"math"
	"time"
)

// estimateLocked returns how long a waiter of level p enqueued at enq (now
// for a new one) is expected to wait for its token: the cooldown left,
// plus the time for the bucket to yield one token for every waiter ranked
// ahead of it and one for itself. It counts the waiters ranked ahead of it
// (see waitQueue.ahead). Waiting for an in-flight slot is not included: it
// depends on latencies not yet observed.
func (l *lane) estimateLocked(now, enq time.Duration, p Priority, tn *tenant, ch *charge) time.Duration {
	return l.estimateBehind(now, p, l.q.ahead(p, tn, enq, l.slot.limit), ch)
}

// estimateBehind is estimateLocked for a waiter with ahead grants ranked
// before it (see waitQueue.ahead).
func (l *lane) estimateBehind(now time.Duration, p Priority, ahead int, ch *charge) time.Duration {
	var d time.Duration
	start := now
	if until := l.pace.NotBefore(); start < until {
		d = until - start
		start = until
	}
	var queued [numLevels]int
	for lv := range queued {
		queued[lv] = l.q.levels[lv].n
	}
	bw := l.budgets.wait(start, p, ch, ahead, &queued)
	r := l.pace.PaceRate()
	if r == 0 {
		return d + bw
	}
	need := float64(ahead + 1)
	if !l.perToken() {
		// Taking tokens from a Backend the local bucket is not drawn from:
		// what it holds says nothing of the shared budget, which is taken
		// as empty.
		need -= l.pace.Held(start)
	}
	w := max(pace.TokensDelay(need, r), bw)
	if w > math.MaxInt64-d {
		return math.MaxInt64
	}
	return d + w
}

// waitEstimate returns how long an attempt of level p for tenant id (see
// labels) would wait for its grant, as an early refusal estimates it: one
// that came now, or, for enq not firstAttempt, a retry that keeps the
// place its first attempt took at enq, on the lane's clock.
func (l *lane) waitEstimate(p Priority, id string, enq time.Duration) time.Duration {
	l.lock()
	defer l.unlock()
	tn := l.q.levels[p].find(id)
	if tn == nil {
		tn = &tenant{} // one with nothing queued
	}
	now := l.clk.tick()
	if enq == firstAttempt {
		enq = now
	}
	return l.estimateLocked(now, enq, p, tn, nil)
}

// refuseLocked checks the early-refusal rules for a waiter of level p and tenant
// tn, enqueued at enq, which will wait for after elsewhere once granted (see
// acquire).
func (l *lane) refuseLocked(ctx context.Context, now, enq time.Duration, p Priority, tn *tenant, ch *charge, after time.Duration) *RejectedError {
	var rej *RejectedError
	switch {
	case l.cfg.maxQueue > 0 && l.q.len() >= l.cfg.maxQueue:
		rej = &RejectedError{Reason: ReasonQueueFull, Queued: l.q.len()}
	case l.cfg.tenantQueue > 0 && tn.id != "" && l.q.waiting(tn.id) >= l.cfg.tenantQueue:
		rej = &RejectedError{Reason: ReasonTenantQueue, Queued: l.q.waiting(tn.id)}
	}
	dl, hasDL := ctx.Deadline()
	maxWait := l.cfg.maxWait[p]
	if rej == nil && !hasDL && maxWait == 0 {
		return nil
	}
	ahead := l.q.ahead(p, tn, enq, l.slot.limit)
	est := l.estimateBehind(now, p, ahead, ch)
	// The other wait runs on while this one does: what the attempt waits
	// in all is about the longer of the two.
	est = max(est, after)
	// Behind a backlog the deadline must also leave the call its time
	// (W + D, most calls'): the callers a deadline refuses come back, the
	// queue stays as long as the deadlines admit, and a call granted at
	// that margin fails at its deadline with its token lost to the others.
	// With no one ahead the wait alone counts, as it did: a refused call
	// teaches the lane no latency, and a latency that counted then would
	// refuse every call for good once a slow spell had raised it.
	answer := est
	if ahead > 0 {
		if c := l.slot.callTime(); answer < math.MaxInt64-c {
			answer += c
		}
	}
	switch {
	case rej != nil:
	case hasDL && answer > l.clk.ticks(dl)-now:
		rej = &RejectedError{Reason: ReasonDeadline, Limit: l.clk.ticks(dl) - now}
	case maxWait > 0 && est > maxWait:
		rej = &RejectedError{Reason: ReasonMaxWait, Limit: maxWait}
	default:
		return nil
	}
	rej.Key, rej.Sublimit = splitKey(l.key)
	rej.Priority, rej.Tenant, rej.Wait = p, tn.id, est
	if rej.Reason == ReasonDeadline {
		rej.Wait = answer
	}
	// Trying again after the estimated wait finds, if nothing else arrives,
	// the queue ahead drained; it is a hint, not a promise.
	rej.RetryAfter = est
	l.countRefusedLocked(p, rej.Reason)
	return rej
}

// countRefusedLocked counts an early refusal of a request of level p. The
// counters are allocated at the lane's first: most lanes refuse nothing.
func (l *lane) countRefusedLocked(p Priority, r Reason) {
	if l.refused == nil {
		l.refused = new([numLevels][numReasons]uint64)
	}
	l.refused[p][r]++
}
