package sluice

import (
	"context"
	"time"
)

// A Backend holds lane budgets outside the process, so that the Transports
// of several processes that call an API with one key draw on one budget
// instead of each spending the whole of it. Package
// github.com/sluice-go/sluice/sluiceredis provides one on Redis.
//
// With a Backend, a lane's tokens come from Backend.Take instead of the
// lane's local bucket; the lane still orders its own waiters by priority in
// front of the shared budget, still bounds its own in-flight attempts, and
// still learns its rate from the server: the rate passed to Take is the
// lane's current rate. A cooldown the lane learns (Retry-After, remaining 0)
// is shared through Cool. A sub-limit given a rate (WithSublimitRate) has a
// budget of its own, keyed by its lane's key, "\x00" and its name; other
// sub-limits are this process's.
//
// A Backend must be safe for concurrent use. Its methods are never called
// with a lane's lock held, and each must bound its own time: a Backend that
// cannot reach its store decides whether to fall back to a local budget or
// to fail (see Take).
type Backend interface {
	// Take takes one token for an attempt from the budget named key, which
	// refills at rate tokens per second up to burst tokens (rate <= 0: the
	// budget is not paced, and only cooldowns and any in-flight cap apply).
	// It returns 0 when the token was taken, or else how long to wait
	// before asking again: until a cooldown set through Cool ends, or until
	// a token is due. An error fails the attempt it was asked for (the
	// caller sees it from RoundTrip); a Backend that falls back to a local
	// budget returns no error.
	//
	// A Backend that also caps attempts in flight across processes takes a
	// lease with the token, and returns a wait when none is free.
	Take(ctx context.Context, key string, rate float64, burst int) (wait time.Duration, err error)

	// Done reports that an attempt granted by Take for key has finished (its
	// response body was closed, or it was never sent). A Backend with an
	// in-flight cap releases one of this process's leases on key; others
	// may do nothing. Done is called from a goroutine of its own once the
	// attempt is done (its body closed), so that no request waits on the
	// store inside Body.Close; it should still end within a bounded time.
	Done(key string)

	// Cool records that nothing may be sent under key before until, for
	// every process that shares the key. An earlier until than one already
	// recorded is ignored.
	Cool(ctx context.Context, key string, until time.Time) error
}

// TakerOf returns who a call of Backend.Take is made for, from its
// context: a comparable value, the same for every call a lane makes and
// different between the Transports of a process (nil for a context a lane
// did not pass). Lanes of several Transports on one key share a Backend's
// budget for the key; a Backend that holds tokens for a later Take (one
// reserved ahead, in its store) keeps them for their taker, so that one
// Transport's lane does not take another's.
func TakerOf(ctx context.Context) any {
	return ctx.Value(takerKey{})
}

type takerKey struct{}

// withTaker returns the context a lane passes to Take: its Transport's
// config, unique to it, names the taker.
func withTaker(cfg *config) context.Context {
	return context.WithValue(context.Background(), takerKey{}, cfg)
}

// A Leaser is a Backend that can lease: instead of a call to Take for every
// attempt, it hands each lane on a key a share of the key's budget (a rate,
// a burst and a number of attempts in flight), which the lane paces locally,
// with no call per attempt, until the Leaser hands it another. The Leaser
// learns what each lane wants by calling its demand function, about once
// per refresh of its own choosing, and divides the key's budget among the
// lanes of every process that shares it.
//
// A lane whose Backend is a Leaser calls Join at its first request. If Join
// returns false the lane takes its tokens with Take, as from any Backend,
// and its budgets (see WithBudget) are its own, as without a Backend;
// if it returns true the lane never calls Take or Done, and sends nothing
// until its first grant. Cool is called as for any Backend.
type Leaser interface {
	Backend

	// Join adds a lane on key to those the Leaser apportions key's budget
	// to, and reports whether it will. From then on the Leaser calls demand
	// to learn what the lane wants and grant to hand it its share, from its
	// own goroutines, never from within Join, and with none of its own
	// locks held (both take the lane's lock). Once demand reports false the
	// lane is gone (its Transport closed, or the lane forgotten as idle):
	// the Leaser must drop it. A grant made meanwhile changes only its
	// budgets' levels. The Demand it returns with false holds only
	// Budgets, with each budget's final Level: what the lane was granted
	// (grants made after it went included) and will never spend, for the
	// Leaser to give back (its other fields are zero).
	Join(key string, demand func() (Demand, bool), grant func(Share)) bool
}

// A Demand is what a lane wants of a Leaser, per priority level (indexed by
// Priority): its attempts waiting and in flight now, and its grants so far,
// from which the Leaser derives its recent rate.
type Demand struct {
	Rate     float64 // the key's rate as the lane knows it, tokens a second; 0: not paced
	Burst    int     // the lane's burst (WithBurst)
	Waiting  [Batch + 1]int
	InFlight [Batch + 1]int
	Granted  [Batch + 1]uint64 // grows by one with each attempt granted
	// LowShare is the lane's WithLowShare: while a level waits below
	// another, the levels below the first waiting one are owed at least
	// 1/LowShare of the rate (0: strict priority).
	LowShare int
	// Budgets is what the lane wants of each of its budgets (see
	// WithBudget), in the order they were given; nil without budgets.
	Budgets []BudgetDemand
}

// A BudgetDemand is what a lane wants of one budget (see WithBudget) that
// a Leaser shares across processes. With a Leaser, a lane's budget does
// not refill by itself: the lane spends what the Leaser grants it (see
// BudgetShare), and the Leaser keeps the budget's level for the fleet,
// refilling it at Size per Per and lowering or raising it to what the
// server says remains.
type BudgetDemand struct {
	Name string
	Size int           // units per Per, and the budget's capacity
	Per  time.Duration // the budget's period
	// Level is what the lane holds of its grants and has not spent; below
	// 0 when a cost turned out larger than its estimate (see
	// Transport.Report).
	Level float64
	// Queued is the estimated cost of the requests waiting, by priority
	// level; Need is what the lane must hold for its next waiter to be
	// granted, the margin included (0: none waits).
	Queued [Batch + 1]float64
	Need   float64
	// Spent grows by the cost of each attempt granted (and shrinks by a
	// refund): the Leaser derives the lane's recent cost rate from it.
	Spent float64
	// Unanswered is the cost of the attempts granted and not answered yet:
	// the server may not have counted them.
	Unanswered float64
	// Seen counts the responses that said what remains of the budget;
	// Server, once Seen > 0, is what the latest said, brought to now: its
	// count, plus what refilled since the attempt was sent, less this
	// lane's costs granted since that attempt and those granted before it
	// and not answered yet. The server counts every process on the key
	// (an API key's organisation), so the Leaser subtracts the others'
	// unanswered costs, and passes on a count once (when Seen grows).
	Seen   uint64
	Server float64
}

// A Share is the part of a key's budget a Leaser grants one lane until its
// next grant. The lane sends at most Rate tokens a second, Burst at once,
// on top of its own pace, and has at most InFlight attempts in flight.
type Share struct {
	Rate     float64   // tokens a second, >= 0; +Inf: not paced by the share
	Burst    int       // at least 1
	InFlight int       // < 0: no cap from the share
	Cool     time.Time // a cooldown shared by another process; zero: none
	// Budgets are the lane's grants of its budgets, indexed as
	// Demand.Budgets; nil: none this time.
	Budgets []BudgetShare
}

// A BudgetShare is a Leaser's grant of one budget to a lane.
type BudgetShare struct {
	// Add is added to what the lane holds of the budget: a grant, or
	// when below 0 what the lane gives back (the server said the fleet
	// holds less than it thought).
	Add float64
	// Rate is the lane's expected part of the budget's refill, units a
	// second, from which it estimates waits (see WithMaxWait).
	Rate float64
	// Margin is the fleet's learned underestimate of costs, a share of an
	// estimate in [0, 1]: the lane holds cost + Margin x (cost +
	// unanswered) before it grants an attempt.
	Margin float64
}

// backendDone tells the Backend, if any, that an attempt it granted is done,
// from a goroutine: it is called from Response.Body.Close and on a
// cancelled request's way out, and a Backend may talk to its store (see
// Backend.Done).
func (l *lane) backendDone() {
	if l.perToken() {
		go l.be().Done(l.key)
	}
}

// shareCooldown passes the lane's cooldown to its Backend, if it has one and
// the cooldown is later than the last one shared, so that every process on
// the key pauses with it. It is called after a response is observed.
func (l *lane) shareCooldown() {
	l.lock()
	d, ok := l.pace.ToShare()
	l.unlock()
	if !ok {
		return
	}
	// d is on the lane's clock, whose wall reading is the lane's creation
	// plus monotonic time; a Backend may use the wall reading (other
	// processes only have that), so rebase it on time.Now's.
	until := time.Now().Add(d - l.clk.read())
	if err := l.be().Cool(context.Background(), l.key, until); err != nil {
		l.cfg.logger.Warn("sluice: backend could not share a cooldown", "lane", l.name(), "until", until, "err", err)
	}
}

// takeShared asks the Backend for a token for the best waiter, holding a
// slot for it meanwhile so that the token is never taken without a slot to
// use it. The waiter is chosen after the Backend answers, so a request of a
// higher level that arrives during the call gets the token. The caller has
// taken the slot (see run) and does not hold mu; r is the lane's rate.
func (l *lane) takeShared(r float64) {
	wait, err := l.be().Take(withTaker(l.cfg), l.key, r, l.cfg.burst)
	l.lock()
	now := l.clk.tick()
	switch {
	case err != nil:
		// The Backend refused to answer: fail one waiter with its error,
		// and try the next one afresh.
		l.slot.put()
		if w := l.q.pop(l.slot.limit, l.payable); w != nil {
			l.grantLocked(now, w, err)
		}
	case wait > 0:
		l.slot.put()
		// A Backend that names an absurd wait is held to the cap that
		// applies to a server's Retry-After.
		l.pace.SetWait(now, wait)
	default:
		if w := l.q.pop(l.slot.limit, l.payable); w != nil {
			// The budgets held the first waiter's cost when the token was
			// asked for (see run); they pay whoever is first now.
			l.budgets.pay(now, w.charge)
			l.grantLocked(now, w, nil)
			break
		}
		// No waiter may be served now: every one left during the call, or
		// the limit shrank and their tenants are at the lower cap. The
		// shared token is spent; the slot and any lease go back.
		l.slot.put()
		l.unlock()
		l.be().Done(l.key)
		return
	}
	l.unlock()
}

// joinLocked joins the lane's Leaser at its first request (see Leaser),
// when the lane is surely the one in its Transport's map. If the Leaser
// declines, the lane takes its tokens with Take. The Leaser calls neither
// function from within Join.
func (l *lane) joinLocked() {
	l.join = false
	if !l.be().(Leaser).Join(l.key, l.demand, l.grant) {
		l.flags.Or(lanePerToken)
		return
	}
	// Nothing is sent before the first grant (see grant); the budgets
	// spend what the Leaser grants them.
	l.pace.Join()
	l.budgets.joinFleet()
}

// demand is what the lane wants of its Leaser; false once the lane is gone.
func (l *lane) demand() (Demand, bool) {
	l.lock()
	defer l.unlock()
	if l.closed || l.isDead() {
		var d Demand
		if !l.budgets.empty() {
			d.Budgets = l.budgets.demand(l.clk.peek(), nil)
		}
		return d, false
	}
	l.reclaimLocked(false) // what in flight was given up on is not demand
	d := Demand{Rate: l.currentRateLocked(), Burst: l.cfg.burst, LowShare: l.cfg.lowShare}
	for p := range l.q.levels {
		lv := &l.q.levels[p]
		d.Waiting[p] = lv.n
		lv.each(func(t *tenant) { d.InFlight[p] += t.inFlight })
		d.Granted[p] = l.levels[p].granted
	}
	if !l.budgets.empty() {
		var next *charge
		if w := l.q.next(l.slot.limit, l.payable); w != nil {
			next = w.charge
		}
		d.Budgets = l.budgets.demand(l.clk.peek(), next)
	}
	return d, true
}

// grant sets the lane's share from its Leaser, and wakes its dispatcher.
func (l *lane) grant(s Share) {
	l.lock()
	defer l.unlock()
	if l.closed || l.isDead() {
		// Gone, its budgets still take the grant: the Leaser counted it
		// (a give-back of a refresh under way as the lane went), and
		// the final levels the lane reports must too (see demand).
		l.budgets.share(l.clk.peek(), s.Budgets)
		return
	}
	if !l.pace.Sharing() {
		return
	}
	now := l.clk.peek()
	l.pace.SetShare(now, s.Rate, s.Burst)
	l.budgets.share(now, s.Budgets)
	l.slot.leased = 0
	if s.InFlight >= 0 {
		l.slot.leased = s.InFlight + 1
	}
	if !s.Cool.IsZero() {
		// Held to the cap of a server's Retry-After, as a Backend's wait
		// is (see takeShared): a Leaser passes a cooldown again at each
		// refresh while it lasts, and one that no process set (a time far
		// off in its store) must not hold the lane after it stops.
		until := min(l.clk.ticks(s.Cool), now+l.cfg.maxRetryAfter)
		l.cooledLocked(context.Background(), l.pace.Cool(now, until, "a cooldown shared by another process"))
	}
	l.wakeLocked()
}
