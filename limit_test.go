package sluice

import (
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/verdict"
)

// setLimitLocked sets l's in-flight limit to n (clamped to its bounds) as a
// sample would, for tests that move it by hand. l.mu must be held.
func (l *lane) setLimitLocked(n int) { l.limitMovedLocked(l.slot.set(n)) }

// pinLimit sets l's in-flight limit to n and pins the limiter's bounds
// there, so that no sample moves it while the test looks.
func pinLimit(l *lane, n int) {
	l.lock()
	defer l.unlock()
	l.limitMovedLocked(l.slot.pin(n))
}

// pin sets the limit and both bounds to n.
func (s *limiter) pin(n int) limitChange {
	s.min, s.max = n, n
	return s.set(n)
}

// feed reports one finished attempt to s as the lane's release does: the
// attempt holds a slot while it is counted. Nothing waits.
func feed(s *limiter, now, latency time.Duration, status int, rate float64) limitChange {
	s.take()
	defer s.put()
	return s.onSample(now, latency, verdict.Of(status), false, false, rate, 0)
}

// window feeds s samples of latency, perSec a second from *now, until a
// window closes, and returns what it found. inUse attempts are in flight
// meanwhile (each sample's own included), and waiting says whether requests
// wait. The limit must stay within its bounds.
func window(t *testing.T, s *limiter, now *time.Duration, perSec int, latency time.Duration, inUse int, waiting bool, rate float64) finding {
	t.Helper()
	s.inUse += inUse
	defer func() { s.inUse -= inUse }()
	for {
		*now += time.Second / time.Duration(perSec)
		ch := s.onSample(*now, latency, verdict.Served, false, waiting, rate, 0)
		if ch.to != s.limit || s.limit < s.min || s.limit > s.max {
			t.Fatalf("limit %d (change %+v), bounds [%d, %d]", s.limit, ch, s.min, s.max)
		}
		if s.n == 0 { // the window closed
			return ch.found
		}
	}
}

// TestLimiterStarts: a paced lane starts at its maximum, an unpaced one at
// initialUnpaced within its bounds, and set clamps to the bounds.
func TestLimiterStarts(t *testing.T) {
	for _, tc := range []struct {
		lo, hi int
		paced  bool
		want   int
	}{
		{1, 256, true, 256},
		{1, 64, false, initialUnpaced},
		{8, 64, false, 8},
		{1, 2, false, 2},
	} {
		s := newLimiter(tc.lo, tc.hi, tc.paced)
		if s.limit != tc.want || !s.free() {
			t.Errorf("newLimiter(%d, %d, %v): limit %d, free %v; want %d and free", tc.lo, tc.hi, tc.paced, s.limit, s.free(), tc.want)
		}
		if ch := s.set(tc.hi + 1); ch.from != tc.want || ch.to != tc.hi {
			t.Errorf("set above the bounds: %+v, want from %d to %d", ch, tc.want, tc.hi)
		}
		if ch := s.set(0); ch.to != tc.lo || s.limit != tc.lo {
			t.Errorf("set below the bounds: %+v, want to %d", ch, tc.lo)
		}
	}
}

// TestLimiterLittle: at fixed latency a paced lane's limit is
// ceil(1.1·λ·W), and it follows W down and up.
func TestLimiterLittle(t *testing.T) {
	s := newLimiter(DefaultMinConcurrency, DefaultMaxConcurrency, true)
	now := time.Duration(0)
	for _, step := range []struct {
		latency time.Duration
		want    int
	}{
		{400 * time.Millisecond, 23}, // ceil(50 × 0.4 × 1.1)
		{40 * time.Millisecond, 3},   // ceil(50 × 0.04 × 1.1)
		{700 * time.Millisecond, 39}, // ceil(50 × 0.7 × 1.1)
	} {
		for range 200 {
			now += 20 * time.Millisecond
			feed(&s, now, step.latency, http.StatusOK, 50)
		}
		if s.limit != step.want {
			t.Errorf("at 50/s and %v: limit %d, want %d", step.latency, s.limit, step.want)
		}
	}
}

// TestLimiterRateGone: a paced lane whose rate goes (feedback can make it
// unlimited) holds the limit it had, as the cap the gradient then moves.
func TestLimiterRateGone(t *testing.T) {
	s := newLimiter(DefaultMinConcurrency, DefaultMaxConcurrency, true)
	var now time.Duration
	for range 200 {
		now += 20 * time.Millisecond
		feed(&s, now, 400*time.Millisecond, http.StatusOK, 50)
	}
	held := s.limit // 23
	for range 200 {
		now += 20 * time.Millisecond
		if ch := feed(&s, now, 100*time.Millisecond, http.StatusOK, 0); ch.to != held {
			t.Fatalf("no rate, latency down: limit %d, want %d held", ch.to, held)
		}
	}
	// Binding with requests waiting, at the baseline: the cap grows.
	window(t, &s, &now, 50, 100*time.Millisecond, held, true, 0)
	if s.limit <= held {
		t.Errorf("limit %d after a binding window at the baseline, want above %d", s.limit, held)
	}
}

// TestAdaptiveIgnoresRefusals: 429s, 503s and transport errors come back
// fast, but they are not latency samples: a burst of them moves neither the
// smoothed latency nor the limit.
func TestAdaptiveIgnoresRefusals(t *testing.T) {
	s := newLimiter(DefaultMinConcurrency, DefaultMaxConcurrency, true)
	now := time.Duration(0)
	for range 100 {
		now += 20 * time.Millisecond
		feed(&s, now, 400*time.Millisecond, http.StatusOK, 50)
	}
	var before, after LaneStats
	s.fill(&before)
	limit := s.limit
	for _, status := range []int{http.StatusTooManyRequests, http.StatusServiceUnavailable, 0} {
		for range 100 {
			now += 20 * time.Millisecond
			if ch := feed(&s, now, time.Millisecond, status, 50); ch != (limitChange{from: limit, to: limit}) {
				t.Fatalf("status %d: %+v, want no change from %d", status, ch, limit)
			}
			s.onUntimed(verdict.Of(status), true)
		}
	}
	s.fill(&after)
	if after.Latency != before.Latency || after.Baseline != before.Baseline || s.limit != limit {
		t.Errorf("refusals moved the controller: latency %v -> %v, limit %d -> %d, baseline %v -> %v",
			before.Latency, after.Latency, limit, s.limit, before.Baseline, after.Baseline)
	}
	if limit != 23 { // ceil(50 x 0.4 x 1.1)
		t.Errorf("limit %d at 50/s and 400 ms, want 23", limit)
	}
}

// TestAdaptiveBaselineIgnoresLuckySample: one very fast answer (a cached
// response, an error page with status 200) among normal ones barely moves
// the baseline, where a minimum of samples would take it.
func TestAdaptiveBaselineIgnoresLuckySample(t *testing.T) {
	s := newLimiter(DefaultMinConcurrency, DefaultMaxConcurrency, true)
	now := time.Duration(0)
	var ls LaneStats
	for i := range 500 {
		now += 20 * time.Millisecond
		lat := 100 * time.Millisecond
		if i == 200 {
			lat = time.Millisecond
		}
		feed(&s, now, lat, http.StatusOK, 50)
		if s.fill(&ls); ls.Baseline != 0 && ls.Baseline < 90*time.Millisecond {
			t.Fatalf("sample %d: baseline %v after one 1 ms answer among 100 ms ones", i, ls.Baseline)
		}
	}
	if ls.Baseline == 0 {
		t.Error("no baseline after 10 s of samples")
	}
}

// TestCompletionRateCountsUntimed: the controller's completion rate, which
// tells calls that got slower from an upstream that queues, counts every
// completion, not only the timed ones. Counting only the samples it read an
// eighth of a 4,000/s lane's rate, took it for short of its rate, and could
// cap a lane whose calls had merely got slower.
func TestCompletionRateCountsUntimed(t *testing.T) {
	s := newLimiter(DefaultMinConcurrency, DefaultMaxConcurrency, true)
	t0 := 1000 * time.Second
	for i := range 12000 { // 3 s at 4,000/s, one in eight timed
		now := t0 + time.Duration(i)*time.Second/4000
		if i%sampleEvery == 0 {
			feed(&s, now, 40*time.Millisecond, http.StatusOK, 4000)
			continue
		}
		s.take()
		s.onUntimed(verdict.Served, false)
		s.put()
	}
	if x := s.prevX; x < 3900 || x > 4100 {
		t.Errorf("completion rate %.0f/s, want 4000/s", x)
	}
}

// TestLimiterCutsWhenUpstreamQueues: latency triples at a flat completion
// rate while every slot is taken and requests wait: the upstream queues
// what the lane sends. The first such window is only suspect; the second
// caps the limit at backoff × in-flight × baseline/latency, and the lane
// reports itself saturated. Back at the baseline, a cap that binds returns
// to the upstream's estimated capacity at once; before any cut it grows a
// step a window.
func TestLimiterCutsWhenUpstreamQueues(t *testing.T) {
	s := newLimiter(1, 64, false)
	s.slow = false // the gradient alone: slow start is TestSlowStart's
	const inFlight, perSec = 10, 80
	var now time.Duration
	base, slow := 100*time.Millisecond, 300*time.Millisecond
	for i := range 2 {
		if f := window(t, &s, &now, perSec, base, inFlight, true, 0); f.kind != foundNothing {
			t.Fatalf("window %d at the baseline: found %+v", i, f)
		}
	}
	if s.limit != initialUnpaced+2 {
		t.Fatalf("limit %d after two binding windows, want %d", s.limit, initialUnpaced+2)
	}
	var ls LaneStats
	if s.fill(&ls); ls.Baseline.Round(time.Millisecond) != base || ls.Saturated {
		t.Fatalf("baseline %v, saturated %v; want %v, not saturated", ls.Baseline, ls.Saturated, base)
	}
	if f := window(t, &s, &now, perSec, slow, inFlight, true, 0); f.kind != foundNothing || s.limit != initialUnpaced+2 {
		t.Fatalf("first queueing window: found %+v, limit %d; want nothing yet", f, s.limit)
	}
	f := window(t, &s, &now, perSec, slow, inFlight, true, 0)
	want := int(backoff * inFlight * base.Seconds() / slow.Seconds()) // 2
	if f.kind != foundQueueing || f.cap != want || s.limit != want {
		t.Fatalf("second queueing window: found %+v, limit %d; want a cut to %d", f, s.limit, want)
	}
	if f.latency.Round(time.Millisecond) != slow || f.baseline.Round(time.Millisecond) != base {
		t.Errorf("cut at latency %v over baseline %v, want %v over %v", f.latency, f.baseline, slow, base)
	}
	if s.fill(&ls); !ls.Saturated {
		t.Error("not reported saturated after a cut")
	}
	window(t, &s, &now, perSec, base, inFlight, true, 0)
	if knee := int(inFlight * base.Seconds() / slow.Seconds()); s.limit != knee { // 3
		t.Errorf("after a window at the baseline: limit %d, want the estimated capacity %d", s.limit, knee)
	}
}

// TestLimiterSlowerCallsRenewBaseline: after a cut, latency rises while the
// completion rate falls: the calls got slower, not queued. The baseline is
// measured afresh, a paced lane's cap is dropped, and Little's law alone
// sizes it again; the lane is no longer reported saturated.
func TestLimiterSlowerCallsRenewBaseline(t *testing.T) {
	const rate, inFlight = 100.0, 40
	s := newLimiter(1, 256, true)
	var now time.Duration
	// 60/s, short of the rate: 50 ms, then 200 ms for two windows: a cut.
	for _, lat := range []time.Duration{50, 50, 200} {
		if f := window(t, &s, &now, 60, lat*time.Millisecond, inFlight, true, rate); f.kind != foundNothing {
			t.Fatalf("before the cut: found %+v", f)
		}
	}
	cut := window(t, &s, &now, 60, 200*time.Millisecond, inFlight, true, rate)
	if cut.kind != foundQueueing || s.limit != cut.cap {
		t.Fatalf("found %+v, limit %d; want a cut", cut, s.limit)
	}
	// Twice the latency at half the completion rate.
	f := window(t, &s, &now, 30, 400*time.Millisecond, inFlight, true, rate)
	if f.kind != foundSlower || f.latency.Round(time.Millisecond) != 400*time.Millisecond {
		t.Fatalf("found %+v, want the calls slower at 400ms", f)
	}
	var ls LaneStats
	if s.fill(&ls); ls.Baseline != 0 || ls.Saturated {
		t.Errorf("baseline %v, saturated %v; want none, not saturated", ls.Baseline, ls.Saturated)
	}
	if s.limit <= cut.cap {
		t.Errorf("limit %d, want the cap %d dropped", s.limit, cut.cap)
	}
}

// BenchmarkControllerOnDone measures the limiter's cost per finished
// attempt, as release calls it: under the lane's lock, which the benchmark
// holds throughout so that only the limiter is measured.
func BenchmarkControllerOnDone(b *testing.B) {
	for _, bc := range []struct {
		name string
		opts []Option
	}{
		{"paced", []Option{WithRate(50, time.Second)}},
		{"unpaced", nil},
	} {
		b.Run(bc.name, func(b *testing.B) {
			tr := mustNew(b, nopBase{}, bc.opts...)
			l := tr.lane("k")
			now := time.Duration(0)
			l.lock()
			defer l.unlock()
			for range 10 {
				l.slot.take()
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				now += 20 * time.Millisecond
				l.limitMovedLocked(l.slot.onSample(now, 400*time.Millisecond+time.Duration(i%7)*10*time.Millisecond, verdict.Served, false, l.q.len() > 0, l.currentRateLocked(), 0))
				i++
			}
		})
	}
}

// TestLimiterSlowStart: a lane with no rate grows its limit by one at each
// sample that finds every slot taken and requests waiting, so it doubles
// each round trip from initialUnpaced; a latency half again the smoothed
// one ends slow start for good (and the mean latency of its samples is the
// gradient's first baseline), and so does an overload.
func TestLimiterSlowStart(t *testing.T) {
	round := func(s *limiter, now *time.Duration, latency time.Duration) {
		*now += latency
		for range s.limit {
			s.inUse = s.limit
			s.onSample(*now, latency, verdict.Served, false, true, 0, 0)
		}
	}
	s := newLimiter(1, 64, false)
	var now time.Duration
	for _, want := range []int{8, 16, 32, 64, 64} {
		round(&s, &now, 100*time.Millisecond)
		if s.limit != want {
			t.Fatalf("after a round trip: limit %d, want %d", s.limit, want)
		}
	}

	s = newLimiter(1, 64, false)
	now = 0
	round(&s, &now, 100*time.Millisecond) // 8
	s.inUse = s.limit
	s.onSample(now, 200*time.Millisecond, verdict.Served, false, true, 0, 0) // the server queues
	round(&s, &now, 200*time.Millisecond)
	if s.slow || s.limit != 8 {
		t.Errorf("after a latency rise: slow start %v, limit %d; want it over, at 8", s.slow, s.limit)
	}
	// Four samples of 100 ms and the one of 200 ms: the mean of slow
	// start's samples is the gradient's first baseline.
	if b := s.baseline(); math.Abs(b-0.12) > 1e-9 {
		t.Errorf("after a latency rise: baseline %v, want the mean of slow start's samples, 120ms", secs(b))
	}

	s = newLimiter(1, 64, false)
	now = 0
	round(&s, &now, 100*time.Millisecond)
	s.inUse = s.limit
	s.onOverload(now, now-time.Millisecond)
	if s.slow {
		t.Error("slow start goes on after an overload")
	}
	// Idle or unbound samples grow nothing.
	s = newLimiter(1, 64, false)
	s.onSample(100*time.Millisecond, 100*time.Millisecond, verdict.Served, false, false, 0, 0)
	if s.limit != initialUnpaced {
		t.Errorf("a sample with nobody waiting: limit %d, want %d", s.limit, initialUnpaced)
	}
}
