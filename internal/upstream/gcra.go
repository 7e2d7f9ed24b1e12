package upstream

import (
	"fmt"
	"net/http"
	"sync"
	"time"
)

// GCRAConfig configures a [GCRA] server model.
type GCRAConfig struct {
	// Rate requests per Per (default one second) is the sustained rate;
	// Rate must be positive.
	Rate int
	Per  time.Duration
	// Burst is the number of requests accepted at once after a pause:
	// throttled's RateQuota.MaxBurst+1, redis_rate's Limit.Burst. Default
	// 1: strict, a request even 1 ns before its turn is refused.
	Burst int
	// NoHeaders sends no X-RateLimit-* at all: a refusal is a bare 429 with
	// Retry-After.
	NoHeaders bool
}

// GCRA models the rate-limiting middlewares built on GCRA, such as
// github.com/throttled/throttled and github.com/go-redis/redis_rate.
//
// The headers are those of throttled's HTTPRateLimiterCtx
// (throttled/throttled http.go, setRateLimitHeaders, at commit 9e814f2):
// on every response, accepted or refused,
//
//	X-RateLimit-Limit: <Burst>               (RateLimitResult.Limit = MaxBurst+1: the burst, not the rate)
//	X-RateLimit-Remaining: <requests that could be sent at once now>
//	X-RateLimit-Reset: <seconds until the bucket is full again, rounded up>  (int(math.Ceil(ResetAfter.Seconds())))
//
// and on a refusal (429) also Retry-After: <seconds until the request
// would be accepted, rounded up> (int(math.Ceil(RetryAfter.Seconds()))).
// Remaining and ResetAfter are computed as in throttled's rate.go
// (RateLimitCtx): ResetAfter = newTAT-now after an accepted request,
// TAT-now after a refused one; Remaining = floor((Burst·T - ResetAfter)/T)
// for the emission interval T, so a strict (burst 1) server says
// "remaining 0, reset 1" after every accepted request.
//
// redis_rate (go-redis/redis_rate rate.go and lua.go at commit 8eadf45)
// sends no headers itself: its Result has Remaining (the same floor),
// RetryAfter and ResetAfter (the same definitions, "the time until the
// RateLimiter returns to its initial state"), and middlewares that use it
// write them as above. With NoHeaders the model stands for a middleware
// that sends only 429 and Retry-After.
type GCRA struct {
	cfg GCRAConfig

	mu sync.Mutex
	b  bucket
}

// NewGCRA returns a GCRA model. It panics if cfg is invalid.
func NewGCRA(cfg GCRAConfig) *GCRA {
	if cfg.Per == 0 {
		cfg.Per = time.Second
	}
	if cfg.Burst == 0 {
		cfg.Burst = 1
	}
	if cfg.Rate <= 0 || cfg.Per < 0 || cfg.Burst < 0 {
		panic(fmt.Sprintf("upstream: invalid GCRAConfig %+v", cfg))
	}
	fill := time.Duration(mulDiv(int64(cfg.Burst), int64(cfg.Per), int64(cfg.Rate), true))
	return &GCRA{cfg: cfg, b: newBucket(int64(cfg.Burst), fill)}
}

// Rate returns the published rate in requests per second.
func (m *GCRA) Rate() float64 { return float64(m.cfg.Rate) / m.cfg.Per.Seconds() }

// Admit implements [Limiter].
func (m *GCRA) Admit(now time.Time, _ *http.Request) Decision {
	m.mu.Lock()
	defer m.mu.Unlock()
	d := m.b.admit(now)
	if !m.cfg.NoHeaders {
		d.Header.Set("X-RateLimit-Limit", itoa(int64(m.cfg.Burst)))
		d.Header.Set("X-RateLimit-Remaining", itoa(m.b.remaining(now)))
		d.Header.Set("X-RateLimit-Reset", ceilSecondsStr(m.b.untilFull(now)))
	}
	return d
}
