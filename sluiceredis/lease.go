package sluiceredis

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-go/sluice"
)

var _ sluice.Leaser = (*Backend)(nil)

// A Backend is a sluice.Leaser that keeps budgets in Redis: every process
// using the same Redis, prefix and key is leased a share of the key's rate
// (and, with WithInFlight, of its places in flight) each refresh, by what
// its lanes want at each priority level, and its lanes pace themselves
// inside their shares with no Redis call per request (see the package
// doc). The fleet sends at most rate x T + burst + 2 per process in any
// window T.
//
// Create a Backend with New; the zero Backend is not usable. A Backend is
// safe for concurrent use, and may serve several Transports (each of their
// lanes gets its own part). It runs one goroutine while a key has lanes,
// to refresh the shares, with one subscription connection to Redis; Close
// stops it. The client stays the caller's to close.
type Backend struct {
	*backend
}

// New returns a Backend that leases shares of the budgets kept in the
// Redis behind client, refreshed every DefaultRefresh unless WithRefresh
// says otherwise. It fails if an option is invalid, or if client is a
// *redis.Client, *redis.ClusterClient or *redis.Ring without
// ContextTimeoutEnabled: go-redis would then ignore the deadline of every
// call and wait up to its own ReadTimeout (3s by default) on a stalled
// Redis, and WithTimeout could not keep its promise. (A client of another
// type must honour context deadlines too.)
func New(client redis.UniversalClient, opts ...Option) (*Backend, error) {
	b, err := open("New", client, true, opts)
	if err != nil {
		return nil, err
	}
	return &Backend{b}, nil
}

// Join adds a lane on key to those this Backend divides the key's share
// among (see sluice.Leaser), and reports true; after Close it reports
// false. The first lane on a key makes the key's first refresh happen at
// once; until it answers (one round trip) the lane sends nothing.
func (b *Backend) Join(key string, demand func() (sluice.Demand, bool), grant func(sluice.Share)) bool {
	return b.backend.join(key, demand, grant)
}

// Take is never called by a lane of a Backend, which joins instead (see
// sluice.Leaser): it returns an error wrapping errors.ErrUnsupported, or
// after Close one wrapping ErrClosed. Use Tokens for a budget taken one
// token at a time.
func (b *Backend) Take(ctx context.Context, key string, rate float64, burst int) (time.Duration, error) {
	if b.backend.closed.Load() {
		return 0, fmt.Errorf("sluiceredis: take from %q: %w", key, ErrClosed)
	}
	return 0, fmt.Errorf("sluiceredis: take from %q: a Backend leases shares, and lanes join it: %w", key, errors.ErrUnsupported)
}

// Done does nothing: a Backend's lanes hold their places in flight
// within their shares, and give nothing back per attempt.
func (b *Backend) Done(key string) {}

// Cool records that nothing may be sent under key before until, in this
// process at once and, through Redis, in every process that shares key:
// the others learn it at their next refresh. The cooldown is sent to
// Redis as a duration from now, so process clocks do not matter; one
// longer than 24 hours holds in full in this process, and for 24 hours in
// the others (who learn the rest from the server when it ends).
//
// If Redis cannot be reached for key, the cooldown holds in this process
// only and Cool returns an error wrapping ErrUnavailable. If Redis answers
// with an error reply about this call (such as WRONGTYPE, when something
// else wrote the key), Cool returns it. After Close it returns an error
// wrapping ErrClosed.
func (b *Backend) Cool(ctx context.Context, key string, until time.Time) error {
	return b.backend.cool(ctx, key, until)
}

// Close gives this process's shares back to the fleet (which has them at
// its next refreshes rather than at the end of the leases), leaves its
// lanes a share of nothing, and stops its goroutines, waiting for them and
// for the calls under way (each bounded by WithTimeout). After Close, Join
// reports false and Cool returns an error wrapping ErrClosed. Close is safe
// to call more than once and concurrently; later calls return what the
// first returned. It does not close the Redis client, which stays the
// caller's.
func (b *Backend) Close() error { return b.backend.shutdown() }
