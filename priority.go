package sluice

import (
	"container/heap"
	"context"
	"fmt"
	"math"
	"time"
)

// Priority orders requests that wait for the same lane. Lower values are
// served first. The zero value is Interactive; a context without a priority
// is Normal.
type Priority int

const (
	Interactive Priority = iota // a person is waiting: served first
	Normal                      // requests whose context carries no priority
	Batch                       // background work: served last

	numLevels = 3
)

// String returns "interactive", "normal", "batch", or "Priority(n)".
func (p Priority) String() string {
	switch p {
	case Interactive:
		return "interactive"
	case Normal:
		return "normal"
	case Batch:
		return "batch"
	}
	return fmt.Sprintf("Priority(%d)", int(p))
}

func (p Priority) valid() bool { return p >= Interactive && p <= Batch }

type priorityKey struct{}

// WithPriority returns a copy of ctx that carries p. Requests made with the
// returned context wait at that level. A priority outside Interactive..Batch
// is stored as given and read back by PriorityFrom as Normal.
func WithPriority(ctx context.Context, p Priority) context.Context {
	return context.WithValue(ctx, priorityKey{}, p)
}

// PriorityFrom returns the priority carried by ctx, or Normal when it carries
// none (or one that is not a defined level).
func PriorityFrom(ctx context.Context) Priority {
	if p, ok := ctx.Value(priorityKey{}).(Priority); ok && p.valid() {
		return p
	}
	return Normal
}

// A waiter is one attempt queued at a lane's gate. ready is closed when the
// dispatcher grants it a token and a slot; granted records that under the
// lane's lock, so a waiter whose context ends at the same moment can tell
// whether it must give the grant back (see lane.acquire).
type waiter struct {
	level   Priority
	rank    int64 // the fixed order key; see waitQueue
	seq     uint64
	enq     time.Time // first enqueue time of the logical request (orders it)
	start   time.Time // enqueue time of this attempt (measures its wait)
	index   int       // position in its level's heap; -1 once removed
	ready   chan struct{}
	first   bool  // the logical request's first attempt
	granted bool  // set under the lane's lock before ready is closed
	err     error // set instead of granted when the lane fails the waiter
}

// levelHeap is a min-heap of the waiters of one level by (rank, seq).
type levelHeap []*waiter

func (h levelHeap) Len() int { return len(h) }
func (h levelHeap) Less(i, j int) bool {
	if h[i].rank != h[j].rank {
		return h[i].rank < h[j].rank
	}
	return h[i].seq < h[j].seq
}
func (h levelHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
func (h *levelHeap) Push(x any) {
	w := x.(*waiter)
	w.index = len(*h)
	*h = append(*h, w)
}
func (h *levelHeap) Pop() any {
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
// Strict priority, FIFO within a level, is the order (level, enqueued, seq).
// Aging with period d lets a waiter gain one level per d of waiting. That
// looks like it needs periodic rescoring, but comparing
// level_a - waited_a/d with level_b - waited_b/d at any instant is the same
// as comparing level_a*d + enqueued_a with level_b*d + enqueued_b, a key
// fixed at enqueue time. So rank = enqueued + level*d, and aging costs
// O(log n) per operation and no timer. Without aging rank is the enqueue
// time and the level is compared first.
//
// Each level has its own heap so that the head of the lowest waiting level is
// at hand for the low-share rule; the best waiter overall is the best of the
// (at most three) heads.
//
// A waitQueue is not safe for concurrent use; the lane's mutex guards it.
type waitQueue struct {
	levels   [numLevels]levelHeap
	aging    time.Duration
	lowShare int    // every lowShare-th grant goes to the lowest waiting level; 0 = never
	grants   uint64 // grants made, for lowShare
	seq      uint64
}

func (q *waitQueue) len() int {
	return len(q.levels[0]) + len(q.levels[1]) + len(q.levels[2])
}

// push files w under its level. w.level and w.enq must be set.
func (q *waitQueue) push(w *waiter) {
	q.seq++
	w.seq = q.seq
	w.rank = w.enq.UnixNano()
	if q.aging > 0 {
		w.rank = addSat(w.rank, int64(w.level)*int64(q.aging))
	}
	heap.Push(&q.levels[w.level], w)
}

// remove takes w out of the queue in O(log n). It is a no-op if w was
// already removed.
func (q *waitQueue) remove(w *waiter) {
	if w.index < 0 {
		return
	}
	heap.Remove(&q.levels[w.level], w.index)
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
// nil if the queue is empty.
func (q *waitQueue) next() *waiter {
	var best, lowest *waiter
	for l := range q.levels {
		if len(q.levels[l]) == 0 {
			continue
		}
		head := q.levels[l][0]
		if best == nil || q.before(head, best) {
			best = head
		}
		lowest = head
	}
	if best != nil && q.lowShare > 0 && (q.grants+1)%uint64(q.lowShare) == 0 && lowest.level > best.level {
		return lowest
	}
	return best
}

// pop removes and returns the waiter next() names, counting the grant.
func (q *waitQueue) pop() *waiter {
	w := q.next()
	if w != nil {
		q.remove(w)
		q.grants++
	}
	return w
}

// ahead counts the waiters at level p or above: an estimate of how many
// grants come before a new waiter of level p (exact for strict priority).
func (q *waitQueue) ahead(p Priority) int {
	n := 0
	for l := Interactive; l <= p; l++ {
		n += len(q.levels[l])
	}
	return n
}

// oldest returns the enqueue time of the longest-waiting waiter of level p.
func (q *waitQueue) oldest(p Priority) (time.Time, bool) {
	h := q.levels[p]
	if len(h) == 0 {
		return time.Time{}, false
	}
	// Within one level rank order is enqueue order, so the head is the oldest.
	return h[0].enq, true
}

func addSat(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
