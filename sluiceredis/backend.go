package sluiceredis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	mrand "math/rand/v2"

	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/sluice-go/sluice"
)

// backend is what Backend and Tokens are made of: the Redis client, the
// health of its nodes, the budgets of the token protocol (see Tokens) and
// the shares of the share protocol (see Backend), and the goroutines that
// serve them. Its fields are guarded as noted; it is safe for concurrent
// use. It runs goroutines only while it has work: one while it holds
// in-flight leases (see WithInFlight), to renew them, which exits once the
// last lease is given back (at Done, or, for a reserved token nobody came
// for, when the reservation goes stale); one while leases asked for by
// calls that failed or timed out may still be taken in Redis, to give them
// back once it answers; and, with shares, one that refreshes them while a
// key has lanes. shutdown gives back every lease and stops them all.
type backend struct {
	client redis.UniversalClient
	cfg    config
	self   string // starts this Backend's lease members
	seq    atomic.Uint64
	rand   func() float64 // in [0, 1); the fallback's phase and slowdown

	closed    atomic.Bool   // set under mu by Close
	done      chan struct{} // closed by Close
	calls     int           // Take, Done and Cool calls under way; guarded by mu
	drained   chan struct{} // closed by the last call to leave after Close; guarded by mu
	closeOnce sync.Once
	closeErr  error
	wg        sync.WaitGroup // the renewer and the releaser

	mu        sync.Mutex
	budgets   map[string]*budget
	gen       uint64        // sweeps of budgets so far; see sweepLocked
	sweepAt   int           // the size of budgets at which it is swept next
	renewing  bool          // a goroutine renews the leases; see keepRenewing
	releasing bool          // a goroutine gives back orphans; see keepReleasing
	idle      chan struct{} // capacity 1: Done gave back a budget's last lease
	back      chan struct{} // capacity 1: Redis answers again, for the releaser

	shares shares // see New and WithRefresh
	wakers wakers // see waitFreed
}

// budget is this process's side of one key's budget. Its fields are guarded
// by mu, which is never held across a Redis call.
type budget struct {
	key  string
	keys keys
	// health is whether Redis answers for this key: on a Redis Cluster a
	// key lives on one master, and a dead master sends only its own keys
	// to their fallbacks.
	health health

	// Under backend.mu, but for users' decrement: the sweep of budgets
	// that it was last looked up in, and the calls that hold it.
	gen   uint64
	users atomic.Int32

	mu      sync.Mutex
	cool    time.Time     // the latest cooldown end this process knows of
	pending []reservation // tokens reserved in Redis and not yet due, by due time
	paces   map[any]*pace // by taker (see sluice.TakerOf), for how many tokens a call takes
	rtt     time.Duration // a smoothed round trip of take.lua; 0 before the first
	held    []string      // leases of attempts granted and not yet Done; "" for a fallback grant
	local   int           // fallback grants in held
	release []string      // leases to remove with the next call to Redis for the key
	orphans []string      // leases of calls that failed or timed out; see orphan
	lim     *rate.Limiter // the fallback budget; nil until first needed
	last    time.Time     // the latest time given to lim
	// fallen is set while the budget is served by its fallback: from the
	// first Take that falls back to the first that Redis answers. Each
	// time it is set, the fallback budget starts afresh, at a random
	// phase and a random slowdown (see fallback).
	fallen bool
	slow   float64 // the fallback's rate factor for this outage, in (1-fallbackJitter, 1]
}

// A reservation is a token take.lua set aside for this process: it may send
// once due has come. Holding it locally is what lets the next Take for the
// key answer without a round trip.
type reservation struct {
	due   time.Time
	late  time.Time // its theoretical arrival time, at the latest; zero: not paced
	stale time.Time // after this it is dropped: due + staleAfter(rate)
	lease string    // "" without an in-flight cap
	by    any       // the taker it was reserved for (see sluice.TakerOf)
}

// A pace is how fast one taker of a budget has been granted tokens lately:
// a smoothed gap between grants.
type pace struct {
	last time.Time
	gap  time.Duration // 0 before the second grant
}

// grant records a token granted at now.
func (p *pace) grant(now time.Time) {
	if !p.last.IsZero() {
		d := min(now.Sub(p.last), time.Second)
		if p.gap == 0 {
			p.gap = d
		} else {
			p.gap += (d - p.gap) / 5
		}
	}
	p.last = now
}

// want returns how many tokens one call to Redis should take for a taker
// granted at p, with replies a round trip rtt away: what it has used in
// about one and a half horizons, where the horizon is two round trips, and
// at least one. So a lane that sends one token per round trip asks for
// more, and reaches the rate within a few calls however far Redis is,
// while a lane that sends less often than that takes one at a time (a
// token taken ahead and not used is lost to the fleet).
func (p *pace) want(horizon time.Duration) int {
	if p == nil || p.gap <= 0 {
		return 1
	}
	return min(max(1, int(math.Ceil(1.5*float64(horizon)/float64(p.gap)))), maxWant)
}

// horizon is how far ahead one call to Redis takes tokens, after the first.
func (bg *budget) horizon() time.Duration {
	return 2*bg.rtt + time.Millisecond
}

// staleAfter is how long after its due time a reservation nobody came for
// is dropped, at rate.
func staleAfter(rate float64) time.Duration {
	stale := 10 * time.Millisecond
	if rate > 0 {
		stale = max(stale, time.Duration(min(float64(time.Second)/rate, float64(time.Hour))))
	}
	return stale
}

// open checks client and opts, as New and NewTokens document, and returns
// a backend: one that leases shares (see Backend) if shares is set, else
// one that takes tokens (see Tokens). name is the constructor's, for errors.
func open(name string, client redis.UniversalClient, shares bool, opts []Option) (*backend, error) {
	if client == nil {
		return nil, fmt.Errorf("sluiceredis: %s: nil client", name)
	}
	cfg := defaultConfig()
	if shares {
		cfg.refresh = DefaultRefresh
	}
	for _, o := range opts {
		if o == nil {
			return nil, invalid("nil Option")
		}
		if err := o.apply(&cfg); err != nil {
			return nil, err
		}
	}
	if !shares && cfg.refresh > 0 {
		return nil, invalid("WithRefresh(%v) with NewTokens: tokens are not leased, so there is nothing to refresh", cfg.refresh)
	}
	if !contextTimeouts(client) {
		return nil, fmt.Errorf("sluiceredis: %s: the client's options have ContextTimeoutEnabled false, so go-redis would not bound calls by WithTimeout (%v); set ContextTimeoutEnabled: true", name, cfg.timeout)
	}
	var id [8]byte
	_, _ = rand.Read(id[:]) // never fails (crypto/rand panics instead)
	return &backend{
		client:  client,
		cfg:     cfg,
		self:    hex.EncodeToString(id[:]),
		rand:    mrand.Float64,
		budgets: make(map[string]*budget),
		sweepAt: minSweep,
		idle:    make(chan struct{}, 1),
		back:    make(chan struct{}, 1),
		done:    make(chan struct{}),
	}, nil
}

func contextTimeouts(c redis.UniversalClient) bool {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return true
}

// take serves Tokens.Take.
func (b *backend) take(ctx context.Context, key string, rate float64, burst int) (time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if !b.enter() {
		return 0, fmt.Errorf("sluiceredis: take from %q: %w", key, ErrClosed)
	}
	defer b.leave()
	bg := b.budget(key)
	defer unuse(bg)
	by := sluice.TakerOf(ctx)
	now := time.Now()
	bg.mu.Lock()
	w, ok := bg.takeLocal(now, by)
	b.maybeIdle(bg) // stale reservations may have taken the last leases
	if ok {
		bg.mu.Unlock()
		return w, nil
	}
	release := bg.takeRelease()
	horizon := bg.horizon()
	want := 1
	if rate > 0 && by != nil {
		// Unpaced, a token is only a place in flight (WithInFlight):
		// one taken ahead would hold a place nobody uses. And a caller
		// that is not a lane (by is nil) may make any use of its tokens.
		want = bg.paces[by].want(horizon)
	}
	bg.mu.Unlock()

	if !bg.health.use(now) {
		bg.requeue(release)
		return b.fallback(bg, now, rate, burst)
	}
	var lease string
	if b.cfg.leases > 0 {
		lease = b.self + ":" + strconv.FormatUint(b.seq.Add(1), 36)
	}
	cctx, cancel := context.WithTimeout(ctx, b.cfg.timeout)
	st, waits, lates, err := runTakeLate(cctx, b.client, bg.keys, takeArgs{
		rate:     rate,
		burst:    burst,
		leases:   b.cfg.leases,
		leaseTTL: b.cfg.leaseTTL,
		member:   lease,
		want:     want,
		horizon:  horizon,
		self:     b.self,
	}, release)
	cancel()
	sent := now
	now = time.Now()
	if err != nil {
		// A call that failed may still have run, or run later: its token
		// is lost (on the safe side), and its lease is given back in the
		// background.
		bg.requeue(release)
		gaveUp, down := ctx.Err() != nil, unreachable(err)
		switch {
		case gaveUp: // the caller gave up; that says nothing of Redis
		case !down:
			b.recovered(bg, now) // it answered
		default:
			b.failed(bg, now, err)
		}
		if lease != "" {
			for i := range want {
				b.orphan(bg, memberN(lease, i))
			}
		}
		switch {
		case gaveUp:
			return 0, ctx.Err()
		case !down:
			return 0, fmt.Errorf("sluiceredis: take from %q: %w", key, err)
		}
		return b.fallback(bg, now, rate, burst)
	}
	b.recovered(bg, now)
	w = bg.apply(now, sent, st, waits, lates, lease, rate, by)
	switch {
	case st == cancelled:
		return 0, fmt.Errorf("sluiceredis: take from %q: take.lua cancelled a call in flight", key)
	case st == full:
		// Rather than ask again after a fixed wait, wait to be told that
		// a lease was given back (see wakers); then at once.
		b.waitFreed(bg, w)
		return time.Microsecond, nil
	case lease != "" && (st == taken || st == reserved):
		b.keepRenewing()
	}
	return w, nil
}

// keepRenewing makes sure that a goroutine renews this process's leases
// while it holds any. mu and no budget's mu may be held.
//
// A lease expires after the ttl, so that a process that dies does not hold
// its place for long; one that lives renews its leases every third of the
// ttl, so that an attempt longer than the ttl (a streamed response) keeps
// its place. The ttl can then be short whatever the calls' length.
func (b *backend) keepRenewing() {
	b.mu.Lock()
	if !b.renewing && !b.closed.Load() {
		b.renewing = true
		b.wg.Add(1)
		go b.renew()
	}
	b.mu.Unlock()
}

// renew renews this process's leases every third of the ttl, and returns
// once it holds none: at the latest on the tick after the last Done, and at
// once when that Done gave back the last lease of its budget. It also
// gives back the leases of reservations nobody came for once they go stale,
// so that they do not hold places in flight until the key's next call.
func (b *backend) renew() {
	defer b.wg.Done()
	t := time.NewTicker(max(b.cfg.leaseTTL/3, time.Millisecond))
	defer t.Stop()
	stale := time.NewTimer(time.Hour)
	defer stale.Stop()
	for {
		select {
		case <-b.done:
			return
		case <-t.C:
			work, next := b.leasedBudgets()
			if work == nil {
				b.releaseStale()
				return
			}
			b.renewAll(work)
			resetTimer(stale, next)
		case <-stale.C:
			work, next := b.leasedBudgets()
			b.releaseStale()
			if work == nil {
				return
			}
			resetTimer(stale, next)
		case <-b.idle:
			work, next := b.leasedBudgets()
			if work == nil {
				return
			}
			resetTimer(stale, next)
		}
	}
}

// resetTimer arms t for at (an hour away if at is zero).
func resetTimer(t *time.Timer, at time.Time) {
	d := time.Hour
	if !at.IsZero() {
		d = max(time.Until(at), time.Millisecond)
	}
	t.Reset(d)
}

// releaseStale gives back the leases queued for release (those of stale
// reservations) on every budget whose Redis is up, one call per budget.
func (b *backend) releaseStale() {
	b.mu.Lock()
	budgets := slices.Collect(maps.Values(b.budgets))
	b.mu.Unlock()
	for _, bg := range budgets {
		if !bg.health.up() {
			continue
		}
		bg.mu.Lock()
		ids := bg.takeRelease()
		bg.mu.Unlock()
		if len(ids) == 0 {
			continue
		}
		b.release(bg, ids)
	}
}

// release gives the leases ids of bg back in Redis, and reports whether
// Redis was reached. If not, they are queued again and the Backend marked
// down. An error reply (the lease key holds another type) would come
// again: the leases are left to expire.
func (b *backend) release(bg *budget, ids []string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.timeout)
	err := runDone(ctx, b.client, bg.keys, ids)
	cancel()
	if err != nil && unreachable(err) {
		bg.requeue(ids)
		b.failed(bg, time.Now(), err)
		return false
	}
	return true
}

// maybeIdle lets the renewer look at once, rather than at its next tick,
// whether it has anything left to do, if bg holds no lease now. bg.mu must
// be held.
func (b *backend) maybeIdle(bg *budget) {
	if bg.leased() {
		return
	}
	select {
	case b.idle <- struct{}{}:
	default:
	}
}

// leasedBudgets returns the budgets on which this process holds leases,
// and when the first of their reservations goes stale (zero: none).
// When there are none it marks the renewer stopped, under mu: a lease taken
// after that finds it stopped and starts another (see keepRenewing).
func (b *backend) leasedBudgets() ([]*budget, time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var (
		work []*budget
		next time.Time
	)
	now := time.Now()
	for _, bg := range b.budgets {
		bg.mu.Lock()
		// A reservation nobody came for is not renewed: its lease is
		// given back by releaseStale, with the key's next call, or
		// expires.
		bg.prune(now)
		if bg.leased() {
			work = append(work, bg)
		}
		for _, r := range bg.pending {
			if r.lease != "" && (next.IsZero() || r.stale.Before(next)) {
				next = r.stale.Add(time.Millisecond)
			}
		}
		bg.mu.Unlock()
	}
	if len(work) == 0 {
		b.renewing = false
	}
	return work, next
}

// renewAll renews this process's leases on the budgets in work, one Redis
// call per budget (per maxRelease leases). While Redis is unreachable it
// takes its turn at probing, as Take does, so that a process whose every
// attempt is a long stream (and which makes no Take) learns when Redis is
// back before its leases expire.
func (b *backend) renewAll(work []*budget) {
	for _, bg := range work {
		if !bg.health.use(time.Now()) {
			// Not tried now: the leases may expire there, as they would
			// for a process that died, and the fallback budget bounds this
			// process meanwhile.
			continue
		}
		bg.mu.Lock()
		ids := bg.leases()
		bg.mu.Unlock()
		for len(ids) > 0 {
			n := min(len(ids), maxRelease)
			ctx, cancel := context.WithTimeout(context.Background(), b.cfg.timeout)
			err := runRenew(ctx, b.client, bg.keys, b.cfg.leaseTTL, ids[:n])
			cancel()
			now := time.Now()
			if err != nil && unreachable(err) {
				b.failed(bg, now, err)
				break
			}
			b.recovered(bg, now)
			if err != nil {
				// An error reply (the lease key holds another type) would
				// come again: those leases are left to expire.
				break
			}
			ids = ids[n:]
		}
	}
}

// finish serves Tokens.Done.
func (b *backend) finish(key string) {
	if b.cfg.leases == 0 || !b.enter() {
		return
	}
	defer b.leave()
	b.mu.Lock()
	bg := b.budgets[key]
	b.mu.Unlock()
	if bg == nil {
		return
	}
	bg.mu.Lock()
	bg.prune(time.Now())
	if n := len(bg.held); n > 0 {
		i := n - 1
		if bg.local > 0 {
			// A fallback grant's first: Redis then counts no fewer
			// leases than this process has attempts in flight, where the
			// fallback's grants, made first, stayed at the bottom of held
			// for as long as the process kept attempts in flight.
			if j := slices.Index(bg.held, ""); j >= 0 {
				i = j
			}
		}
		id := bg.held[i]
		bg.held = slices.Delete(bg.held, i, i+1)
		if id == "" {
			bg.local--
		} else {
			bg.release = append(bg.release, id)
		}
		b.maybeIdle(bg)
	}
	if len(bg.release) == 0 || !bg.health.up() {
		bg.mu.Unlock()
		return
	}
	ids := bg.takeRelease()
	bg.mu.Unlock()
	b.release(bg, ids)
}

// cool serves Tokens.Cool and Backend.Cool.
func (b *backend) cool(ctx context.Context, key string, until time.Time) error {
	if !b.enter() {
		return fmt.Errorf("sluiceredis: cooldown of %q not shared: %w", key, ErrClosed)
	}
	defer b.leave()
	bg := b.budget(key)
	defer unuse(bg)
	now := time.Now()
	bg.mu.Lock()
	bg.prune(now)
	bg.coolUntil(until)
	b.maybeIdle(bg)
	bg.mu.Unlock()
	d := until.Sub(now)
	if d <= 0 {
		return nil
	}
	if !bg.health.use(now) {
		return fmt.Errorf("sluiceredis: cooldown of %q not shared: %w", key, bg.health.unavailable())
	}
	bg.mu.Lock()
	release := bg.takeRelease()
	bg.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, b.cfg.timeout)
	err := runCool(cctx, b.client, bg.keys, d, release)
	cancel()
	now = time.Now()
	if err != nil {
		bg.requeue(release)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !unreachable(err) {
			b.recovered(bg, now)
			return fmt.Errorf("sluiceredis: cooldown of %q not shared: %w", key, err)
		}
		b.failed(bg, now, err)
		return fmt.Errorf("sluiceredis: cooldown of %q not shared: %w: %w", key, ErrUnavailable, err)
	}
	b.recovered(bg, now)
	return nil
}

// budget returns key's budget, held for the caller until it calls unuse:
// one that no call holds, that holds nothing and that no call has looked
// up since the sweep before last is dropped (see sweepLocked).
func (b *backend) budget(key string) *budget {
	b.mu.Lock()
	defer b.mu.Unlock()
	bg := b.budgets[key]
	if bg == nil {
		if len(b.budgets) >= b.sweepAt {
			b.sweepLocked(time.Now())
		}
		bg = &budget{key: key, keys: newKeys(b.cfg.prefix, key), health: health{every: b.cfg.probeEvery}}
		b.budgets[key] = bg
	}
	bg.gen = b.gen
	bg.users.Add(1)
	return bg
}

// unuse lets go of a budget that budget returned.
func unuse(bg *budget) { bg.users.Add(-1) }

// minSweep is the least size of budgets at which it is swept.
const minSweep = 1024

// sweepLocked drops the budgets of keys no longer used, so that a process
// that takes tokens for many keys, a key per tenant or per model, keeps
// only those in use: each time budgets has doubled since the last sweep,
// which costs a constant time a new key. A budget is dropped when no call
// holds it, it was not looked up since the sweep before this one, and it
// holds nothing: no reservation, lease or lease to give back, no
// cooldown, no fallback, and Redis answers for it. New lookups wait for
// b.mu, which the sweep holds, so none finds a budget being dropped.
func (b *backend) sweepLocked(now time.Time) {
	b.gen++
	for key, bg := range b.budgets {
		if bg.gen+1 >= b.gen || bg.users.Load() != 0 {
			continue
		}
		bg.mu.Lock()
		idle := len(bg.pending) == 0 && len(bg.held) == 0 && len(bg.release) == 0 && len(bg.orphans) == 0 &&
			!bg.fallen && !now.Before(bg.cool)
		bg.mu.Unlock()
		if idle && bg.health.up() {
			delete(b.budgets, key)
		}
	}
	b.sweepAt = max(2*len(b.budgets), minSweep)
}

// fallback serves a Take from the local budget while Redis is unreachable.
func (b *backend) fallback(bg *budget, now time.Time, rate float64, burst int) (time.Duration, error) {
	if b.cfg.share == 0 {
		return 0, bg.health.unavailable()
	}
	bg.mu.Lock()
	defer bg.mu.Unlock()
	if !bg.fallen {
		// A new outage: every process of the fleet may meet it at the same
		// instant. Budgets that started together, full, at one rate would
		// send in step for as long as it lasts (a process's burst at the
		// same instant as every other's, once an interval), so each
		// starts empty at a random phase of its interval, and runs a
		// little slower than its share, by a random factor, so that two
		// that happen to start close drift apart.
		bg.fallen, bg.lim = true, nil
		bg.slow = 1 - fallbackJitter*b.rand()
	}
	if b.cfg.leases > 0 && bg.local >= b.cfg.fallbackLeases() {
		return leasePoll, nil
	}
	if rate > 0 {
		lb := max(1, int(float64(max(burst, 1))*b.cfg.share))
		if w := bg.localTake(now, rate*b.cfg.share*bg.slow, lb, b.rand); w > 0 {
			return w, nil
		}
	}
	if b.cfg.leases > 0 {
		bg.held = append(bg.held, "")
		bg.local++
	}
	return 0, nil
}

// failed records that Redis did not answer a call for bg, and logs it
// once per outage of the key.
func (b *backend) failed(bg *budget, now time.Time, err error) {
	first := bg.health.fail(now, err)
	if b.lost() {
		// A replica may have taken the key's slot over: the map of the
		// slots is being reloaded, and the key probed again sooner than
		// at its turn, so that it is back within a probe of a failover.
		bg.health.probeBy(now.Add(b.cfg.probeEvery / retryRefreshes))
	}
	if !first {
		return
	}
	if b.cfg.share == 0 {
		b.cfg.logger.Warn("sluiceredis: redis unreachable; refusing requests until it answers",
			"key", bg.key, "err", err, "probe", b.cfg.probeEvery)
		return
	}
	b.cfg.logger.Warn("sluiceredis: redis unreachable; using a local budget until it answers",
		"key", bg.key, "err", err, "share", b.cfg.share, "probe", b.cfg.probeEvery)
}

// recovered records that Redis answered a call for bg.
func (b *backend) recovered(bg *budget, now time.Time) {
	if d := bg.health.ok(now); d > 0 {
		b.cfg.logger.Info("sluiceredis: redis answers again; using the shared budget", "key", bg.key, "down", d)
		select {
		case b.back <- struct{}{}: // the releaser need not wait for its turn to probe
		default:
		}
	}
}

// lost has a Redis Cluster client reload its map of the slots after a
// call found Redis unreachable: go-redis reloads it by itself only on a
// MOVED reply or once a minute, so that after a master dies and a replica
// takes its slots over, calls would go on failing on the dead address.
// The client runs one reload at a time, and at most one more after it.
// It reports whether the client is a Cluster's.
func (b *backend) lost() bool {
	c, ok := b.client.(*redis.ClusterClient)
	if ok {
		c.ReloadState(context.Background())
	}
	return ok
}

// takeLocal answers a Take for taker by without Redis when it can: during
// a cooldown it knows of, or from a reservation of by's. bg.mu must be
// held.
func (bg *budget) takeLocal(now time.Time, by any) (time.Duration, bool) {
	if d := bg.cool.Sub(now); d > 0 {
		return d, true
	}
	bg.prune(now)
	i := slices.IndexFunc(bg.pending, func(r reservation) bool { return r.by == by })
	if i < 0 {
		return 0, false
	}
	r := bg.pending[i]
	if d := r.due.Sub(now); d > 0 {
		return d, true
	}
	bg.pending = slices.Delete(bg.pending, i, i+1)
	if r.lease != "" {
		bg.held = append(bg.held, r.lease)
	}
	if !r.late.IsZero() && now.After(r.late) {
		// Sent after its theoretical arrival time, a token adds to a
		// window the rest of the fleet may have filled: one such token
		// per taker is the slack the bound allows (as when a call took
		// one token), so the taker's other tokens that are late too are
		// dropped.
		bg.pending = slices.DeleteFunc(bg.pending, func(o reservation) bool {
			if o.by != by || o.late.IsZero() || !now.After(o.late) {
				return false
			}
			if o.lease != "" {
				bg.release = append(bg.release, o.lease)
			}
			return true
		})
	}
	bg.pace(by).grant(now)
	return 0, true
}

// pace returns by's pace, making it. bg.mu must be held.
func (bg *budget) pace(by any) *pace {
	p := bg.paces[by]
	if p == nil {
		if bg.paces == nil {
			bg.paces = make(map[any]*pace)
		}
		p = &pace{}
		bg.paces[by] = p
	}
	return p
}

// prune drops the reservations nobody came for in time, and queues their
// leases for release; and forgets the pace of a taker granted nothing for
// paceIdle (a Transport closed, or an idle lane). bg.mu must be held.
func (bg *budget) prune(now time.Time) {
	bg.pending = slices.DeleteFunc(bg.pending, func(r reservation) bool {
		if !now.After(r.stale) {
			return false
		}
		if r.lease != "" {
			bg.release = append(bg.release, r.lease)
		}
		return true
	})
	for by, p := range bg.paces {
		if now.Sub(p.last) > paceIdle {
			delete(bg.paces, by)
		}
	}
}

// paceIdle is how long a taker's pace is kept without a grant: longer
// than any gap it smooths (a second at most).
const paceIdle = time.Minute

// leased reports whether this process holds leases on the budget in Redis:
// for attempts granted and not yet done, or with reserved tokens. bg.mu
// must be held.
func (bg *budget) leased() bool {
	return len(bg.held) > bg.local || slices.ContainsFunc(bg.pending, func(r reservation) bool { return r.lease != "" })
}

// leases returns the ids of the leases leased reports. bg.mu must be held.
func (bg *budget) leases() []string {
	var ids []string
	for _, id := range bg.held {
		if id != "" {
			ids = append(ids, id)
		}
	}
	for _, r := range bg.pending {
		if r.lease != "" {
			ids = append(ids, r.lease)
		}
	}
	return ids
}

// takeRelease returns up to maxRelease leases to give back with a call to
// Redis, and keeps the rest for the next. bg.mu must be held.
func (bg *budget) takeRelease() []string {
	n := len(bg.release)
	if n == 0 {
		return nil
	}
	k := min(n, maxRelease)
	ids := slices.Clone(bg.release[n-k:])
	clear(bg.release[n-k:])
	bg.release = bg.release[:n-k]
	return ids
}

// apply records what take.lua, called at sent, decided, and returns Take's
// wait. The tokens taken are reserved for the caller's taker, by, and the
// first due is the caller's (0) if due now.
func (bg *budget) apply(now, sent time.Time, st status, waits, lates []time.Duration, lease string, rate float64, by any) time.Duration {
	bg.mu.Lock()
	defer bg.mu.Unlock()
	bg.fallen = false // Redis answers for this budget: a later outage is a new one
	if rtt := now.Sub(sent); bg.rtt == 0 {
		bg.rtt = rtt
	} else {
		bg.rtt += (rtt - bg.rtt) / 8
	}
	switch st {
	case taken, reserved:
		for i, wait := range waits {
			id := ""
			if lease != "" {
				id = memberN(lease, i)
			}
			// Due counted from after the reply, and late from before the
			// call: the token is due no earlier, and its theoretical
			// arrival time is no later.
			due := now.Add(wait)
			r := reservation{due: due, stale: due.Add(staleAfter(rate)), lease: id, by: by}
			if lates != nil {
				r.late = sent.Add(lates[i])
			}
			j := len(bg.pending)
			for j > 0 && bg.pending[j-1].due.After(r.due) {
				j--
			}
			bg.pending = slices.Insert(bg.pending, j, r)
		}
		if w, ok := bg.takeLocal(now, by); ok {
			return w
		}
		return time.Microsecond // dropped at once (a cooldown): ask again
	case cooling:
		// cool.lua shares no cooldown longer than maxCool: a longer one was
		// written by something else (a far future time). It is not kept
		// here, where it would hold every Take of the key without asking
		// Redis until then, and the wait is held to maxCool.
		if waits[0] > maxCool {
			return maxCool
		}
		bg.coolUntil(now.Add(waits[0]))
	}
	return max(waits[0], time.Microsecond)
}

// coolUntil extends the cooldown this process knows of. Reserved tokens due
// before it ends are dropped, and their leases queued for release: take.lua
// does not move the GCRA state during a cooldown, so when it ends the
// budget has its burst back, and tokens reserved before it would come on
// top. Tokens due after it ends are kept (the GCRA state accounts for
// them). bg.mu must be held.
func (bg *budget) coolUntil(t time.Time) {
	if !t.After(bg.cool) {
		return
	}
	bg.cool = t
	bg.pending = slices.DeleteFunc(bg.pending, func(r reservation) bool {
		if !r.due.Before(t) {
			return false
		}
		if r.lease != "" {
			bg.release = append(bg.release, r.lease)
		}
		return true
	})
}

// requeue keeps leases whose release did not reach Redis for the next call.
func (bg *budget) requeue(ids []string) {
	if len(ids) == 0 {
		return
	}
	bg.mu.Lock()
	bg.release = append(bg.release, ids...)
	bg.mu.Unlock()
}

// unreachable reports whether err from a Redis call means that Redis
// cannot serve now (the Backend then falls back to its local budget until a
// probe succeeds), rather than an error reply about this call, which is
// returned to its caller and changes nothing else. A transport error, a
// timeout and anything that is not a reply count as unreachable; so do the
// replies by which a server says it cannot serve any key at the moment,
// and those of a Cluster whose slot moved.
func unreachable(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return true
	}
	if errors.Is(err, redis.Nil) {
		return false
	}
	return redis.IsLoadingError(err) || redis.IsReadOnlyError(err) || redis.IsOOMError(err) ||
		redis.IsMasterDownError(err) || redis.IsClusterDownError(err) || redis.IsNoReplicasError(err) ||
		redis.IsMaxClientsError(err) || redis.IsAuthError(err) ||
		redis.HasErrorPrefix(err, "BUSY") || redis.HasErrorPrefix(err, "MISCONF") ||
		// A Cluster moving a key's slot (a failover, a resharding) that
		// the client has not followed yet.
		redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK") ||
		redis.HasErrorPrefix(err, "TRYAGAIN")
}
