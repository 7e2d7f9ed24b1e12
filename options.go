package sluice

import (
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"slices"
	"time"

	"github.com/hashicorp/go-retryablehttp"
)

// Defaults, and why.
const (
	// DefaultBurst is 1: the provider's bucket size is rarely published, and a
	// burst of 1 never exceeds even a strict GCRA limiter. A larger burst only
	// helps the first moments after idle.
	DefaultBurst = 1

	// DefaultHeadroom is 1: sluice paces evenly (it never sends a window's
	// allowance at once) and learns from 429s and rate-limit headers, so the
	// 20% margin advised for unpaced clients would be given away for nothing.
	// Set WithHeadroom(0.9) where the provider counts in short sliding windows
	// and even one 429 is costly.
	DefaultHeadroom = 1.0

	// DefaultMinConcurrency and DefaultMaxConcurrency bound the in-flight
	// limit. The minimum of 1 keeps a lane moving whatever latency does. The
	// maximum protects the process (sockets, memory of pending bodies), not
	// the provider (the rate does that): 256 covers 1.1 x rate x latency (the
	// adaptive limit, see WithConcurrency) up to, for example, 50/s at 4.5 s.
	// Raise it for slow calls at high rates.
	DefaultMinConcurrency = 1
	DefaultMaxConcurrency = 256

	// DefaultRetries is 2 attempts after the first. Every attempt takes a
	// token, so retries spend budget; past two, a failing upstream is rarely
	// saved by a third, and a retry budget bounds them anyway.
	DefaultRetries = 2

	// DefaultMaxRetryAfter caps how long a Retry-After or a rate-limit reset
	// may pause a lane. Ten minutes bounds the damage of a hostile or broken
	// server; if the real wait is longer, the next attempt after the cap costs
	// one request and brings a fresh Retry-After.
	DefaultMaxRetryAfter = 10 * time.Minute

	// DefaultLowShare is 10: while a lower level waits, every tenth grant
	// goes to the levels below the first in line, so that work below
	// Interactive keeps at least a tenth of the rate however much
	// interactive work there is, and interactive calls wait at most one
	// extra token's time for it.
	DefaultLowShare = 10

	// DefaultLaneIdle is how long a lane must have been idle before it is
	// forgotten (see WithLaneIdle). Five minutes is longer than the windows
	// a lane's statistics and feedback look back over (a minute at most), so
	// a key called now and then keeps its lane, and short enough that a
	// gateway with a key per customer holds the lanes of the recently active
	// ones only.
	DefaultLaneIdle = 5 * time.Minute
)

// An Option configures a Transport. Options are checked by New, which
// returns an error naming any bad value.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	rateN         int
	ratePer       time.Duration
	burst         int
	headroom      float64
	minConc       int
	maxConc       int
	aging         time.Duration
	lowShare      int
	maxWait       [numLevels]time.Duration
	retries       int
	checkRetry    retryablehttp.CheckRetry
	backoff       retryablehttp.Backoff
	maxRetryAfter time.Duration
	retryRatio    float64
	retryMin      int
	key           func(*http.Request) string
	laneIdle      time.Duration // see WithLaneIdle; 0: lanes are kept
	logger        *slog.Logger
	observers     []Observer
	events        *events // built by New from observers; nil if none
	backend       Backend
	budgets       []budgetConfig
	tenantShare   [numLevels]float64
	tenantQueue   int
	maxQueue      int
	sublimitKey   func(*http.Request) string // see WithSublimitKey
	subRates      map[string]subRate         // see WithSublimitRate
	sub           bool                       // the options of a sub-limit's lane (see sublimit)
}

// subRate is a sub-limit's published allowance: n requests per per.
type subRate struct {
	n   int
	per time.Duration
}

func defaultConfig() config {
	return config{
		burst:         DefaultBurst,
		headroom:      DefaultHeadroom,
		minConc:       DefaultMinConcurrency,
		maxConc:       DefaultMaxConcurrency,
		retries:       DefaultRetries,
		lowShare:      DefaultLowShare,
		maxRetryAfter: DefaultMaxRetryAfter,
		laneIdle:      DefaultLaneIdle,
		retryRatio:    DefaultRetryRatio,
		retryMin:      DefaultRetryMin,
		key:           hostKey,
		logger:        slog.New(slog.DiscardHandler),
	}
}

// perSecond is the lane's pacing rate after headroom, or 0 when no rate is
// configured (the lane is then bounded by concurrency and server signals only).
func (c *config) perSecond() float64 {
	if c.rateN == 0 {
		return 0
	}
	return perSecond(c.rateN, c.ratePer, c.headroom)
}

// perSecond is n per per, after headroom, in requests a second.
func perSecond(n int, per time.Duration, headroom float64) float64 {
	return float64(n) / per.Seconds() * headroom
}

// sublimit returns the options of a sub-limit's lane: c's, with no
// configured rate, no Backend and an in-flight limit that never binds.
func (c config) sublimit() config {
	c.rateN, c.ratePer = 0, 0
	c.minConc, c.maxConc = subSlots, subSlots
	c.backend = nil
	c.sub = true
	return c
}

func hostKey(r *http.Request) string {
	if r.URL.Host != "" {
		return r.URL.Host
	}
	return r.Host
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidOption}, args...)...)
}

// WithRate sets the published allowance: n requests per period per, for
// example WithRate(500, time.Minute). Each lane paces to n/per x headroom
// requests per second. Without WithRate a lane is not paced; it is bounded by
// its in-flight limit and by what the server says.
//
// A paced lane hands at most rate x T + burst + 1 requests to the base
// transport in any window T: tokens are charged when they were due rather
// than when a late timer woke the lane, up to one token's time early, so
// that late wake-ups cost no throughput.
func WithRate(n int, per time.Duration) Option {
	return optionFunc(func(c *config) error {
		if n <= 0 {
			return invalid("WithRate(%d, %v): n must be positive", n, per)
		}
		if per <= 0 {
			return invalid("WithRate(%d, %v): per must be positive", n, per)
		}
		c.rateN, c.ratePer = n, per
		return nil
	})
}

// WithBurst sets the token bucket's size: how many requests may leave at once
// after a lane has been idle. Default DefaultBurst (1).
func WithBurst(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 1 {
			return invalid("WithBurst(%d): burst must be at least 1", n)
		}
		c.burst = n
		return nil
	})
}

// WithHeadroom sets the fraction of the published rate to use, 0 < f <= 1.
// Default DefaultHeadroom (1).
func WithHeadroom(f float64) Option {
	return optionFunc(func(c *config) error {
		if !(f > 0 && f <= 1) { // also rejects NaN
			return invalid("WithHeadroom(%v): must be in (0, 1]", f)
		}
		c.headroom = f
		return nil
	})
}

// WithConcurrency bounds a lane's in-flight limit: the number of attempts
// sent and not yet finished (response body closed or read to EOF). min == max
// fixes the limit. Defaults DefaultMinConcurrency and DefaultMaxConcurrency.
//
// Between the bounds the limit adapts to observed latency (send to body
// done). With a rate it follows Little's law: 1.1 x rate x latency, plus an
// allowance for the spread of latencies (none when it does not vary), so
// that the rate, not the limit, paces the lane; it is max until the first
// answer. When latency rises at a
// flat completion rate under the rate, the upstream is queueing sluice's own
// requests, and the limit comes down to about what it serves at its no-load
// latency. With no rate this gradient alone sets the limit, starting at 4
// and growing while requests wait and latency holds. Refusals, overloads
// (502, 503, 504, 529) and transport errors are not latency samples. Stats reports the limit, the smoothed
// latency and the baseline; changes are logged at debug level.
func WithConcurrency(min, max int) Option {
	return optionFunc(func(c *config) error {
		if min < 1 {
			return invalid("WithConcurrency(%d, %d): min must be at least 1", min, max)
		}
		if max < min {
			return invalid("WithConcurrency(%d, %d): max must be at least min", min, max)
		}
		c.minConc, c.maxConc = min, max
		return nil
	})
}

// WithAging makes waiting raise a request's rank: a request that has waited
// d outranks a fresh one a level above it (a Batch request that has waited
// 2d outranks a fresh Interactive one). It guards lower levels against
// starvation at the cost of higher levels' wait. 0, the default, disables
// aging: strict priority.
func WithAging(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d < 0 {
			return invalid("WithAging(%v): must not be negative", d)
		}
		c.aging = d
		return nil
	})
}

// WithLowShare gives every n-th grant of a lane to the levels below the best
// waiter's when one of them is waiting, to the waiter among them that has
// waited longest, so the levels below receive at least 1/n of the rate
// under any load from above, and none of them starves: a waiter's wait
// only grows until it is the longest. n is 0 (no share: strict priority)
// or at least 2. Default DefaultLowShare (10).
func WithLowShare(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 0 || n == 1 {
			return invalid("WithLowShare(%d): n must be 0 (strict priority) or at least 2", n)
		}
		c.lowShare = n
		return nil
	})
}

// WithMaxWait refuses a request of level p at once, with a *RejectedError of
// Reason ReasonMaxWait, when its estimated wait exceeds d. By default only
// the context's deadline bounds the wait.
func WithMaxWait(p Priority, d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if !p.valid() {
			return invalid("WithMaxWait(%v, %v): unknown priority", p, d)
		}
		if d <= 0 {
			return invalid("WithMaxWait(%v, %v): must be positive", p, d)
		}
		c.maxWait[p] = d
		return nil
	})
}

// WithRetry sets how many attempts may follow the first; 0 disables retries.
// Default DefaultRetries (2).
func WithRetry(max int) Option {
	return optionFunc(func(c *config) error {
		if max < 0 {
			return invalid("WithRetry(%d): must not be negative", max)
		}
		c.retries = max
		return nil
	})
}

// WithRetryPolicy sets the policy that decides whether an attempt is retried.
// sluice's own safety rules apply on top of it: a server's X-Should-Retry
// or Stripe-Should-Retry answer decides first, either way; bodies that
// cannot be replayed are never retried, nor permanent errors (a bad
// certificate, too many redirects); a non-idempotent method is retried
// only on 429 and 503, unless the request carries an Idempotency-Key; and
// a request from an SDK that retries on its own (its X-Stainless-Retry-Count,
// X-Stripe-Client-User-Agent or Amz-Sdk-Request header, "azsdk-go-" in its
// User-Agent, "gccl-attempt-count/" in its X-Goog-Api-Client) is attempted
// once, whatever WithRetry says. Default: retryablehttp.DefaultRetryPolicy.
func WithRetryPolicy(p retryablehttp.CheckRetry) Option {
	return optionFunc(func(c *config) error {
		if p == nil {
			return invalid("WithRetryPolicy(nil)")
		}
		c.checkRetry = p
		return nil
	})
}

// WithBackoff sets how long to wait before a retry, held to
// WithMaxRetryAfter. It is called for every retry, with the answer that
// caused it; retryablehttp.DefaultBackoff waits a 429's or a 503's
// Retry-After, and so does the lane's pause. Default: no wait after an
// answer that names a time the lane pauses for (its pause holds the
// retry back, in its place in the queue), the time named after any other,
// and otherwise a random wait up to 250ms x 2^n (full jitter), at most
// 10s.
func WithBackoff(b retryablehttp.Backoff) Option {
	return optionFunc(func(c *config) error {
		if b == nil {
			return invalid("WithBackoff(nil)")
		}
		c.backoff = b
		return nil
	})
}

// WithMaxRetryAfter caps how long a server's Retry-After or rate-limit reset
// may pause a lane, and how long a retry's backoff waits. Default
// DefaultMaxRetryAfter (10 minutes).
func WithMaxRetryAfter(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d <= 0 {
			return invalid("WithMaxRetryAfter(%v): must be positive", d)
		}
		// Held to half a Duration's range: lane times are offsets of
		// years at most, and now + the cap must not overflow.
		c.maxRetryAfter = min(d, math.MaxInt64/2)
		return nil
	})
}

// WithKey sets which budget (lane) a request draws on. Requests with the same
// key share one rate, one queue and one in-flight limit. Default: the URL's
// host. A lane is forgotten once idle for WithLaneIdle (DefaultLaneIdle),
// so keys from an unbounded set (a tenant each, a host each) cost memory
// only while they are in use; a key per request still makes a lane per
// request, with no rate shared among them.
func WithKey(f func(*http.Request) string) Option {
	return optionFunc(func(c *config) error {
		if f == nil {
			return invalid("WithKey(nil)")
		}
		c.key = f
		return nil
	})
}

// WithSublimitKey names, for each request, the sub-limit it draws on
// besides its lane's limit (see WithSublimit), or "" for none: for example
// the model of an LLM call, read from the request's path or a header. A
// sub-limit named by the request's context comes first. Without it, a
// lane still learns the sub-limits that its responses name (GitHub's
// X-RateLimit-Resource, Discord's X-RateLimit-Bucket).
func WithSublimitKey(f func(*http.Request) string) Option {
	return optionFunc(func(c *config) error {
		if f == nil {
			return invalid("WithSublimitKey(nil)")
		}
		c.sublimitKey = f
		return nil
	})
}

// WithSublimitRate sets the published allowance of the sub-limit name, on
// every lane that has one (see WithSublimit): n requests per period per, as
// WithRate sets a lane's, for example each model's requests per minute
// where an LLM API limits models apart. The sub-limit paces to n/per x
// headroom, and slower where its responses say so; the lane's own rate and
// in-flight limit still apply to its requests. It applies to the sub-limit
// of that exact name, whether a caller or the server named it. Without it
// a sub-limit is not paced until its responses state a limit. A name must
// be valid UTF-8 of 1 to 64 bytes; setting a name again replaces its rate.
// With WithBackend the sub-limit's allowance is shared as a lane's is, under
// the key of its lane, "\x00" and its name.
func WithSublimitRate(name string, n int, per time.Duration) Option {
	return optionFunc(func(c *config) error {
		if name == "" || callerName(name) != name {
			return invalid("WithSublimitRate(%q, %d, %v): name must be valid UTF-8 of 1 to %d bytes", name, n, per, maxSublimit)
		}
		if n <= 0 {
			return invalid("WithSublimitRate(%q, %d, %v): n must be positive", name, n, per)
		}
		if per <= 0 {
			return invalid("WithSublimitRate(%q, %d, %v): per must be positive", name, n, per)
		}
		if c.subRates == nil {
			c.subRates = make(map[string]subRate)
		}
		c.subRates[name] = subRate{n, per}
		return nil
	})
}

// WithLogger sets where sluice logs (cooldowns, limit changes at debug
// level). Default: nowhere.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) error {
		if l == nil {
			return invalid("WithLogger(nil)")
		}
		c.logger = l
		return nil
	})
}

// WithLaneIdle forgets a lane (see WithKey) that has been idle for d: no
// request waiting or in flight, no cooldown or rate-limit reset still in
// force, and its token bucket and budgets full again. The next request of
// its key starts a fresh lane, at the configured rate. What is lost is what
// the lane had learned from the server: a rate cut by 429s, the kind and
// pace of its rate-limit headers, its latency and in-flight limit, and its
// counters (Stats). That is safe because nothing the server said is still
// in force by then, and a fresh lane relearns the rest from the next
// responses: at worst one 429 at the configured rate. d must not be
// negative; 0 keeps every lane for the Transport's life. The default is
// DefaultLaneIdle. Idle lanes are found by a sweep every d/2 that runs
// only while the Transport has lanes, so a lane is forgotten between d and
// 1.5 d after its last use.
func WithLaneIdle(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d < 0 {
			return invalid("WithLaneIdle(%v): d must not be negative", d)
		}
		c.laneIdle = d
		return nil
	})
}

func (c *config) validate() error {
	if _, ok := c.backend.(Leaser); len(c.budgets) > 0 && c.backend != nil && !ok {
		return invalid("WithBudget(%q, ...) with WithBackend of a %T: budgets are shared only through a Leaser", c.budgets[0].name, c.backend)
	}
	if c.rateN > 0 {
		// A rate that underflows to 0 (a tiny headroom) would mean no rate.
		if r := c.perSecond(); !(r > 0) || math.IsInf(r, 0) || r > 1e9 {
			return invalid("WithRate(%d, %v): %v per second is out of range", c.rateN, c.ratePer, r)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.subRates)) {
		sr := c.subRates[name]
		if r := perSecond(sr.n, sr.per, c.headroom); !(r > 0) || r > 1e9 {
			return invalid("WithSublimitRate(%q, %d, %v): %v per second is out of range", name, sr.n, sr.per, r)
		}
	}
	return nil
}

// WithTenantShare caps one tenant's attempts in flight at level p to
// max(1, floor(limit x share)), where limit is the lane's in-flight limit at
// the time (so the cap follows the adaptive limit). share must be in (0, 1].
// The floor of 1 is deliberate: a share that rounds to zero still lets the
// tenant send one attempt at a time, never none.
//
// A waiter whose tenant is at its cap keeps its place (and its aging) in the
// queue while the gate serves other tenants' waiters, and is served as soon
// as its tenant drops under the cap, or the limit grows. Requests without a
// tenant are one tenant, the anonymous one, and are capped like any other:
// with a share for level p, tag every caller of that level. By default no
// level has a cap: tenants only take turns.
func WithTenantShare(p Priority, share float64) Option {
	return optionFunc(func(c *config) error {
		if !p.valid() {
			return invalid("WithTenantShare(%v, %v): unknown priority", p, share)
		}
		if !(share > 0 && share <= 1) { // also refuses NaN
			return invalid("WithTenantShare(%v, %v): share must be in (0, 1]", p, share)
		}
		c.tenantShare[p] = share
		return nil
	})
}

// WithTenantQueue refuses, with ReasonTenantQueue, a request whose tenant
// already has n attempts waiting in the lane, so that one tenant's flood is
// turned away at once rather than queued behind its own backlog. It applies
// to requests that carry a tenant (WithTenant), not to the anonymous tenant;
// WithMaxQueue bounds the lane as a whole. n must be at least 1. By default
// a tenant's queue is not bounded.
func WithTenantQueue(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 1 {
			return invalid("WithTenantQueue(%d): n must be at least 1", n)
		}
		c.tenantQueue = n
		return nil
	})
}

// WithMaxQueue refuses, with ReasonQueueFull, a request that finds n
// attempts already waiting in its lane: past some depth a queue only adds
// latency, and the caller is better told at once. n must be at least 1. By
// default the queue is not bounded; requests with deadlines are refused
// early by their estimated wait anyway.
func WithMaxQueue(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 1 {
			return invalid("WithMaxQueue(%d): n must be at least 1", n)
		}
		c.maxQueue = n
		return nil
	})
}

// WithBudget gives every lane a budget besides its request rate: n units of
// name per period per, held in a bucket of n units (a period's worth, as
// OpenAI and Anthropic keep their token limits). A request draws on it by
// the cost its context carries (see WithCost), and waits, in priority
// order, until every budget it draws on can pay; a cost above n is refused
// at once (ReasonCost). For example:
//
//	sluice.WithRate(500, time.Minute), sluice.WithBudget("tokens", 30000, time.Minute)
//
// When a response states what remains of a budget of the same name (OpenAI's
// x-ratelimit-*-tokens is "tokens"; Anthropic's anthropic-ratelimit-*
// are "tokens", "input-tokens" and "output-tokens"), the lane takes the
// server's count, less what it sent since and what it sent before that is
// not answered yet (it may reach the server later). A budget named
// "points" is a GraphQL API's cost bucket as Shopify states it in the body
// of every answer on a graphql.json path (extensions.cost): the query's
// actual cost replaces the cost its context carried, and the bucket's
// currentlyAvailable is what remains. Names must be distinct and
// non-empty; at most 8 budgets.
//
// With WithBackend of a Leaser, the budgets are shared by every process on
// a key: the Leaser grants each lane a part of the fleet's budget by what
// it wants (see BudgetDemand), and a server's count sets the fleet's
// level; a lane the Leaser declines (see Leaser) keeps budgets of its
// own. New refuses WithBudget with a Backend that is not a Leaser.
func WithBudget(name string, n int, per time.Duration) Option {
	return optionFunc(func(c *config) error {
		switch {
		case name == "":
			return invalid("WithBudget(%q, %d, %v): name must not be empty", name, n, per)
		case n <= 0:
			return invalid("WithBudget(%q, %d, %v): n must be positive", name, n, per)
		case per <= 0:
			return invalid("WithBudget(%q, %d, %v): per must be positive", name, n, per)
		case float64(n)/per.Seconds() > 1e12:
			return invalid("WithBudget(%q, %d, %v): %v per second is out of range", name, n, per, float64(n)/per.Seconds())
		case len(c.budgets) == maxBudgets:
			return invalid("WithBudget(%q, %d, %v): more than %d budgets", name, n, per, maxBudgets)
		}
		for _, b := range c.budgets {
			if b.name == name {
				return invalid("WithBudget(%q, %d, %v): budget %q is already set", name, n, per, name)
			}
		}
		c.budgets = append(c.budgets, budgetConfig{name, n, per})
		return nil
	})
}

// WithRetryBudget sets the retry budget: over any RetryBudgetWindow, a
// lane's retries may number at most ratio x its first attempts, plus min.
// A retry the budget refuses is not made: the last response is returned.
// Defaults DefaultRetryRatio (0.2) and DefaultRetryMin (10).
func WithRetryBudget(ratio float64, min int) Option {
	return optionFunc(func(c *config) error {
		if !(ratio >= 0 && ratio <= 1) {
			return invalid("WithRetryBudget(%v, %d): ratio must be in [0, 1]", ratio, min)
		}
		if min < 0 {
			return invalid("WithRetryBudget(%v, %d): min must not be negative", ratio, min)
		}
		c.retryRatio, c.retryMin = ratio, min
		return nil
	})
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

// WithObserver adds o to the Observers of the Transport's events. It may be
// given more than once; each Observer sees every event, in order. Without
// one, a request pays one nil check for them.
func WithObserver(o Observer) Option {
	return optionFunc(func(c *config) error {
		if o == nil {
			return invalid("WithObserver(nil): the observer must not be nil")
		}
		c.observers = append(c.observers, o)
		return nil
	})
}
