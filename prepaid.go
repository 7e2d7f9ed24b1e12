package sluice

import (
	"context"
	"runtime"
	"sync/atomic"
	"time"
)

// Prepaid grants are the path of a busy lane that waits for nothing: the
// lane takes a few tokens and slots ahead, under its lock, and hands them
// out without it, one atomic decrement each; the counts they change are
// brought up to date by the lock's next holder (see settleOutLocked).
//
// A lane prepays only when no decision would differ between the moment it
// prepays and the moment a grant is handed out: nobody waits, the lane
// paces itself alone, no server has said anything about its limits (see
// pace.Pacer.Prepay and quietAfter), it grants fast enough that one
// attempt in sampleEvery is timed anyway, and the request names no tenant,
// at a level with no tenant cap, and draws on no budget. Anything that
// could change a decision takes the prepaid grants back first (see
// revokeLocked): a waiter, a response that says something, an overload,
// Close, Stats and forget.
//
// The prepaid tokens count against the bucket's size until they are
// handed out and settled, so the hand-off bound holds; the slots count as
// in flight from the moment they are prepaid.

// testHookPrepay, set only by tests, sees every prepayment, with the
// lane's lock held.
var testHookPrepay func(l *lane, n int)

// The low bits of lane.fast count the prepaid grants left, fewer than
// sampleEvery; the time above them has 58 bits of nanoseconds, over nine
// years.
const (
	fastBits = 6
	fastMask = 1<<fastBits - 1
)

// timedAtLocked returns when the lane's last timed grant was made.
func (l *lane) timedAtLocked() time.Duration { return time.Duration(l.fast.Load() >> fastBits) }

// setTimedAtLocked records a timed grant at at; prepaid grants may be
// handed out meanwhile. The time it records only grows, by a nanosecond
// at least: no value of fast comes back once it has changed (see
// takePrepaid).
func (l *lane) setTimedAtLocked(at time.Duration) {
	for {
		v := l.fast.Load()
		at = max(at, time.Duration(v>>fastBits)+1)
		if l.fast.CompareAndSwap(v, uint64(at)<<fastBits|v&fastMask) {
			return
		}
	}
}

// prepayLocked tops up the lane's prepaid grants at now, just after a
// timed grant at now (prev: the timed grant before it), and reports
// whether it prepaid any. The lane must have granted the sampleEvery
// attempts since prev within sampleEvery x sampleGap: it is busy enough
// that one attempt in sampleEvery is timed anyway, and prepaid grants do
// not wait long to be handed out.
func (l *lane) prepayLocked(now, prev time.Duration) bool {
	// A Backend's lane (perToken, join) is not local: Prepay refuses it.
	if now-prev >= sampleEvery*sampleGap || l.pace.Rate() < sampleAbove || !l.budgets.empty() || l.quiet.Load() < quietAfter {
		return false
	}
	pre := l.pre.Load()
	if l.fast.Load()&fastMask != 0 || pre != nil && pre.unsettled() {
		// The holds are laid out only while none is left (see
		// takePrepaid) and every one taken is settled.
		return false
	}
	n := l.pace.Prepay(now, min(sampleEvery-1, l.slot.limit-l.slot.inUse))
	if n == 0 {
		return false
	}
	if testHookPrepay != nil {
		testHookPrepay(l, n)
	}
	l.slot.inUse += n
	if pre == nil {
		pre = new(prepaid)
		l.pre.Store(pre)
	}
	for i := range n {
		if pre.free[i] {
			// The hold there is the lane's: settled, and not handed out.
			pre.free[i] = false
			pre.holds[i].Load().state = 0 // no atomic: nobody else reaches it
		} else {
			pre.layLocked(l, i)
		}
	}
	pre.top.Store(int32(n))
	pre.floor.Store(0)
	// No taker changes fast while its count is 0; the holds are out
	// before it is not.
	l.fast.Add(uint64(n))
	return true
}

// prepaid keeps the holds of a lane's prepaid grants, made at its first
// prepayment: holds[i] is the hold of the grant handed out when the count
// of those left goes from i+1 to i. Its taker publishes it, once filled
// in, by setting holdTaken; the lane's lock's next holder settles the
// holds taken (see settleOutLocked). A hold given back
// before it is settled stays in its place, for the next prepayment, as do
// the holds of grants taken back: a request that takes a prepaid grant
// takes no hold from the pool and writes no pointer to the lane.
type prepaid struct {
	holds [sampleEvery - 1]atomic.Pointer[hold]
	// The holds taken since the last settle are those in [lo, top), where
	// lo is the count of grants left, or floor once they were taken back
	// (see revokeLocked); pending has a bit for each taken before it
	// that the settle found not filled in yet. Changed under the lane's
	// lock; atomic for unsettled.
	top, floor atomic.Int32
	pending    atomic.Uint32
	// owed is set by an owner that gives back a grant not settled yet
	// while none is left, before it tries the lock; a settle clears it
	// before it looks at the holds. A holder that finds it set once it
	// has let the lock go settles again (see settleIfFree): the owner may
	// have found the lock held by that holder, after the settle had found
	// the grant still being filled in.
	owed atomic.Uint32
	// Under the lane's lock: holds[i] is the lane's to lay out again.
	free [sampleEvery - 1]bool
}

// unsettled reports whether holds were taken and are not settled yet,
// while no grant is left.
func (pre *prepaid) unsettled() bool {
	return pre.pending.Load() != 0 || pre.top.Load() > pre.floor.Load()
}

// layLocked lays out a new hold from the pool at i for a prepaid grant of
// l, where no hold is free.
func (pre *prepaid) layLocked(l *lane, i int) {
	h := holds.Get().(*hold)
	h.l, h.state = l, 0
	pre.holds[i].Store(h)
}

// takePrepaid hands out one of the lane's prepaid grants to an attempt of
// ctx at level p for tenant id, if there is one it may have, and returns
// its hold; nil if none.
func (l *lane) takePrepaid(ctx context.Context, p Priority, id string) *hold {
	if l.cfg.tenantShare[p] > 0 || id != "" {
		return nil
	}
	// The hold is read before the count is taken down: the CAS fails if
	// the holds were laid out again since the load of fast, since that
	// changes the time fast records (see setTimedAtLocked).
	var v uint64
	var h *hold
	for {
		v = l.fast.Load()
		k := v & fastMask
		if k == 0 {
			return nil
		}
		h = l.pre.Load().holds[k-1].Load()
		if l.fast.CompareAndSwap(v, v-1) {
			break
		}
	}
	h.ctx = ctx
	if tn := &l.q.levels[p].anon; h.tn != tn {
		h.tn = tn
	}
	// A prepaid grant is stamped a nanosecond after the timed grant
	// before it: an instant no grant the pacer records has, so that a
	// refusal of it is not read against that grant's spacing (see
	// pace.Pacer.Prepay).
	at := time.Duration(v>>fastBits) + 1
	h.start, h.at, h.wait = at, at, 0
	h.timed, h.spaced, h.look = false, false, false
	h.nth = -1 // a prepaid token is not given back (see pace.Pacer.Refund)
	// Last: once it is set, the settle reads the rest.
	atomic.StoreUint32(&h.state, holdTaken)
	return h
}

// lockSlow locks the lane, whose lock an attempt of ctx at level p for
// tenant id found held, or hands the attempt a prepaid grant that came
// meanwhile, if it may have one (first), and returns its hold, with the
// lock not held; else nil, with the lock held.
//
// A busy lane's lock is held mostly by the timed grant that lays out the
// next prepaid grants (see prepayLocked), for less time than parking a
// goroutine and waking it takes: a few yields let the holder finish, and
// the attempt then most often takes one of them without the lock.
func (l *lane) lockSlow(ctx context.Context, p Priority, id string, first bool) *hold {
	if first && l.pre.Load() != nil {
		for range lockYields {
			runtime.Gosched()
			if l.fast.Load()&fastMask != 0 {
				if h := l.takePrepaid(ctx, p, id); h != nil {
					return h
				}
			}
			if l.mu.TryLock() {
				return nil
			}
		}
	}
	l.mu.Lock()
	return nil
}

// lockYields bounds the yields of lockSlow: a lane that lays out no
// prepaid grants meanwhile is waited for as a lock is.
const lockYields = 4

// settleOutLocked counts the prepaid grants handed out since it last ran,
// as grants made under the lock are counted, and lists among the lane's
// holds those not given back yet. A hold given back before it is settled
// is its to give back (see listReturned), and stays in its place for the
// next prepayment.
func (l *lane) settleOutLocked() {
	pre := l.pre.Load()
	if pre == nil {
		return
	}
	if pre.owed.Load() != 0 {
		pre.owed.Store(0)
	}
	top, lo := int(pre.top.Load()), max(int(l.fast.Load()&fastMask), int(pre.floor.Load()))
	pending := pre.pending.Load()
	if top <= lo && pending == 0 {
		return
	}
	// The slots to look at: those taken since the last settle, and those
	// it found not filled in.
	look := pending | (1<<top-1)&^(1<<lo-1)
	var n [numLevels]uint64
	var at time.Duration
	// The holds given back, given back once counted: on the stack, as a
	// pointer written to the heap costs a write barrier while the GC
	// marks.
	var given [sampleEvery - 1]int8
	var ng int
	pending = 0
	for i := range sampleEvery - 1 {
		if look&(1<<i) == 0 {
			continue
		}
		h := pre.holds[i].Load()
		s := atomic.LoadUint32(&h.state)
		if s&holdTaken == 0 {
			pending |= 1 << i // its taker is filling it in: the next settle has it
			continue
		}
		if testHookGrant != nil {
			testHookGrant(l, h.at)
		}
		p := h.tn.level
		n[p]++
		at = max(at, h.at)
		for {
			if s&holdGiven != 0 {
				// Its tenant's count would go up and down at once: it
				// is left as it is (see servedLocked).
				h.idx = -1
				given[ng] = int8(i)
				ng++
				break
			}
			if atomic.CompareAndSwapUint32(&h.state, s, s|holdHeld) {
				l.q.levels[p].started(h.tn, l.slot.limit)
				h.idx = len(l.held)
				l.held = append(l.held, h)
				break
			}
			s = atomic.LoadUint32(&h.state)
		}
	}
	pre.top.Store(int32(lo))
	pre.pending.Store(pending)
	var total uint64
	for p := range n {
		if n[p] > 0 {
			l.levels[p].granted += n[p]
			l.levels[p].wait.RecordZeros(at, waitPeriod, n[p])
			total += n[p]
		}
	}
	if total == 0 {
		return
	}
	l.budget.firsts.AddNano(l.clk.epochNS+int64(at), total) // every prepaid grant is a first attempt's
	// At a fresh reading: the bucket may fill past its prepaid share only
	// from the instant they were handed out, which is no later than now.
	l.pace.Spend(l.clk.tick(), int(total))
	l.untimed = uint8(min(uint64(l.untimed)+total, sampleEvery-1))
	if ng > 0 {
		l.servedLocked(pre, given[:ng])
	}
}

// servedLocked gives back the slots of the prepaid grants in the slots
// given, given back before they were settled (only a served, untimed
// hold is), as releaseLocked would one by one, and leaves their holds
// free in their places. Their tenant, the anonymous one of a level
// without a cap, was not counted in flight.
func (l *lane) servedLocked(pre *prepaid, given []int8) {
	// At once for each run prepaid after the same timed grant: they
	// were sent at the same instant.
	for len(given) > 0 {
		sent := pre.holds[given[0]].Load().start
		n := 1
		for n < len(given) && pre.holds[given[n]].Load().start == sent {
			n++
		}
		l.slot.onDone(n, l.q.len() > 0)
		l.movedLocked(l.pace.SettleServed(l.clk.last, sent, n))
		l.slot.inUse -= n
		for _, i := range given[:n] {
			pre.free[i] = true
		}
		given = given[n:]
	}
	if l.slot.free() && l.q.len() > 0 {
		l.wakeLocked()
	}
}

// revokeLocked takes back at now the prepaid grants not handed out: their
// tokens go back to the bucket and their slots are free. Their holds stay
// laid out, as free (see prepaid).
func (l *lane) revokeLocked(now time.Duration) {
	var n int
	for {
		v := l.fast.Load()
		if n = int(v & fastMask); n == 0 {
			return
		}
		if l.fast.CompareAndSwap(v, v&^fastMask) {
			break
		}
	}
	pre := l.pre.Load()
	for i := range n {
		pre.free[i] = true
	}
	pre.floor.Store(int32(n))
	l.forgetContextsLocked()
	l.pace.Unprepay(now, n)
	l.slot.inUse -= n
	if l.q.len() > 0 {
		l.wakeLocked()
	}
}

// forgetContextsLocked drops the contexts that the free holds laid out
// keep from the requests they were last handed to: a lane that stops
// prepaying keeps its holds, but no request's values.
func (l *lane) forgetContextsLocked() {
	pre := l.pre.Load()
	for i := range pre.holds {
		if pre.free[i] {
			if h := pre.holds[i].Load(); h.ctx != nil {
				h.ctx = nil
			}
		}
	}
}
