package sluice

import (
	"container/heap"
	"math"
	"slices"
)

// A tenant is one tenant's work at one level of one lane: its waiters, in
// rank order, and its attempts in flight. Named tenants live in their level's
// map only while they have either; when both are none the record leaves the
// map (a few are kept for reuse, see forget), so the memory held is for
// active tenants only, whatever ids come and go.
type tenant struct {
	id       string
	level    Priority
	waiters  waiterHeap
	inFlight int
	// prev and next link a tenant with waiters into one of its level's two
	// lists: the rotation, while it is under its cap, or held, while it is
	// at its cap. A tenant without waiters is in neither.
	prev, next *tenant
	held       bool
}

func (t *tenant) linked() bool { return t.next != nil }
func (t *tenant) inRing() bool { return t.next != nil && !t.held }

// levelQueue is one level of a waitQueue: its tenants and their rotation.
type levelQueue struct {
	anon  tenant        // requests without a tenant
	named *namedTenants // nil until the level's first named tenant
	lists *tenantLists  // nil until the level's first waiter
	share float64       // the tenant cap's share of the limit; 0: none
	n     int           // waiters queued at this level

	// queuing counts tenants with waiters (in the rotation or at their cap).
	queuing int
}

// namedTenants are a level's records of named tenants (see WithTenant). A
// level allocates them at its first named tenant: a lane whose requests
// carry none does without.
type namedTenants struct {
	m     map[string]*tenant // active named tenants; see forget
	spare []*tenant          // records to reuse; see forget
	big   bool               // m has held more than bigTenants
}

// tenantLists are the sentinels of a level's two lists of tenants with
// waiters: the rotation, a circular list, and the tenants at their cap.
// A level allocates them at its first waiter: a lane whose requests never
// wait does without.
type tenantLists struct {
	ring, held tenant
}

func (lv *levelQueue) init(p Priority, share float64) {
	lv.anon.level = p
	lv.share = share
}

// tenant returns the record for id, creating it if needed.
func (lv *levelQueue) tenant(id string) *tenant {
	if id == "" {
		return &lv.anon
	}
	nt := lv.named
	if nt == nil {
		nt = new(namedTenants)
		lv.named = nt
	}
	if t, ok := nt.m[id]; ok {
		return t
	}
	if nt.m == nil {
		nt.m = make(map[string]*tenant)
	}
	var t *tenant
	if n := len(nt.spare); n > 0 {
		t, nt.spare = nt.spare[n-1], nt.spare[:n-1]
		t.id = id
	} else {
		t = &tenant{id: id, level: lv.anon.level}
	}
	nt.m[id] = t
	nt.big = nt.big || len(nt.m) > bigTenants
	return t
}

// find returns the record for id (the anonymous one for ""), nil if the
// level has none: unlike tenant, it creates nothing.
func (lv *levelQueue) find(id string) *tenant {
	if id == "" {
		return &lv.anon
	}
	if nt := lv.named; nt != nil {
		return nt.m[id]
	}
	return nil
}

// capOf is how many attempts one tenant of this level may have in flight
// when the lane's limit is limit.
func (lv *levelQueue) capOf(limit int) int {
	if lv.share == 0 {
		return math.MaxInt
	}
	c := float64(limit) * lv.share
	if c >= float64(limit) {
		return limit // share 1; also keeps float64(MaxInt) from overflowing int
	}
	return max(1, int(c))
}

// link puts t at the back of the rotation if it is under its cap, or in
// the held list if not.
func (lv *levelQueue) link(t *tenant, limit int) {
	if lv.lists == nil {
		ls := new(tenantLists)
		ls.ring.next, ls.ring.prev = &ls.ring, &ls.ring
		ls.held.next, ls.held.prev = &ls.held, &ls.held
		lv.lists = ls
	}
	list := &lv.lists.ring
	t.held = t.inFlight >= lv.capOf(limit)
	if t.held {
		list = &lv.lists.held
	}
	last := list.prev
	t.prev, t.next = last, list
	last.next = t
	list.prev = t
}

func (lv *levelQueue) unlink(t *tenant) {
	t.prev.next = t.next
	t.next.prev = t.prev
	t.prev, t.next, t.held = nil, nil, false
}

func (lv *levelQueue) push(w *waiter, limit int) {
	t := w.tn
	if len(t.waiters) == 0 {
		lv.queuing++
	}
	heap.Push(&t.waiters, w)
	lv.n++
	if !t.linked() {
		lv.link(t, limit)
	}
}

func (lv *levelQueue) remove(w *waiter) {
	t := w.tn
	heap.Remove(&t.waiters, w.index)
	lv.n--
	if len(t.waiters) == 0 {
		lv.queuing--
		lv.unlink(t)
		lv.forget(t)
	}
}

// pop removes w, the level's candidate, and sends its tenant to the back of
// the rotation: that is the turn-taking.
func (lv *levelQueue) pop(w *waiter, limit int) {
	t := w.tn
	heap.Remove(&t.waiters, w.index)
	lv.n--
	lv.unlink(t)
	if len(t.waiters) == 0 {
		lv.queuing--
	} else {
		lv.link(t, limit)
	}
}

// candidate returns the first waiter of the first tenant in the rotation
// that is under its cap, or nil. A tenant found at its cap (the limit shrank
// since it was filed) moves to the held list.
func (lv *levelQueue) candidate(limit int) *waiter {
	if lv.lists == nil {
		return nil
	}
	ring := &lv.lists.ring
	for t := ring.next; t != ring; t = ring.next {
		if t.inFlight < lv.capOf(limit) {
			return t.waiters[0]
		}
		lv.unlink(t)
		lv.link(t, limit)
	}
	return nil
}

// started counts an attempt of t granted; a tenant that reaches its cap
// leaves the rotation for the held list.
func (lv *levelQueue) started(t *tenant, limit int) {
	t.inFlight++
	if t.inRing() && t.inFlight >= lv.capOf(limit) {
		lv.unlink(t)
		lv.link(t, limit)
	}
}

// finished counts an attempt of t done (or given back); a held tenant under
// its cap again rejoins the rotation, at the back.
func (lv *levelQueue) finished(t *tenant, limit int) {
	t.inFlight--
	if t.held && t.inFlight < lv.capOf(limit) {
		lv.unlink(t)
		lv.link(t, limit)
	}
	lv.forget(t)
}

// grew moves the held tenants that a larger limit puts under their cap back
// into the rotation. Each held tenant holds at least one slot, so the list
// is never longer than the limit.
func (lv *levelQueue) grew(limit int) {
	if lv.lists == nil {
		return
	}
	held := &lv.lists.held
	for t := held.next; t != held; {
		next := t.next
		if t.inFlight < lv.capOf(limit) {
			lv.unlink(t)
			lv.link(t, limit)
		}
		t = next
	}
}

// turnsAhead returns how many of the level's waiters are served before a
// waiter of tenant tn with k of tn's waiters ahead of it. The rotation
// serves one waiter of each tenant under its cap in turn: tn's (k+1)-th
// turn comes after k+1 turns of each tenant ahead of it in the rotation
// and k of each behind it (a tenant not in it joins at the back), each
// tenant taking no more turns than it has waiters. A tenant held at its
// cap takes no turn until a call of its own ends, and is not counted; tn
// held counts k+1 turns of every other tenant with waiters. Past
// turnsWalked tenants, each left counts k+1 turns.
func (lv *levelQueue) turnsAhead(tn *tenant, k int) int {
	others := lv.queuing
	if len(tn.waiters) > 0 {
		others-- // tn itself
	}
	if lv.lists == nil || tn.held {
		return k + (k+1)*others
	}
	n, turns, walked := k, k+1, 0
	ring := &lv.lists.ring
	for t := ring.next; t != ring; t = t.next {
		if t == tn {
			turns = k // the tenants behind it
			continue
		}
		if walked++; walked > turnsWalked {
			return n + (k+1)*max(others-walked+1, 0)
		}
		n += min(len(t.waiters), turns)
	}
	return n
}

// turnsWalked is the most tenants turnsAhead walks: an estimate is made
// under the lane's lock, and a level may hold thousands of tenants.
const turnsWalked = 256

// heldExcess returns how many waiters of the tenants held at their cap
// exceed the cap: they wait for their tenant's slots, not for tokens.
func (lv *levelQueue) heldExcess(limit int) int {
	if lv.lists == nil {
		return 0
	}
	n, c := 0, lv.capOf(limit)
	for t := lv.lists.held.next; t != &lv.lists.held; t = t.next {
		n += max(0, len(t.waiters)-c)
	}
	return n
}

// forget drops the record of a named tenant that has nothing queued or in
// flight, and keeps it for reuse (up to spareTenants of them): a tenant
// whose requests are sent at once, one at a time, would otherwise allocate
// a record for each. A map that has held more than bigTenants goes when
// it empties: a Go map keeps the buckets of its largest size, and a burst
// of many tenant ids must not pin them.
func (lv *levelQueue) forget(t *tenant) {
	if t.id == "" || t.inFlight != 0 || len(t.waiters) != 0 {
		return
	}
	nt := lv.named
	delete(nt.m, t.id)
	if len(nt.spare) < spareTenants {
		t.id = ""
		if cap(t.waiters) > spareWaiters {
			t.waiters = nil // a flood's queue is not kept for the next tenant
		}
		nt.spare = append(nt.spare, t)
	}
	if len(nt.m) == 0 && nt.big {
		nt.m, nt.big = nil, false
	}
}

const (
	spareTenants = 16
	spareWaiters = 64
	bigTenants   = 1024
)

// each calls f for every tenant of the level with work (anonymous included).
func (lv *levelQueue) each(f func(*tenant)) {
	if lv.anon.inFlight > 0 || len(lv.anon.waiters) > 0 {
		f(&lv.anon)
	}
	if lv.named == nil {
		return
	}
	for _, t := range lv.named.m {
		f(t)
	}
}

// tenantStats fills s with the level's tenant count and its busiest
// tenants, by in-flight plus queued. It keeps only the top few while it
// scans, so a snapshot of 10,000 tenants allocates for TopTenants.
func (lv *levelQueue) tenantStats(s *LevelStats) {
	busier := func(a, b TenantStats) bool {
		if x, y := a.InFlight+a.Queued, b.InFlight+b.Queued; x != y {
			return x > y
		}
		return a.ID < b.ID
	}
	var top []TenantStats // allocated at the first tenant with work
	lv.each(func(t *tenant) {
		s.Tenants++
		ts := TenantStats{ID: t.id, InFlight: t.inFlight, Queued: len(t.waiters)}
		if top == nil {
			top = make([]TenantStats, 0, TopTenants)
		}
		if len(top) == TopTenants && !busier(ts, top[len(top)-1]) {
			return
		}
		i, _ := slices.BinarySearchFunc(top, ts, func(e, target TenantStats) int {
			if busier(e, target) {
				return -1
			}
			return 1
		})
		if len(top) == TopTenants {
			top = top[:len(top)-1]
		}
		top = slices.Insert(top, i, ts)
	})
	s.Top = top
}
