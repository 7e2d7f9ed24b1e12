package pace

import (
	"math"
	"time"
)

// bucket is a lane's token bucket: it holds at most burst tokens, starts
// full, and gains rate tokens a second. It decides as x/time/rate's Limiter
// does for the same calls, to the float (bucket_test.go replays random call
// sequences against a Limiter and compares every answer), but it has no
// lock: its owner locks (see docs/design.md, "The token bucket").
//
// It differs from a Limiter in one way: a time earlier than the latest one
// it was given counts as no time at all, and does not move that latest time
// back, so no interval is credited twice (golang/go#65508, where a Limiter
// over-admits when given times that run backwards). The lane feeds it
// non-decreasing times anyway.
//
// Times are readings of the lane's clock: offsets from an epoch, not
// time.Time, which costs more to subtract and compare.
type bucket struct {
	rate   float64 // tokens a second, > 0; +Inf: no limit
	burst  float64
	tokens float64 // at last; may exceed burst until the next advance
	last   time.Duration
	// held counts the tokens prepaid and not yet spent (see prepay): the
	// bucket holds at most burst - held.
	held float64
}

func newBucket(rate float64, burst int) *bucket {
	return &bucket{rate: rate, burst: float64(burst), tokens: float64(burst)}
}

// advance returns the tokens held at now.
func (b *bucket) advance(now time.Duration) float64 {
	t := b.tokens
	if d := now - b.last; d > 0 {
		t += d.Seconds() * b.rate
	}
	return min(t, b.burst-b.held)
}

// set records that the bucket holds t tokens at now.
func (b *bucket) set(now time.Duration, t float64) {
	b.tokens = t
	if now > b.last {
		b.last = now
	}
}

// take takes a token at now if there is one, and reports whether it did.
func (b *bucket) take(now time.Duration) bool {
	if math.IsInf(b.rate, 1) {
		return true
	}
	t := b.advance(now) - 1
	// A Limiter allows an event whose token is due within the nanosecond:
	// its wait, truncated to whole nanoseconds, is zero. Compared as a
	// float: a wait of centuries would overflow a Duration.
	if t < 0 && -t/b.rate*1e9 >= 1 {
		return false
	}
	b.set(now, t)
	return true
}

// takeLate is take for a dispatcher that slept until a token was due and
// woke up late: the token is charged at the instant it was due, not at now,
// so the lateness costs no throughput, but never earlier than now - lag, so
// that a grant is charged at most lag before it is handed out. With lag one
// token's time (1/rate) the times tokens are handed out keep within
// rate x T + burst + 1 in any window T: a hand-off at h is charged in
// [h - 1/rate, h], and the charges keep within rate x T + burst.
func (b *bucket) takeLate(now, lag time.Duration) bool {
	if math.IsInf(b.rate, 1) {
		return true
	}
	at := max(now-lag, b.last)
	if b.tokens < 1 {
		// The instant the bucket held one token: later than at if the
		// dispatcher was less than lag late.
		// Compared as a float: a slow bucket's wait may not fit a
		// Duration, and would wrap to an instant long past.
		wait := math.Ceil((1 - b.tokens) / b.rate * 1e9)
		if wait > float64(now-b.last) {
			return b.take(now)
		}
		at = max(at, b.last+time.Duration(wait))
	}
	b.set(at, b.advance(at)-1)
	return true
}

// refund gives back a token taken and not used. The bucket may hold more
// than burst until its next advance, which caps it: a refund to a full
// bucket is lost, as if the token had never been taken.
func (b *bucket) refund(now time.Duration) {
	if math.IsInf(b.rate, 1) {
		return
	}
	b.set(now, b.advance(now)+1)
}

// prepay takes up to n whole tokens at now for grants made later, and
// returns how many it took. Until spend or unprepay counts them back, they
// count against the bucket's size: the bucket and the prepaid tokens never
// hold more than burst together, so grants made from them keep within the
// same bound as grants made at once. The count is kept whatever the rate,
// which may change meanwhile.
func (b *bucket) prepay(now time.Duration, n int) int {
	k := float64(n)
	if !math.IsInf(b.rate, 1) {
		t := b.advance(now)
		if k = min(k, math.Floor(t)); k < 1 {
			return 0
		}
		b.set(now, t-k)
	}
	b.held += k
	return int(k)
}

// spend counts at now n prepaid tokens as used: the bucket's size is its
// own again from now on. The bucket is settled at its smaller size first:
// time that passed while it was full at that size must not fill it
// further.
func (b *bucket) spend(now time.Duration, n int) {
	if !math.IsInf(b.rate, 1) {
		b.set(now, b.advance(now))
	}
	b.held -= float64(n)
}

// unprepay gives back at now n prepaid tokens that were not used.
func (b *bucket) unprepay(now time.Duration, n int) {
	t := b.advance(now)
	b.held -= float64(n)
	if !math.IsInf(b.rate, 1) {
		b.set(now, t+float64(n))
	}
}

// drain empties the bucket at now.
func (b *bucket) drain(now time.Duration) {
	b.set(now, 0)
}

// tokensAt returns the tokens held at now; burst with no limit.
func (b *bucket) tokensAt(now time.Duration) float64 {
	if math.IsInf(b.rate, 1) {
		return b.burst
	}
	return b.advance(now)
}

// setRate changes the rate from now on. A bucket that filled before now,
// set to a rate no higher, keeps the instant it filled as its latest time:
// a dispatcher late for a token due then may still charge it then (see
// takeLate). A lane whose responses restate its rate as often as it sends
// would otherwise lose the lateness of every grant a response comes just
// before. A higher rate would count from that instant and credit more
// than the old rate gave before now, beyond rate x T + burst + 1.
func (b *bucket) setRate(now time.Duration, rate float64) {
	if !math.IsInf(b.rate, 1) {
		at := now
		if b.rate > 0 && rate <= b.rate && b.tokens < b.burst && now > b.last {
			// Compared in seconds: a slow bucket's fill time may not fit
			// a Duration.
			if fill := (b.burst - b.tokens) / b.rate; fill < (now - b.last).Seconds() {
				at = min(now, b.last+time.Duration(math.Ceil(fill*1e9)))
			}
		}
		b.set(at, b.advance(at))
	} else {
		// An unlimited bucket did not count its tokens: it is full.
		b.set(now, b.burst)
	}
	b.rate = rate
}

// fullAt returns a bucket of size burst gaining rate tokens a second,
// full at now.
func fullAt(rate, burst float64, now time.Duration) bucket {
	return bucket{rate: rate, burst: burst, tokens: burst, last: now}
}

// perSecond returns the tokens the bucket gains a second; +Inf: no limit.
func (b *bucket) perSecond() float64 { return b.rate }

// size returns the most tokens the bucket holds (0: a share not granted
// yet).
func (b *bucket) size() float64 { return b.burst }

// setBurst makes the bucket's size n from its next advance on.
func (b *bucket) setBurst(n float64) { b.burst = n }

// resize makes the bucket's size n at now: a smaller size caps what it
// holds now, a larger one adds nothing yet.
func (b *bucket) resize(now time.Duration, n float64) {
	held := b.tokensAt(now)
	b.burst = n
	b.set(now, min(held, n))
}

// TokensDelay returns how long a bucket filling at r per second takes to gain
// n tokens, rounded up so that the tokens are there when it ends.
func TokensDelay(n, r float64) time.Duration {
	if n <= 0 {
		return 0
	}
	if r <= 0 {
		return math.MaxInt64
	}
	s := math.Ceil(n / r * 1e9)
	if s >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(s)
}

// TokenTime returns one token's time at rate r, rounded down.
func TokenTime(r float64) time.Duration {
	return time.Duration(min(1e9/r, math.MaxInt64/2))
}

// A Bucket is a token bucket for a caller that locks around it (a lane's
// budgets): it holds at most Burst tokens and gains Rate tokens a second,
// as a lane's own bucket does, and may hold fewer than none. Its zero value
// holds nothing and gains nothing.
type Bucket struct{ b bucket }

// NewBucket returns a bucket gaining rate tokens a second (0: none), of
// size burst, holding tokens at the clock's epoch.
func NewBucket(rate, burst, tokens float64) Bucket {
	return Bucket{bucket{rate: rate, burst: burst, tokens: tokens}}
}

// Stop empties the bucket and stops its refill. It keeps the bucket's
// size, which callers read without their lock (it is fixed at
// construction).
func (b *Bucket) Stop() { b.b.rate, b.b.tokens = 0, 0 }

// Rate returns the tokens the bucket gains a second.
func (b *Bucket) Rate() float64 { return b.b.rate }

// Burst returns the bucket's size.
func (b *Bucket) Burst() float64 { return b.b.burst }

// Level returns the tokens held at now, at most Burst; a time earlier than
// the latest one given counts as no time.
func (b *Bucket) Level(now time.Duration) float64 { return b.b.advance(now) }

// Set records that the bucket holds t tokens at now; it may be more than
// Burst until the next Level, or less than none.
func (b *Bucket) Set(now time.Duration, t float64) { b.b.set(now, t) }
