package sluiceredis

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"
)

// Defaults, and why.
const (
	// DefaultPrefix starts every Redis key written, so that its
	// keys can be told apart (and scanned for) in a shared Redis.
	DefaultPrefix = "sluice:"

	// DefaultTimeout bounds every Redis call. A healthy Redis on the same
	// network answers the script in well under a millisecond; 50ms leaves
	// room for a busy server and a slow network, while a request that meets
	// a dead or stalled Redis loses at most that much before the fallback
	// budget serves it.
	DefaultTimeout = 50 * time.Millisecond

	// DefaultFallbackShare is the fraction of the rate each process may use
	// from its local budget while Redis is unreachable. The Backend cannot
	// know how many processes share a key, so it assumes a small fleet: a
	// quarter keeps up to four processes within the limit, and a larger
	// fleet that overshoots is slowed by what the server says (429s and
	// Retry-After, which every lane still obeys) until Redis is back. A
	// smaller default would idle a lone process for the length of an
	// outage. Set WithFallbackShare(1/N) when the fleet size N is known.
	DefaultFallbackShare = 0.25

	// probeEvery is how often a Backend that fell back tries Redis again.
	// Only the one Take that probes pays the timeout; the others use the
	// fallback without asking Redis.
	probeEvery = time.Second

	// DefaultRefresh is how often a Backend refreshes its shares (see
	// WithRefresh): a second moves a share to where it is needed within
	// two, and costs a fleet of 1,000 processes 1,000 script calls a
	// second per key.
	DefaultRefresh = time.Second

	// leasePoll is the wait Take returns when every in-flight lease is held:
	// the Backend is not told when another process releases one, so it
	// asks again. 20ms adds little to a request that waits for a lease, and
	// costs a waiting lane at most 50 calls a second.
	leasePoll = 20 * time.Millisecond
)

// ErrInvalidOption is wrapped by the errors New returns for a bad option.
var ErrInvalidOption = errors.New("sluiceredis: invalid option")

// An Option configures a Backend or Tokens. Options are checked by New and
// NewTokens, which return an error naming any bad value.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	prefix     string
	timeout    time.Duration
	share      float64
	leases     int           // 0: no in-flight cap
	leaseTTL   time.Duration // how long a lease outlives its process
	logger     *slog.Logger
	probeEvery time.Duration
	refresh    time.Duration // a Backend's refresh interval; 0: Tokens
}

func defaultConfig() config {
	return config{
		prefix:     DefaultPrefix,
		timeout:    DefaultTimeout,
		share:      DefaultFallbackShare,
		logger:     slog.New(slog.DiscardHandler),
		probeEvery: probeEvery,
	}
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidOption}, args...)...)
}

// WithPrefix sets what every Redis key written starts with. The keys
// of a budget named key are prefix + "{" + key + "}" + a suffix: the braces
// are a Redis Cluster hash tag, so that one budget's keys share a slot and
// one script can touch them all. So the prefix must not contain braces
// itself. (A key that is empty or contains a brace, which would make an
// empty or a cut tag, is written in hex inside the braces instead, and
// marked: prefix + "{=" + hex(key) + "}=:" + a suffix.) Default
// DefaultPrefix ("sluice:").
func WithPrefix(p string) Option {
	return optionFunc(func(c *config) error {
		if strings.ContainsAny(p, "{}") {
			return invalid("WithPrefix(%q): must not contain '{' or '}'", p)
		}
		c.prefix = p
		return nil
	})
}

// WithTimeout bounds every Redis call: a Backend's refreshes and Cool;
// Tokens' Take, Done and Cool. A call that runs out of time counts as
// Redis being unreachable for its key: Tokens go to their fallback for at
// least a probe interval (a second), and a Backend keeps its share until
// its lease ends. Set it well above the slowest answer you expect from a
// healthy Redis. Default DefaultTimeout (50ms).
func WithTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d <= 0 {
			return invalid("WithTimeout(%v): must be positive", d)
		}
		c.timeout = d
		return nil
	})
}

// WithFallbackShare sets what each process may use while Redis is
// unreachable for a key: a local budget of f times the rate (and, with
// WithInFlight, of f times the in-flight cap, at least 1), 0 <= f <= 1. A
// Backend uses it only for a key it never had a share of (after one, it
// falls back to the rate divided by the processes it last shared with).
// For Tokens, f = 0 means no local budget: Take then fails with an error
// wrapping ErrUnavailable.
// Each outage, the local budget starts empty at a random phase and runs at
// a random 95-100% of f times the rate, so that processes that lose Redis
// together do not send in step. Default DefaultFallbackShare (0.25).
func WithFallbackShare(f float64) Option {
	return optionFunc(func(c *config) error {
		if !(f >= 0 && f <= 1) { // also rejects NaN
			return invalid("WithFallbackShare(%v): must be in [0, 1]", f)
		}
		c.share = f
		return nil
	})
}

// WithInFlight caps the attempts in flight under one key across every
// process at n. A Backend shares the n places out as it shares the rate,
// by what each process's lanes have waiting and in flight at each level,
// for three refreshes, and ttl does not apply. With Tokens, each attempt
// holds a lease, an entry in a Redis sorted set
// that expires after ttl, from Take until Done. While a process holds
// leases, a goroutine renews them every ttl/3, so an attempt
// may run for longer than ttl (a streamed response) and keep its place; a
// process that dies, or loses Redis, holds its leases for at most ttl. So
// ttl need not cover the longest call: it is how long a dead process's
// places stay taken, and a few renewal periods of slack against a slow
// Redis. 30 seconds suits most fleets. An attempt whose body is never
// closed holds its lease for as long as its process lives, as it holds its
// lane's slot. By default there is no cap.
func WithInFlight(n int, ttl time.Duration) Option {
	return optionFunc(func(c *config) error {
		if n < 1 {
			return invalid("WithInFlight(%d, %v): n must be at least 1", n, ttl)
		}
		if ttl < time.Millisecond || ttl > 24*time.Hour {
			return invalid("WithInFlight(%d, %v): ttl must be between 1ms and 24h", n, ttl)
		}
		c.leases, c.leaseTTL = n, ttl
		return nil
	})
}

// WithRefresh sets how often a Backend refreshes its shares: every
// refresh, each process tells Redis what its lanes on a key want at each
// priority level, and is granted a share of the key's rate (and, with
// WithInFlight, of its places in flight) for three refreshes. A shorter
// refresh moves shares between processes sooner, at one script call per
// key per refresh per process. refresh must be between 10ms and 1 minute;
// the default, DefaultRefresh (1s), suits most fleets. NewTokens refuses
// it: tokens are not leased.
func WithRefresh(refresh time.Duration) Option {
	return optionFunc(func(c *config) error {
		if refresh < 10*time.Millisecond || refresh > time.Minute {
			return invalid("WithRefresh(%v): refresh must be between 10ms and 1m", refresh)
		}
		c.refresh = refresh
		return nil
	})
}

// WithLogger sets where a Backend or Tokens log: once per key (warning)
// when it falls back because Redis is unreachable, and once (info) when
// Redis answers again.
// Default: nowhere.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) error {
		if l == nil {
			return invalid("WithLogger(nil)")
		}
		c.logger = l
		return nil
	})
}

// fallbackLeases is the in-flight cap of the local fallback budget.
func (c *config) fallbackLeases() int {
	return max(1, int(math.Floor(float64(c.leases)*c.share)))
}
