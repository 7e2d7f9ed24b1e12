package pace

import (
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/headers"
)

// quotaAt is a quota of source src with limit, remaining and a reset from
// now, in whole seconds if coarse.
func quotaAt(src string, limit, remaining int64, reset time.Duration, coarse bool) headers.Quota {
	return headers.Quota{Limit: limit, Remaining: remaining, Reset: reset, Source: src, Coarse: coarse}
}

// instantAt is a quota of source src with limit and remaining whose reset
// is stated as the instant end, in whole seconds, seen at now.
func instantAt(src string, limit, remaining int64, end, now time.Time) headers.Quota {
	q := quotaAt(src, limit, remaining, max(0, end.Sub(now)), true)
	q.Instant = true
	return q
}

// slidingWindows are the windows TestQuotaKinds' sliding windows measure.
var slidingWindows = map[string]time.Duration{
	"sliding window, 50 a second: the end of each second, little left": time.Second,
	"sliding window, 100 a minute":                                     time.Minute,
}

// TestQuotaKinds: the model tells a fixed window from a bucket by how the
// reset instant moves, whatever the family's prior, and a sliding window
// from both.
func TestQuotaKinds(t *testing.T) {
	t0 := time.Unix(1e9, 0)
	for _, c := range []struct {
		name string
		// at returns the quota stated at the i-th response, sent every
		// step.
		at   func(i int, now time.Time) headers.Quota
		step time.Duration
		want limitKind
	}{
		{"GCRA burst 1, reset rounded up to 1 s", func(int, time.Time) headers.Quota {
			return quotaAt("x-ratelimit", 1, 0, time.Second, true)
		}, 20 * time.Millisecond, kindBucket},
		{"GCRA burst 10 at 50/s, rounded", func(i int, _ time.Time) headers.Quota {
			return quotaAt("x-ratelimit", 10, int64(i%3), time.Second, true)
		}, 20 * time.Millisecond, kindBucket},
		{"fixed 10 s window, X-RateLimit, reset counts down", func(i int, now time.Time) headers.Quota {
			end := t0.Add(10 * time.Second * time.Duration(1+now.Sub(t0)/(10*time.Second)))
			return quotaAt("x-ratelimit", 500, int64(500-i%500), end.Sub(now).Truncate(time.Second)+time.Second, true)
		}, 50 * time.Millisecond, kindWindow},
		{"GitHub prior, hourly window", func(i int, now time.Time) headers.Quota {
			return quotaAt("github", 5000, int64(4000-i), t0.Add(time.Hour).Sub(now), true)
		}, time.Second, kindWindow},
		{"GitHub prior, 1 s windows drained by the end of each", func(i int, now time.Time) headers.Quota {
			// 50 a window, sent evenly over its first 0.9 s: a response
			// late in one window and the next seen late in the next both
			// say little remains, though the window refilled between.
			end := now.Truncate(time.Second).Add(time.Second)
			used := int64(now.Sub(now.Truncate(time.Second)) / (18 * time.Millisecond))
			return quotaAt("github", 50, max(0, 49-used), end.Sub(now), true)
		}, 900 * time.Millisecond, kindWindow},
		{"GitHub prior, but the reset moves: evidence wins", func(int, time.Time) headers.Quota {
			return quotaAt("github", 10, 0, 2*time.Second, true)
		}, 100 * time.Millisecond, kindBucket},
		{"OpenAI prior, reset until full in ms", func(i int, _ time.Time) headers.Quota {
			return quotaAt("openai", 600, 590, 1200*time.Millisecond, false)
		}, 10 * time.Millisecond, kindBucket},
		{"sliding window, 50 a second: the end of each second, little left", func(i int, now time.Time) headers.Quota {
			return instantAt("x-ratelimit", 50, int64(1+i%3), now.Truncate(time.Second).Add(time.Second), now)
		}, 21 * time.Millisecond, kindSliding},
		{"sliding window, 100 a minute", func(i int, now time.Time) headers.Quota {
			return instantAt("x-ratelimit", 100, 2, now.Truncate(time.Minute).Add(time.Minute), now)
		}, 610 * time.Millisecond, kindSliding},
		{"fixed 1 s window, instant reset: refilled at each end", func(i int, now time.Time) headers.Quota {
			used := int64(now.Sub(now.Truncate(time.Second)) / (20 * time.Millisecond))
			// Remaining falls by what each request takes, then all of it
			// comes back at once: a window (see windowEdge).
			return instantAt("x-ratelimit", 50, 49-used, now.Truncate(time.Second).Add(time.Second), now)
		}, 21 * time.Millisecond, kindWindow},
		{"GCRA burst 10 at 50/s, instant when full, rounded up", func(i int, now time.Time) headers.Quota {
			rem := int64(i % 3)
			full := now.Add(time.Duration(10-rem) * 20 * time.Millisecond)
			return instantAt("x-ratelimit", 10, rem, full.Truncate(time.Second).Add(time.Second), now)
		}, 20 * time.Millisecond, kindBucket},
		{"Anthropic prior, instant when full, little left: no sliding window", func(i int, now time.Time) headers.Quota {
			return instantAt("anthropic", 50, 2, now.Truncate(time.Second).Add(time.Second), now)
		}, 21 * time.Millisecond, kindBucket},
	} {
		t.Run(c.name, func(t *testing.T) {
			var m quotaModel
			now := t0
			for i := range 400 {
				// The model sees the time on a lane's clock, its epoch t0.
				m.observe(now.Sub(t0), now.Sub(t0), c.at(i, now), 1)
				now = now.Add(c.step)
			}
			if m.kind != c.want {
				t.Errorf("kind %v, want %v", m.kind, c.want)
			}
			if w := slidingWindows[c.name]; m.window != w {
				t.Errorf("window %v, want %v", m.window, w)
			}
		})
	}
}

// TestQuotaPace: what a quota says to do, by kind.
func TestQuotaPace(t *testing.T) {
	now := time.Hour // on a lane's clock
	ietf := headers.Quota{Limit: 20, Remaining: 0, Reset: time.Second, Window: time.Second, Source: "ietf", Coarse: true}
	halfFull := 299.5 / 30.0
	for _, c := range []struct {
		name     string
		q        headers.Quota
		inFlight int
		want     quotaPace
	}{
		{"bucket empty, coarse: no pace below the configured rate, wait a token",
			quotaAt("x-ratelimit", 1, 0, time.Second, true), 1, quotaPace{empty: true}},
		{"IETF policy with r and t: q/w is the refill rate",
			ietf, 1, quotaPace{rate: 20, until: now + time.Second, empty: true}},
		{"OpenAI bucket half full: the refill rate (299.5 missing, remaining rounded down, over 30 s) and more",
			quotaAt("openai", 600, 300, 30*time.Second, false), 1,
			quotaPace{rate: halfFull * (1 + 299.0/600), until: now + time.Duration(600/halfFull*float64(time.Second)), spare: true}},
		{"OpenAI bucket one token short: that token over the reset",
			quotaAt("openai", 600, 599, 100*time.Millisecond, false), 1,
			quotaPace{rate: 10 * (1 + 598.0/600), until: now + time.Minute, spare: true}},
		{"window: what remains over the time to the reset, less half a rounded second, for what remains and the attempts in flight",
			quotaAt("github", 5000, 101, 100*time.Second+time.Second/2, true), 2, quotaPace{rate: 1, until: now + 100*time.Second + time.Second/2, allow: 103}},
		{"window with a precise reset: the last of what remains one interval before it",
			quotaAt("github", 5000, 100, 100*time.Second, false), 2, quotaPace{rate: 1, until: now + 100*time.Second, allow: 102}},
		{"window with nothing left stops until the reset",
			quotaAt("github", 5000, 1, 30*time.Second, true), 3, quotaPace{stop: now + 30*time.Second}},
	} {
		var m quotaModel
		if got := m.observe(now, now, c.q, c.inFlight); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
	// A sliding window takes its limit a window, less one, whatever
	// remains: what remains comes back as the lane's own past sends leave.
	// A quota that omits the limit keeps the one stated before.
	sliding := quotaModel{kind: kindSliding, evidence: true, window: time.Second}
	for _, c := range []struct{ limit, rem int64 }{{50, 0}, {50, 1}, {50, 30}, {-1, 5}} {
		q := quotaAt("x-ratelimit", c.limit, c.rem, 300*time.Millisecond, true)
		q.Instant = true
		if got, want := sliding.observe(now, now, q, 2), (quotaPace{rate: 50 - slidingSpare, until: now + time.Second}); got != want {
			t.Errorf("sliding window, limit %d, %d remaining: %+v, want %+v", c.limit, c.rem, got, want)
		}
	}
	// A refill rate counted from the quotas paces the lane until their
	// reset at most, not for the time the count says the bucket takes to
	// fill: a window's tail, counted before the window is told apart,
	// refills at its reset (ulule/limiter's 1,200 per 6 s, counted at
	// 1.3/s, held a lane at that rate for 15 minutes).
	counted := quotaModel{counts: 1.3}
	tail := quotaAt("x-ratelimit", 1200, 6, 5*time.Second, true)
	if got := counted.observe(now, now, tail, 1); got.rate <= 0 || got.until != now+5*time.Second {
		t.Errorf("refill counted at 1.3/s, 6 remaining, reset in 5 s: %+v, want a rate until the reset", got)
	}
	// The last token beyond those in flight is kept, not spare.
	var m quotaModel
	for _, c := range []struct {
		remaining int64
		inFlight  int
		spare     bool
	}{{3, 2, true}, {3, 3, false}, {1, 1, false}, {2, 1, true}} {
		got := m.observe(now, now, quotaAt("openai", 600, c.remaining, 30*time.Second, false), c.inFlight)
		if got.spare != c.spare || got.rate <= 0 {
			t.Errorf("remaining %d, %d in flight: %+v, want spare %v", c.remaining, c.inFlight, got, c.spare)
		}
	}
}

// TestQuotaCountAtRefusal: a refusal ends a count of the refill rate begun
// at an acceptance, and starts none: the cooldown after it lets the bucket
// fill, and a count across that would read a burst-1 GCRA as one request a
// cooldown (before: a lane at R fell to 1/s for good).
func TestQuotaCountAtRefusal(t *testing.T) {
	const ms = time.Millisecond
	strict := quotaAt("x-ratelimit", 1, 0, time.Second, true)
	empty := quotaAt("x-ratelimit", 10, 0, time.Second, true)
	for _, c := range []struct {
		name string
		run  func(m *quotaModel)
		want float64
	}{
		{"burst 1: two refusals a cooldown apart count nothing", func(m *quotaModel) {
			m.refused(0, strict, 0)
			// The request accepted after the cooldown is answered a
			// latency later than the next one's refusal.
			m.refused(1010*ms, strict, 1)
			m.observe(1020*ms, 1000*ms, strict, 1)
		}, 0},
		{"burst 10: two refusals a cooldown apart count nothing", func(m *quotaModel) {
			m.refused(0, empty, 3)
			m.refused(1000*ms, empty, 3)
		}, 0},
		{"a count from acceptances ends at the refusal", func(m *quotaModel) {
			for i := range 5 { // 5 left at 0 ms, then 4 more taken
				m.observe(time.Duration(i)*50*ms, time.Duration(i)*50*ms, quotaAt("x-ratelimit", 10, int64(5-i), time.Second, true), 1)
			}
			// At 250 ms the bucket is empty with one more in flight: it
			// gained 0 - 5 + 4 + 1 = 0, no rate to take.
			m.refused(250*ms, empty, 1)
		}, 0},
		{"a count from acceptances ends at the refusal, with refill", func(m *quotaModel) {
			// The bucket once showed 9 remaining: at 5 it is not full.
			m.observe(-50*ms, -50*ms, quotaAt("x-ratelimit", 10, 9, time.Second, true), 1)
			for i := range 5 {
				m.observe(time.Duration(i)*50*ms, time.Duration(i)*50*ms, quotaAt("x-ratelimit", 10, 5, time.Second, true), 1)
			}
			// Remaining held at 5 while 4 were taken, and 5 more were in
			// flight at 250 ms: it gained 0 - 5 + 4 + 5 = 4 in 0.25 s.
			m.refused(250*ms, empty, 5)
		}, 16},
		{"a window spent before its end counts no trickle", func(m *quotaModel) {
			// A fixed window of 50 a second, which the quotas have not
			// told apart yet.
			m.observe(-50*ms, -50*ms, quotaAt("x-ratelimit", 50, 30, time.Second, true), 1)
			m.observe(0, 0, quotaAt("x-ratelimit", 50, 20, time.Second, true), 1)
			m.observe(100*ms, 100*ms, quotaAt("x-ratelimit", 50, 19, time.Second, true), 1)
			// Spent 414 ms after 20 remained, with 20 in flight: 0 - 20
			// + 1 + 20 = 1 gained, 2.4/s, where the refusal says all 50
			// come back within a second.
			m.refused(414*ms, quotaAt("x-ratelimit", 50, 0, time.Second, true), 20)
		}, 0},
	} {
		var m quotaModel
		c.run(&m)
		if m.counts != c.want {
			t.Errorf("%s: counted %v/s, want %v/s", c.name, m.counts, c.want)
		}
	}
}

func TestCommonStep(t *testing.T) {
	const s = time.Second
	for _, c := range []struct{ a, b, want time.Duration }{
		{s, s, s},
		{s, s + 40*time.Millisecond, s},
		{2 * s, s, s},                     // a lane held across a window
		{s, 3*s - 90*time.Millisecond, s}, // within the slack of each step
		{s, 1500 * time.Millisecond, 0},
		{s, 5 * s, 0}, // too many windows apart to say
		{s, 0, 0},
		{60 * time.Millisecond, 120 * time.Millisecond, 0}, // within the slack of a reading
	} {
		if got := commonStep(c.a, c.b); got != c.want {
			t.Errorf("commonStep(%v, %v) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}

// TestQuotaSlidingFromOneStep: a reset instant that came and was replaced
// by one a step later, the count of the window before carried over (three
// or more still counted at the next window's first quota, after the count
// fell by three or more), is a sliding window of that step: a bucket is
// full when its instant comes. No refill rate is counted from its quotas
// after that: one counted over its first windows measured the lane's own
// past sends (on real loopback, httprate at R was paced at 3/s of 50 for a
// second).
func TestQuotaSlidingFromOneStep(t *testing.T) {
	var m quotaModel
	q := func(now time.Duration, rem int64) headers.Quota {
		end := now.Truncate(time.Second) + time.Second
		return headers.Quota{Limit: 50, Remaining: rem, Reset: end - now, Coarse: true, Instant: true, Source: "x-ratelimit"}
	}
	now := 10 * time.Millisecond
	for i := range 46 {
		m.observe(now, now, q(now, int64(48-i)), 1)
		now += 20 * time.Millisecond
	}
	if m.kind == kindSliding {
		t.Fatal("told a sliding window apart before its instant came")
	}
	// The next window: 40 of the 46 still counted at its start, then a
	// request every 25 ms as the window before lets go.
	for now = time.Second + 10*time.Millisecond; now < 2*time.Second; now += 25 * time.Millisecond {
		m.observe(now, now, q(now, max(1, 9-int64((now-time.Second)/(100*time.Millisecond)))), 1)
	}
	if m.kind != kindSliding || m.window != time.Second {
		t.Errorf("kind %v, window %v; want a sliding window of 1s", m.kind, m.window)
	}
	if m.counts != 0 {
		t.Errorf("counted a refill of %.1f/s", m.counts)
	}
}

// TestQuotaStatesBurst: the quotas show a burst when a request left one or
// more remaining, whatever the limit they state: a limit of 50 with
// nothing ever remaining is a rate (redis_rate's), not a bucket's size.
func TestQuotaStatesBurst(t *testing.T) {
	for _, c := range []struct {
		limit, remaining int64
		burst            bool
	}{{1, 0, false}, {50, 0, false}, {2, 1, true}, {50, 49, true}} {
		var m quotaModel
		if m.statesBurst() {
			t.Fatal("a burst before any quota")
		}
		m.observe(time.Second, time.Second, quotaAt("x-ratelimit", c.limit, c.remaining, time.Second, true), 1)
		if got := m.statesBurst(); got != c.burst {
			t.Errorf("limit %d, %d remaining: burst %v, want %v", c.limit, c.remaining, got, c.burst)
		}
	}
}
