package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/didip/tollbooth/v8"
	"github.com/didip/tollbooth/v8/limiter"
	"github.com/go-chi/httprate"
	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/sethvargo/go-limiter/httplimit"
	"github.com/sethvargo/go-limiter/memorystore"
	"github.com/throttled/throttled/v2"
	"github.com/throttled/throttled/v2/store/memstore"
	ulule "github.com/ulule/limiter/v3"
	ululestd "github.com/ulule/limiter/v3/drivers/middleware/stdlib"
	ululemem "github.com/ulule/limiter/v3/drivers/store/memory"
)

// The real middleware: servers built from the rate-limiting packages Go
// APIs use, each in the set-up its documentation shows, with the headers
// it sends by default. Each limits one key (every request of a run comes
// from the same loopback address).
//
// A window of a minute is scaled down in time by minuteScale where the
// package lets the period be set: the limit of a minute at rate R, 60R,
// becomes 60R/minuteScale per 60 s/minuteScale (300 per 6 s at 50/s),
// which keeps the window's shape (its length in requests, its refill all
// at once or sliding) within a run of seconds. Packages whose window is
// not a count over a period are served at one window only: throttled is
// a GCRA, whose period only sets the emission interval (PerMin(60R) and
// PerSec(R) are the same limiter, with the same headers), and tollbooth's
// limit is always per second.
const minuteScale = 10

// minuteWindow is a minute scaled by minuteScale.
const minuteWindow = time.Minute / minuteScale

// A middleware builds the limiting handler around next; stop releases
// what it holds (a store's goroutines, a Redis client). redisAddr is the
// address of a redis-server for the packages that need one, "" otherwise.
type middleware func(next http.Handler, redisAddr string) (h http.Handler, stop func(), err error)

// realRates are the published rates the matrix serves each middleware at.
var realRates = []int{10, 50, 200}

// realModels returns the real middleware at every rate and window.
func realModels() []model {
	var ms []model
	for _, r := range realRates {
		ms = append(ms,
			mwModel(fmt.Sprintf("throttled GCRA, MaxBurst 5, %d/s", r), r, time.Second, false, throttledGCRA(r, 5)),
			mwModel(fmt.Sprintf("go-chi/httprate, %d per 1 s", r), r, time.Second, false, httprateWindow(r, time.Second)),
			mwModel(fmt.Sprintf("go-chi/httprate, %d per %v (a minute scaled)", r*60/minuteScale, minuteWindow), r*60/minuteScale, minuteWindow, false, httprateWindow(r*60/minuteScale, minuteWindow)),
			mwModel(fmt.Sprintf("sethvargo/go-limiter, %d per 1 s", r), r, time.Second, false, goLimiter(r, time.Second)),
			mwModel(fmt.Sprintf("sethvargo/go-limiter, %d per %v (a minute scaled)", r*60/minuteScale, minuteWindow), r*60/minuteScale, minuteWindow, false, goLimiter(r*60/minuteScale, minuteWindow)),
			mwModel(fmt.Sprintf("ulule/limiter \"%d-S\"", r), r, time.Second, false, ululeFormatted(fmt.Sprintf("%d-S", r))),
			mwModel(fmt.Sprintf("ulule/limiter, %d per %v (a minute scaled)", r*60/minuteScale, minuteWindow), r*60/minuteScale, minuteWindow, false, ululeRate(ulule.Rate{Period: minuteWindow, Limit: int64(r * 60 / minuteScale)})),
			mwModel(fmt.Sprintf("didip/tollbooth, %d/s", r), r, time.Second, false, tollboothLimit(r)),
			mwModel(fmt.Sprintf("go-redis/redis_rate PerSecond(%d)", r), r, time.Second, true, redisRate(redis_rate.PerSecond(r))),
			mwModel(fmt.Sprintf("go-redis/redis_rate, %d per %v, burst %d (a minute scaled)", r*60/minuteScale, minuteWindow, r*60/minuteScale), r*60/minuteScale, minuteWindow, true,
				redisRate(redis_rate.Limit{Rate: r * 60 / minuteScale, Period: minuteWindow, Burst: r * 60 / minuteScale})),
		)
	}
	ms = append(ms, mwModel("go-redis/redis_rate PerSecond(50), burst 1", 50, time.Second, true,
		redisRate(redis_rate.Limit{Rate: 50, Period: time.Second, Burst: 1})))
	both := mwModel("strict GCRA (throttled, burst 1), IETF RateLimit and X-RateLimit-* with epoch reset, 100/s, 64 callers", 100, time.Second, false, bothHeadersGCRA(100))
	both.workers = 64
	return append(ms, both)
}

func mwModel(name string, limit int, per time.Duration, redis bool, mw middleware) model {
	return model{name: name, limit: limit, per: per, mw: mw, redis: redis}
}

// throttledGCRA is throttled's README set-up: a GCRA over the in-memory
// store, MaxBurst requests above the rate. It sends X-RateLimit-Limit
// (MaxBurst+1), -Remaining, -Reset (whole seconds until full, rounded up)
// and, on a 429, Retry-After in whole seconds rounded up.
func throttledGCRA(perSec, burst int) middleware {
	return func(next http.Handler, _ string) (http.Handler, func(), error) {
		st, err := memstore.NewCtx(65536)
		if err != nil {
			return nil, nil, err
		}
		rl, err := throttled.NewGCRARateLimiterCtx(st, throttled.RateQuota{MaxRate: throttled.PerSec(perSec), MaxBurst: burst})
		if err != nil {
			return nil, nil, err
		}
		h := &throttled.HTTPRateLimiterCtx{RateLimiter: rl, VaryBy: &throttled.VaryBy{Path: true}}
		return h.RateLimit(next), func() {}, nil
	}
}

// httprateWindow is httprate's sliding-window counter, one bucket for all
// (LimitBy with Key("*")). It sends X-RateLimit-Limit, -Remaining, -Reset
// (the Unix time the current window ends) and, on a 429, Retry-After: the
// window in whole seconds.
func httprateWindow(n int, window time.Duration) middleware {
	return func(next http.Handler, _ string) (http.Handler, func(), error) {
		return httprate.LimitBy(n, window, httprate.Key("*"))(next), func() {}, nil
	}
}

// goLimiter is go-limiter's httplimit over memorystore: a window of
// tokens per interval that refills all at once. It sends
// X-RateLimit-Limit, -Remaining, -Reset and, on a 429, Retry-After, the
// reset and Retry-After both the window's end formatted with time.RFC1123
// in UTC ("Tue, 02 Jan 2024 15:04:05 UTC").
func goLimiter(tokens int, interval time.Duration) middleware {
	return func(next http.Handler, _ string) (http.Handler, func(), error) {
		st, err := memorystore.New(&memorystore.Config{Tokens: uint64(tokens), Interval: interval})
		if err != nil {
			return nil, nil, err
		}
		m, err := httplimit.NewMiddleware(st, httplimit.IPKeyFunc())
		if err != nil {
			st.Close(context.Background())
			return nil, nil, err
		}
		return m.Handle(next), func() { st.Close(context.Background()) }, nil
	}
}

// ululeFormatted is ulule/limiter's stdlib middleware over its memory
// store, at a rate in its "N-S" notation: a fixed window. It sends
// X-RateLimit-Limit, -Remaining and -Reset (the Unix time the window
// ends), and no Retry-After.
func ululeFormatted(rate string) middleware {
	return func(next http.Handler, addr string) (http.Handler, func(), error) {
		r, err := ulule.NewRateFromFormatted(rate)
		if err != nil {
			return nil, nil, err
		}
		return ululeRate(r)(next, addr)
	}
}

// ululeRate is ululeFormatted with the rate given as a period and a limit.
func ululeRate(rate ulule.Rate) middleware {
	return func(next http.Handler, _ string) (http.Handler, func(), error) {
		m := ululestd.NewMiddleware(ulule.New(ululemem.NewStore(), rate))
		return m.Handler(next), func() {}, nil
	}
}

// tollboothLimit is tollbooth's HTTPMiddleware at perSec requests a
// second (a token bucket of as many, its default burst), keyed by the
// remote address. It sends X-Rate-Limit-Limit, X-Rate-Limit-Duration: 1
// and the draft IETF RateLimit-Limit, RateLimit-Remaining and
// RateLimit-Reset: 1, and no Retry-After.
func tollboothLimit(perSec int) middleware {
	return func(next http.Handler, _ string) (http.Handler, func(), error) {
		lmt := tollbooth.NewLimiter(float64(perSec), nil)
		lmt.SetIPLookup(limiter.IPLookup{Name: "RemoteAddr"})
		return tollbooth.HTTPMiddleware(lmt)(next), func() {}, nil
	}
}

// redisRate is go-redis/redis_rate's GCRA on a real redis-server.
// redis_rate ships no HTTP middleware; this is the handler its README's
// Allow leads to, sending what it returns the usual way:
// X-RateLimit-Limit (the rate per period), -Remaining, -Reset (the Unix
// time the limiter is back to full, rounded up to the second) and, on a
// 429, Retry-After in whole seconds rounded up.
func redisRate(lim redis_rate.Limit) middleware {
	return func(next http.Handler, addr string) (http.Handler, func(), error) {
		if addr == "" {
			return nil, nil, fmt.Errorf("redis_rate needs a redis-server")
		}
		rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
		if err := rdb.FlushDB(context.Background()).Err(); err != nil {
			rdb.Close()
			return nil, nil, err
		}
		rl := redis_rate.NewLimiter(rdb)
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			res, err := rl.Allow(r.Context(), "bench", lim)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			h := w.Header()
			h.Set("X-RateLimit-Limit", strconv.Itoa(lim.Rate))
			h.Set("X-RateLimit-Remaining", strconv.Itoa(res.Remaining))
			reset := time.Now().Add(res.ResetAfter)
			h.Set("X-RateLimit-Reset", strconv.FormatInt(int64(math.Ceil(float64(reset.UnixNano())/1e9)), 10))
			if res.Allowed == 0 {
				h.Set("Retry-After", strconv.FormatInt(int64(math.Ceil(res.RetryAfter.Seconds())), 10))
				http.Error(w, "rate limit exceeded", http.StatusTooManyRequests)
				return
			}
			next.ServeHTTP(w, r)
		})
		return h, func() { rdb.Close() }, nil
	}
}
