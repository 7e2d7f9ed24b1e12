package sluiceredis

import (
	"context"
	_ "embed"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-go/sluice"
)

var (
	//go:embed share.lua
	shareSrc    string
	shareScript = redis.NewScript(shareSrc)
)

// shareLeases is how many refresh intervals a share is leased for: a
// process that misses two refreshes in a row (Redis slow or away) still
// holds its share, and one that died loses it within three.
const shareLeases = 3

const (
	// estGain is the weight of the latest refresh in a lane's estimated
	// arrival rate: a quarter averages over about four refreshes (a
	// refresh brought forward weighs its part of an interval).
	estGain = 0.25
	// backlogRefreshes: a lane asks for its queue to be served within this
	// many refreshes, on top of its arrival rate.
	backlogRefreshes = 2
	// urgentQueue: an Interactive queue longer than this part of a
	// refresh's arrivals is urgent: it asks to be served within
	// urgentDrain refreshes, and its process refreshes as soon as it finds
	// it (see watch).
	urgentQueue = 0.25
	urgentDrain = 0.5
	// urgentLeast: a queue of this many or fewer is never urgent, so that a
	// lane with few recent arrivals does not ask for its whole queue at
	// once.
	urgentLeast = 8
	// watchEvery: a key with Interactive demand has its queues looked at
	// (locally) this many times a refresh, for an urgent one (see watch).
	watchEvery = 8
	// An Interactive queue that held backedUpQueue or more at every look
	// (watchEvery a refresh, and at each refresh) for a refresh divided by
	// backedUpFor or longer is backed up: its lane wants more than it was
	// granted (a closed loop of workers, whose arrivals follow its grants,
	// says no more of its need): it asks for what it was let send since
	// the last refresh, if more than its smoothed arrivals, and for its
	// queue as an urgent one does. A queue that empties, or a short one,
	// asks for its smoothed arrivals and its queue.
	backedUpQueue = urgentLeast
	backedUpFor   = 2 // a refresh divided by this

	// retryRefreshes: a key whose refresh failed is refreshed again this
	// many times a refresh for retryFor refreshes (twice its lease), so
	// that a key whose master failed over is back soon; then once a
	// refresh, until Redis answers for it, so that a long outage costs
	// Redis no more calls than a healthy key.
	retryRefreshes = 4
	retryFor       = 2 * shareLeases

	// refreshParallel is how many batches of keys' refreshes run at once,
	// and refreshBatch how many keys a batch holds (see refreshDue).
	refreshParallel = 16
	refreshBatch    = 64
	// refreshGrid: a key's next refresh is rounded up to a refresh divided
	// by this, so that a process with many keys refreshes them together,
	// in batches, at most this many times a refresh.
	refreshGrid = 20
)

// shares is a Backend's state (see New, WithRefresh): the keys its
// lanes joined, each refreshed by one goroutine, which runs while any key
// has lanes and exits at Close.
type shares struct {
	mu      sync.Mutex
	keys    map[string]*shareKey
	running bool
	kick    chan struct{} // capacity 1: a key was added, or a refresh brought forward
	nudges  nudges
}

// A shareKey is this process's share of one key's budget and the lanes it
// is divided among. Its fields other than lanes are used by the refresher
// goroutine only.
type shareKey struct {
	key     string
	redis   [3]string // the entries, the cooldown and the recovery (see share.lua)
	channel string    // where share.lua names the processes to refresh now
	lanes   []*member // guarded by shares.mu
	fresh   bool      // a lane joined since the last refresh; guarded by shares.mu
	next    time.Time // when to refresh next
	failed  int       // refreshes failed in a row (see retryRefreshes)
	sent    time.Time // when the last refresh began; guarded by shares.mu
	nudged  time.Time // when a name brought the next refresh forward to; guarded by shares.mu
	// interactive: the last refresh found Interactive demand, and watched
	// is when to look at its queue next (see watch).
	interactive bool
	watched     time.Time
	// pushed is a larger share another process's refresh granted this one
	// (see nudges), not yet applied; guarded by shares.mu.
	pushed struct {
		seq  int64
		rate float64
	}
	seq int64 // the entry's version of the share held (see share.lua)
	// handed is what the last share was divided by, to divide a pushed one.
	handed struct {
		lanes    []*member
		wants    [][levels]float64
		places   [][levels]int
		cool     time.Time
		lowShare int
	}

	leased   bool      // a share was ever granted by Redis
	until    time.Time // when the last one ends, on this process's clock
	rate     float64   // the last share's rate, and its places (-1: none)
	places   int
	procs    int // live processes at the last refresh
	keyRate  float64
	keyBurst int
	fallen   bool // the share is the local fallback (see fallbackShare)
	// fellTo is the fallback's rate while fallen, 0 otherwise: the first
	// share after an outage takes no more (see most).
	fellTo float64
	frac   float64 // the fallback's fraction of the rate, for this outage

	budgets budgetState // see refreshBudgets
	// idle counts the refreshes in a row that found the lanes idle;
	// parked: the key is parked (see parkAfter).
	idle   int
	parked bool
}

// A member is one lane on a key.
type member struct {
	demand func() (sluice.Demand, bool)
	grant  func(sluice.Share)

	prev, now sluice.Demand // at the last refresh, and at this one
	at        time.Time     // of the last refresh; zero before the first
	est       [levels]float64
	// backed is since when the lane's Interactive queue has held
	// backedUpQueue or more at every look (see look); zero: it held less
	// at the last.
	backed time.Time
	// budgets: the lane's budgets, as the refresher knows them (see
	// refreshBudgets).
	budgets []laneBudget
}

// look records the lane's demand d, read at now, at a refresh or between
// (see watch).
func (m *member) look(now time.Time, d sluice.Demand) {
	switch {
	case d.Waiting[sluice.Interactive] < backedUpQueue:
		m.backed = time.Time{}
	case m.backed.IsZero():
		m.backed = now
	}
}

// backedUp reports whether level l's queue is backed up at now (see
// backedUpQueue). Only Interactive is asked: a lower level's queue asks
// for the whole rate anyway.
func (m *member) backedUp(l int, now time.Time, refresh time.Duration) bool {
	return l == int(sluice.Interactive) && !m.backed.IsZero() && now.Sub(m.backed) >= refresh/backedUpFor
}

// join serves Backend.Join.
func (b *backend) join(key string, demand func() (sluice.Demand, bool), grant func(sluice.Share)) bool {
	if b.cfg.refresh == 0 || !b.enter() {
		return false
	}
	defer b.leave()
	s := &b.shares
	s.mu.Lock()
	sk := s.keys[key]
	if sk == nil {
		if s.keys == nil {
			s.keys = make(map[string]*shareKey)
			s.kick = make(chan struct{}, 1)
		}
		k := newKeys(b.cfg.prefix, key)
		sk = &shareKey{key: key, redis: [3]string{k.shares(), k[1], k.recovery()}, channel: k.moved(), places: -1}
		s.keys[key] = sk
	}
	sk.lanes = append(sk.lanes, &member{demand: demand, grant: grant})
	// The new lane sends nothing until it has a part: the key is refreshed
	// at once, not at its turn.
	sk.fresh = true
	if !s.running {
		s.running = true
		b.wg.Add(1)
		go b.refreshLoop()
	}
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
	return true
}

// refreshLoop refreshes each key's share when it is due, and exits when no
// key has lanes left, or at Close.
func (b *backend) refreshLoop() {
	defer b.wg.Done()
	defer b.stopNudges(b.startNudges())
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		next, ok := b.refreshDue(time.Now())
		if !ok {
			return
		}
		t.Reset(time.Until(next))
		select {
		case <-b.done:
			return
		case <-b.shares.kick:
		case <-t.C:
		}
	}
}

// refreshDue refreshes the keys due at now, and returns when the next is
// due; false when no key is left, having marked the loop stopped.
func (b *backend) refreshDue(now time.Time) (time.Time, bool) {
	s := &b.shares
	s.mu.Lock()
	var due, watch, pushed, polls []*shareKey
	for _, sk := range s.keys {
		if sk.pushed.seq > 0 {
			pushed = append(pushed, sk)
		}
		if sk.parked && !sk.fresh {
			sk.nudged = time.Time{} // it holds no share to give up
			if !now.Before(sk.next) {
				polls = append(polls, sk)
			}
			continue
		}
		if sk.fresh || !now.Before(sk.next) || !sk.nudged.IsZero() && !now.Before(sk.nudged) {
			sk.fresh, sk.sent, sk.nudged = false, now, time.Time{}
			due = append(due, sk)
		} else if sk.interactive && !now.Before(sk.watched) {
			watch = append(watch, sk)
		}
	}
	s.mu.Unlock()
	for _, sk := range pushed {
		b.applyPushed(sk)
	}
	for _, sk := range watch {
		b.watch(sk)
	}
	if len(polls) > 0 {
		woke := b.wakes(polls, now)
		s.mu.Lock()
		for _, sk := range woke {
			sk.sent, sk.nudged = now, time.Time{}
		}
		s.mu.Unlock()
		due = append(due, woke...)
	}
	// Keys are refreshed in batches of refreshBatch, one pipeline (one
	// round trip) each on a single Redis, refreshParallel batches side by
	// side: one after
	// another, a process with many keys and a Redis a few milliseconds
	// away would take longer than a refresh to go round them.
	var wg sync.WaitGroup
	sem := make(chan struct{}, refreshParallel)
	size := 1
	if _, single := b.client.(*redis.Client); single {
		// Not on a Cluster (or a Ring), whose keys live on several nodes:
		// in a pipeline one that fails would hold up the others' answers
		// (go-redis retries it), so each key has its own call.
		size = refreshBatch
	}
	for len(due) > 0 {
		batch := due[:min(len(due), size)]
		due = due[len(batch):]
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			b.refreshBatch(batch)
		})
	}
	wg.Wait()
	s.mu.Lock()
	var (
		next time.Time
		gone []*shareKey
	)
	for key, sk := range s.keys {
		if len(sk.lanes) == 0 {
			delete(s.keys, key)
			gone = append(gone, sk)
			continue
		}
		if next.IsZero() || sk.next.Before(next) {
			next = sk.next
		}
		if !sk.nudged.IsZero() && sk.nudged.Before(next) {
			next = sk.nudged
		}
		if sk.interactive {
			if !now.Before(sk.watched) {
				sk.watched = now.Add(b.cfg.refresh / watchEvery)
			}
			if sk.watched.Before(next) {
				next = sk.watched
			}
		}
	}
	if len(s.keys) == 0 {
		s.running = false
		s.mu.Unlock()
		return time.Time{}, false
	}
	s.mu.Unlock()
	for _, sk := range gone {
		b.unlisten(sk)
	}
	return next, true
}

// A refreshing is one refresh of a key between prepare and conclude: what
// its lanes want, and the call to make.
type refreshing struct {
	sk       *shareKey
	lanes    []*member
	sent     time.Time
	wants    [][levels]float64
	places   [][levels]int
	rate     float64
	burst    int
	lowShare int
	args     shareArgs
}

// prepare reads what sk's lanes want and returns the call to make for
// it; nil when none is to be made (the key is gone or parked, see park).
// The calls it makes itself are bounded by ctx, the batch's: a Redis that
// stalls holds a batch up for one timeout, not one a key.
func (b *backend) prepare(ctx context.Context, sk *shareKey) *refreshing {
	lanes := b.live(sk)
	if len(lanes) == 0 {
		// The key's last lane is gone: its share goes back to the fleet now
		// rather than at the end of the lease, and so does what its lanes
		// held of its budgets (an entry that expires gives back nothing).
		b.client.HDel(ctx, sk.redis[0], b.self)
		if err := b.refreshBudgets(ctx, sk, nil, time.Now()); err != nil {
			b.cfg.logger.Warn("sluiceredis: could not give back the budgets of a key whose lanes are gone", "key", sk.key, "err", err)
		}
		// A lane that joins the key before it is dropped holds nothing:
		// its entry is not one Redis lost (see held).
		sk.leased, sk.rate, sk.seq = false, 0, 0
		return nil
	}
	sent := time.Now()
	if idle(lanes) {
		sk.idle++
		if sk.parked || sk.idle >= parkAfter && b.park(ctx, sk, lanes, sent) {
			for _, m := range lanes {
				m.prev, m.at = m.now, sent
			}
			if sk.parked {
				sk.next = nextPoll(sent, b.cfg.refresh)
			}
			return nil
		}
	} else {
		sk.idle, sk.parked = 0, false
	}
	wants := make([][levels]float64, len(lanes))
	places := make([][levels]int, len(lanes))
	var (
		total, ptotal [levels]float64
		inFlight      int
		rate          float64
		burst         int
		lowShare      int // the lanes' sluice.WithLowShare: the largest, or 0 if one is 0
	)
	for i, m := range lanes {
		d, cur := m.prev, m.now
		elapsed := b.cfg.refresh
		if !m.at.IsZero() {
			elapsed = max(sent.Sub(m.at), time.Millisecond)
		}
		m.look(sent, cur)
		for l := range levels {
			// Arrivals since the last refresh: grants, and the growth of
			// the queue. The rate is smoothed (see estGain); the queue is
			// asked for on top, to be served within backlogRefreshes.
			arrived := float64(cur.Granted[l]-d.Granted[l]) + float64(cur.Waiting[l]-d.Waiting[l])
			now := max(arrived, 0) / elapsed.Seconds()
			gain := 1 - math.Pow(1-estGain, min(elapsed.Seconds()/b.cfg.refresh.Seconds(), 1))
			m.est[l] += gain * (now - m.est[l])
			// Backed up, and granted some since the last refresh: a lane
			// granted nothing is not held back by its share.
			backed := m.backedUp(l, sent, b.cfg.refresh) && !m.at.IsZero() && cur.Granted[l] > d.Granted[l]
			wants[i][l] = m.est[l] + float64(cur.Waiting[l])/(backlogRefreshes*b.cfg.refresh.Seconds())
			switch {
			case cur.Waiting[l] == 0:
			case backed:
				// Backed up (see backedUpQueue): what it was let send since
				// the last refresh (arrivals follow grants: not a slow
				// average of them), and its queue within urgentDrain, so
				// that its share grows by its queue each half a refresh
				// until its queue empties or it has the rate.
				wants[i][l] = max(m.est[l], now) + float64(cur.Waiting[l])/(urgentDrain*b.cfg.refresh.Seconds())
			case l > int(sluice.Interactive) && cur.Rate > 0:
				// A Normal or Batch queue uses whatever it is given (a
				// closed loop of workers arrives at the rate it is let
				// send, so its rate says nothing of its need): it asks
				// for the whole rate, and processes with queues at one
				// level split what is left equally at once.
				wants[i][l] = max(wants[i][l], cur.Rate)
			case m.urgent(l, cur.Waiting[l], b.cfg.refresh):
				// An Interactive queue is served within backlogRefreshes
				// while it is short: what it is granted over its arrivals
				// idles whenever its queue is empty, so the margin is kept
				// small, at the cost of a queue that its Poisson noise
				// makes grow and shrink. A long one is drained at once.
				wants[i][l] = m.est[l] + float64(cur.Waiting[l])/(urgentDrain*b.cfg.refresh.Seconds())
			}
			places[i][l] = cur.Waiting[l] + cur.InFlight[l]
			total[l] += wants[i][l]
			ptotal[l] += float64(places[i][l])
			inFlight += cur.InFlight[l]
		}
		if r := cur.Rate; r > 0 && (rate == 0 || r < rate) {
			rate = r
		}
		burst = max(burst, cur.Burst)
		switch {
		case cur.LowShare == 0 || i > 0 && lowShare == 0:
			lowShare = 0
		case i == 0 || cur.LowShare > lowShare:
			lowShare = cur.LowShare
		}
		m.prev, m.at = cur, sent
	}

	sk.interactive = total[sluice.Interactive] > 0
	return &refreshing{sk: sk, lanes: lanes, sent: sent, wants: wants, places: places,
		rate: rate, burst: burst, lowShare: lowShare,
		args: shareArgs{
			self: b.self, lease: shareLeases * b.cfg.refresh,
			rate: rate, burst: burst, cap: b.cfg.leases, inFlight: inFlight,
			wants: total, places: ptotal, most: sk.most(), channel: sk.channel, lowShare: lowShare,
			held: sk.held(),
		}}
}

// held is the share sk's lanes send at now, and the version of sk's entry
// it was granted at (0: none; a key that never had a share, or parked). A
// refresh that finds the entry missing, expired or older knows that Redis
// lost it, and may have lost the others' too, whose processes still send
// at their shares: share.lua then grants no process more than it holds
// until their leases have ended (see share.lua).
func (sk *shareKey) held() heldShare {
	switch {
	case sk.fallen:
		return heldShare{seq: sk.seq, rate: sk.fellTo, places: sk.places}
	case sk.leased:
		return heldShare{seq: sk.seq, rate: sk.rate, places: sk.places}
	}
	return heldShare{}
}

// most is, after a failed call, the rate sk holds (the fallback's, or the
// lease's), which the next refresh of sk takes no more than and records
// no less than; negative: no bound. No more: Redis may have lost the
// others' entries meanwhile (they expired on its clock, or a failover
// lost them), and would give the first process to ask the whole rate
// while the others still send at their fallback rates until they reach
// it again. No less: the failed call may have run and recorded a smaller
// share, which this process did not take, and Redis would give the rest
// to others while this one still sends at what it holds.
func (sk *shareKey) most() float64 {
	switch {
	case sk.fallen && sk.fellTo > 0:
		return sk.fellTo
	case !sk.fallen && sk.failed > 0 && sk.leased:
		return sk.rate
	}
	return -1
}

// conclude takes Redis's answer r (or err) to p's call: it hands the lanes
// their parts, or keeps the last share until its lease ends and then
// falls back, and sets when to refresh next.
func (b *backend) conclude(p *refreshing, r shareReply, err error) {
	sk, lanes, sent := p.sk, p.lanes, p.sent
	wants, places, rate, burst, lowShare := p.wants, p.places, p.rate, p.burst, p.lowShare
	if err == nil {
		bs := &sk.budgets
		ctx, cancel := context.WithTimeout(context.Background(), b.cfg.timeout)
		berr := b.refreshBudgets(ctx, sk, lanes, sent)
		cancel()
		if berr == nil {
			bs.failed, bs.fell = time.Time{}, time.Time{}
		} else {
			b.cfg.logger.Warn("sluiceredis: could not refresh the budgets; the lanes keep what they hold", "key", sk.key, "err", berr)
			if bs.failed.IsZero() {
				bs.failed = sent
			}
			// The share is answered and the budgets' calls fail (a key
			// of another type, a script error): after a lease, the
			// budgets fall back as they do when Redis is away.
			if sent.Sub(bs.failed) >= shareLeases*b.cfg.refresh {
				bs.fallback(lanes, 1/float64(max(sk.procs, 1)), sent, b.cfg.refresh)
			}
		}
	}
	now := time.Now()
	// Subscribed after the call, which a key's first request waits for.
	b.listen(sk)
	next := b.cfg.refresh
	if err == nil {
		if sk.fallen {
			b.cfg.logger.Info("sluiceredis: redis answers again; using the leased share", "key", sk.key)
		}
		sk.leased, sk.fallen, sk.fellTo, sk.failed = true, false, 0, 0
		sk.until = sent.Add(shareLeases * b.cfg.refresh)
		// Taken whatever version sk holds: a push is applied only while
		// no refresh of sk runs (see applyPushed), so one applied before
		// this call has a lower version than its answer, unless Redis
		// lost the entry (restarted empty, or let it expire), whose
		// versions then start again from 1.
		sk.rate, sk.seq = r.rate, r.seq
		sk.places, sk.procs = r.places, r.procs
		sk.keyRate, sk.keyBurst = r.keyRate, r.keyBurst
		var cool time.Time
		if r.cool > 0 {
			cool = now.Add(r.cool)
		}
		b.hand(lanes, wants, places, sk.rate, sk.places, sk.keyRate, sk.keyBurst, lowShare, cool)
		sk.handed.lanes, sk.handed.wants, sk.handed.places, sk.handed.cool = lanes, wants, places, cool
		sk.handed.lowShare = lowShare
		if r.short {
			// Others hold what this process is due: they give it back at
			// their next refreshes, and this one asks again after them.
			next = b.cfg.refresh / 2
		}
	} else {
		if unreachable(err) {
			b.lost()
		}
		if now.After(sk.until) || !sk.leased {
			b.fallbackShare(sk, lanes, wants, places, rate, burst, lowShare, err)
		}
		// Asked again sooner than at its turn, for twice its lease (see
		// retryRefreshes), so that a key whose master failed over is back
		// within about a refresh of it.
		if sk.failed++; sk.failed <= retryRefreshes*retryFor {
			next = b.cfg.refresh / retryRefreshes
		}
	}
	// Each process refreshes at its own phase, a little off the interval,
	// so that a fleet that starts together does not refresh together.
	jitter := 0.9 + 0.2*b.rand()
	grid := max(b.cfg.refresh/refreshGrid, time.Millisecond)
	sk.next = now.Add(time.Duration(float64(next) * jitter)).Truncate(grid).Add(grid)
}

// refreshBatch asks Redis for this process's share of each key of batch,
// by what its lanes want, their calls in one pipeline (one round trip),
// and hands the lanes their parts (see prepare and conclude). Without an
// answer a key keeps its last share until its lease ends, and then falls
// back (see fallbackShare).
func (b *backend) refreshBatch(batch []*shareKey) {
	var ps []*refreshing
	side, cancelSide := context.WithTimeout(context.Background(), b.cfg.timeout)
	for _, sk := range batch {
		if p := b.prepare(side, sk); p != nil {
			ps = append(ps, p)
		}
	}
	cancelSide()
	if len(ps) == 0 {
		return
	}
	rs, errs := make([]shareReply, len(ps)), make([]error, len(ps))
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.timeout)
	if len(ps) == 1 {
		rs[0], errs[0] = runShare(ctx, b.client, ps[0].sk.redis, ps[0].args)
	} else {
		pipe := b.client.Pipeline()
		cmds := make([]*redis.Cmd, len(ps))
		for i, p := range ps {
			cmds[i] = shareScript.EvalSha(ctx, pipe, p.sk.redis[:], p.args.list()...)
		}
		pipe.Exec(ctx) // each command has its own error
		var again []int
		for i, c := range cmds {
			if redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
				again = append(again, i)
			}
		}
		if len(again) > 0 && shareScript.Load(ctx, b.client).Err() == nil {
			// Redis did not have the script (it restarted, or this is the
			// first call): loaded, the calls are made again, in one more
			// pipeline.
			pipe := b.client.Pipeline()
			for _, i := range again {
				cmds[i] = shareScript.EvalSha(ctx, pipe, ps[i].sk.redis[:], ps[i].args.list()...)
			}
			pipe.Exec(ctx)
		}
		for i, c := range cmds {
			rs[i], errs[i] = parseShare(c.Slice())
		}
	}
	cancel()
	for i, p := range ps {
		b.conclude(p, rs[i], errs[i])
	}
}

// urgent reports whether a queue of waiting at level l is urgent (see
// urgentQueue): only an Interactive one can be.
func (m *member) urgent(l, waiting int, refresh time.Duration) bool {
	return l == int(sluice.Interactive) && float64(waiting) > max(urgentQueue*m.est[l]*refresh.Seconds(), urgentLeast)
}

// watch reads the demand of sk's lanes between refreshes (see look), and
// brings the next refresh forward if an Interactive queue is urgent.
// Called by the refresher goroutine, while no refresh of sk runs.
func (b *backend) watch(sk *shareKey) {
	b.shares.mu.Lock()
	lanes := append([]*member(nil), sk.lanes...)
	b.shares.mu.Unlock()
	urgent := false
	for _, m := range lanes {
		d, ok := m.demand()
		if !ok {
			continue
		}
		m.look(time.Now(), d)
		urgent = urgent || m.urgent(int(sluice.Interactive), d.Waiting[sluice.Interactive], b.cfg.refresh)
	}
	if urgent {
		b.nudge(sk)
	}
}

// applyPushed hands sk's lanes the larger share another process's refresh
// granted this one, unless this process has since refreshed (see
// share.lua). Called by the refresher goroutine, while no refresh of sk runs.
func (b *backend) applyPushed(sk *shareKey) {
	s := &b.shares
	s.mu.Lock()
	p := sk.pushed
	sk.pushed.seq = 0
	s.mu.Unlock()
	if p.seq <= sk.seq || sk.fallen || !sk.leased || sk.handed.lanes == nil || time.Now().After(sk.until) {
		return
	}
	sk.rate, sk.seq = p.rate, p.seq
	h := &sk.handed
	b.hand(h.lanes, h.wants, h.places, sk.rate, sk.places, sk.keyRate, sk.keyBurst, h.lowShare, h.cool)
}

// live reads the demand of sk's lanes and drops those that are gone.
func (b *backend) live(sk *shareKey) []*member {
	b.shares.mu.Lock()
	lanes := append([]*member(nil), sk.lanes...)
	b.shares.mu.Unlock()
	var out []*member
	gone := map[*member]bool{}
	for _, m := range lanes {
		d, ok := m.demand()
		if !ok {
			gone[m] = true
			sk.budgets.gone(d)
			continue
		}
		m.now = d
		out = append(out, m)
	}
	if len(gone) > 0 {
		b.shares.mu.Lock()
		kept := sk.lanes[:0]
		for _, m := range sk.lanes {
			if !gone[m] {
				kept = append(kept, m)
			}
		}
		clear(sk.lanes[len(kept):])
		sk.lanes = kept
		b.shares.mu.Unlock()
	}
	return out
}

// fallbackShare hands sk's lanes a local share once the last leased one has
// ended and Redis does not answer: the rate divided by the processes that
// shared it at the last refresh (WithFallbackShare of it if this process
// never had a share), a little slower by a factor drawn at random per
// outage, so that processes that lose Redis together do not send in step.
func (b *backend) fallbackShare(sk *shareKey, lanes []*member, wants [][levels]float64, places [][levels]int, rate float64, burst, lowShare int, err error) {
	if !sk.fallen {
		sk.fallen = true
		frac := b.cfg.share
		if sk.leased {
			frac = 1 / float64(max(sk.procs, 1))
		}
		sk.frac = frac * (1 - fallbackJitter*b.rand())
		sk.places = -1
		if b.cfg.leases > 0 {
			sk.places = max(1, int(math.Floor(float64(b.cfg.leases)*frac)))
		}
		b.cfg.logger.Warn("sluiceredis: redis unreachable and the leased share ended; using a local share until it answers",
			"key", sk.key, "err", err, "share", frac)
	}
	keyRate := rate
	if sk.keyRate > 0 {
		keyRate = min(keyRate, sk.keyRate)
	}
	if keyRate == 0 {
		keyRate = sk.keyRate
	}
	sk.fellTo = sk.frac * keyRate
	sk.budgets.fallback(lanes, sk.frac, time.Now(), b.cfg.refresh)
	b.hand(lanes, wants, places, sk.fellTo, sk.places, keyRate, max(burst, 1), lowShare, time.Time{})
}

// hand divides a share of rate and places among lanes by their wants
// (see apportion), and grants each its part.
func (b *backend) hand(lanes []*member, wants [][levels]float64, places [][levels]int, rate float64, nplaces int, keyRate float64, keyBurst, lowShare int, cool time.Time) {
	var rates []float64
	if keyRate > 0 {
		rates = apportion(rate, wants, lowShare)
	}
	var ps []int
	if nplaces >= 0 {
		ps = apportionWhole(nplaces, places)
	}
	for i, m := range lanes {
		s := sluice.Share{Rate: math.Inf(1), InFlight: -1, Cool: cool}
		if rates != nil {
			s.Rate = rates[i]
		}
		s.Burst = burstOf(s.Rate, keyRate, keyBurst)
		if ps != nil {
			s.InFlight = ps[i]
		}
		s.Budgets = m.budgetShares()
		m.grant(s)
	}
}

// shareArgs are share.lua's arguments.
type shareArgs struct {
	self     string
	lease    time.Duration
	rate     float64
	burst    int
	cap      int
	inFlight int
	wants    [levels]float64
	places   [levels]float64
	most     float64 // after a failed call, the rate held: take no more, record no less; negative: none
	channel  string  // where to name the processes to refresh now (see nudges)
	lowShare int     // the part of the levels below the highest that wants (see apportion)
	held     heldShare
}

// heldShare is what a process holds of a key's budget (see shareKey.held).
type heldShare struct {
	seq    int64 // the version of the entry it was granted at; 0: none
	rate   float64
	places int // -1: no cap
}

// shareReply is what share.lua answered.
type shareReply struct {
	rate     float64
	places   int // -1: no cap
	procs    int
	cool     time.Duration
	keyRate  float64
	keyBurst int
	keyCap   int
	short    bool
	seq      int64 // the version of the caller's entry
}

// runShare runs share.lua: one round trip.
func runShare(ctx context.Context, c redis.Scripter, k [3]string, a shareArgs) (shareReply, error) {
	return parseShare(shareScript.Run(ctx, c, k[:], a.list()...).Slice())
}

// list returns a as share.lua's ARGV.
func (a shareArgs) list() []any {
	f := func(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
	return []any{a.self, a.lease.Microseconds(), f(a.rate), a.burst, a.cap, a.inFlight,
		f(a.wants[0]), f(a.wants[1]), f(a.wants[2]),
		f(a.places[0]), f(a.places[1]), f(a.places[2]), f(a.most), a.channel, a.lowShare,
		a.held.seq, f(a.held.rate), a.held.places}
}

// parseShare reads share.lua's answer v (or err).
func parseShare(v []any, err error) (shareReply, error) {
	if err != nil {
		return shareReply{}, err
	}
	bad := func() (shareReply, error) { return shareReply{}, fmt.Errorf("sluiceredis: share.lua returned %v", v) }
	if len(v) != 9 {
		return bad()
	}
	var r shareReply
	num := func(x any) (float64, bool) {
		switch x := x.(type) {
		case string:
			f, err := strconv.ParseFloat(x, 64)
			return f, err == nil
		case int64:
			return float64(x), true
		}
		return 0, false
	}
	var vals [9]float64
	for i, x := range v {
		f, ok := num(x)
		// Within what an int holds exactly: counts are converted.
		if !ok || math.IsNaN(f) || math.Abs(f) > 1<<53 {
			return bad()
		}
		vals[i] = f
	}
	r.rate, r.places, r.procs = vals[0], int(vals[1]), int(vals[2])
	r.cool = min(micros(int64(vals[3])), maxCool)
	r.keyRate, r.keyBurst, r.keyCap, r.short = vals[4], int(vals[5]), int(vals[6]), vals[7] != 0
	r.seq = int64(vals[8])
	if r.rate < 0 || r.procs < 1 || r.places < -1 || r.keyRate < 0 || r.keyCap < -1 || r.keyCap > 0 && r.places < 0 {
		return bad()
	}
	// share.lua grants no process more than the key holds.
	if r.keyRate > 0 {
		r.rate = min(r.rate, r.keyRate)
	}
	if r.keyCap > 0 {
		r.places = min(r.places, r.keyCap)
	}
	return r, nil
}
