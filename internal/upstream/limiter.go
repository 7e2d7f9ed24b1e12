package upstream

import (
	"math"
	"math/bits"
	"net/http"
	"strconv"
	"time"
)

// A Limiter is a server's rate-limit policy: it decides whether a request
// is served and what the response says about the limit. Set it as
// [Config.Limiter]; the models in this package ([NewGitHub], [NewOpenAI],
// [NewAnthropic], [NewIETF], [NewGCRA], [NewSlidingWindow]) are Limiters.
//
// The [Server] calls Admit once per request, in arrival order, under its
// own lock, with the instant the request reached the handler: Admit must
// not block. Admit must commit what an accepted request consumes.
type Limiter interface {
	Admit(now time.Time, r *http.Request) Decision
}

// Decision is a [Limiter]'s answer for one request.
type Decision struct {
	// Accepted requests are served (after Config.Latency) by
	// Config.Handler; the others are answered at once with Status and Body.
	Accepted bool
	Status   int    // status of a refusal; 0 means 429
	Body     string // body of a refusal; "" means "rate limited"
	// Header is added to the response, accepted or not.
	Header http.Header
	// Done, if not nil, is called when the server is done with the
	// request: its response written, or the request abandoned.
	Done func()
}

// bucket is a token bucket of capacity tokens that refills completely in
// fill (so at capacity/fill tokens per unit of time), kept as a GCRA
// theoretical arrival time: it is full when tat <= now, and in general
// holds capacity·(1 - (tat-now)/fill) tokens. All arithmetic is in whole
// nanoseconds, so results are exact in a synctest bubble; the cost of n
// tokens is rounded up, so the bucket is never more generous than its
// published rate.
type bucket struct {
	capacity int64
	fill     time.Duration
	tat      time.Time
}

func newBucket(capacity int64, fill time.Duration) bucket {
	return bucket{capacity: capacity, fill: fill}
}

// cost is the time n tokens take to refill.
func (b *bucket) cost(n int64) time.Duration {
	return time.Duration(mulDiv(n, int64(b.fill), b.capacity, true))
}

// untilFull is the time until the bucket is full again.
func (b *bucket) untilFull(now time.Time) time.Duration {
	return max(b.tat.Sub(now), 0)
}

// wait is the time until n tokens are available: 0 if they are now, and
// -1 if they never will be (n exceeds the capacity).
func (b *bucket) wait(now time.Time, n int64) time.Duration {
	if n > b.capacity {
		return -1
	}
	allowAt := now.Add(b.untilFull(now) + b.cost(n) - b.fill)
	return max(allowAt.Sub(now), 0)
}

// take removes n tokens, which must be available (wait(now, n) == 0).
func (b *bucket) take(now time.Time, n int64) {
	b.tat = now.Add(b.untilFull(now) + b.cost(n))
}

// admit decides one request at now: it takes a token if one is there, and
// otherwise refuses with Retry-After in whole seconds, rounded up.
func (b *bucket) admit(now time.Time) Decision {
	d := Decision{Header: http.Header{}}
	if wait := b.wait(now, 1); wait == 0 {
		d.Accepted = true
		b.take(now, 1)
	} else {
		d.Header.Set("Retry-After", ceilSecondsStr(wait))
	}
	return d
}

// remaining is the number of whole tokens in the bucket.
func (b *bucket) remaining(now time.Time) int64 {
	return mulDiv(int64(b.fill-b.untilFull(now)), b.capacity, int64(b.fill), false)
}

// untilNext is the time until the bucket holds one more whole token than
// now: 0 if it is full.
func (b *bucket) untilNext(now time.Time) time.Duration {
	uf := b.untilFull(now)
	if uf == 0 {
		return 0
	}
	r := b.remaining(now)
	// The bucket holds r+1 tokens when untilFull drops to fill - cost(r+1).
	target := max(b.fill-b.cost(r+1), 0)
	return max(uf-target, 1)
}

// mulDiv returns a·b/c for non-negative a, b and positive c, rounded down
// (or up), without overflowing the intermediate product; it saturates at
// math.MaxInt64.
func mulDiv(a, b, c int64, roundUp bool) int64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, rem := bits.Div64(hi, lo, uint64(c))
	if roundUp && rem != 0 {
		q++
	}
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// ceilSecondsStr is d in whole seconds, rounded up, as a decimal string.
func ceilSecondsStr(d time.Duration) string {
	return strconv.FormatInt(ceilSeconds(d), 10)
}

// ceilTime rounds t up to the whole second.
func ceilTime(t time.Time) time.Time {
	if tt := t.Truncate(time.Second); tt.Before(t) {
		return tt.Add(time.Second)
	}
	return t
}

// itoa is strconv.FormatInt for int64.
func itoa(n int64) string { return strconv.FormatInt(n, 10) }
