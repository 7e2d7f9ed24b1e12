package sluice

import (
	"context"
	"time"
)

// A Backend holds lane budgets outside the process, so that the Transports
// of several processes that call an API with one key draw on one budget
// instead of each spending the whole of it. Package
// github.com/sluice-go/sluice/sluiceredis provides one on Redis.
//
// With a Backend, a lane's tokens come from Backend.Take instead of the
// lane's local bucket; the lane still orders its own waiters by priority in
// front of the shared budget, still bounds its own in-flight attempts, and
// still learns its rate from the server: the rate passed to Take is the
// lane's current rate. A cooldown the lane learns (Retry-After, remaining 0)
// is shared through Cool.
//
// A Backend must be safe for concurrent use. Its methods are never called
// with a lane's lock held, and each must bound its own time: a Backend that
// cannot reach its store decides whether to fall back to a local budget or
// to fail (see Take).
type Backend interface {
	// Take takes one token for an attempt from the budget named key, which
	// refills at rate tokens per second up to burst tokens (rate <= 0: the
	// budget is not paced, and only cooldowns and any in-flight cap apply).
	// It returns 0 when the token was taken, or else how long to wait
	// before asking again: until a cooldown set through Cool ends, or until
	// a token is due. An error fails the attempt it was asked for (the
	// caller sees it from RoundTrip); a Backend that falls back to a local
	// budget returns no error.
	//
	// A Backend that also caps attempts in flight across processes takes a
	// lease with the token, and returns a wait when none is free.
	Take(ctx context.Context, key string, rate float64, burst int) (wait time.Duration, err error)

	// Done reports that an attempt granted by Take for key has finished (its
	// response body was closed, or it was never sent). A Backend with an
	// in-flight cap releases one of this process's leases on key; others
	// may do nothing. Done is called on the caller's path (from
	// Response.Body.Close): it must not block for long.
	Done(key string)

	// Cool records that nothing may be sent under key before until, for
	// every process that shares the key. An earlier until than one already
	// recorded is ignored.
	Cool(ctx context.Context, key string, until time.Time) error
}

// WithBackend makes every lane draw its tokens from b instead of a budget of
// its own (see Backend). The lane's key names the budget in b, so processes
// that share a key share its budget.
func WithBackend(b Backend) Option {
	return optionFunc(func(c *config) error {
		if b == nil {
			return invalid("WithBackend(nil): the backend must not be nil")
		}
		c.backend = b
		return nil
	})
}
