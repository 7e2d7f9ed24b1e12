package sluice

import (
	"context"
	"log/slog"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/stats"
)

// A lane is the state behind one key: its pace (see pacer), the wait queue,
// the in-flight slots and the counters. Everything in it is guarded
// by mu, which is never held across a wait: waiting happens on channels and
// timers after mu is released.
//
// The path of a request that waits for nothing keeps its times on the lane's
// clock (see clock): offsets from the lane's creation, which compare and
// subtract as integers, where a time.Time costs an addition to build.
type lane struct {
	key     string
	cfg     *config
	epoch   time.Time // see clock
	epochNS int64     // epoch.UnixNano()

	mu   sync.Mutex
	last time.Duration // the latest reading of the clock used; see tick
	q    waitQueue
	slot limiter // the in-flight slots and their adaptive limit
	pace pacer   // the bucket, the rate, the cooldown

	// See timeNext: grants not timed since the last timed one, and when
	// that one was made, on the lane's clock.
	untimed int
	timedAt time.Duration

	closed bool // see Transport.Close: every acquire fails
	// dead: the lane was forgotten (see forget). Set under mu, never
	// cleared; read without it by lookups, which then make a new lane.
	dead        atomic.Bool
	dispatching bool // a dispatcher goroutine is running
	stalled     bool // it waits for a kick: no waiter's tenant is under its cap
	perToken    bool // see be; with the flags above, in their padding (TestLaneHeap)
	join        bool
	// kick wakes the dispatcher early; capacity 1. It is made when the
	// first dispatcher starts, and never changes after: a lane whose
	// requests never wait does without.
	kick chan struct{}

	// be, when set, holds the lane's budget (see Backend). perToken: tokens
	// come from be.Take, the local bucket only keeps the lane's rate, and
	// the pacer keeps when be said to ask again. Otherwise be is a Leaser
	// (see Leaser) that the lane joins at its first request (join), and
	// the lane paces itself locally by both its bucket and the share of
	// the key's rate the Leaser grants it (see pacer.join).
	be Backend

	budgets budgets // see WithBudget

	levels  [numLevels]levelCounters
	refused *[numLevels][numReasons]uint64 // early refusals; nil before the first
	budget  retryBudget                    // see retry.go
}

type levelCounters struct {
	granted   uint64
	cancelled uint64
	throttled uint64
	wait      stats.Recent // over the last waitPeriod or two; rows allocated as waits come
}

// countRefused counts an early refusal of a request of level p. The
// counters are allocated at the lane's first: most lanes refuse nothing.
// mu must be held.
func (l *lane) countRefused(p Priority, r Reason) {
	if l.refused == nil {
		l.refused = new([numLevels][numReasons]uint64)
	}
	l.refused[p][r]++
}

// waitPeriod is the period of the wait quantiles in Stats: they cover the
// last one to two of them.
const waitPeriod = time.Minute

func newLane(key string, cfg *config) *lane {
	epoch := time.Now()
	l := &lane{
		key:     key,
		cfg:     cfg,
		epoch:   epoch,
		epochNS: epoch.UnixNano(),
		q:       waitQueue{aging: cfg.aging, lowShare: cfg.lowShare},
		be:      cfg.backend,
	}
	if _, ok := cfg.backend.(Leaser); ok {
		l.join = true
	} else {
		l.perToken = cfg.backend != nil
	}
	l.pace = newPacer(cfg.perSecond(), cfg.burst, cfg.maxRetryAfter, cfg.backend == nil, l.epochNS)
	l.q.init(cfg.tenantShare)
	l.budgets = newBudgets(cfg.budgets)
	l.budget = newRetryBudget()
	l.slot = newLimiter(cfg.minConc, cfg.maxConc, l.pace.paced())
	return l
}

// clock reads the lane's clock: the time since the lane was created, on the
// monotonic clock. It is one clock read, where time.Now makes two (wall and
// monotonic), and what it returns is an integer to compare and subtract.
// timeOf turns a reading into the time.Time time.Now would have given.
func (l *lane) clock() time.Duration {
	return time.Since(l.epoch)
}

// timeOf returns the time of a reading d of the lane's clock.
func (l *lane) timeOf(d time.Duration) time.Time {
	return l.epoch.Add(d)
}

// tick reads the lane's clock, never earlier than a reading already used:
// every user of the lane's state (the bucket, the cooldown, the windows)
// sees time that never runs backwards, so no interval is counted twice
// (golang/go#65508; the bucket also guards itself against it). mu must be
// held.
func (l *lane) tick() time.Duration {
	return l.at(l.clock())
}

// at returns d, or the latest reading already used if d is earlier; see
// tick. mu must be held.
func (l *lane) at(d time.Duration) time.Duration {
	if d < l.last {
		return l.last
	}
	l.last = d
	return d
}

// now is tick as a time.Time, for the paths that need one. mu must be held.
func (l *lane) now() time.Time {
	return l.timeOf(l.tick())
}

// tryTake takes a token and a slot at once if both are available at now
// (on the lane's clock) and the lane is not cooling down. late says the
// dispatcher slept until a token was due: the token is then charged when it
// was due, up to one token's time before now (see bucket.takeLate). mu must
// be held.
func (l *lane) tryTake(now time.Duration, late bool, ch *charge) bool {
	if !l.pace.ready(now) || !l.slot.free() || !l.budgets.canPay(now, ch) || !l.pace.take(now, late) {
		return false
	}
	l.slot.take()
	l.budgets.pay(now, ch)
	return true
}

// estimate returns how long a new waiter of level p is expected to wait for
// its token: the cooldown left, plus the time for the bucket to yield one
// token for every waiter ranked ahead of it and one for itself. It counts
// the waiters at p and above, which is exact for strict priority and an
// upper bound when aging lets lower levels move ahead only later. Waiting
// for an in-flight slot is not included: it depends on latencies not yet
// observed. mu must be held.
func (l *lane) estimate(now time.Time, p Priority, tn *tenant, ch *charge) time.Duration {
	var d time.Duration
	start := now.Sub(l.epoch)
	if until := l.pace.notBefore(); start < until {
		d = until - start
		start = until
	}
	r := l.pace.paceRate()
	if r == 0 {
		return d + l.budgets.wait(start, p, ch)
	}
	need := float64(l.q.ahead(p, tn) + 1)
	if !l.perToken {
		// Taking tokens from a Backend the local bucket is not drawn from:
		// what it holds says nothing of the shared budget, which is taken
		// as empty.
		need -= l.pace.held(start)
	}
	w := max(tokensDelay(need, r), l.budgets.wait(start, p, ch))
	if w > math.MaxInt64-d {
		return math.MaxInt64
	}
	return d + w
}

// refuse checks the early-refusal rules for a waiter of level p and tenant
// tn. mu must be held.
func (l *lane) refuse(ctx context.Context, now time.Time, p Priority, tn *tenant, ch *charge) *RejectedError {
	var rej *RejectedError
	switch {
	case l.cfg.maxQueue > 0 && l.q.len() >= l.cfg.maxQueue:
		rej = &RejectedError{Reason: ReasonQueueFull, Queued: l.q.len()}
	case l.cfg.tenantQueue > 0 && tn.id != "" && len(tn.waiters) >= l.cfg.tenantQueue:
		rej = &RejectedError{Reason: ReasonTenantQueue, Queued: len(tn.waiters)}
	}
	dl, hasDL := ctx.Deadline()
	maxWait := l.cfg.maxWait[p]
	if rej == nil && !hasDL && maxWait == 0 {
		return nil
	}
	est := l.estimate(now, p, tn, ch)
	switch {
	case rej != nil:
	case hasDL && now.Add(est).After(dl):
		rej = &RejectedError{Reason: ReasonDeadline, Limit: dl.Sub(now)}
	case maxWait > 0 && est > maxWait:
		rej = &RejectedError{Reason: ReasonMaxWait, Limit: maxWait}
	default:
		return nil
	}
	rej.Key, rej.Priority, rej.Tenant, rej.Wait = l.key, p, tn.id, est
	// Trying again after the estimated wait finds, if nothing else arrives,
	// the queue ahead drained; it is a hint, not a promise.
	rej.RetryAfter = est
	l.countRefused(p, rej.Reason)
	return rej
}

// A grant is an attempt's token and in-flight slot, as acquire hands them
// out. Exactly one of Done and Drop gives it back. It also carries the
// enqueue time of its logical request's first attempt (for the next attempt
// to keep its place), its tenant (whose in-flight count it is part of until
// it is given back), its charge to the lane's budgets, and whether its
// latency is measured (see timeNext). A grant is a value; the zero grant
// holds nothing.
type grant struct {
	l          *lane
	enq, start time.Duration // on the lane's clock; start: latency is measured from it
	tn         *tenant
	timed      bool
	ch         *charge       // what it cost the lane's budgets
	at         time.Duration // when it was handed out, on the lane's clock
	wait       time.Duration // how long this attempt queued for it
}

// Done gives back the slot of an attempt that was sent and is finished, with
// its response's status (0: the base transport failed): the lane counts the
// response and, if the grant is timed, its latency.
func (g grant) Done(status int) { g.l.release(g, status) }

// Drop gives back the token and the slot of an attempt that was granted but
// not sent, as if the grant had not been made.
func (g grant) Drop() { g.l.refund(g.tn, g.ch, g.at) }

// testHookGrant, set only by tests, sees every grant a lane makes, at its
// reading of the lane's clock, with the lane's lock held: the hand-off
// times the bound is about, before any goroutine is scheduled.
// testHookRefund sees every grant given back unsent, by the time it was
// made.
var testHookGrant, testHookRefund func(l *lane, at time.Duration)

// firstAttempt is the enqueue time acquire is given for a logical request's
// first attempt: it has none yet.
const firstAttempt time.Duration = -1

const (
	// A lane that grants more than sampleAbove requests a second times one
	// attempt in sampleEvery, and at least one a sampleGap; a slower one
	// times every attempt. A clock read and a controller update were about
	// a third of what a request cost sluice when nothing waits, and at
	// such rates a sample of the latencies is as good as all of them: the
	// controller still gets over a hundred samples a second, and its
	// smoothing (an eighth per sample) forgets a sample within tens of
	// milliseconds. Every response is still counted, for feedback and for
	// the controller's completion rate; an untimed one is counted at the
	// lane's latest clock reading, which a lane this busy keeps fresh.
	sampleAbove = 1000
	sampleEvery = 8
	sampleGap   = time.Second / sampleAbove
)

// timeNext reports whether the attempt granted at now (on the lane's
// clock) is to be timed from its grant to its release. The decision goes
// by the grants actually made, not only by the configured rate: a lane
// paced at 5,000/s that sees a request a minute times every one, so none
// is counted at a reading a minute old. mu must be held.
func (l *lane) timeNext(now time.Duration) bool {
	if l.pace.rate < sampleAbove || now-l.timedAt >= sampleGap || l.untimed+1 >= sampleEvery {
		// Including rate 0: an unpaced lane sizes itself by latency alone.
		l.untimed, l.timedAt = 0, now
		return true
	}
	l.untimed++
	return false
}

// acquire waits until the lane grants this attempt a token and an in-flight
// slot, in priority order. enq is the enqueue time of the logical request's
// first attempt on the lane's clock, or firstAttempt. On error nothing is
// held, and the grant still carries enq.
func (l *lane) acquire(ctx context.Context, p Priority, enq time.Duration) (grant, error) {
	id := TenantFrom(ctx)
	ch, rej := l.chargeOf(ctx, p)
	if rej != nil {
		l.mu.Lock()
		l.countRefused(p, ReasonCost)
		l.mu.Unlock()
		return grant{enq: enq}, rej
	}
	l.mu.Lock()
	if l.dead.Load() {
		l.mu.Unlock()
		return grant{enq: enq}, errLaneGone
	}
	if l.closed {
		l.mu.Unlock()
		return grant{enq: enq}, ErrClosed
	}
	// The clock is read under the lock: a reading taken before it would
	// charge the grant to an instant up to the lock wait in the past, when
	// the bucket may have been full and overflowing, and the bound would
	// hold only on readings, not on the moments tokens are handed out.
	now := l.tick()
	first := enq == firstAttempt
	if first {
		enq = now
	}
	if l.join {
		l.joinLocked()
	}
	lv := &l.q.levels[p]
	tn := lv.tenant(id)
	// Fast path: nobody waiting, token and slot free, tenant under its
	// cap. No goroutine hand-off. Taking tokens from a Backend, every token
	// is a call to it, which must not be made under mu: the dispatcher
	// makes it.
	if !l.perToken && l.q.len() == 0 && tn.inFlight < lv.capOf(l.slot.limit) && l.tryTake(now, false, ch) {
		lv.started(tn, l.slot.limit)
		l.grantedLocked(now, p, first)
		if testHookGrant != nil {
			testHookGrant(l, now)
		}
		l.levels[p].wait.Record(now, waitPeriod, 0)
		timed := l.timeNext(now)
		l.mu.Unlock()
		// The grant time is the send time, give or take the few
		// nanoseconds until the caller sends: no clock read is needed.
		return grant{l, enq, now, tn, timed, ch, now, 0}, nil
	}
	if err := ctx.Err(); err != nil {
		lv.forget(tn)
		l.mu.Unlock()
		return grant{enq: enq}, err
	}
	if rej := l.refuse(ctx, l.timeOf(now), p, tn, ch); rej != nil {
		lv.forget(tn)
		l.mu.Unlock()
		return grant{enq: enq}, rej
	}
	w := &waiter{level: p, tn: tn, enq: enq, start: now, first: first, ready: make(chan struct{}), charge: ch}
	l.q.push(w, l.slot.limit)
	l.budgets.queue(w.level, w.charge, 1)
	if ev := l.cfg.events; ev != nil {
		ev.push(ctx, Event{Kind: EventQueued, Lane: l.key, Priority: p, Tenant: id, Queued: l.q.len()})
	}
	inline := false
	if !l.dispatching {
		l.dispatching = true
		if l.kick == nil {
			l.kick = make(chan struct{}, 1)
		}
		// Taking tokens from a Backend, the loop waits on the Backend's
		// calls, which the caller's context cannot cut short: it runs on
		// a goroutine of its own, so that a cancelled caller returns at
		// once.
		inline = !l.perToken
		if !inline {
			go l.dispatch()
		}
	} else if l.stalled {
		// The dispatcher waits for a release because every tenant with
		// waiters is at its cap; this waiter's tenant may not be.
		l.wake()
	}
	l.mu.Unlock()
	if inline {
		// No dispatcher runs: this goroutine is it until its own waiter
		// is served, and hands the loop on if others still wait. A caller
		// alone in the queue, the common case, then waits for its token
		// on its own timer, with no goroutine to start and wake.
		l.run(ctx, w)
	}

	select {
	case <-w.ready:
		if w.err != nil {
			return grant{enq: enq}, w.err
		}
		return grant{l, enq, l.clock(), tn, w.timed, ch, w.at, w.at - now}, nil
	case <-ctx.Done():
		l.mu.Lock()
		refunded, failed := false, false
		if w.granted {
			// The grant and the cancellation raced and the grant won: give
			// the token and the slot back, as if it had not happened. The
			// caller sees its context's error and sends nothing.
			l.refundLocked(tn, ch, w.at)
			refunded = true
		} else if w.err != nil {
			failed = true // the lane failed it first; it was not cancelled
		} else {
			l.q.remove(w)
			l.budgets.queue(w.level, w.charge, -1)
			// A dispatcher waiting for a slot may now exit, or serve
			// another tenant.
			l.wake()
		}
		if !failed {
			l.levels[p].cancelled++
		}
		l.mu.Unlock()
		if failed {
			return grant{enq: enq}, w.err
		}
		if refunded {
			l.backendDone()
		}
		return grant{enq: enq}, ctx.Err()
	}
}

// forget marks the lane dead, and reports true, if it has been idle for
// idle (0: never) and forgetting it loses nothing still in force: no
// waiter, nothing in flight, no dispatcher, no cooldown, Backend wait or
// header rate pending, and its token bucket and budgets full again, as a
// new lane's are. A lane that is already dead reports true. What is lost
// is what it learned (see WithLaneIdle). Its clock is read without moving
// its last-use stamp (l.last, the latest reading a request used).
func (l *lane) forget(idle time.Duration) bool {
	if idle <= 0 {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead.Load() {
		return true
	}
	d := l.clock()
	if d-l.last < idle || l.q.len() > 0 || l.slot.inUse > 0 || l.dispatching || l.pace.pending(d) {
		return false
	}
	if !l.budgets.full(d) {
		return false
	}
	l.dead.Store(true)
	return true
}

// grantedLocked counts a grant made at now, on the lane's clock. First
// attempts feed the retry budget. mu must be held.
func (l *lane) grantedLocked(now time.Duration, p Priority, first bool) {
	l.levels[p].granted++
	if first {
		l.budget.firsts.AddNano(l.epochNS+int64(now), 1)
	}
}

// refund gives back the token and slot of an attempt that was granted but
// not sent.
func (l *lane) refund(tn *tenant, ch *charge, at time.Duration) {
	l.mu.Lock()
	l.refundLocked(tn, ch, at)
	l.mu.Unlock()
	l.backendDone()
}

// refundLocked gives back the token and the slot. A Backend's token is not
// given back (a shared budget cannot take one back safely once others may
// have been refused for it); its lease is, by the caller's backendDone
// after mu is released. mu must be held.
func (l *lane) refundLocked(tn *tenant, ch *charge, at time.Duration) {
	if testHookRefund != nil {
		testHookRefund(l, at)
	}
	now := l.tick()
	l.pace.refund(now, !l.perToken)
	l.budgets.repay(now, ch)
	l.slot.put()
	l.q.levels[tn.level].finished(tn, l.slot.limit)
	l.wake()
}

// chargeOf returns what a request with ctx costs the lane's budgets, nil if
// nothing, or a refusal if a cost exceeds its budget's size. mu need not be
// held (see budgets.chargeOf).
func (l *lane) chargeOf(ctx context.Context, p Priority) (*charge, *RejectedError) {
	if l.budgets.empty() {
		return nil, nil
	}
	costs, _ := ctx.Value(costKey{}).(*cost)
	ch, over := l.budgets.chargeOf(costs)
	if over != nil {
		return nil, &RejectedError{Key: l.key, Priority: p, Reason: ReasonCost, Budget: over.name,
			Cost: int64(over.n), Limit: time.Duration(math.MaxInt64)}
	}
	return ch, nil
}

// dropCharge takes ch as answered by a response that says nothing of the
// budgets; a nil check where it is inlined when there is no charge.
func (l *lane) dropCharge(ch *charge) {
	if ch != nil {
		l.dropChargeLocking(ch)
	}
}

func (l *lane) dropChargeLocking(ch *charge) {
	l.mu.Lock()
	l.budgets.answered(ch)
	l.mu.Unlock()
}

// adjust charges the budget named name, if the lane has it, the difference
// between an attempt's estimated and actual cost (see Report).
func (l *lane) adjust(name string, estimate, actual float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i := l.budgets.index(name); i >= 0 {
		l.budgets.adjust(i, l.tick(), estimate, actual)
	}
}

// release returns the slot of g's attempt, finished with status (0: the
// base transport failed), counts the response for feedback and, if g is
// timed, feeds its latency to the concurrency controller. See grant.Done.
func (l *lane) release(g grant, status int) {
	start, tn, timed := g.start, g.tn, g.timed
	var d time.Duration
	if timed {
		d = l.clock()
	}
	l.mu.Lock()
	if timed {
		d = l.at(d)
		l.limitMovedLocked(l.slot.onSample(d, d-start, status, l.q.len() > 0, l.currentRate()))
		l.settle(d, start, status)
	} else {
		// Untimed only on a lane busy enough that the latest clock
		// reading, from a grant, is recent: good enough to count the
		// response in windows of seconds (see timeNext).
		l.slot.onUntimed(status, l.q.len() > 0)
		l.settle(l.last, start, status)
	}
	l.q.levels[tn.level].finished(tn, l.slot.limit)
	if l.slot.put() && l.q.len() > 0 {
		l.wake()
	}
	l.mu.Unlock()
	l.backendDone()
}

// observe reads what a response says, when its headers arrive: the attempt
// was granted at sent, on the lane's clock. It is called only for responses
// for which signals is true; the parsing happens before the lane's lock is
// taken. It reports whether the response refused the attempt for its rate
// (see pacer.observe).
func (l *lane) observe(ctx context.Context, resp *http.Response, sent time.Duration, p Priority, ch *charge) (throttled bool) {
	wall := time.Now()
	r := readReply(resp, wall, l.cfg.maxRetryAfter)
	r.sent = sent
	var left [maxBudgets]int64 // what remains of each budget; -1: not stated
	for i := range l.budgets.len() {
		left[i] = -1
		if bq, ok := headers.ParseTokenBudget(resp.Header, wall, l.budgets.name(i)); ok {
			left[i] = bq.Remaining
		}
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.tick()
	if l.budgets.observe(now, sent, &left, ch) {
		r.budgetOut = true // a budget had less left than the attempt cost
	}
	c := l.pace.observe(now, r, l.slot.inUse)
	if c.throttled {
		l.levels[p].throttled++
	}
	ev := l.cfg.events
	if c.refused && ev != nil {
		ev.push(ctx, Event{Kind: EventThrottled, Lane: l.key, Priority: p, Tenant: TenantFrom(ctx), Status: r.status})
	}
	l.cooled(c.cool)
	if c.raised && l.q.len() > 0 {
		l.wake()
	}
	if ev != nil {
		if c.cool.extended {
			ev.push(ctx, Event{Kind: EventCooldown, Lane: l.key, Until: l.timeOf(c.cool.until),
				Wait: c.cool.until - l.last, Cause: c.cool.why})
		}
		l.rateChanged(ctx, ev, c.cause)
	}
	return c.throttled
}

// cooled logs a cooldown that c began. mu must be held.
func (l *lane) cooled(c coolChange) {
	if c.fresh {
		l.cfg.logger.Info("sluice: lane cooling down", "lane", l.key, "for", (c.until - l.last).Round(time.Millisecond), "why", c.why)
	}
}

// settle counts for the lane's pace an attempt sent at sent that finished
// at now (both on the lane's clock) with status (see pacer.settle). mu must
// be held.
func (l *lane) settle(now, sent time.Duration, status int) {
	moved, raised := l.pace.settle(now, sent, status)
	if raised && l.q.len() > 0 {
		l.wake()
	}
	if ev := l.cfg.events; moved && ev != nil {
		l.rateChanged(context.Background(), ev, RateRecovery)
	}
}

// rateChanged reports the lane's rate to ev for cause, if it moved enough
// since the last report (see pacer.report). mu must be held.
func (l *lane) rateChanged(ctx context.Context, ev *events, cause string) {
	if from, to, ok := l.pace.report(cause); ok {
		ev.push(ctx, Event{Kind: EventRateChanged, Lane: l.key, From: from, To: to, Cause: cause})
	}
}

// currentRate returns the lane's pace now, 0 if not paced. mu must be held.
func (l *lane) currentRate() float64 { return l.pace.rate }

// backendDone tells the Backend, if any, that an attempt it granted is done,
// from a goroutine: it is called from Response.Body.Close and on a
// cancelled request's way out, and a Backend may talk to its store (see
// Backend.Done).
func (l *lane) backendDone() {
	if l.perToken {
		go l.be.Done(l.key)
	}
}

// shareCooldown passes the lane's cooldown to its Backend, if it has one and
// the cooldown is later than the last one shared, so that every process on
// the key pauses with it. It is called after a response is observed.
func (l *lane) shareCooldown() {
	l.mu.Lock()
	d, ok := l.pace.toShare()
	l.mu.Unlock()
	if !ok {
		return
	}
	// d is on the lane's clock, whose wall reading is the lane's creation
	// plus monotonic time; a Backend may use the wall reading (other
	// processes only have that), so rebase it on time.Now's.
	until := time.Now().Add(d - l.clock())
	if err := l.be.Cool(context.Background(), l.key, until); err != nil {
		l.cfg.logger.Warn("sluice: backend could not share a cooldown", "lane", l.key, "until", until, "err", err)
	}
}

// limitMovedLocked acts on what the limiter did on a sample: it logs what a
// closed window found and a new limit, emits EventLimitChanged, and lets
// the dispatcher serve waiters in priority order if the limit grew (a
// smaller one cancels nothing: in-flight attempts drain). mu must be held.
func (l *lane) limitMovedLocked(ch limitChange) {
	// Logging is checked first: building a record's arguments allocates,
	// and the limit can change on any response.
	if f := ch.found; f.kind != foundNothing && l.cfg.logger.Enabled(context.Background(), slog.LevelDebug) {
		if f.kind == foundQueueing {
			l.cfg.logger.Debug("sluice: upstream queueing; limit capped", "lane", l.key,
				"latency", f.latency, "baseline", f.baseline, "cap", f.cap)
		} else {
			l.cfg.logger.Debug("sluice: calls slower; new baseline", "lane", l.key,
				"latency", f.latency, "baseline", f.baseline)
		}
	}
	if ch.to == ch.from {
		return
	}
	if l.cfg.logger.Enabled(context.Background(), slog.LevelDebug) {
		l.cfg.logger.Debug("sluice: in-flight limit changed", "lane", l.key, "from", ch.from, "to", ch.to)
	}
	if ev := l.cfg.events; ev != nil {
		ev.push(context.Background(), Event{Kind: EventLimitChanged, Lane: l.key, From: float64(ch.from), To: float64(ch.to)})
	}
	if ch.to > ch.from && l.q.len() > 0 {
		for p := range l.q.levels {
			if l.cfg.tenantShare[p] > 0 {
				l.q.levels[p].grew(ch.to)
			}
		}
		l.wake()
	}
}

// wake makes a running dispatcher re-examine the lane. mu must be held.
func (l *lane) wake() {
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
		l.mu.Lock()
		if l.q.len() == 0 {
			l.dispatching = false
			l.mu.Unlock()
			return
		}
		if own != nil && (own.granted || own.err != nil || ctx.Err() != nil) {
			go l.dispatch() // still dispatching: the loop changes goroutine
			l.mu.Unlock()
			return
		}
		tick := l.tick()
		// Nobody the gate may serve (every tenant with waiters is at its
		// cap): only a release can change that.
		next := l.q.next(l.slot.limit)
		servable := next != nil
		if servable && l.perToken && l.slot.free() && tick >= l.pace.notBefore() {
			l.takeShared() // unlocks mu
			continue
		}
		if servable && !l.perToken && l.tryTake(tick, late, next.charge) {
			l.grantLocked(tick, l.q.pop(l.slot.limit), nil)
			l.mu.Unlock()
			continue
		}
		// Sleep until the cooldown ends or the token is due. When the
		// token is there but no slot is free, only a release (or a larger
		// limit) can help: wait for a kick alone.
		l.stalled = !servable
		var d time.Duration = -1
		late = false
		switch {
		case !servable:
		case tick < l.pace.cooldown():
			d = l.pace.cooldown() - tick
		case l.perToken && tick < l.pace.backendWait() && l.slot.free():
			d = l.pace.backendWait() - tick
		case !l.perToken && l.slot.free():
			d = max(l.pace.tokenDelay(tick), l.budgets.payDelay(tick, next.charge))
			late = l.pace.paceRate() > 0
		}
		precise := late && d < timerGrain && tokenTime(l.pace.paceRate()) < preciseLag
		l.mu.Unlock()

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
	// lateness back (see bucket.takeLate), so its dispatcher sleeps
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
	for prev := l.clock(); prev < until; {
		select {
		case <-l.kick:
			return true
		default:
		}
		preciseSleep(until - prev)
		now := l.clock()
		if now == prev {
			return false
		}
		prev = now
	}
	return true
}

// grantLocked hands w its grant at now, on the lane's clock, or fails it
// with err. mu must be held.
func (l *lane) grantLocked(now time.Duration, w *waiter, err error) {
	l.budgets.queue(w.level, w.charge, -1)
	if err != nil {
		w.err = err
		l.q.levels[w.level].forget(w.tn) // it may have been its last waiter
	} else {
		w.granted = true
		w.at = now
		w.timed = l.timeNext(now)
		if testHookGrant != nil {
			testHookGrant(l, now)
		}
		l.q.levels[w.level].started(w.tn, l.slot.limit)
		l.grantedLocked(now, w.level, w.first)
		l.levels[w.level].wait.Record(now, waitPeriod, now-w.start)
	}
	close(w.ready)
}

// takeShared asks the Backend for a token for the best waiter, holding a
// slot for it meanwhile so that the token is never taken without a slot to
// use it. The waiter is chosen after the Backend answers, so a request of a
// higher level that arrives during the call gets the token. mu must be held;
// it is released during the call and on return.
func (l *lane) takeShared() {
	l.slot.take()
	r, burst := l.currentRate(), l.cfg.burst
	l.mu.Unlock()
	wait, err := l.be.Take(withTaker(l.cfg), l.key, r, burst)
	l.mu.Lock()
	now := l.now()
	switch {
	case err != nil:
		// The Backend refused to answer: fail one waiter with its error,
		// and try the next one afresh.
		l.slot.put()
		if w := l.q.pop(l.slot.limit); w != nil {
			l.grantLocked(now.Sub(l.epoch), w, err)
		}
	case wait > 0:
		l.slot.put()
		// A Backend that names an absurd wait is held to the cap that
		// applies to a server's Retry-After.
		l.pace.setWait(now.Sub(l.epoch), wait)
	default:
		if w := l.q.pop(l.slot.limit); w != nil {
			l.grantLocked(now.Sub(l.epoch), w, nil)
			break
		}
		// No waiter may be served now: every one left during the call, or
		// the limit shrank and their tenants are at the lower cap. The
		// shared token is spent; the slot and any lease go back.
		l.slot.put()
		l.mu.Unlock()
		l.be.Done(l.key)
		return
	}
	l.mu.Unlock()
}

// joinLocked joins the lane's Leaser at its first request (see Leaser),
// when the lane is surely the one in its Transport's map. If the Leaser
// declines, the lane takes its tokens with Take. mu must be held: the
// Leaser calls neither function from within Join.
func (l *lane) joinLocked() {
	l.join = false
	if !l.be.(Leaser).Join(l.key, l.demand, l.grant) {
		l.perToken = true
		return
	}
	// Nothing is sent before the first grant (see grant).
	l.pace.join()
}

// demand is what the lane wants of its Leaser; false once the lane is gone.
func (l *lane) demand() (Demand, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.dead.Load() {
		return Demand{}, false
	}
	d := Demand{Rate: l.currentRate(), Burst: l.cfg.burst}
	for p := range l.q.levels {
		lv := &l.q.levels[p]
		d.Waiting[p] = lv.n
		lv.each(func(t *tenant) { d.InFlight[p] += t.inFlight })
		d.Granted[p] = l.levels[p].granted
	}
	return d, true
}

// grant sets the lane's share from its Leaser, and wakes its dispatcher.
func (l *lane) grant(s Share) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.dead.Load() || !l.pace.sharing() {
		return
	}
	now := l.tick()
	l.pace.setShare(now, s.Rate, s.Burst)
	l.slot.leased = 0
	if s.InFlight >= 0 {
		l.slot.leased = s.InFlight + 1
	}
	if !s.Cool.IsZero() {
		l.cooled(l.pace.cool(now, s.Cool.Sub(l.epoch), "a cooldown shared by another process"))
	}
	l.wake()
}
