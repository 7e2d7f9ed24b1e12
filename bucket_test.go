package sluice

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
