package sluiceredis

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-go/sluice"
)

var _ sluice.Backend = (*Tokens)(nil)

// Tokens is a sluice.Backend that takes its tokens from Redis one call at
// a time (see the package doc, "How Tokens take"): the fleet sends at most
// rate x T + burst in any window T, plus one late token per lane at most,
// at the cost of about one Redis call per request (and with WithInFlight one more, in Done). Use it
// against a server whose burst is smaller than about twice the number of
// processes, which would refuse what a Backend's slack of two tokens a
// process lets through; use a Backend otherwise.
//
// Create Tokens with NewTokens; the zero value is not usable. Tokens are
// safe for concurrent use, and run goroutines only while they have work:
// one while they hold in-flight leases, to renew them, and one while leases
// asked for by calls that failed or timed out may still be taken in Redis,
// to give them back once it answers. Close stops both. The client stays the
// caller's to close.
type Tokens struct {
	*backend
}

// NewTokens returns Tokens that keep their budgets in the Redis behind
// client. Every option but WithRefresh applies. It fails if an option is
// invalid, or if client is a *redis.Client, *redis.ClusterClient or
// *redis.Ring without ContextTimeoutEnabled (see New).
func NewTokens(client redis.UniversalClient, opts ...Option) (*Tokens, error) {
	b, err := open("NewTokens", client, false, opts)
	if err != nil {
		return nil, err
	}
	return &Tokens{b}, nil
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
func (t *Tokens) Take(ctx context.Context, key string, rate float64, burst int) (time.Duration, error) {
	return t.backend.take(ctx, key, rate, burst)
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
func (t *Tokens) Done(key string) { t.backend.finish(key) }

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
func (t *Tokens) Cool(ctx context.Context, key string, until time.Time) error {
	return t.backend.cool(ctx, key, until)
}

// Close gives back every lease these Tokens hold in Redis (for attempts
// still in flight too: call it once they are done, or when their places no
// longer matter, as the process exits) and any its failed calls may hold,
// and stops the goroutines it started. It waits for them and for the calls
// of Take, Done and Cool under way (each bounded by the timeout), then for
// at most one timeout (WithTimeout) per budget for Redis; leases it cannot give
// back (Redis is unreachable) expire with their ttl, and Close then returns
// an error saying how many. After Close, Take and Cool return an error
// wrapping ErrClosed, and Done does nothing. Close is safe to call more than
// once and concurrently; later calls return what the first returned. It
// does not close the Redis client, which stays the caller's.
func (t *Tokens) Close() error { return t.backend.shutdown() }
