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

var _ sluice.Backend = (*Backend)(nil)

// A Backend is a sluice.Backend that keeps budgets in Redis, so that every
// process using the same Redis and the same key draws on one budget. Create
// it with New; the zero Backend is not usable. A Backend is safe for
// concurrent use. It runs goroutines only while it has work: one while it
// holds in-flight leases (see WithInFlight), to renew them, which exits
// once the last lease is given back (at Done, or, for a reserved token
// nobody came for, when the reservation goes stale); and one while leases
// asked for by calls that failed or timed out may still be taken in Redis,
// to give them back once it answers. Close gives back every lease and
// stops both. The client stays the caller's to close.
type Backend struct {
	client redis.UniversalClient
	cfg    config
	self   string // starts this Backend's lease members
	seq    atomic.Uint64
	health health
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
	renewing  bool          // a goroutine renews the leases; see keepRenewing
	releasing bool          // a goroutine gives back orphans; see keepReleasing
	idle      chan struct{} // capacity 1: Done gave back a budget's last lease
	back      chan struct{} // capacity 1: Redis answers again, for the releaser

	shares shares // see WithShares
	wakers wakers // see waitFreed
}

// budget is this process's side of one key's budget. Its fields are guarded
// by mu, which is never held across a Redis call.
type budget struct {
	keys keys

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

// New returns a Backend that keeps its budgets in the Redis behind client.
// It fails if an option is invalid, or if client is a *redis.Client,
// *redis.ClusterClient or *redis.Ring without ContextTimeoutEnabled: go-redis
// would then ignore the deadline of every call and wait up to its own
// ReadTimeout (3s by default) on a stalled Redis, and WithTimeout could not
// keep its promise. (A client of another type must honour context
// deadlines too.)
func New(client redis.UniversalClient, opts ...Option) (*Backend, error) {
	if client == nil {
		return nil, errors.New("sluiceredis: New: nil client")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			return nil, invalid("nil Option")
		}
		if err := o.apply(&cfg); err != nil {
			return nil, err
		}
	}
	if !contextTimeouts(client) {
		return nil, fmt.Errorf("sluiceredis: New: the client's options have ContextTimeoutEnabled false, so go-redis would not bound calls by WithTimeout (%v); set ContextTimeoutEnabled: true", cfg.timeout)
	}
	var id [8]byte
	_, _ = rand.Read(id[:]) // never fails (crypto/rand panics instead)
	return &Backend{
		client:  client,
		cfg:     cfg,
		self:    hex.EncodeToString(id[:]),
		health:  health{every: cfg.probeEvery},
		rand:    mrand.Float64,
		budgets: make(map[string]*budget),
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

// Take takes a token from the budget named key, refilling at rate tokens
// per second up to burst (see sluice.Backend), and with WithInFlight a
// lease with it. It returns 0 when both are the caller's, or how long to
// wait before asking again.
//
// A token that is not due yet is reserved in Redis for this process, and
// the wait returned is until it is due; asking again then takes it without
// a Redis call. So each token granted costs at most one Redis call, however
// many processes contend. A caller (sluice.TakerOf: a Transport's lane)
// that has lately been granted more than one token per round trip to Redis
// takes several with one call, reserved for it alone (see the package
// doc). A reservation is dropped (its token wasted) when
// nobody asks for it within max(1/rate, 10ms) of its due time, because a
// token used late would add to a window the rest of the fleet has already
// filled, and when this process learns of a cooldown that ends after its
// due time (see Cool).
//
// Every process sharing key shares one GCRA state, whatever rate each
// passes: each token a process takes moves the state on by its own
// 1/rate. So processes that pass different rates for one key (one has
// learned a lower rate from the server and another not yet) are together
// bounded by the highest rate among them, not the lowest, until each has
// learned. Rates are paced to a fraction of a microsecond per token (never
// faster than asked; slower by at most 1/4us per token, 1% at 40,000/s),
// above 1,000,000/s at 1,000,000/s, and a burst is cut to about 3 years'
// worth of tokens.
//
// When Redis cannot be reached within the timeout, Take falls back to a
// local budget of WithFallbackShare of the rate and returns no error, or,
// with a share of 0, returns an error wrapping ErrUnavailable. While Redis
// is down, one Take a second tries it again; the others do not wait for it.
// Redis answering with an error that concerns this call (for example
// WRONGTYPE, when something else wrote one of the budget's keys) is not an
// outage: that Take returns the error, and other keys are not affected. An
// error reply that says the server cannot serve at all (LOADING, BUSY,
// READONLY, OOM, MASTERDOWN, CLUSTERDOWN, NOREPLICAS, MISCONF, NOAUTH, max
// clients) counts as Redis being unreachable. An error is also returned if
// ctx ends during the call.
//
// A call that fails or times out may still run in Redis later (a stalled
// server runs what it had received when it resumes), and with WithInFlight
// take a lease that nobody holds. Such a lease is given back in the
// background once Redis answers, and a run that comes after that takes
// nothing; so a fault costs at most the places in flight during it, not
// the lease ttl.
//
// With WithInFlight, a Take that finds every lease held waits, up to
// 250ms, until a lease is given back somewhere in the fleet and this
// process's turn comes (see the package doc), and then returns a wait of a
// microsecond: the caller asks again at once.
//
// After Close, Take returns an error wrapping ErrClosed.
func (b *Backend) Take(ctx context.Context, key string, rate float64, burst int) (time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if !b.enter() {
		return 0, fmt.Errorf("sluiceredis: take from %q: %w", key, ErrClosed)
	}
	defer b.leave()
	bg := b.budget(key)
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

	if !b.health.use(now) {
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
			b.recovered(now) // it answered
		default:
			b.failed(now, err)
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
	b.recovered(now)
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
func (b *Backend) keepRenewing() {
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
func (b *Backend) renew() {
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
// reservations) on every budget, one call per budget, if Redis is up.
func (b *Backend) releaseStale() {
	if !b.health.up() {
		return
	}
	b.mu.Lock()
	budgets := slices.Collect(maps.Values(b.budgets))
	b.mu.Unlock()
	for _, bg := range budgets {
		bg.mu.Lock()
		ids := bg.takeRelease()
		bg.mu.Unlock()
		if len(ids) == 0 {
			continue
		}
		if !b.release(bg, ids) {
			return
		}
	}
}

// release gives the leases ids of bg back in Redis, and reports whether
// Redis was reached. If not, they are queued again and the Backend marked
// down. An error reply (the lease key holds another type) would come
// again: the leases are left to expire.
func (b *Backend) release(bg *budget, ids []string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.timeout)
	err := runDone(ctx, b.client, bg.keys, ids)
	cancel()
	if err != nil && unreachable(err) {
		bg.requeue(ids)
		b.failed(time.Now(), err)
		return false
	}
	return true
}

// maybeIdle lets the renewer look at once, rather than at its next tick,
// whether it has anything left to do, if bg holds no lease now. bg.mu must
// be held.
func (b *Backend) maybeIdle(bg *budget) {
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
func (b *Backend) leasedBudgets() ([]*budget, time.Time) {
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
func (b *Backend) renewAll(work []*budget) {
	if !b.health.use(time.Now()) {
		// Not tried now: the leases may expire there, as they would for a
		// process that died, and the fallback budget bounds this process
		// meanwhile.
		return
	}
	for _, bg := range work {
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
				b.failed(now, err)
				return
			}
			b.recovered(now)
			if err != nil {
				// An error reply (the lease key holds another type) would
				// come again: those leases are left to expire.
				break
			}
			ids = ids[n:]
		}
	}
}

// Done releases one of this process's leases on key, when WithInFlight is
// set; otherwise it does nothing. The release is one Redis call bounded by
// the timeout, which also gives back the leases of this process's stale
// reservations on key and those whose release did not reach Redis earlier,
// and wakes the process that has waited longest for a lease on key.
// While Redis is unreachable it is not tried, and the lease goes with the
// next call for key (Take, Done or Cool). A lease whose key sees no further
// call is held until its ttl (WithInFlight) runs out.
//
// After Close, Done does nothing: Close gave every lease back.
func (b *Backend) Done(key string) {
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
		id := bg.held[n-1]
		bg.held = bg.held[:n-1]
		if id == "" {
			bg.local--
		} else {
			bg.release = append(bg.release, id)
		}
		b.maybeIdle(bg)
	}
	if len(bg.release) == 0 || !b.health.up() {
		bg.mu.Unlock()
		return
	}
	ids := bg.takeRelease()
	bg.mu.Unlock()
	b.release(bg, ids)
}

// Cool records that nothing may be sent under key before until, in this
// process at once and, through Redis, in every process that shares key.
// The cooldown is sent to Redis as a duration from now, so process clocks
// do not matter; a cooldown longer than 24 hours holds in full in this
// process, and for 24 hours in the others (who learn the rest from the
// server when it ends).
//
// A process that learns of a cooldown, from Cool or from a Take that meets
// it in Redis, drops its reservations due before the cooldown ends and
// gives back their leases: sending them when it ends, on top of the burst
// the budget has regained by then, would overshoot. (Its next Take after
// the cooldown reserves again, for one round trip.) Other processes learn
// of a cooldown at their next Take for key that reaches Redis: until then,
// one that holds a reservation may still send it during the cooldown, one
// token per reservation, which Take answers without Redis.
//
// If Redis cannot be reached, the cooldown holds in this process only and
// Cool returns an error wrapping ErrUnavailable. If Redis answers with an
// error reply about this call (see Take), Cool returns it.
func (b *Backend) Cool(ctx context.Context, key string, until time.Time) error {
	if !b.enter() {
		return fmt.Errorf("sluiceredis: cooldown of %q not shared: %w", key, ErrClosed)
	}
	defer b.leave()
	bg := b.budget(key)
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
	if !b.health.use(now) {
		return fmt.Errorf("sluiceredis: cooldown of %q not shared: %w", key, b.health.unavailable())
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
			b.recovered(now)
			return fmt.Errorf("sluiceredis: cooldown of %q not shared: %w", key, err)
		}
		b.failed(now, err)
		return fmt.Errorf("sluiceredis: cooldown of %q not shared: %w: %w", key, ErrUnavailable, err)
	}
	b.recovered(now)
	return nil
}

func (b *Backend) budget(key string) *budget {
	b.mu.Lock()
	defer b.mu.Unlock()
	bg := b.budgets[key]
	if bg == nil {
		bg = &budget{keys: newKeys(b.cfg.prefix, key)}
		b.budgets[key] = bg
	}
	return bg
}

// fallback serves a Take from the local budget while Redis is unreachable.
func (b *Backend) fallback(bg *budget, now time.Time, rate float64, burst int) (time.Duration, error) {
	if b.cfg.share == 0 {
		return 0, b.health.unavailable()
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

func (b *Backend) failed(now time.Time, err error) {
	if !b.health.fail(now, err) {
		return
	}
	if b.cfg.share == 0 {
		b.cfg.logger.Warn("sluiceredis: redis unreachable; refusing requests until it answers",
			"err", err, "probe", b.cfg.probeEvery)
		return
	}
	b.cfg.logger.Warn("sluiceredis: redis unreachable; using a local budget until it answers",
		"err", err, "share", b.cfg.share, "probe", b.cfg.probeEvery)
}

func (b *Backend) recovered(now time.Time) {
	if d := b.health.ok(now); d > 0 {
		b.cfg.logger.Info("sluiceredis: redis answers again; using the shared budget", "down", d)
		select {
		case b.back <- struct{}{}: // the releaser need not wait for its turn to probe
		default:
		}
	}
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
// replies by which a server says it cannot serve any key at the moment.
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
		redis.HasErrorPrefix(err, "BUSY") || redis.HasErrorPrefix(err, "MISCONF")
}

func toAny(ss []string) []any {
	a := make([]any, len(ss))
	for i, s := range ss {
		a[i] = s
	}
	return a
}
