package sluiceredis

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// ErrUnavailable is wrapped by the error Take returns when Redis cannot be
// reached and WithFallbackShare(0) forbids a local budget, and by the error
// Cool returns when it could not share a cooldown.
var ErrUnavailable = errors.New("sluiceredis: redis unavailable")

// health tracks whether Redis answers. While it does not, calls go to the
// local fallback, and one call per probe interval tries Redis again, so that
// an outage costs one timeout a second rather than one per request.
type health struct {
	every time.Duration

	mu    sync.Mutex
	down  bool
	since time.Time // when it went down
	next  time.Time // when to probe next, while down
	cause error     // why it went down
}

// use reports whether a call should go to Redis now: always while Redis is
// up; while it is down, once per probe interval.
func (h *health) use(now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.down {
		return true
	}
	if now.Before(h.next) {
		return false
	}
	h.next = now.Add(h.every) // this caller probes; the others do not
	return true
}

// up reports whether Redis is believed reachable, without claiming a probe.
func (h *health) up() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.down
}

// ok records that Redis answered. It returns how long Redis had been down,
// or 0 if it was up.
func (h *health) ok(now time.Time) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.down {
		return 0
	}
	h.down, h.cause = false, nil
	return max(now.Sub(h.since), time.Nanosecond)
}

// fail records that a call failed with err. It reports whether Redis had
// been up until now (so that the transition is logged once).
func (h *health) fail(now time.Time, err error) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.down {
		return false
	}
	h.down, h.since, h.next, h.cause = true, now, now.Add(h.every), err
	return true
}

// probeBy brings the next probe forward to at, if Redis is down.
func (h *health) probeBy(at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.down && at.Before(h.next) {
		h.next = at
	}
}

// unavailable returns the error for a call that cannot go to Redis.
func (h *health) unavailable() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cause == nil {
		return ErrUnavailable
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, h.cause)
}

// fallbackJitter is how much slower than its share a process's fallback
// may run: each outage, each budget draws a factor in (1-fallbackJitter, 1].
// Processes whose budgets start close in phase then drift apart by up to
// fallbackJitter of an interval per interval, instead of sending in step
// for the whole outage; the fleet gives up 2.5% of the rate on average.
const fallbackJitter = 0.05

// maxPhase bounds the random phase of a fallback budget (see newLocal), so
// that a very slow rate does not overflow a Duration.
const maxPhase = 24 * time.Hour

// newLocal returns a fallback limiter of r tokens per second and the given
// burst that starts empty, with its first token due at a random point
// (rnd in [0, 1)) of its first interval, instead of full: budgets created
// at the same instant across a fleet then neither send their bursts
// together nor stay in step.
func newLocal(now time.Time, r float64, burst int, rnd float64) *rate.Limiter {
	lim := rate.NewLimiter(rate.Limit(r), burst)
	interval := min(float64(time.Second)/r, float64(maxPhase))
	// Empty (1-rnd) of an interval ago: the first token is due in rnd of
	// an interval.
	lim.AllowN(now.Add(-time.Duration((1-rnd)*interval)), burst)
	return lim
}

// localTake takes a token from the budget's fallback limiter, which runs at
// r tokens per second with the given burst (see newLocal for how it
// starts), and returns 0, or how long until a token is due. b.mu must be
// held.
func (b *budget) localTake(now time.Time, r float64, burst int, rnd func() float64) time.Duration {
	// x/time/rate over-admits when handed times that run backwards
	// (golang/go#65508); callers read the clock before taking b.mu, so
	// clamp.
	if now.Before(b.last) {
		now = b.last
	}
	b.last = now
	if b.lim == nil || b.lim.Burst() != burst {
		b.lim = newLocal(now, r, burst, rnd())
	} else if float64(b.lim.Limit()) != r {
		b.lim.SetLimitAt(now, rate.Limit(r))
	}
	if b.lim.AllowN(now, 1) {
		return 0
	}
	ns := math.Ceil((1 - b.lim.TokensAt(now)) / r * 1e9)
	if ns >= math.MaxInt64 {
		return math.MaxInt64
	}
	return max(time.Duration(ns), time.Microsecond)
}
