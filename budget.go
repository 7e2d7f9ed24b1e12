package sluice

import (
	"context"
	"math"
	"net/http"
	"slices"
	"time"
)

// maxBudgets bounds how many budgets a Transport may have: APIs publish one
// to three (OpenAI's tokens, Anthropic's input, output and total tokens).
const maxBudgets = 8

type budgetConfig struct {
	name string
	n    int
	per  time.Duration
}

// budget is a lane's account of one budget.
type budget struct {
	name   string
	b      bucket
	queued [numLevels]float64 // cost of the waiters queued at each level
	// sent counts the units granted since the lane began; a charge keeps
	// its value at the grant, so that what was sent after an attempt is
	// known when its response states what remained.
	sent float64
	// margin is how much costs are underestimated, as a share of the
	// estimate, learned from what the server says remains: a request waits
	// until its cost and that margin are there, so that an estimate below
	// the true cost is not refused. Waiting longer costs no throughput
	// while requests queue: the bucket does not fill meanwhile.
	margin float64
	// out is the cost of the attempts granted and not yet answered (see
	// lane.out): each may have cost more than its estimate, by up to the
	// margin, and the server's count will say so only when it answers.
	out float64
}

// maxCostMargin bounds the learned underestimate: an estimate half the
// cost.
const maxCostMargin = 1.0

// A charge is what one attempt costs the lane's budgets, indexed as
// l.budgets, and each budget's sent count when it was granted.
type charge struct {
	cost, mark []float64
}

func newBudgets(cfg []budgetConfig) []budget {
	if len(cfg) == 0 {
		return nil
	}
	bs := make([]budget, len(cfg))
	for i, c := range cfg {
		bs[i] = budget{name: c.name, b: bucket{rate: float64(c.n) / c.per.Seconds(), burst: float64(c.n), tokens: float64(c.n)}}
	}
	return bs
}

// chargeOf returns what a request with ctx costs l's budgets, nil if
// nothing, or a refusal if a cost exceeds its budget's size. The lane's
// mutex need not be held: it reads only the budgets' fixed sizes.
func (l *lane) chargeOf(ctx context.Context, p Priority) (*charge, *RejectedError) {
	if l.budgets == nil {
		return nil, nil
	}
	head, _ := ctx.Value(costKey{}).(*cost)
	if head == nil {
		return nil, nil
	}
	var ch *charge
	for i := range l.budgets {
		b := &l.budgets[i]
		for c := head; c != nil; c = c.next {
			if c.name != b.name {
				continue
			}
			if c.n > b.b.burst {
				return nil, &RejectedError{Key: l.key, Priority: p, Reason: ReasonCost, Budget: b.name,
					Cost: int64(c.n), Limit: time.Duration(math.MaxInt64)}
			}
			if c.n > 0 {
				if ch == nil {
					ch = &charge{cost: make([]float64, len(l.budgets)), mark: make([]float64, len(l.budgets))}
				}
				ch.cost[i] = c.n
			}
			break
		}
	}
	return ch, nil
}

// canPay reports whether every budget holds ch's cost at now. mu must be
// held.
func (l *lane) canPay(now time.Duration, ch *charge) bool {
	if ch == nil {
		return true
	}
	for i := range l.budgets {
		if c := ch.cost[i]; c > 0 && l.budgets[i].b.advance(now) < l.budgets[i].need(c) {
			return false
		}
	}
	return true
}

// need is what b must hold to pay a cost c: c, and the learned margin for
// underestimates of c and of the costs not yet answered, within the
// bucket's size.
func (b *budget) need(c float64) float64 {
	return min(c+b.margin*(c+b.out), b.b.burst)
}

// pay takes ch's cost from every budget at now, and counts ch among the
// charges not yet answered (see reconcile) until answered is called. mu
// must be held.
func (l *lane) pay(now time.Duration, ch *charge) {
	if ch == nil {
		return
	}
	if len(l.out) >= maxOut {
		// An attempt whose answer was never observed (its send panicked)
		// must not pin its charge: the oldest goes first.
		l.answered(l.out[0])
	}
	l.out = append(l.out, ch)
	for i := range l.budgets {
		l.budgets[i].out += ch.cost[i]
	}
	for i := range l.budgets {
		b := &l.budgets[i]
		ch.mark[i] = b.sent
		if c := ch.cost[i]; c > 0 {
			b.b.set(now, b.b.advance(now)-c)
			b.sent += c
		}
	}
}

// maxOut bounds the charges a lane keeps unanswered: more than any
// in-flight limit a budget's lane runs at.
const maxOut = 4096

// answered takes ch out of the charges not yet answered: its response was
// observed, it failed, or it was not sent. mu must be held.
func (l *lane) answered(ch *charge) {
	if ch == nil {
		return
	}
	i := slices.Index(l.out, ch)
	if i < 0 {
		return
	}
	l.out = slices.Delete(l.out, i, i+1)
	for i := range l.budgets {
		l.budgets[i].out -= ch.cost[i]
	}
	if len(l.out) == 0 {
		for i := range l.budgets {
			l.budgets[i].out = 0 // no rounding left behind
		}
		if cap(l.out) > 64 {
			l.out = nil // a burst's backlog is not kept
		}
	}
}

// dropCharge is answered for an attempt whose response says nothing of
// its budgets, taking the lane's lock; it does nothing for no charge, at
// the cost of a nil check where it is called (it is inlined).
func (l *lane) dropCharge(ch *charge) {
	if ch != nil {
		l.dropChargeLocking(ch)
	}
}

func (l *lane) dropChargeLocking(ch *charge) {
	l.mu.Lock()
	l.answered(ch)
	l.mu.Unlock()
}

// repay gives ch's cost back to every budget at now: the attempt was not
// sent. mu must be held.
func (l *lane) repay(now time.Duration, ch *charge) {
	if ch == nil {
		return
	}
	l.answered(ch)
	for i := range l.budgets {
		if c := ch.cost[i]; c > 0 {
			b := &l.budgets[i]
			b.b.set(now, b.b.advance(now)+c)
			b.sent -= c
		}
	}
}

// payDelay returns how long until every budget holds ch's cost. mu must be
// held.
func (l *lane) payDelay(now time.Duration, ch *charge) time.Duration {
	var d time.Duration
	if ch == nil {
		return 0
	}
	for i := range l.budgets {
		b := &l.budgets[i]
		if c := ch.cost[i]; c > 0 {
			d = max(d, tokensDelay(b.need(c)-b.b.advance(now), b.b.rate))
		}
	}
	return d
}

// queueCost adds (sign 1) or removes (sign -1) a waiter's cost from its
// level's queued totals. mu must be held.
func (l *lane) queueCost(w *waiter, sign float64) {
	if w.charge == nil {
		return
	}
	for i := range l.budgets {
		l.budgets[i].queued[w.level] += sign * w.charge.cost[i]
	}
}

// budgetWait estimates how long a new waiter of level p costing ch waits
// for its budgets from start: the cost queued at p and above, and its own,
// less what each budget holds at start. mu must be held.
func (l *lane) budgetWait(start time.Duration, p Priority, ch *charge) time.Duration {
	var d time.Duration
	if ch == nil {
		return 0
	}
	for i := range l.budgets {
		b := &l.budgets[i]
		need := ch.cost[i]
		for lv := Interactive; lv <= p; lv++ {
			need += b.queued[lv]
		}
		d = max(d, tokensDelay(need-b.b.advance(start), b.b.rate))
	}
	return d
}

// reconcile brings budget i to what a response to an attempt granted with
// ch says remains of it at now, less what the lane sent since that grant
// and what it sent before that is not answered yet, plus what refilled
// meanwhile (sent is when the attempt was). mu must be held.
//
// Attempts reach the server in another order than they were granted: one
// granted earlier and still unanswered may arrive after this one, so the
// server's count may not include it yet. Taking it as not included errs
// on the side of less (by what the next responses correct); taking it as
// included let every such overtaking send a request the server refused.
func (l *lane) reconcile(i int, remaining int64, now, sent time.Duration, ch *charge) {
	b := &l.budgets[i]
	since, before := b.sent, 0.0
	if ch != nil {
		since -= ch.mark[i] + ch.cost[i]
		for _, o := range l.out {
			if o == ch {
				break
			}
			before += o.cost[i] // granted before ch, not answered yet
		}
	}
	t := float64(remaining) + (now-sent).Seconds()*b.b.rate - since - before
	t = min(max(t, -b.b.burst), b.b.burst)
	if ch != nil && ch.cost[i] > 0 && before == 0 {
		// The lane held more than the server: the attempt, and those
		// granted after it that the server may have counted already, cost
		// more than their estimates by about that much, a share of what
		// they were estimated at (of the attempt's alone, a cheap call
		// overtaken by a dear one read that one's error as its own). The
		// margin follows the largest underestimate, and forgets it over
		// thousands of responses. With earlier attempts unanswered, which
		// the server may or may not have counted, the difference is not
		// evidence.
		under := (b.b.advance(now) - t) / (ch.cost[i] + max(since, 0))
		b.margin = min(max(b.margin*0.9999, under), maxCostMargin)
	}
	b.b.set(now, t)
}

// adjust charges budget name the difference between what an attempt was
// estimated to cost and what it cost: a refund when the estimate was high.
func (l *lane) adjust(name string, estimate, actual float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range l.budgets {
		b := &l.budgets[i]
		if b.name == name {
			now := l.tick()
			b.b.set(now, min(b.b.advance(now)+estimate-actual, b.b.burst))
			b.sent += actual - estimate
			return
		}
	}
}

// Report tells the Transport what the request of resp, a response it
// returned, really cost the budget named name, once the response has said
// (for example usage.total_tokens in an LLM's JSON body) and no header
// stated it: the lane refunds or charges the difference from the cost the
// request's context carried (see WithCost). It does nothing for a budget
// the lane does not have, or a request that carried no cost of it.
func (t *Transport) Report(resp *http.Response, name string, actual int) {
	if resp == nil || resp.Request == nil || resp.Request.URL == nil {
		return
	}
	est := CostFrom(resp.Request.Context(), name)
	if est == 0 {
		return
	}
	l := t.find(t.cfg.key(resp.Request))
	if l == nil {
		return // forgotten: idle since, its budgets full again
	}
	l.adjust(name, float64(est), float64(max(actual, 0)))
}
