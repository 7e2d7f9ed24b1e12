package sluice

import (
	"math"
	"net/http"
	"slices"
	"time"

	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/pace"
	"github.com/sluice-go/sluice/internal/verdict"
)

// maxBudgets bounds how many budgets a Transport may have: APIs publish one
// to three (OpenAI's tokens, Anthropic's input, output and total tokens).
const maxBudgets = 8

type budgetConfig struct {
	name string
	n    int
	per  time.Duration
}

// budgets is a lane's account of its budgets (see WithBudget), and of the
// charges of the attempts granted and not yet answered, in grant order.
// Times are readings of the lane's clock. The zero value has no budgets;
// every method then does nothing, as it does for a nil charge. It has no
// lock: the lane calls it with its mutex held, but for chargeOf.
type budgets struct {
	bs  []budget
	out []*charge // see pay
}

// budget is the account of one budget. See docs/design.md, "Budgets".
type budget struct {
	name   string
	b      pace.Bucket
	queued [numLevels]float64 // cost of the waiters queued at each level
	sent   float64            // units granted so far; a charge keeps its value at its grant
	margin float64            // the learned underestimate, a share of the estimate
	out    float64            // cost of the charges not yet answered

	// With a Leaser (budgets.fleet): the budget's own refill rate, the
	// lane's expected part of it (see BudgetShare.Rate), and the latest
	// server count (see seen), taken at seenAt when the lane had sent
	// seenSent; seen counts the server counts read.
	refill, flow     float64
	server, seenSent float64
	seenAt           time.Duration
	seen             uint64
	// fleet: the budget is shared through a Leaser (see BudgetDemand): it
	// does not refill by itself, and what a response says remains is
	// passed on to the Leaser instead of taken as the lane's own. (Kept
	// here, not in budgets, which every lane carries.)
	fleet bool
}

// maxCostMargin bounds the learned underestimate: an estimate half the
// cost.
const maxCostMargin = 1.0

// maxOut bounds the charges kept unanswered: more than any in-flight limit
// a budget's lane runs at.
const maxOut = 4096

// A charge is what one attempt costs the budgets, indexed as budgets.bs,
// each budget's sent count when it was granted, and each budget's level
// once it was paid, moved by what changed the level since other than the
// refill and the grants (see reconcile).
type charge struct {
	cost, mark, lvl []float64
}

// overlaps reports whether ch and o both cost something of one budget.
func (ch *charge) overlaps(o *charge) bool {
	if ch == nil || o == nil {
		return false
	}
	for i, c := range ch.cost {
		if c > 0 && o.cost[i] > 0 {
			return true
		}
	}
	return false
}

// newBudgets returns budgets of the sizes cfg gives, full.
func newBudgets(cfg []budgetConfig) budgets {
	if len(cfg) == 0 {
		return budgets{}
	}
	bs := make([]budget, len(cfg))
	for i, c := range cfg {
		r := float64(c.n) / c.per.Seconds()
		bs[i] = budget{name: c.name, b: pace.NewBucket(r, float64(c.n), float64(c.n)), refill: r}
	}
	return budgets{bs: bs}
}

// joinFleet makes the budgets shared through a Leaser, before any
// attempt is granted: empty and not refilling until the Leaser grants
// them some (see share).
func (bs *budgets) joinFleet() {
	for i := range bs.bs {
		b := &bs.bs[i]
		b.b.Stop() // its size is read without the lane's lock (see chargeOf)
		b.flow, b.fleet = b.refill, true
	}
}

// shared reports whether the budgets are shared through a Leaser.
func (bs *budgets) shared() bool { return bs.bs != nil && bs.bs[0].fleet }

// empty reports whether there are no budgets.
func (bs *budgets) empty() bool { return bs.bs == nil }

// len returns the number of budgets; name returns budget i's name.
func (bs *budgets) len() int          { return len(bs.bs) }
func (bs *budgets) name(i int) string { return bs.bs[i].name }

// size returns budget i's size; fixed at construction, it needs no lock.
func (bs *budgets) size(i int) float64 { return bs.bs[i].b.Burst() }

// index returns the index of the budget named name, or -1.
func (bs *budgets) index(name string) int {
	for i := range bs.bs {
		if bs.bs[i].name == name {
			return i
		}
	}
	return -1
}

// chargeOf returns what an attempt carrying costs (see WithCost) costs the
// budgets, nil if there are none; or, in over, the first cost that exceeds
// its budget's size, which can never be paid. An attempt that costs
// nothing has a charge of nothing: its mark of what was granted before it
// is what a count in its answer is read against (see uncounted). It reads
// only the budgets' names and sizes, fixed at construction: it needs no
// lock.
func (bs *budgets) chargeOf(costs *cost) (ch *charge, over *cost) {
	if bs.bs == nil {
		return nil, nil
	}
	ch = &charge{cost: make([]float64, len(bs.bs)), mark: make([]float64, len(bs.bs)), lvl: make([]float64, len(bs.bs))}
	for i := range bs.bs {
		b := &bs.bs[i]
		for c := costs; c != nil; c = c.next {
			if c.name != b.name {
				continue
			}
			if c.n > b.b.Burst() {
				return nil, c
			}
			ch.cost[i] = max(c.n, 0)
			break
		}
	}
	return ch, nil
}

// canPay reports whether every budget holds ch's cost at now.
func (bs *budgets) canPay(now time.Duration, ch *charge) bool {
	if ch == nil {
		return true
	}
	for i := range bs.bs {
		if c := ch.cost[i]; c > 0 && bs.bs[i].b.Level(now) < bs.bs[i].need(c) {
			return false
		}
	}
	return true
}

// need is what b must hold to pay a cost c: c, and the learned margin for
// underestimates of c and of the costs not yet answered, within the
// bucket's size.
func (b *budget) need(c float64) float64 {
	return min(c+b.margin*(c+b.out), b.b.Burst())
}

// pay takes ch's cost from every budget at now, and counts ch among the
// charges not yet answered until answered is called. Past maxOut of them,
// the oldest is taken as answered: an attempt whose answer was never
// observed (its send panicked) must not pin its charge.
func (bs *budgets) pay(now time.Duration, ch *charge) {
	if ch == nil {
		return
	}
	if len(bs.out) >= maxOut {
		bs.answered(bs.out[0])
	}
	bs.out = append(bs.out, ch)
	for i := range bs.bs {
		bs.bs[i].out += ch.cost[i]
	}
	for i := range bs.bs {
		b := &bs.bs[i]
		ch.mark[i] = b.sent
		if c := ch.cost[i]; c > 0 {
			b.b.Set(now, b.b.Level(now)-c)
			b.sent += c
		}
		ch.lvl[i] = b.b.Level(now)
	}
}

// answered takes ch out of the charges not yet answered: its response was
// observed, it failed, or it was not sent. A charge not among them is
// ignored.
func (bs *budgets) answered(ch *charge) {
	if ch == nil {
		return
	}
	i := slices.Index(bs.out, ch)
	if i < 0 {
		return
	}
	bs.out = slices.Delete(bs.out, i, i+1)
	for i := range bs.bs {
		bs.bs[i].out -= ch.cost[i]
	}
	if len(bs.out) == 0 {
		for i := range bs.bs {
			bs.bs[i].out = 0 // no rounding left behind
		}
		if cap(bs.out) > 64 {
			bs.out = nil // a burst's backlog is not kept
		}
	}
}

// repay gives ch's cost back to every budget at now: the attempt was not
// sent.
func (bs *budgets) repay(now time.Duration, ch *charge) {
	if ch == nil {
		return
	}
	for i := range bs.bs {
		bs.resent(i, ch, -ch.cost[i])
	}
	bs.answered(ch)
	for i := range bs.bs {
		if c := ch.cost[i]; c > 0 {
			b := &bs.bs[i]
			b.b.Set(now, b.b.Level(now)+c)
		}
	}
}

// resent moves by d what budget i counts as sent, for charge ch: the
// charges not yet answered that were granted after ch move their marks
// with it, so that what each counts as granted since it stays what it
// was (see uncounted). ch's own mark and those before it stay: what was
// sent before them did not change.
func (bs *budgets) resent(i int, ch *charge, d float64) {
	if d == 0 {
		return
	}
	bs.bs[i].sent += d
	if k := slices.Index(bs.out, ch); k >= 0 {
		for _, o := range bs.out[k+1:] {
			o.mark[i] += d
			o.lvl[i] -= d // what was taken before them moved too
		}
	}
}

// payDelay returns how long after now every budget holds ch's cost.
func (bs *budgets) payDelay(now time.Duration, ch *charge) time.Duration {
	var d time.Duration
	if ch == nil {
		return 0
	}
	for i := range bs.bs {
		b := &bs.bs[i]
		if c := ch.cost[i]; c > 0 {
			d = max(d, pace.TokensDelay(b.need(c)-b.b.Level(now), b.b.Rate()))
		}
	}
	return d
}

// queue adds (sign 1) or removes (sign -1) the cost ch of a waiter of level
// p from the costs queued.
func (bs *budgets) queue(p Priority, ch *charge, sign float64) {
	if ch == nil {
		return
	}
	for i := range bs.bs {
		bs.bs[i].queued[p] += sign * ch.cost[i]
	}
}

// wait estimates how long a new waiter of level p costing ch waits for the
// budgets from start, with ahead waiters ranked before it (see
// waitQueue.ahead) of queued[lv] at each level: ahead times the mean cost
// queued at p and above (at every level if none waits there), with the
// margin (the calls ahead are underestimated as this one is), and what it
// must find held to be paid (its cost and the margin: see need), less
// what each budget holds at start. The waiters ahead are counted as the
// queue will grant them, tenants' turns and aged waiters below included,
// and not as the levels hold them.
func (bs *budgets) wait(start time.Duration, p Priority, ch *charge, ahead int, queued *[numLevels]int) time.Duration {
	var d time.Duration
	if ch == nil {
		return 0
	}
	top, n := p, 0
	for lv := Interactive; lv <= p; lv++ {
		n += queued[lv]
	}
	if n == 0 {
		top = numLevels - 1
		for lv := p + 1; lv <= top; lv++ {
			n += queued[lv]
		}
	}
	for i := range bs.bs {
		b := &bs.bs[i]
		need := ch.cost[i]
		if need > 0 {
			need = b.need(need)
		}
		if ahead > 0 && n > 0 {
			var cost float64
			for lv := Interactive; lv <= top; lv++ {
				cost += b.queued[lv]
			}
			need += cost / float64(n) * float64(ahead) * (1 + b.margin)
		}
		d = max(d, pace.TokensDelay(need-b.b.Level(start), b.estRate()))
	}
	return d
}

// estRate is the rate at which b is expected to gain units: its refill,
// or with a Leaser the lane's expected part of the fleet's.
func (b *budget) estRate() float64 {
	if b.b.Rate() == 0 {
		return b.flow
	}
	return b.b.Rate()
}

// observe takes what a response at now to an attempt sent at sent with
// charge ch (nil: none) says remains of each budget, remaining[i] (< 0:
// nothing), and what its body says of a budget in points (see points),
// and then takes ch as answered. It reports whether a budget
// had less left than the attempt cost: that budget is what ran out.
func (bs *budgets) observe(now, sent time.Duration, remaining *[maxBudgets]int64, ch *charge, pts verdict.Points) (ranOut bool) {
	ranOut = bs.points(now, sent, remaining, ch, pts)
	for i := range bs.bs {
		if r := remaining[i]; r >= 0 {
			if ch != nil && float64(r) < ch.cost[i] {
				ranOut = true
			}
			bs.reconcile(i, r, now, sent, ch)
		}
	}
	bs.answered(ch)
	return ranOut
}

// pointsBudget is the name of the budget that a GraphQL answer's cost in
// points (Shopify's extensions.cost) reconciles: see WithBudget.
const pointsBudget = "points"

// points takes what a GraphQL answer's body says of the points budget, if
// the lane has one and the attempt carried a cost of it: the query's
// actual cost replaces its estimate in ch (as Report would; a throttled
// query, whose actual cost is not stated, cost nothing), what the server's
// bucket holds becomes what remains of the budget (see observe), and a
// requested cost above the estimate teaches the margin. The bucket's state
// is stated at the answer, now, where a header's is at the attempt's
// arrival, near sent: what it refilled between is taken off. It reports
// whether the query was refused for want of points.
func (bs *budgets) points(now, sent time.Duration, remaining *[maxBudgets]int64, ch *charge, pts verdict.Points) (ranOut bool) {
	if !pts.Stated || ch == nil {
		return false
	}
	i := bs.index(pointsBudget)
	if i < 0 || ch.cost[i] <= 0 || remaining[i] >= 0 {
		return false
	}
	b := &bs.bs[i]
	est, actual := ch.cost[i], max(pts.Actual, 0)
	if pts.Requested > est {
		b.margin = min(max(b.margin, (pts.Requested-est)/est), maxCostMargin)
	}
	// What it cost is what was sent: reconcile then counts as sent since
	// the attempt only what was granted after it.
	bs.resent(i, ch, actual-est)
	bs.retarget(i, ch, actual)
	remaining[i] = int64(max(pts.Available-(now-sent).Seconds()*b.b.Rate(), 0))
	return pts.Actual < 0 && max(pts.Requested, est) > pts.Available
}

// retarget sets ch's cost of budget i to c, keeping the sum of the costs
// not yet answered.
func (bs *budgets) retarget(i int, ch *charge, c float64) {
	if slices.Contains(bs.out, ch) {
		bs.bs[i].out += c - ch.cost[i]
	}
	ch.cost[i] = c
}

// reconcile brings budget i to what a response says remains of it at now,
// less what was granted since ch and what was granted before ch and is not
// answered yet (the server may not have counted it), plus what refilled
// since sent; it learns the margin from the difference when nothing earlier
// is unanswered. See docs/design.md, "Budgets" (underestimates, overtaking).
func (bs *budgets) reconcile(i int, remaining int64, now, sent time.Duration, ch *charge) {
	b := &bs.bs[i]
	if b.fleet {
		bs.seen(i, remaining, now, sent, ch)
		return
	}
	since, before := bs.uncounted(i, ch)
	level := b.b.Level(now)
	t := float64(remaining) + (now-sent).Seconds()*b.b.Rate() - since - before
	if ch != nil {
		// The refill since sent counts only while the server's bucket was
		// not full: the lane's own bucket, which got the same grants and
		// refill since, lost what the server's did. The server holds at
		// most the lane's level plus what it held above the lane's at
		// the send (exactly that when it held less).
		t = min(t, level+max(float64(remaining)-before-ch.lvl[i], 0))
	}
	t = min(max(t, -b.b.Burst()), b.b.Burst())
	if ch != nil && ch.cost[i] > 0 && before == 0 {
		under := (level - t) / (ch.cost[i] + max(since, 0))
		b.margin = min(max(b.margin*0.9999, under), maxCostMargin)
	}
	b.b.Set(now, t)
	// The charges still unanswered read their counts against the level
	// as it is now known.
	for _, o := range bs.out {
		o.lvl[i] += t - level
	}
}

// uncounted returns what a server's count in answer to the attempt of
// charge ch (nil: none) may not have counted of budget i: the costs
// granted since ch, and those granted before it and not answered yet. An
// attempt without a charge (one the lane's budgets did not draw, on a
// sub-limit's host) has no mark of what was granted before it: the costs
// not answered yet are taken as uncounted, all of them.
func (bs *budgets) uncounted(i int, ch *charge) (since, before float64) {
	if ch == nil {
		for _, o := range bs.out {
			before += o.cost[i]
		}
		return 0, before
	}
	since = bs.bs[i].sent - ch.mark[i] - ch.cost[i]
	for _, o := range bs.out {
		if o == ch {
			break
		}
		before += o.cost[i] // granted before ch, not answered yet
	}
	return since, before
}

// adjust charges budget i at now the difference between what an attempt
// was estimated to cost and what it cost: a refund when the estimate was
// high.
func (bs *budgets) adjust(i int, now time.Duration, estimate, actual float64) {
	b := &bs.bs[i]
	b.b.Set(now, min(b.b.Level(now)+estimate-actual, b.b.Burst()))
	b.sent += actual - estimate
}

// full reports whether every budget is full at now, as new budgets are.
// Budgets shared through a Leaser always are: their level is the fleet's,
// and the Leaser takes back what a forgotten lane held.
func (bs *budgets) full(now time.Duration) bool {
	if bs.shared() {
		return true
	}
	for i := range bs.bs {
		if b := &bs.bs[i].b; b.Level(now) < b.Burst() {
			return false
		}
	}
	return true
}

// Report tells the Transport what the request of resp, a response it
// returned, really cost the budget named name, once the response has said
// (for example usage.total_tokens in an LLM's JSON body): the lane refunds
// or charges the difference from the cost the request's context carried
// (see WithCost). It does nothing for a budget the lane does not have, a
// request that carried no cost of it, or a response whose headers state
// what remains of the budget: the lane took that count, which holds the
// request's cost as the server charged it.
func (t *Transport) Report(resp *http.Response, name string, actual int) {
	if resp == nil || resp.Request == nil || resp.Request.URL == nil {
		return
	}
	if _, counted := headers.ParseTokenBudget(resp.Header, time.Now(), name); counted {
		return
	}
	est := CostFrom(resp.Request.Context(), name)
	if est == 0 {
		return
	}
	l := t.find(t.keyOf(resp.Request))
	if l == nil {
		return // forgotten: idle since, its budgets full again
	}
	if l = t.chargedLane(l, resp.Request); l == nil {
		return
	}
	l.adjust(name, float64(est), float64(max(actual, 0)))
}

// seen keeps what a response at now, to an attempt sent at sent with
// charge ch, says remains of budget i, for the Leaser (see
// BudgetDemand.Server): the count, plus the refill since sent, less the
// lane's costs granted since ch and granted before it and not answered.
func (bs *budgets) seen(i int, remaining int64, now, sent time.Duration, ch *charge) {
	b := &bs.bs[i]
	since, before := bs.uncounted(i, ch)
	t := float64(remaining) + (now-sent).Seconds()*b.refill - since - before
	b.server, b.seenAt, b.seenSent = min(t, b.b.Burst()), now, b.sent
	b.seen++
}

// demand returns what the lane wants of each budget at now, next being the
// next waiter's charge (nil: none, or it costs nothing).
func (bs *budgets) demand(now time.Duration, next *charge) []BudgetDemand {
	if bs.bs == nil {
		return nil
	}
	ds := make([]BudgetDemand, len(bs.bs))
	for i := range bs.bs {
		b := &bs.bs[i]
		d := &ds[i]
		// Saturated: float64(math.MaxInt) is 2^63, which no int holds,
		// and the period of WithBudget(name, 1, math.MaxInt64) rounds
		// to it too.
		d.Name, d.Size = b.name, int(min(b.b.Burst(), 1<<63-1024))
		d.Per = time.Duration(min(math.Round(b.b.Burst()/b.refill*1e9), 1<<63-1024))
		d.Level, d.Spent, d.Unanswered = b.b.Level(now), b.sent, max(b.out, 0)
		for p := range d.Queued {
			d.Queued[p] = max(b.queued[p], 0)
		}
		if next != nil && next.cost[i] > 0 {
			d.Need = b.need(next.cost[i])
		}
		if d.Seen = b.seen; d.Seen > 0 {
			d.Server = min(b.server+(now-b.seenAt).Seconds()*b.refill-(b.sent-b.seenSent), b.b.Burst())
		}
	}
	return ds
}

// share applies a Leaser's grants at now (see BudgetShare): indexed as
// the budgets, any missing ones left as they are.
func (bs *budgets) share(now time.Duration, ss []BudgetShare) {
	for i := range min(len(ss), len(bs.bs)) {
		b, s := &bs.bs[i], ss[i]
		if s.Add != 0 && !math.IsNaN(s.Add) {
			b.b.Set(now, min(b.b.Level(now)+s.Add, b.b.Burst()))
		}
		if s.Rate >= 0 && !math.IsInf(s.Rate, 0) {
			b.flow = s.Rate
		}
		if s.Margin >= 0 && s.Margin <= maxCostMargin {
			b.margin = s.Margin
		}
	}
}
