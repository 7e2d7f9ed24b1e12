package sluice

import (
	"context"
	"fmt"
	"time"
)

// An Observer is told what a Transport does, as it happens: see
// WithObserver. Observe is called from one goroutine per Transport, in the
// order the events happened, never with a lock of the Transport held and
// never on a request's path, so a slow or blocking Observer delays only
// the events after it (and drops some, see Stats.EventsDropped), and one
// that panics loses that event only.
type Observer interface {
	Observe(ctx context.Context, e Event)
}

// ObserverFunc adapts a function to an Observer.
type ObserverFunc func(ctx context.Context, e Event)

// Observe calls f(ctx, e).
func (f ObserverFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }

// WaitEvents returns when every event so far has reached the Observers, or
// ctx ends; with no Observer it returns at once. A test, or a service
// shutting down, calls it before reading what its Observers recorded.
func (t *Transport) WaitEvents(ctx context.Context) error {
	if t.cfg.events == nil {
		return nil
	}
	return t.cfg.events.wait(ctx)
}

// EventKind says what an Event reports.
type EventKind uint8

const (
	// EventQueued: an attempt could not be granted at once and waits in
	// its lane. Queued is the lane's queue length with it.
	EventQueued EventKind = iota + 1
	// EventGranted: an attempt was granted its token and in-flight slot
	// after waiting Wait (0 if it did not wait), and is about to be sent.
	EventGranted
	// EventRefused: an attempt was refused before it was sent, for
	// Reason; Err is its *RejectedError, and Wait the wait estimated.
	EventRefused
	// EventRetried: a request is tried again (Attempt is the attempt about
	// to be made, 2 for the first retry) after a response with Status (0:
	// none, the base failed with Err), after Wait.
	EventRetried
	// EventThrottled: the server refused an attempt for its rate: a 429, a
	// 403 that says so (GitHub's limits), a 502, 503, 504 or 529 with
	// Retry-After, or a throttle in a GraphQL body or a stream's first
	// event. Status is the response's. LaneStats.Throttled leaves out the
	// 5xx ones, which pause the lane (LaneStats.Cooldowns).
	EventThrottled
	// EventCooldown: the lane sends nothing before Until, for Wait from
	// now, because of Cause ("retry-after", "remaining 0", ...). A cooldown
	// that is extended is reported again.
	EventCooldown
	// EventRateChanged: the lane's pace went From To requests per second
	// (0: not paced), because of Cause: RateCut (a 429), RateHeader (what
	// the server's rate-limit headers say) or RateRecovery (accepted
	// requests after a cut).
	EventRateChanged
	// EventLimitChanged: the lane's in-flight limit went From To.
	EventLimitChanged
	// EventOverloaded: the server answered that it is overloaded (see
	// OverloadStatus and OverloadStream for Cause): a 529 (Anthropic's
	// overloaded_error), or a 502, 503 or 504 without Retry-After, with
	// Status; or a stream's first event, an error about overload, with
	// Status 0. The lane's in-flight limit went From To on it (equal when
	// an overload of the same round of calls cut it already), and Wait is
	// the pause of a lane at its limit's floor, 0 if none. An
	// EventLimitChanged follows if the limit moved, and an EventCooldown
	// for a pause.
	EventOverloaded
)

// Causes of an EventRateChanged.
const (
	RateCut      = "429"
	RateHeader   = "header"
	RateRecovery = "recovery"
)

// Causes of an EventOverloaded.
const (
	OverloadStatus = "status" // the response's status said so
	OverloadStream = "stream" // a stream's first event said so
)

// String returns the kind's name in lower case, as in "queued" or
// "rate changed".
func (k EventKind) String() string {
	switch k {
	case EventQueued:
		return "queued"
	case EventGranted:
		return "granted"
	case EventRefused:
		return "refused"
	case EventRetried:
		return "retried"
	case EventThrottled:
		return "throttled"
	case EventCooldown:
		return "cooldown"
	case EventRateChanged:
		return "rate changed"
	case EventLimitChanged:
		return "limit changed"
	case EventOverloaded:
		return "overloaded"
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// An Event is one thing a Transport did; which fields are set depends on
// its Kind (see EventKind). The context Observe gets with it is the
// request's for the events of an attempt (queued, granted, refused,
// retried, throttled, overloaded, cooldown, and a rate change a response
// caused), and
// context.Background() for the lane's own (a limit change, a rate change
// on recovery).
type Event struct {
	Kind     EventKind
	Time     time.Time // when it happened
	Lane     string    // the lane's key
	Sublimit string    // the sub-limit of the lane, if the event is of one (see WithSublimit)
	Priority Priority
	Tenant   string // see WithTenant
	Attempt  int    // 1 for a first attempt; set for Granted, Refused and Retried (0 for Queued)

	Wait   time.Duration
	Queued int
	Reason Reason
	Err    error
	Status int
	Cause  string
	Until  time.Time
	From   float64
	To     float64
}
