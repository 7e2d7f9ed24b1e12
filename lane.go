package sluice

import (
	"context"
	"github.com/sluice-go/sluice/internal/pace"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/stats"
	"github.com/sluice-go/sluice/internal/verdict"
)

// A lane is the state behind one key: its pace (see pace.Pacer), the wait queue,
// the in-flight limit (see limiter), the budgets and the counters. Each part
// owns its state and takes values; the lane is the only code that locks and
// the only code that calls across parts. Everything in it is guarded by mu,
// which is never held across a wait: waiting happens on channels and timers
// after mu is released. Methods whose names end in Locked are called with mu
// held; the others take it themselves, through lock and unlock, which also
// settle the holds given back without it (see listReturned).
//
// The path of a request that waits for nothing keeps its times on the lane's
// clock (see clock): offsets from the lane's creation, which compare and
// subtract as integers, where a time.Time costs an addition to build.
type lane struct {
	key string
	cfg *config
	// Read by every request, written seldom: away from fast, which a
	// busy lane's requests write.
	flags atomic.Uint32 // laneDead, laneWatching, laneLeakWarned
	quiet atomic.Uint32 // responses in a row with no rate-limit header; see reads

	clk clock // read without mu; ticked (see clock.tick) under it

	mu   sync.Mutex
	q    waitQueue
	slot limiter    // the in-flight slots and their adaptive limit
	pace pace.Pacer // the bucket, the rate, the cooldown

	// returned lists the holds given back without the lock, newest first,
	// linked by next, until the lock's next holder settles them (see
	// listReturned).
	returned atomic.Pointer[hold]
	// fast packs, above its low fastBits bits, when the last timed grant
	// was made, on the lane's clock (see timeNextLocked; untimed, below,
	// counts the grants since), and in them the prepaid grants left (see
	// prepaid.go). One word: the lane is within a size class of growing
	// a seventh (TestLaneHeap).
	fast atomic.Uint64
	pre  atomic.Pointer[prepaid] // the prepaid grants' holds; set once, under mu
	// The flags below sit in one word, and the atomic ones in another:
	// the lane is within a size class of growing a seventh (TestLaneHeap).
	closed      bool // see Transport.Close: every acquire fails
	dispatching bool // a dispatcher goroutine is running
	stalled     bool // it waits for a kick: no waiter's tenant is under its cap
	join        bool
	untimed     uint8 // < sampleEvery
	// kick wakes the dispatcher early; capacity 1. It is made when the
	// first dispatcher starts, and never changes after: a lane whose
	// requests never wait does without.
	kick chan struct{}

	budgets budgets // see WithBudget
	held    []*hold // the holds not yet given back (see hold)

	levels  [numLevels]levelCounters
	refused *[numLevels][numReasons]uint64 // early refusals; nil before the first
	budget  retryBudget                    // see retry.go
}

// The bits of lane.flags.
const (
	// laneDead: the lane was forgotten (see forget). Set under mu, never
	// cleared; read without it by lookups, which then make a new lane.
	laneDead uint32 = 1 << iota
	// laneWatching: a dispatcher needs the slots back (see reclaimLocked);
	// a response that goes out meanwhile is watched at once (see wrap).
	laneWatching
	// laneLeakWarned: a response body was collected unclosed; see
	// leakToken.
	laneLeakWarned
	// lanePerToken: see be. Set before the first grant, never cleared;
	// here rather than beside fast, so that a release, which reads it,
	// reads no line that the lane's other requests write.
	lanePerToken
)

// be returns the Backend that holds the lane's budget, nil if none (see
// WithBackend). perToken: tokens come from be().Take, the local bucket
// only keeps the lane's rate, and the pacer keeps when the Backend said to
// ask again. Otherwise it is a Leaser (see Leaser) that the lane joins at
// its first request (join), and the lane paces itself locally by both its
// bucket and the share of the key's rate the Leaser grants it (see
// pace.Pacer.Join). It is read from the lane's options rather than kept in
// the lane: a million lanes share it.
func (l *lane) be() Backend { return l.cfg.backend }

// perToken reports whether the lane takes each token from its Backend
// (see be).
func (l *lane) perToken() bool { return l.flags.Load()&lanePerToken != 0 }

// isDead reports whether the lane was forgotten (see laneDead).
func (l *lane) isDead() bool { return l.flags.Load()&laneDead != 0 }

// watching reports whether its dispatcher needs the slots back (see
// laneWatching).
func (l *lane) watching() bool { return l.flags.Load()&laneWatching != 0 }

type levelCounters struct {
	granted   uint64
	cancelled uint64
	throttled uint64
	wait      stats.Recent // over the last waitPeriod or two; rows allocated as waits come
}

// waitPeriod is the period of the wait quantiles in Stats: they cover the
// last one to two of them.
const waitPeriod = time.Minute

func newLane(key string, cfg *config) *lane {
	l := &lane{
		key: key,
		cfg: cfg,
		clk: newClock(),
		q:   waitQueue{aging: cfg.aging, lowShare: cfg.lowShare},
	}
	if _, ok := cfg.backend.(Leaser); ok {
		l.join = true
	} else {
		if cfg.backend != nil {
			l.flags.Store(lanePerToken)
		}
	}
	l.pace = pace.New(cfg.perSecond(), cfg.burst, cfg.maxRetryAfter, cfg.backend == nil, l.clk.epochNS)
	l.q.init(cfg.tenantShare)
	l.budgets = newBudgets(cfg.budgets)
	l.budget = newRetryBudget()
	l.slot = newLimiter(cfg.minConc, cfg.maxConc, l.pace.Paced())
	return l
}

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
	// sampleEvery also bounds the grants a busy lane prepays (see
	// prepaid.go): the fewer times it takes its lock, the fewer of its
	// goroutines park on it.
	sampleAbove = 1000
	sampleEvery = 32
	sampleGap   = time.Second / sampleAbove
)

// timeNextLocked reports whether the attempt granted at now (on the lane's
// clock) is to be timed from its grant to its release. The decision goes
// by the grants actually made, not only by the configured rate: a lane
// paced at 5,000/s that sees a request a minute times every one, so none
// is counted at a reading a minute old.
func (l *lane) timeNextLocked(now time.Duration) bool {
	if l.pace.Rate() < sampleAbove || now-l.timedAtLocked() >= sampleGap || l.untimed+1 >= sampleEvery {
		// Including rate 0: an unpaced lane sizes itself by latency alone.
		l.untimed = 0
		l.setTimedAtLocked(now)
		return true
	}
	l.untimed++
	return false
}

// acquire waits until the lane grants this attempt a token and an in-flight
// slot, in priority order, and returns its hold; ctx carries tenant id
// and priority p (see labels). enq is the enqueue time of
// the logical request's first attempt on the lane's clock, or firstAttempt
// (now); acquire returns it for the next attempt, also with an error.
// first: this is that first attempt, which may have waited elsewhere since
// enq (its sub-limit) and keeps its place in the queue by it. free: the
// attempt's costs are drawn on its sub-limit, not here. after: what the
// attempt will wait for elsewhere once granted here (its host's lane, for
// a sub-limit), which an early refusal counts. On error nothing is held.
func (l *lane) acquire(ctx context.Context, p Priority, id string, enq time.Duration, first, free bool, after time.Duration) (*hold, time.Duration, error) {
	if first && l.fast.Load()&fastMask != 0 {
		if h := l.takePrepaid(ctx, p, id); h != nil {
			return h, h.at, nil
		}
	}
	var ch *charge
	if !free {
		var rej *RejectedError
		if ch, rej = l.chargeOf(ctx, p); rej != nil {
			rej.Tenant = id
			l.lock()
			l.countRefusedLocked(p, ReasonCost)
			l.unlock()
			return nil, enq, rej
		}
	}
	h := l.newHold(ctx, ch) // before the lock: see fillLocked
	// The returned holds are settled only if the grant needs their slots,
	// and otherwise once the lock is let go (see unlock): the lock is held
	// for less on the path that waits for nothing.
	if !l.mu.TryLock() {
		if ph := l.lockSlow(ctx, p, id, first && ch == nil); ph != nil {
			h.recycle()
			return ph, ph.at, nil
		}
	}
	l.settleOutLocked()
	if err := l.usableLocked(); err != nil {
		l.unlock()
		h.recycle()
		return nil, enq, err
	}
	// The clock is read under the lock: a reading taken before it would
	// charge the grant to an instant up to the lock wait in the past, when
	// the bucket may have been full and overflowing, and the bound would
	// hold only on readings, not on the moments tokens are handed out.
	now := l.clk.tick()
	if enq == firstAttempt {
		enq = now
	}
	if l.join {
		l.joinLocked()
	}
	tn := l.q.levels[p].tenant(id)
	granted := l.tryGrantLocked(h, p, tn, now, first)
	if !granted && (l.returned.Load() != nil || l.fast.Load()&fastMask != 0) {
		recycleAll(l.settleReturnedLocked())
		l.revokeLocked(now) // nobody is to wait while prepaid grants are left
		// The settle may have ended the tenant's last attempt, and
		// forgotten its record: the request's is looked up again.
		tn = l.q.levels[p].tenant(id)
		granted = l.tryGrantLocked(h, p, tn, now, first)
	}
	if granted {
		l.unlock()
		return h, enq, nil
	}
	w, err := l.enqueueLocked(ctx, p, tn, ch, enq, now, first, after)
	if err != nil {
		l.unlock()
		h.recycle()
		return nil, enq, err
	}
	h.recycle() // the dispatcher takes one for the grant (nothing else holds h)
	return l.await(ctx, w)
}

// usableLocked returns the error of an acquire on a lane that can grant
// nothing: forgotten or closed.
func (l *lane) usableLocked() error {
	if l.isDead() {
		return errLaneGone
	}
	if l.closed {
		return ErrClosed
	}
	return nil
}

// tryGrantLocked is the fast path: nobody waiting, token and slot free,
// the tenant under its cap. It grants at now with no goroutine hand-off,
// filling h, or reports false. Taking tokens from a Backend, every token
// is a call to it, which must not be made under mu: the dispatcher makes
// it.
func (l *lane) tryGrantLocked(h *hold, p Priority, tn *tenant, now time.Duration, first bool) bool {
	lv := &l.q.levels[p]
	if l.perToken() || l.q.len() > 0 || tn.inFlight >= lv.capOf(l.slot.limit) || !l.tryTakeLocked(now, false, h.ch) {
		return false
	}
	lv.started(tn, l.slot.limit)
	l.grantedLocked(now, p, first, 0)
	// The grant time is the send time, give or take the few nanoseconds
	// until the caller sends: no clock read is needed.
	prev := l.timedAtLocked()
	l.fillLocked(h, tn, now, 0)
	if h.timed && l.prepayLocked(now, prev) {
		// The prepaid grants' responses are not looked at: this one is.
		h.look = true
	}
	return true
}

// enqueueLocked queues an attempt that cannot be granted at once, unless
// its context has ended or an early-refusal rule refuses it, and starts a
// dispatcher if none runs.
func (l *lane) enqueueLocked(ctx context.Context, p Priority, tn *tenant, ch *charge, enq, now time.Duration, first bool, after time.Duration) (*waiter, error) {
	lv := &l.q.levels[p]
	if err := ctx.Err(); err != nil {
		lv.forget(tn)
		return nil, err
	}
	if rej := l.refuseLocked(ctx, now, enq, p, tn, ch, after); rej != nil {
		lv.forget(tn)
		return nil, rej
	}
	w := &waiter{ctx: ctx, level: p, tn: tn, enq: enq, start: now, first: first, ready: make(chan struct{}), charge: ch}
	l.q.push(w, l.slot.limit)
	l.budgets.queue(w.level, w.charge, 1)
	if ev := l.cfg.events; ev != nil {
		ev.pushRequest(ctx, EventQueued, l, now, p, tn.id, l.q.len(), 0)
	}
	if !l.dispatching {
		l.dispatching = true
		if l.kick == nil {
			l.kick = make(chan struct{}, 1)
		}
		// No dispatcher runs: the caller is it (see await), unless tokens
		// come from a Backend, whose calls the caller's context cannot cut
		// short: the loop then runs on a goroutine of its own, so that a
		// cancelled caller returns at once.
		w.dispatches = !l.perToken()
		if !w.dispatches {
			go l.dispatch()
		}
	} else if l.stalled || !l.budgets.empty() {
		// The dispatcher waits for a release because every tenant with
		// waiters is at its cap, and this waiter's tenant may not be; or
		// for the budgets to hold what the first waiter costs, and this
		// one may come first and cost less.
		l.wakeLocked()
	}
	return w, nil
}

// await waits, with the lock held on entry and released, until w is granted
// or failed, or its context ends.
func (l *lane) await(ctx context.Context, w *waiter) (*hold, time.Duration, error) {
	l.unlock()
	if w.dispatches {
		// This goroutine runs the dispatcher's loop until its own waiter
		// is served, and hands the loop on if others still wait. A caller
		// alone in the queue, the common case, then waits for its token
		// on its own timer, with no goroutine to start and wake.
		l.run(ctx, w)
	}
	select {
	case <-w.ready:
		if w.err != nil {
			return nil, w.enq, w.err
		}
		return w.h, w.enq, nil
	case <-ctx.Done():
	}
	l.lock()
	var dropped *hold
	switch {
	case w.h != nil:
		// The grant and the cancellation raced and the grant won: give
		// the token and the slot back, as if it had not happened. The
		// caller sees its context's error and sends nothing.
		dropped = w.h
	case w.err != nil:
		l.unlock()
		return nil, w.enq, w.err // the lane failed it first; it was not cancelled
	default:
		l.q.remove(w)
		l.budgets.queue(w.level, w.charge, -1)
		// A dispatcher waiting for a slot may now exit, or serve
		// another tenant.
		l.wakeLocked()
	}
	l.levels[w.level].cancelled++
	l.unlock()
	if dropped != nil {
		dropped.Drop()
	}
	return nil, w.enq, ctx.Err()
}

// forget marks the lane dead, and reports true, if it has been idle for
// idle (0: never) and forgetting it loses nothing still in force: no
// waiter, nothing in flight, no dispatcher, no cooldown, Backend wait or
// header rate pending, and its token bucket and budgets full again, as a
// new lane's are. A lane that is already dead reports true. What is lost
// is what it learned (see WithLaneIdle). Its clock is read without moving
// its last-use stamp (l.clk.last, the latest reading a request used).
func (l *lane) forget(idle time.Duration) bool {
	if idle <= 0 {
		return false
	}
	l.lock()
	defer l.unlock()
	if l.isDead() {
		return true
	}
	d := l.clk.read()
	l.revokeLocked(max(d, l.clk.last)) // without moving the last-use stamp
	l.reclaimLocked(false)
	if d-l.clk.last < idle || l.q.len() > 0 || l.slot.inUse > 0 || l.dispatching || l.pace.Pending(d) {
		return false
	}
	if !l.budgets.full(d) {
		return false
	}
	l.flags.Or(laneDead)
	return true
}

// grantedLocked counts a grant made at now, on the lane's clock, to an
// attempt of level p that waited wait. First attempts feed the retry budget.
func (l *lane) grantedLocked(now time.Duration, p Priority, first bool, wait time.Duration) {
	if testHookGrant != nil {
		testHookGrant(l, now)
	}
	l.levels[p].granted++
	if wait <= 0 {
		l.levels[p].wait.RecordZero(now, waitPeriod)
	} else {
		l.levels[p].wait.Record(now, waitPeriod, wait)
	}
	if first {
		l.budget.firsts.AddNano(l.clk.epochNS+int64(now), 1)
	}
}

// refund gives back the token and slot of h's attempt, granted but not
// sent. A Backend's token is not given back (a shared budget cannot take
// one back safely once others may have been refused for it); its lease is.
func (l *lane) refund(h *hold) {
	l.lock()
	if testHookRefund != nil {
		testHookRefund(l, h.at)
	}
	l.unholdLocked(h)
	now := l.clk.tick()
	l.pace.Refund(now, !l.perToken(), h.nth)
	l.budgets.repay(now, h.ch)
	l.slot.put()
	l.q.levels[h.tn.level].finished(h.tn, l.slot.limit)
	l.wakeLocked()
	l.unlock()
	l.backendDone()
	h.recycle() // never out: no watch
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
		key, sub := splitKey(l.key)
		return nil, &RejectedError{Key: key, Sublimit: sub, Priority: p, Reason: ReasonCost, Budget: over.name,
			Cost: int64(min(over.n, 1<<63-1024)), Size: int64(l.budgets.size(l.budgets.index(over.name))), Limit: time.Duration(math.MaxInt64)}
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
	l.lock()
	l.budgets.answered(ch)
	l.budgetsMovedLocked()
	l.unlock()
}

// budgetsMovedLocked wakes the dispatcher after the budgets changed in a
// way that may shorten its wait: it sleeps for the time the budgets say
// its first waiter must wait to pay.
func (l *lane) budgetsMovedLocked() {
	if l.q.len() > 0 && !l.budgets.empty() {
		l.wakeLocked()
	}
}

// adjust charges the budget named name, if the lane has it, the difference
// between an attempt's estimated and actual cost (see Report).
func (l *lane) adjust(name string, estimate, actual float64) {
	l.lock()
	defer l.unlock()
	if i := l.budgets.index(name); i >= 0 {
		l.budgets.adjust(i, l.clk.tick(), estimate, actual)
		l.budgetsMovedLocked()
	}
}

// release gives back h's slot, if it is not yet, for an attempt finished
// as k (see verdict.Kind): the lane counts the response
// for feedback and, with sample, feeds its latency to the concurrency
// controller. owner: the caller is h's owner, done with it, and h is
// recycled unless a context watch may still run (its stop finds it
// started). It reports whether it gave the slot back.
func (l *lane) release(h *hold, k verdict.Kind, sample, owner bool) (released bool) {
	var d time.Duration
	if sample {
		d = l.clk.read()
	}
	listable := owner && !sample && k == verdict.Served && !l.perToken()
	// A prepaid grant not settled yet (not held) is looked at first: its
	// release then reads fast, which the lane's other takers write, once.
	if listable && (atomic.LoadUint32(&h.state)&holdHeld == 0 || l.fast.Load()&fastMask != 0) && l.listReturned(h, true) {
		// While grants are prepaid nobody waits for a slot: the hold is
		// settled with the lane's next lock (see prepaid.go).
		return true
	}
	if !l.mu.TryLock() {
		// The common case never waits for the lock: an owner done with a
		// served response that is neither timed nor watched lists its
		// hold as returned (see listReturned).
		if listable && l.listReturned(h, false) {
			return true
		}
		l.mu.Lock()
	}
	l.settleOutLocked()
	stop := h.stop
	h.stop = nil
	released = h.claim()
	if released {
		l.releaseLocked(h, k, sample, d)
	}
	l.unlock()
	if released {
		l.backendDone()
	}
	// The watch is stopped outside the lock: it takes its context's. If
	// it has started, it may still read h, which is then left to the
	// garbage collector; if not, the owner's h can be recycled.
	stopped := stop == nil || stop()
	if owner && stopped {
		h.recycle()
	}
	return released
}

// listReturned gives back h, whose owner is done with it, without the
// lane's lock, unless its context is watched or its slot given back
// already, and reports whether it did. A prepaid grant not yet settled is
// left in its place for the settle to give back (see settleOutLocked);
// any other hold is listed as returned. The first on an
// empty list settles the list if the lock is free; if not, the lock's
// holder settles it before it lets go (see unlock). A hold listed behind
// others is settled with them. Under contention a release then parks no
// goroutine, and one lock settles many.
//
// lazy: grants are prepaid, and the hold is left to the lock's next
// holder, unless they were taken back meanwhile. A revoke comes before its
// holder unlocks and settles the lists: if the load of fast below comes
// before the revoke, so does the hold's return, which that holder then
// finds; if after, the owner settles.
func (l *lane) listReturned(h *hold, lazy bool) bool {
	var s uint32
	for {
		s = atomic.LoadUint32(&h.state)
		if s&^(holdOut|holdHeld|holdTaken) != 0 {
			return false
		}
		if atomic.CompareAndSwapUint32(&h.state, s, s|holdGiven) {
			break
		}
	}
	if s&holdHeld == 0 {
		// Not settled yet: the lock holder that settles it gives it back.
		// While grants are left, the lock's next holder will; once none
		// is, nobody may come, and a request may wait for the slot: the
		// owner settles. The count is 0 before the last grant's hold is
		// given back, so at least that owner settles them all.
		if l.fast.Load()&fastMask == 0 {
			// A read-modify-write, as the returned list's CAS below:
			// TryLock reads the lock's state with a plain load, which a
			// weakly ordered CPU may make before an atomic store.
			l.pre.Load().owed.Swap(1)
			l.settleIfFree()
		}
		return true
	}
	var first bool // h is alone on the list; once listed, h is not ours
	for {
		next := l.returned.Load()
		h.next, first = next, next == nil
		if l.returned.CompareAndSwap(next, h) {
			break
		}
	}
	if lazy && l.fast.Load()&fastMask != 0 {
		return true
	}
	if first || lazy {
		l.settleIfFree()
	}
	return true
}

// lock locks the lane and settles the holds given back while it was not
// held (see release), so that the holder sees every slot given back.
func (l *lane) lock() {
	l.mu.Lock()
	if l.returned.Load() != nil {
		recycleAll(l.settleReturnedLocked())
	} else {
		l.settleOutLocked()
	}
}

// unlock unlocks the lane, and settles the holds given back while it was
// held (see unsettled), unless another goroutine has taken the lock
// again: that one then does. An owner that gives a hold back and finds the
// lock held relies on this: its return came before the holder's check, so
// no hold waits to be settled once the lock is free.
func (l *lane) unlock() {
	l.mu.Unlock()
	l.settleIfFree()
}

// settleIfFree settles the holds given back without the lock (see
// unsettled) while there are some and the lock is free, and recycles the
// returned list's holds once the lock is let go.
func (l *lane) settleIfFree() {
	for l.unsettled() && l.mu.TryLock() {
		list := l.settleReturnedLocked()
		l.mu.Unlock()
		recycleAll(list)
		if l.returned.Load() == nil && !l.owed() {
			// Once is enough for the prepaid grants, unless one was
			// given back meanwhile (see prepaid.owed): one whose taker
			// is still filling it in is not given back yet, and its
			// owner settles when it is (see listReturned).
			return
		}
	}
}

// owed reports whether a prepaid grant was given back since the last
// settle began (see prepaid.owed).
func (l *lane) owed() bool {
	pre := l.pre.Load()
	return pre != nil && pre.owed.Load() != 0
}

// unsettled reports whether holds were given back without the lock and
// wait to be settled: listed as returned, or prepaid grants taken and
// not settled while none is left (see listReturned).
func (l *lane) unsettled() bool {
	if l.returned.Load() != nil {
		return true
	}
	pre := l.pre.Load()
	return pre != nil && l.fast.Load()&fastMask == 0 && pre.unsettled()
}

// settleReturnedLocked gives back the slots of the holds on the returned
// list, and returns the list: their owners are done with them and nothing
// watches them, so the caller recycles them (see recycleAll), after it
// unlocks if it can. The order does not matter: each is counted as
// answered at the lane's latest reading.
func (l *lane) settleReturnedLocked() *hold {
	list := l.returned.Swap(nil)
	// After the swap: a prepaid grant on the list was handed out before
	// it was listed, so the swap below finds it.
	l.settleOutLocked()
	for h := list; h != nil; h = h.next {
		l.releaseLocked(h, verdict.Served, false, 0)
	}
	return list
}

// recycleAll recycles the holds of a list that settleReturnedLocked
// returned.
func recycleAll(list *hold) {
	for h := list; h != nil; {
		next := h.next
		h.next = nil
		h.recycle()
		h = next
	}
}

// overloadedLocked takes an overload at now of an attempt sent at sent,
// answered with status (0: a stream's error event) to a request of ctx at
// priority p: the in-flight limit is cut and, at its floor, the lane pauses
// (see limiter.onOverload).
func (l *lane) overloadedLocked(ctx context.Context, now, sent time.Duration, status int, p Priority) {
	l.revokeLocked(now)
	ch := l.slot.onOverload(now, sent)
	if ev := l.cfg.events; ev != nil {
		cause := OverloadStatus
		if status == 0 {
			cause = OverloadStream
		}
		ev.push(ctx, &Event{Kind: EventOverloaded, Lane: l.key, Priority: p, Tenant: TenantFrom(ctx),
			Status: status, Cause: cause, From: float64(ch.from), To: float64(ch.to), Wait: ch.pause})
	}
	l.limitMovedLocked(ch)
	if ch.pause > 0 {
		l.cooledLocked(ctx, l.pace.Cool(now, now+ch.pause, "overloaded"))
	}
}

// releaseLocked gives back h's slot (see release); d is the clock reading
// of a sample, taken before the lock.
func (l *lane) releaseLocked(h *hold, k verdict.Kind, sample bool, d time.Duration) {
	long := h.long
	l.unholdLocked(h)
	if sample {
		d = l.clk.at(d)
		ahead := int(l.fast.Load() & fastMask) // prepaid grants left: their slots are not in flight
		ch := l.slot.onSample(d, d-h.start, k, long, l.q.len() > 0, l.currentRateLocked(), ahead)
		l.limitMovedLocked(ch)
		if ch.sooner && l.q.len() > 0 {
			l.wakeLocked() // it may sleep until the later instant
		}
		if l.slot.spreading {
			l.spreadLocked(d)
		}
		l.settleLocked(d, h.start, k)
	} else {
		// Untimed only on a lane busy enough that the latest clock
		// reading, from a grant, is recent: good enough to count the
		// response in windows of seconds (see timeNext). Or not a sample
		// at all: the response was given up by its caller.
		l.slot.onUntimed(k, l.q.len() > 0)
		l.settleLocked(l.clk.last, h.start, k)
	}
	l.q.levels[h.tn.level].finished(h.tn, l.slot.limit)
	if l.slot.put() && l.q.len() > 0 {
		l.wakeLocked()
	}
}

// observe reads what a response says, when its headers arrive: the attempt
// was granted at sent, on the lane's clock; quota: the response's quotas
// are the lane's to read. It is called only for responses
// for which reads is true; the parsing happens before the lane's lock is
// taken. It returns what the attempt was to the server (see verdict), and
// false, having kept nothing, if the lane was forgotten: what the
// response says is then the live lane's to read.
func (l *lane) observe(ctx context.Context, resp *http.Response, sent time.Duration, p Priority, ch *charge, body verdict.Signal, quota bool) (verdict.Kind, bool) {
	wall := time.Now()
	r := pace.ReadReply(resp, wall, l.cfg.maxRetryAfter)
	r.Sent, r.Body = sent, body
	if !quota {
		// The quota is another limit's (see hostRefusal): only the
		// refusal is this lane's.
		r.HasQuota, r.HasTokens = false, false
	}
	var left [maxBudgets]int64 // what remains of each budget; -1: not stated
	for i := range l.budgets.len() {
		left[i] = -1
		if bq, ok := headers.ParseTokenBudget(resp.Header, wall, l.budgets.name(i)); ok {
			left[i] = bq.Remaining
		}
	}

	l.lock()
	defer l.unlock()
	if l.isDead() {
		return verdict.Of(resp.StatusCode), false
	}
	now := l.clk.tick()
	if l.budgets.observe(now, sent, &left, ch, body.Points) {
		r.BudgetOut = true // a budget had less left than the attempt cost
	}
	l.budgetsMovedLocked()
	// The grants prepaid and not handed out are taken back before the
	// attempts in flight are counted: their slots are nobody's.
	l.revokeLocked(now)
	k := l.pacedLocked(ctx, now, r, l.slot.inUse, p)
	if k == verdict.Overloaded {
		l.overloadedLocked(ctx, now, sent, r.Status, p)
	}
	return k, true
}

// pacedLocked passes r, seen at now with inFlight attempts in flight, to the
// lane's pace (see pace.Pacer.Observe), and acts on what it changed: counts,
// events, the cooldown, a wake-up for a faster bucket.
func (l *lane) pacedLocked(ctx context.Context, now time.Duration, r pace.Reply, inFlight int, p Priority) verdict.Kind {
	l.revokeLocked(now) // what the server said may change the next grant
	c := l.pace.Observe(now, r, inFlight)
	if c.Throttled {
		l.levels[p].throttled++
	}
	ev := l.cfg.events
	if c.Refused && ev != nil {
		ev.push(ctx, &Event{Kind: EventThrottled, Lane: l.key, Priority: p, Tenant: TenantFrom(ctx), Status: r.Status})
	}
	l.cooledLocked(ctx, c.Cool)
	if c.Raised && l.q.len() > 0 {
		l.wakeLocked()
	}
	if ev != nil {
		l.rateChangedLocked(ctx, ev, c.Cause)
	}
	return c.Kind
}

// cooledLocked logs a cooldown that c began, and tells the Observers of one
// it extended.
func (l *lane) cooledLocked(ctx context.Context, c pace.CoolChange) {
	if c.Fresh {
		l.cfg.logger.Info("sluice: lane cooling down", "lane", l.name(), "for", (c.Until - l.clk.last).Round(time.Millisecond), "why", c.Why)
	}
	if ev := l.cfg.events; ev != nil && c.Extended {
		ev.push(ctx, &Event{Kind: EventCooldown, Lane: l.key, Until: l.clk.timeOf(c.Until),
			Wait: c.Until - l.clk.last, Cause: c.Why})
	}
}

// traceWrite returns req, for an attempt granted at at, with a trace that
// tells the lane when the request is written to its connection (see
// pace.Pacer.Wrote). The caller's request is not changed; a base transport that
// is not net/http's never calls the trace, and the lane then paces by its
// grants alone.
func (l *lane) traceWrite(req *http.Request, at time.Duration) *http.Request {
	trace := &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { l.wrote(at) }}
	return req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
}

// wrote records that the request of a grant made at at was written.
func (l *lane) wrote(at time.Duration) {
	// Read before the lock: a wait for it is not the request's lateness.
	now := l.clk.read()
	l.lock()
	l.pace.Wrote(now, at)
	l.unlock()
}

// settleLocked counts for the lane's pace an attempt sent at sent that finished
// at now (both on the lane's clock) as k (see pace.Pacer.Settle).
func (l *lane) settleLocked(now, sent time.Duration, k verdict.Kind) {
	l.movedLocked(l.pace.Settle(now, sent, k))
}

// movedLocked takes what pace.Pacer.Settle returned: why the rate may have
// moved ("": it did not), and whether the bucket now fills faster.
func (l *lane) movedLocked(moved string, raised bool) {
	if raised && l.q.len() > 0 {
		l.wakeLocked()
	}
	if ev := l.cfg.events; moved != "" && ev != nil {
		l.rateChangedLocked(context.Background(), ev, moved)
	}
}

// rateChangedLocked reports the lane's rate to ev for cause, if it moved enough
// since the last report (see pace.Pacer.Report).
func (l *lane) rateChangedLocked(ctx context.Context, ev *events, cause string) {
	if from, to, ok := l.pace.Report(cause); ok {
		ev.push(ctx, &Event{Kind: EventRateChanged, Lane: l.key, From: from, To: to, Cause: cause})
	}
}

// currentRateLocked returns the lane's pace now, 0 if not paced.
func (l *lane) currentRateLocked() float64 { return l.pace.Rate() }

// limitMovedLocked acts on what the limiter did on a sample: it logs what a
// closed window found and a new limit, emits EventLimitChanged, and lets
// the dispatcher serve waiters in priority order if the limit grew (a
// smaller one cancels nothing: in-flight attempts drain).
func (l *lane) limitMovedLocked(ch limitChange) {
	// Logging is checked first: building a record's arguments allocates,
	// and the limit can change on any response.
	if f := ch.found; f.kind != foundNothing && l.cfg.logger.Enabled(context.Background(), slog.LevelDebug) {
		if f.kind == foundQueueing {
			l.cfg.logger.Debug("sluice: upstream queueing; limit capped", "lane", l.name(),
				"latency", f.latency, "baseline", f.baseline, "cap", f.cap)
		} else {
			l.cfg.logger.Debug("sluice: calls slower; new baseline", "lane", l.name(),
				"latency", f.latency, "baseline", f.baseline)
		}
	}
	if ch.to == ch.from {
		return
	}
	if l.cfg.logger.Enabled(context.Background(), slog.LevelDebug) {
		l.cfg.logger.Debug("sluice: in-flight limit changed", "lane", l.name(), "from", ch.from, "to", ch.to)
	}
	if ev := l.cfg.events; ev != nil {
		ev.push(context.Background(), &Event{Kind: EventLimitChanged, Lane: l.key, From: float64(ch.from), To: float64(ch.to)})
	}
	if ch.to > ch.from && l.q.len() > 0 {
		for p := range l.q.levels {
			if l.cfg.tenantShare[p] > 0 {
				l.q.levels[p].grew(ch.to)
			}
		}
		l.wakeLocked()
	}
}

// payable reports whether ch can be paid at the lane's latest clock
// reading (see waitQueue.pick).
func (l *lane) payable(ch *charge) bool { return l.budgets.canPay(l.clk.last, ch) }

// streamServed counts, for an attempt sent at sent that drew on l as a
// sub-limit, that its stream's first event said it was served (see
// frameWatch): l's pace counts the acceptance then, not at the headers,
// which a refusal in that event would contradict. It reports false if the
// lane was forgotten.
func (l *lane) streamServed(sent time.Duration) bool {
	l.lock()
	defer l.unlock()
	if l.isDead() {
		return false
	}
	l.settleLocked(l.clk.tick(), sent, verdict.Served)
	return true
}

// streamFailed takes what a stream's first event said after its headers
// (see frameWatch): for an attempt sent at sent, k is Throttled (a rate
// limit, read as a 429 without headers would be) or Overloaded (read as an
// overload: the in-flight limit is cut). counted: the attempt's slot is
// held on l, and counted among its attempts in flight. Only the lane's
// pace and limit learn. It reports false, having learned nothing, if the
// lane was forgotten.
func (l *lane) streamFailed(ctx context.Context, k verdict.Kind, sent time.Duration, p Priority, counted bool) bool {
	l.lock()
	defer l.unlock()
	if l.isDead() {
		return false
	}
	now := l.clk.tick()
	switch k {
	case verdict.Throttled:
		l.revokeLocked(now) // before the attempts in flight are counted
		inFlight := l.slot.inUse
		if !counted {
			inFlight++ // as a 429 is, whose slot is held when it is read
		}
		l.pacedLocked(ctx, now, pace.Reply{Status: http.StatusTooManyRequests, Sent: sent}, inFlight, p)
	case verdict.Overloaded:
		l.overloadedLocked(ctx, now, sent, 0, p)
	}
	return true
}
