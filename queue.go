package sluice

import (
	"context"
	"math"
	"time"
)

// A waiter is one attempt queued at a lane's gate. ready is closed when the
// dispatcher grants it a token and a slot; granted records that under the
// lane's lock, so a waiter whose context ends at the same moment can tell
// whether it must give the grant back (see lane.await).
type waiter struct {
	ctx        context.Context
	level      Priority
	tn         *tenant // whose work it is
	rank       int64   // the fixed order key; see waitQueue
	seq        uint64
	enq        time.Duration // first enqueue of the logical request, on the lane's clock (orders it)
	start      time.Duration // enqueue of this attempt, on the lane's clock (measures its wait)
	index      int           // position in its tenant's heap; -1 once removed
	ready      chan struct{}
	first      bool    // the logical request's first attempt
	dispatches bool    // its goroutine runs the dispatcher until it is served (see lane.await)
	h          *hold   // its grant, set under the lane's lock before ready is closed
	err        error   // set instead of h when the lane fails the waiter
	charge     *charge // what it costs the lane's budgets; nil: nothing
}

// waiterHeap is a min-heap of waiters by (rank, seq).
type waiterHeap []*waiter

func (h waiterHeap) Len() int { return len(h) }
func (h waiterHeap) Less(i, j int) bool {
	if h[i].rank != h[j].rank {
		return h[i].rank < h[j].rank
	}
	return h[i].seq < h[j].seq
}
func (h waiterHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
func (h *waiterHeap) Push(x any) {
	w := x.(*waiter)
	w.index = len(*h)
	*h = append(*h, w)
}
func (h *waiterHeap) Pop() any {
	old := *h
	n := len(old)
	w := old[n-1]
	old[n-1] = nil
	w.index = -1
	*h = old[:n-1]
	return w
}

// waitQueue orders the waiters of a lane.
//
// Between levels. Strict priority is the order (level, enqueued, seq). Aging
// with period d lets a waiter gain one level per d of waiting. That looks
// like it needs periodic rescoring, but comparing level_a - waited_a/d with
// level_b - waited_b/d at any instant is the same as comparing
// level_a*d + enqueued_a with level_b*d + enqueued_b, a key fixed at enqueue
// time. So rank = enqueued + level*d, and aging costs O(log n) per operation
// and no timer. Without aging rank is the enqueue time and the level is
// compared first. WithLowShare gives every n-th grant to the levels below
// the one first in line that have a waiter it may serve, the waiter that
// has waited longest first.
//
// Within a level, tenants take turns (see level.go): each level keeps a
// rotation of the tenants that have waiters and are under their in-flight
// cap, and the level's candidate is the first waiter (in rank order, so
// FIFO) of the tenant at the front of the rotation. A grant sends that
// tenant to the back. Between levels the candidates' ranks are compared as
// above. With one tenant, as when no request carries one, this is exactly
// (level, enqueued, seq). With several, a level competes with the rank of
// its candidate, not of its oldest waiter: aging promotes a level by the
// waiter whose turn it is, so taking turns can delay an old waiter's
// promotion by up to one round of its level's tenants.
//
// A waitQueue is not safe for concurrent use; the lane's mutex guards it.
type waitQueue struct {
	levels   [numLevels]levelQueue
	aging    time.Duration
	lowShare int    // every lowShare-th grant goes to a level below the first in line; 0 = never
	grants   uint64 // grants made, for lowShare
	seq      uint64
	n        int // waiters queued
}

func (q *waitQueue) init(shares [numLevels]float64) {
	for p := range q.levels {
		q.levels[p].init(Priority(p), shares[p])
	}
}

func (q *waitQueue) len() int { return q.n }

// push files w under its tenant. w.level, w.tn and w.enq must be set; limit
// is the lane's in-flight limit, which sets the tenant's cap.
func (q *waitQueue) push(w *waiter, limit int) {
	q.seq++
	w.seq = q.seq
	w.rank = int64(w.enq)
	if q.aging > 0 {
		w.rank = addSat(w.rank, mulSat(int64(w.level), int64(q.aging)))
	}
	q.n++
	q.levels[w.level].push(w, limit)
}

// remove takes w out of the queue in O(log n). It is a no-op if w was
// already removed.
func (q *waitQueue) remove(w *waiter) {
	if w.index < 0 {
		return
	}
	q.n--
	q.levels[w.level].remove(w)
}

// before reports whether a is served before b under the rank order.
func (q *waitQueue) before(a, b *waiter) bool {
	if q.aging == 0 && a.level != b.level {
		return a.level < b.level
	}
	if a.rank != b.rank {
		return a.rank < b.rank
	}
	return a.seq < b.seq
}

// next returns the waiter the next grant goes to, without removing it, or
// nil if no waiter may be served (the queue is empty, or every tenant with
// waiters is at its cap). limit is the lane's in-flight limit; pay, if not
// nil, says whether a charge can be paid now (see pick).
func (q *waitQueue) next(limit int, pay func(*charge) bool) *waiter {
	w, _ := q.pick(limit, pay)
	return w
}

// pick is next, and reports whether the grant is the low share's turn
// given to the first in line because the waiter it falls to cannot pay
// its budgets yet (pay, if not nil, says whether a charge can be paid
// now), and the first in line costs nothing of them: that waiter waits
// for its budgets without holding the levels above behind it, and the
// turn stays its for the next grant. One that would spend what the
// waiter waits for does not take its turn: the low share would then
// never come.
func (q *waitQueue) pick(limit int, pay func(*charge) bool) (w *waiter, skipped bool) {
	var heads [numLevels]*waiter
	var best *waiter
	for p := range q.levels {
		head := q.levels[p].candidate(limit)
		if head == nil {
			continue
		}
		heads[p] = head
		if best == nil || q.before(head, best) {
			best = head
		}
	}
	if best == nil || q.lowShare == 0 || (q.grants+1)%uint64(q.lowShare) != 0 {
		return best, false
	}
	// The low share goes to the levels below the first in line, the
	// waiter that has waited longest first: given to the lowest level
	// alone, it would starve the levels between.
	var low *waiter
	for p := best.level + 1; p < numLevels; p++ {
		if h := heads[p]; h != nil && (low == nil || h.enq < low.enq || h.enq == low.enq && h.seq < low.seq) {
			low = h
		}
	}
	switch {
	case low == nil:
		return best, false
	case pay != nil && !pay(low.charge) && !best.charge.overlaps(low.charge):
		return best, true
	}
	return low, false
}

// pop removes and returns the waiter next names, counting the grant and
// sending its tenant to the back of its level's rotation. A low share's
// turn given to the first in line (see pick) is not counted.
func (q *waitQueue) pop(limit int, pay func(*charge) bool) *waiter {
	w, skipped := q.pick(limit, pay)
	if w != nil {
		q.take(w, limit, skipped)
	}
	return w
}

// take removes w, which pick returned with skipped, as pop does.
func (q *waitQueue) take(w *waiter, limit int, skipped bool) *waiter {
	q.n--
	q.levels[w.level].pop(w, limit)
	if !skipped {
		q.grants++
	}
	return w
}

// ahead estimates how many grants come before a new waiter of tenant tn at
// level p, the lane's in-flight limit being limit: every waiter of the
// levels above (exact for strict priority) but those of a tenant held at
// its cap beyond the cap, which wait for that tenant's own calls while the
// grants go past them; and
// at level p as many of each tenant's waiters as tn's turns take, which is
// bounded by tn's own queue plus one times the tenants taking turns. With
// a low share, a level below the first in line is served sooner: every
// lowShare-th grant goes to the longest waiter below that level, and
// every waiter below it now has waited longer than the new one; and the
// first in line waits for those grants too. With aging, the waiters of
// the levels below that have waited long enough to outrank a new waiter
// at p (see push) come before it too. now is the new waiter's enqueue
// time: now for a new one; earlier for a retry, or a first attempt that
// waited elsewhere first, which ranks ahead of its tenant's waiters that
// came after it.
func (q *waitQueue) ahead(p Priority, tn *tenant, now time.Duration, limit int) int {
	n, top := 0, p
	for l := Interactive; l < p; l++ {
		if top == p && q.levels[l].n > 0 {
			top = l
		}
		n += q.levels[l].n - q.levels[l].heldExcess(limit)
	}
	aged := 0
	if q.aging > 0 {
		for l := p + 1; l < numLevels; l++ {
			// Ranked ahead: enq + l*aging < now + p*aging.
			by := time.Duration(addSat(int64(now), -mulSat(int64(l-p), int64(q.aging))))
			q.levels[l].each(func(t *tenant) {
				for _, w := range t.waiters {
					if w.enq <= by { // a tie goes to the older seq: the waiter already queued
						aged++
					}
				}
			})
		}
	}
	n += aged
	lv := &q.levels[p]
	// tn's own waiters ranked before the new one, and before each of them
	// and the new one a turn of every other tenant with waiters.
	k := len(tn.waiters)
	if k > 0 && now < tn.waiters[k-1].enq {
		// Ranked ahead of some (a new waiter, at now, is ranked after
		// all): count those before it. The waiters are a heap, whose
		// last is a late one but not surely the latest: where it is
		// not after the new one, all count, never fewer than are ahead.
		k = 0
		for _, w := range tn.waiters {
			if w.enq <= now { // a tie goes to the waiter already queued
				k++
			}
		}
	}
	n += min(lv.n, lv.turnsAhead(tn, k))
	if q.lowShare == 0 {
		return n
	}
	lower := 0
	for l := top + 1; l < numLevels; l++ {
		lower += q.levels[l].n
	}
	if top < p {
		// Meanwhile every lowShare-th grant goes below top: to waiters
		// below p (older than this one) too.
		below := -aged
		for l := p + 1; l < numLevels; l++ {
			below += q.levels[l].n
		}
		if below > 0 {
			n += q.lowerGrants(n+1, below)
		}
		if lower+1 <= math.MaxInt/q.lowShare {
			n = min(n, q.lowShare*(lower+1))
		}
		return n
	}
	// First in line: while a level below waits, every lowShare-th grant
	// goes below (see next), before this waiter's own or between.
	if lower -= aged; lower > 0 {
		n += q.lowerGrants(n+1, lower)
	}
	return n
}

// lowerGrants returns how many of the next grants go below the first level
// in line (see next) while it takes own grants, lower waiting below. It
// counts the grants whose number is a multiple of lowShare among the
// fewest that hold own others; a few rounds reach it, as each adds a
// lowShare-th of the last.
func (q *waitQueue) lowerGrants(own, lower int) int {
	share := uint64(q.lowShare)
	k := 0
	for range 16 {
		m := min(lower, int((q.grants+uint64(own+k))/share-q.grants/share))
		if m == k {
			break
		}
		k = m
	}
	return k
}

// waiting returns how many attempts tenant id (not anonymous) has waiting,
// at every level.
func (q *waitQueue) waiting(id string) int {
	n := 0
	for l := range q.levels {
		if t := q.levels[l].find(id); t != nil {
			n += len(t.waiters)
		}
	}
	return n
}

// oldest returns the enqueue time of the longest-waiting waiter of level p.
// It looks at every tenant of the level: it is for Stats, not the hot path.
func (q *waitQueue) oldest(p Priority) (time.Duration, bool) {
	var t time.Duration
	found := false
	q.levels[p].each(func(tn *tenant) {
		// Within one tenant rank order is enqueue order: the head is its oldest.
		if len(tn.waiters) > 0 && (!found || tn.waiters[0].enq < t) {
			t, found = tn.waiters[0].enq, true
		}
	})
	return t, found
}

// mulSat is a*b, at most math.MaxInt64, for a and b not negative.
func mulSat(a, b int64) int64 {
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}

func addSat(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
