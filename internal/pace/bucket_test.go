package pace

import (
	"encoding/binary"
	"math"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// FuzzBucketMatchesLimiter replays a call sequence, decoded from the input,
// on a bucket and on x/time/rate's Limiter, with non-decreasing times (as a
// lane gives them; the bucket's as offsets from an epoch), and requires the same answer to every call and the same
// tokens after it, to the float. Each call is three bytes: an operation, and
// how far the clock moves first (in units that span nanoseconds to seconds).
func FuzzBucketMatchesLimiter(f *testing.F) {
	f.Add(uint16(10), uint8(1), []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0x0f, 0, 0x10, 0})
	f.Add(uint16(1000), uint8(5), []byte{0, 1, 0, 1, 2, 0, 0, 3, 0, 3, 0x40, 0, 2, 0, 0, 0, 9, 9})
	f.Add(uint16(1), uint8(200), []byte{3, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 2, 0, 0})
	f.Fuzz(func(t *testing.T, r uint16, burst uint8, ops []byte) {
		if r == 0 || burst == 0 {
			return
		}
		b := newBucket(float64(r), int(burst))
		lim := rate.NewLimiter(rate.Limit(r), int(burst))
		epoch := time.Unix(1e9, 0)
		now := epoch
		for i := 0; i+2 < len(ops) && i < 3*1000; i += 3 {
			// The step's unit grows with the top bits of its first byte:
			// ns, µs, ms or 100 ms.
			step := time.Duration(binary.LittleEndian.Uint16(ops[i+1:]))
			step *= [...]time.Duration{1, time.Microsecond, time.Millisecond, 100 * time.Millisecond}[ops[i]>>6]
			now = now.Add(step)
			switch op := ops[i] & 0x3f % 4; op {
			case 0:
				if got, want := b.take(now.Sub(epoch)), lim.AllowN(now, 1); got != want {
					t.Fatalf("call %d: take at +%v = %v, Limiter says %v", i/3, step, got, want)
				}
			case 1:
				b.refund(now.Sub(epoch))
				lim.AllowN(now, -1)
			case 2:
				nr := 1 + float64(binary.LittleEndian.Uint16(ops[i+1:]))
				b.setRate(now.Sub(epoch), nr)
				lim.SetLimitAt(now, rate.Limit(nr))
			case 3: // only the clock moves
			}
			if got, want := b.tokensAt(now.Sub(epoch)), lim.TokensAt(now); got != want {
				t.Fatalf("call %d (op %d): %v tokens, Limiter has %v", i/3, ops[i]&0x3f%4, got, want)
			}
		}
	})
}

// TestBucketIgnoresTimeRunningBackwards: an earlier time is no time at all.
// A Limiter given t, then t-1s, then t again credits the second twice
// (golang/go#65508); the bucket does not.
func TestBucketIgnoresTimeRunningBackwards(t *testing.T) {
	t0 := 5 * time.Second
	b := newBucket(1, 1)
	if !b.take(t0) {
		t.Fatal("a full bucket refused a token")
	}
	if b.take(t0 - time.Second) {
		t.Error("took a token at an earlier time from an empty bucket")
	}
	if b.take(t0) {
		t.Error("took a second token at the same time: the interval was credited twice")
	}
	if !b.take(t0 + time.Second) {
		t.Error("refused the token earned one second later")
	}
}

// TestBucketSetRate: a new rate applies from the instant it is set; a
// bucket that filled before then, set to a rate no higher, keeps that
// instant as its latest (a late grant may be charged then); one set higher,
// or whose rate was 0 or too slow to fill, credits nothing before it.
func TestBucketSetRate(t *testing.T) {
	const ms = time.Millisecond
	for _, c := range []struct {
		name     string
		rate, to float64
		at       time.Duration // when the rate is set to to
		last     time.Duration // the bucket's latest time then
		heldThen float64       // what it holds 5 ms later
	}{
		{"filled at 20 ms, set the same", 50, 50, 25 * ms, 20 * ms, 1},
		{"filled at 20 ms, set lower", 50, 40, 25 * ms, 20 * ms, 1},
		{"filled at 20 ms, set higher", 50, 100, 25 * ms, 25 * ms, 1},
		{"half full", 50, 100, 10 * ms, 10 * ms, 1},
		{"at rate 0", 0, 100, 25 * ms, 25 * ms, 0.5},
		{"at a token a year", 1.0 / (365 * 24 * 3600), 100, 25 * ms, 25 * ms, 0.5},
	} {
		b := &bucket{rate: c.rate, burst: 1}
		b.setRate(c.at, c.to)
		if got := b.tokensAt(c.at + 5*ms); b.last != c.last || math.Abs(got-c.heldThen) > 1e-6 {
			t.Errorf("%s: latest time %v, %v held 5 ms later; want %v and %v", c.name, b.last, got, c.last, c.heldThen)
		}
	}
}

// TestBucketDrain: a drained bucket holds nothing, and refills at its rate.
func TestBucketDrain(t *testing.T) {
	t0 := 5 * time.Second
	b := newBucket(10, 5)
	b.drain(t0)
	if b.take(t0) {
		t.Error("took a token from a drained bucket")
	}
	if got := b.tokensAt(t0 + 200*time.Millisecond); got != 2 {
		t.Errorf("200 ms after draining at 10/s: %v tokens, want 2", got)
	}
}

// TestBucketUnlimited: with no limit every take succeeds, and a finite rate
// set later starts from a full bucket.
func TestBucketUnlimited(t *testing.T) {
	var t0 time.Duration
	b := newBucket(math.Inf(1), 3)
	for i := range 1000 {
		if !b.take(t0) {
			t.Fatalf("take %d refused with no limit", i)
		}
	}
	b.setRate(t0, 1)
	if got := b.tokensAt(t0); got != 3 {
		t.Errorf("after setting a rate: %v tokens, want 3 (full)", got)
	}
}

// TestBucketNanosecondEdge: a token due within the nanosecond is granted, as
// a Limiter grants it (its wait, truncated to nanoseconds, is zero), and one
// due a nanosecond or more later is not. The fuzz target seldom lands that
// close to a token, so every rate up to 2,000 is tried at the last whole
// nanosecond before its token, and the one before that.
func TestBucketNanosecondEdge(t *testing.T) {
	t0 := time.Unix(1e9, 0)
	var granted, refused int
	for r := 1; r <= 2000; r++ {
		for _, early := range []time.Duration{0, 1} {
			b := newBucket(float64(r), 1)
			lim := rate.NewLimiter(rate.Limit(r), 1)
			b.take(0)
			lim.AllowN(t0, 1)
			d := time.Second/time.Duration(r) - early
			got, want := b.take(d), lim.AllowN(t0.Add(d), 1)
			if got != want {
				t.Fatalf("rate %d: take %v after the first = %v, Limiter says %v", r, d, got, want)
			}
			if got {
				granted++
			} else {
				refused++
			}
		}
	}
	if granted < 2000 || refused == 0 {
		t.Errorf("%d granted and %d refused of 4000: the edge was not exercised", granted, refused)
	}
}

// TestBucketWaitBeyondDuration: a token centuries away (a rate of one a
// billion years) is refused, as a Limiter refuses it; a wait that does not
// fit in a Duration must not wrap round to "due now".
func TestBucketWaitBeyondDuration(t *testing.T) {
	const r = 1e-18 // tokens a second
	b := newBucket(r, 1)
	lim := rate.NewLimiter(r, 1)
	t0 := time.Unix(1e9, 0)
	for i := range 5 {
		d := time.Duration(i) * time.Second
		if got, want := b.take(d), lim.AllowN(t0.Add(d), 1); got != want {
			t.Fatalf("take %d = %v, Limiter says %v", i, got, want)
		}
	}
}

// dispatchLate plays a dispatcher against b with a backlog that never
// empties: it sleeps until a token is due, wakes late by the next of
// lateness (cycled), and grants as many tokens as takeLate allows at that
// wake-up, for the time span. With sets, the rate is set again (to the
// same) halfway between each token's due time and the wake-up, as a
// response that restates a lane's pace does. It returns the hand-off time
// of every grant.
func dispatchLate(b *bucket, lateness []time.Duration, span time.Duration, late, sets bool) []time.Duration {
	var out []time.Duration
	lag := TokenTime(b.rate)
	now := time.Duration(0)
	for i := 0; now < span; i++ {
		for late && b.takeLate(now, lag) || !late && b.take(now) {
			out = append(out, now)
		}
		now += TokensDelay(1-b.tokensAt(now), b.rate)
		if len(lateness) > 0 {
			d := lateness[i%len(lateness)]
			if sets {
				b.setRate(now+d/2, b.rate)
			}
			now += d
		}
	}
	return out
}

// overBound returns the first hand-off at which times break the bound
// rate x T + burst + 1 for some window T ending there, or -1: times conform
// to a token bucket of burst + 1 (the two are the same condition).
func overBound(times []time.Duration, r, burst float64) int {
	tokens, last := burst+1, time.Duration(0)
	for i, at := range times {
		tokens = min(burst+1, tokens+(at-last).Seconds()*r)
		last = at
		if tokens < 1-1e-9 {
			return i
		}
		tokens--
	}
	return -1
}

// TestTakeLateKeepsTheSchedule: a dispatcher that wakes up to one token's
// time late grants what the rate allows, where charging each token at the
// wake-up loses the lateness for good. Both keep within rate x T + burst +
// 1.
func TestTakeLateKeepsTheSchedule(t *testing.T) {
	const span = 10 * time.Second
	for _, r := range []float64{20, 100, 2000, 10000} {
		for _, burst := range []int{1, 10} {
			// Lateness up to one token's time, in an irregular cycle.
			step := TokensDelay(1, r)
			lateness := []time.Duration{0, step / 3, step, step / 7, step * 9 / 10, 1}
			late := dispatchLate(newBucket(r, burst), lateness, span, true, false)
			now := dispatchLate(newBucket(r, burst), lateness, span, false, false)
			set := dispatchLate(newBucket(r, burst), lateness, span, true, true)
			want := r*span.Seconds() + float64(burst)
			t.Logf("R %v burst %d: %d grants charged when due (%d with the rate set between), %d charged at wake-up, schedule %v",
				r, burst, len(late), len(set), len(now), want)
			// A rate set between a token's due time and the wake-up
			// (a response) keeps the lateness too: a bucket that filled
			// keeps the instant it did.
			for _, g := range [][]time.Duration{late, set} {
				if float64(len(g)) < want-2 {
					t.Errorf("R %v burst %d: %d grants in %v, want %v", r, burst, len(g), span, want)
				}
			}
			for _, g := range [][]time.Duration{late, now, set} {
				if i := overBound(g, r, float64(burst)); i >= 0 {
					t.Errorf("R %v burst %d: grant %d at %v breaks rate x T + burst + 1", r, burst, i, g[i])
				}
			}
		}
	}
}

// FuzzTakeLateBound: whatever the lateness of the wake-ups (none, a
// nanosecond, seconds), the hand-off times keep within rate x T + burst + 1
// in every window T, and the grants never outrun the schedule.
func FuzzTakeLateBound(f *testing.F) {
	f.Add(uint16(2000), uint8(1), []byte{0, 1, 2, 3, 0xff, 0x40, 0x80, 0xc0})
	f.Add(uint16(1), uint8(10), []byte{0xff, 0xff, 0, 0})
	f.Add(uint16(100), uint8(3), []byte{0x81, 0x42, 0xc3, 0x04})
	f.Fuzz(func(t *testing.T, r uint16, burst uint8, raw []byte) {
		if r == 0 || burst == 0 || len(raw) == 0 {
			return
		}
		// The low bit of burst's byte sets the rate again before each
		// wake-up (see dispatchLate).
		sets := burst&1 == 1
		// Each byte is a lateness: its low six bits in a unit its top two
		// bits choose (ns, µs, ms or 100 ms).
		lateness := make([]time.Duration, len(raw))
		for i, c := range raw {
			unit := [...]time.Duration{1, time.Microsecond, time.Millisecond, 100 * time.Millisecond}[c>>6]
			lateness[i] = time.Duration(c&0x3f) * unit
		}
		span := time.Duration(min(2000/float64(r), 20) * float64(time.Second))
		g := dispatchLate(newBucket(float64(r), int(burst)), lateness, span, true, sets)
		if i := overBound(g, float64(r), float64(burst)); i >= 0 {
			t.Fatalf("grant %d at %v breaks rate x T + burst + 1", i, g[i])
		}
		if last := g[len(g)-1]; float64(len(g)) > float64(r)*last.Seconds()+float64(burst)+1e-6 {
			t.Fatalf("%d grants by %v: ahead of the schedule", len(g), last)
		}
	})
}

func TestLateLag(t *testing.T) {
	for _, c := range []struct {
		rate, safe float64
		want       time.Duration
	}{
		{50, 0, 20 * time.Millisecond}, // no refusal yet: a whole token
		{40, 50, 5 * time.Millisecond}, // 25 ms a token, never closer than 20 ms
		{45, 45, 0},                    // at the plateau: no catch-up
		{60, 50, 0},                    // above it: none either
		{1000, 0, time.Millisecond},    // fast lanes keep their token's time
		{1000, 1250, 200 * time.Microsecond},
	} {
		if got := lateLag(c.rate, c.safe); got != c.want {
			t.Errorf("lateLag(%v, %v) = %v, want %v", c.rate, c.safe, got, c.want)
		}
	}
}

// TestBucketPrepay: prepaid tokens come out of the bucket and keep its
// size smaller until they are spent or given back, and time that passed
// while it was full at the smaller size does not fill it past it.
func TestBucketPrepay(t *testing.T) {
	const s = time.Second
	b := newBucket(10, 5)
	if got := b.prepay(0, 3); got != 3 {
		t.Fatalf("prepay(3) from a full bucket of 5: took %d", got)
	}
	if got := b.advance(10 * s); got != 2 {
		t.Fatalf("with 3 prepaid, 10 s later: %v tokens, want 2", got)
	}
	b.spend(10*s, 3)
	if got := b.advance(10 * s); got != 2 {
		t.Errorf("just after the 3 are spent: %v tokens, want 2 (the wait while full does not count)", got)
	}
	if got := b.advance(10*s + 100*time.Millisecond); math.Abs(got-3) > 1e-9 {
		t.Errorf("100 ms after: %v tokens, want 3", got)
	}
	b.set(11*s, 1.5)
	if got := b.prepay(11*s, 4); got != 1 {
		t.Errorf("prepay(4) from 1.5 tokens: took %d, want 1", got)
	}
	b.unprepay(11*s, 1)
	if got, held := b.advance(11*s), b.held; math.Abs(got-1.5) > 1e-9 || held != 0 {
		t.Errorf("given back: %v tokens, %v held; want 1.5 and 0", got, held)
	}
	if got := b.prepay(11*s, 0); got != 0 {
		t.Errorf("prepay(0) took %d", got)
	}
}
