package pace

import (
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/trace"
)

// TestWindowEdgeTraces replays the header traces recorded from real
// middleware through a windowEdge, on the trace's own clock: the two whose
// windows refill all at once are told apart, at their first refill after
// a refusal, with the period they were set up with; none of the others
// (buckets, a GCRA, a sliding window) is.
func TestWindowEdgeTraces(t *testing.T) {
	for name, window := range map[string]bool{
		"ulule-limiter.txt": true,
		"go-limiter.txt":    true,
		"throttled.txt":     false,
		"httprate.txt":      false,
		"redis_rate.txt":    false,
		"tollbooth.txt":     false,
	} {
		t.Run(name, func(t *testing.T) {
			tr, err := trace.Read(filepath.Join("..", "..", "testdata", "traces", name))
			if err != nil {
				t.Fatal(err)
			}
			var e windowEdge
			toldAt, refused := -1, false
			for i, r := range tr.Records {
				q, ok := headers.Parse(r.Header, tr.Start.Add(r.Received))
				if !ok {
					t.Fatalf("record %d: no quota", i)
				}
				if e.observe(r.Received, r.Sent, q, r.Status != 429) && toldAt < 0 {
					toldAt = i
					if !refused {
						t.Errorf("record %d: told apart before any refusal", i)
					}
				}
				refused = refused || r.Status == 429
			}
			switch {
			case !window && e.isTold():
				t.Errorf("told a window that refills at once at record %d", toldAt)
			case window && !e.isTold():
				t.Errorf("not told apart over %d records", len(tr.Records))
			case window && period(&e) != tr.Per:
				t.Errorf("period %v; the middleware was set up with %v", period(&e), tr.Per)
			}
		})
	}
}

// TestWindowEdgeEnd follows a window of 10 a second that starts at its
// first request, its reset a Unix time truncated to the second, on a
// clock 0.9 s past a whole second at the start: the stated instant passes
// 0.1 s into each window. A lane that spends each window in its first
// tenth is refused for the rest; the first refill after that tells the
// window apart, and the end measured is then a period after the first
// attempt each window answers, never before the window truly ends.
func TestWindowEdgeEnd(t *testing.T) {
	const limit, per, phase = 10, time.Second, 900 * time.Millisecond
	var (
		e     windowEdge
		start time.Duration = -1 // the current window's start, on the lane's clock
		n     int
		told  time.Duration = -1
	)
	for now := time.Duration(0); now < 5*time.Second; now += 10 * time.Millisecond {
		if start < 0 || now >= start+per {
			start, n = now, 0
		}
		ok := n < limit
		if ok {
			n++
		}
		// The Unix time of the window's end, truncated, on the lane's clock.
		inst := (start + per + phase).Truncate(time.Second) - phase
		q := headers.Quota{Limit: limit, Remaining: int64(limit - n), Reset: max(0, inst-now), Coarse: true, Instant: true, Source: "x-ratelimit"}
		if e.observe(now, now, q, ok) {
			told = now
		}
		if e.isTold() && e.until(now) <= 0 && now < start+per {
			t.Fatalf("at %v: the window ends at %v, measured as ended already", now, start+per)
		}
	}
	if told < 0 || told > 1100*time.Millisecond {
		t.Errorf("told apart at %v; want at the first refill, 1 s in", told)
	}
	if period(&e) != per {
		t.Errorf("period %v, want %v", period(&e), per)
	}
}

// TestWindowEdgeDelay follows a window of 10 a second on a grid 0.3 s
// off the lane's clock, its reset draft-07's delay rounded up to the
// second ("1" all through each window), answered 20 ms after each send,
// with a lane sending every 100 ms: the first refill tells the window
// apart, its period is measured, and the end measured is never before the
// window truly ends, nor more than one send's interval after it.
func TestWindowEdgeDelay(t *testing.T) {
	const limit, per, off = 10, time.Second, 300 * time.Millisecond
	var (
		e    windowEdge
		idx  time.Duration = -1
		n    int
		told time.Duration = -1
	)
	for sent := time.Duration(0); sent < 5*time.Second; sent += 100 * time.Millisecond {
		if i := (sent + off) / per; i != idx {
			idx, n = i, 0
		}
		end := (idx+1)*per - off
		ok := n < limit
		if ok {
			n++
		}
		reset := (end - sent + time.Second - 1).Truncate(time.Second)
		q := headers.Quota{Limit: limit, Remaining: int64(limit - n), Reset: reset, Coarse: true, Source: "ietf-draft07"}
		now := sent + 20*time.Millisecond
		if e.observe(now, sent, q, ok) && told < 0 {
			told = sent
		}
		if !e.isTold() {
			continue
		}
		if measured := now + e.until(now); measured < end || measured > end+100*time.Millisecond+e.guard {
			t.Fatalf("sent at %v: the window ends at %v, measured %v", sent, end, measured)
		}
	}
	if told < 0 || told > per {
		t.Errorf("told apart at %v; want at the first refill, 0.7 s in", told)
	}
	if period(&e) != per {
		t.Errorf("period %v, want %v", period(&e), per)
	}
}

// TestWindowEdgeContradicted: a window told apart as one refilled at once
// (10 a second, each spent in its first tenth and refused for the rest)
// whose next window's first answer states less than half the limit
// remaining, as a sliding window's count of the one before does, is no
// longer told apart, and is not told apart again by later refills.
func TestWindowEdgeContradicted(t *testing.T) {
	const limit, per = 10, time.Second
	var e windowEdge
	told, dropped := false, time.Duration(-1)
	for now := time.Duration(0); now < 8*time.Second; now += 10 * time.Millisecond {
		start := now.Truncate(per)
		// In the window from 3 s to 4 s, 8 of the one before still count.
		carried := 0
		if start == 3*time.Second {
			carried = 8
		}
		n := min(limit, carried+int((now-start)/(10*time.Millisecond)))
		ok := n < limit
		if ok {
			n++
		}
		q := headers.Quota{Limit: limit, Remaining: int64(limit - n), Reset: start + per - now, Coarse: true, Instant: true, Source: "x-ratelimit"}
		e.observe(now, now, q, ok)
		told = told || e.isTold()
		if told && !e.isTold() && dropped < 0 {
			dropped = now
		}
	}
	switch {
	case !told:
		t.Fatal("never told apart")
	case dropped != 3*time.Second:
		t.Errorf("dropped at %v; want at the first answer of the window that did not refill, 3 s in", dropped)
	case e.isTold():
		t.Error("told apart again after it was contradicted")
	}
}

// TestWindowEdgeTransit follows a window of 10 a second that starts when
// its first request arrives, a random transit after it is sent, from a
// lane that sends one request every 100 ms and, once a window is spent,
// waits for the end it measured. A window measured from its first send
// ends up to a transit before the server's does. The least guard
// (period/edgeGuardMin) keeps a transit's spread within it from costing
// any refusal once the window is told apart; a wider spread costs one,
// which teaches a guard that keeps the rest from being refused, at under
// 1% of the period.
func TestWindowEdgeTransit(t *testing.T) {
	const per = time.Second
	least := per / edgeGuardMin
	for _, c := range []struct {
		spread  time.Duration
		refused int // at most, once told apart
		learned bool
	}{
		{1500 * time.Microsecond, 0, false},
		{3 * time.Millisecond, 0, false},
		{6 * time.Millisecond, 1, true},
	} {
		refused, guard, told := windowTransit(c.spread, per)
		switch {
		case !told:
			t.Errorf("spread %v: never told apart", c.spread)
		case refused > c.refused:
			t.Errorf("spread %v: %d attempts refused once the window was told apart, want at most %d (guard %v)", c.spread, refused, c.refused, guard)
		case c.learned != (guard > least) || guard < least || guard > per/100:
			t.Errorf("spread %v: guard %v, want %v, more if learned (%v), at most %v", c.spread, guard, least, c.learned, per/100)
		}
	}
}

// windowTransit runs TestWindowEdgeTransit's lane and server for a minute
// with transits spread over [0, spread), and returns the refusals of
// attempts sent once the window was told apart, the guard learned, and
// whether the window was told apart.
func windowTransit(spread, per time.Duration) (refused int, guard time.Duration, told bool) {
	const limit, gap, latency = 10, 100 * time.Millisecond, 20 * time.Millisecond
	rng := rand.New(rand.NewPCG(1, 2))
	var (
		e     windowEdge
		start time.Duration = -1 // the server's window, from its first arrival
		n     int
		next  = 500 * time.Millisecond
	)
	for next < 60*time.Second {
		sent := next
		wasTold := e.isTold()
		arrived := sent + time.Duration(rng.Int64N(int64(spread)))
		if start < 0 || arrived >= start+per {
			start, n = arrived, 0
		}
		ok := n < limit
		if ok {
			n++
		}
		now := arrived + latency
		q := headers.Quota{Limit: limit, Remaining: int64(limit - n), Reset: max(0, (start+per).Truncate(time.Second)-now), Coarse: true, Instant: true, Source: "x-ratelimit"}
		e.observe(now, sent, q, ok)
		if !ok && wasTold {
			refused++
		}
		next = sent + gap
		if e.isTold() && (!ok || q.Remaining == 0) {
			next = max(next, e.end)
		}
	}
	return refused, e.guard, e.isTold()
}

// TestWindowEdgeFarReset: a lane that spends a window of 60 per 6 s in its
// first 60 ms (sethvargo/go-limiter's: on a grid from the first request,
// its reset a date read as the end of its second) and waits for the reset
// has seen the window gain nothing in a span too short to tell; the next
// window's first answer, nearly full and stating its reset some 6 s away,
// tells it apart: a bucket that gained 60 in those 6 s would be full a
// tenth of a second later, and say so. A bucket of 60 refilling 10 a
// second, its reset the instant it is full rounded up to the second
// (redis_rate's), spent and waited for as long or shorter, is not told
// apart.
func TestWindowEdgeFarReset(t *testing.T) {
	const limit, per = 60, 6 * time.Second
	for _, c := range []struct {
		name   string
		bucket bool
		wait   time.Duration // from the refusal to the next attempt
	}{
		{"window", false, 6 * time.Second},
		{"bucket, full again", true, 7 * time.Second},
		{"bucket, three quarters full", true, 4600 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			var e windowEdge
			phase := 300 * time.Millisecond
			quota := func(now time.Duration, n int) headers.Quota {
				// n requests counted; a date read as the end of its second
				// for the window, a Unix time rounded up for the bucket.
				end := (per + phase).Truncate(time.Second) + time.Second // the window's first end as read
				if now >= per {
					end += per
				}
				if c.bucket {
					end = (now + phase + time.Duration(n)*per/limit + time.Second - 1).Truncate(time.Second)
				}
				return headers.Quota{Limit: limit, Remaining: int64(limit - n), Reset: end - phase - now, Coarse: true, Instant: true, Source: "x-ratelimit"}
			}
			now := time.Duration(0)
			for i := 1; i <= limit; i++ {
				e.observe(now+20*time.Millisecond, now, quota(now, i), true)
				now += time.Millisecond
			}
			e.observe(now+20*time.Millisecond, now, quota(now, limit), false) // refused
			now += c.wait
			n := 1
			if c.bucket {
				// What the bucket refilled over the wait, less this request.
				n = limit - min(limit, int(c.wait*limit/per)) + 1
			}
			told := e.observe(now+20*time.Millisecond, now, quota(now, n), true)
			if told == c.bucket {
				t.Errorf("told apart: %v, want %v", told, !c.bucket)
			}
		})
	}
}

// period returns the step e measured from one window to the next.
func period(e *windowEdge) time.Duration {
	p, _ := e.statedPeriod()
	return p
}

// TestWindowEdgeGranted: once the grants an answer allowed before the
// window's measured end went, the next waits for that end, until an answer
// allows more; past the end, and after an answer that allowed none, grants
// are not counted.
func TestWindowEdgeGranted(t *testing.T) {
	ms := time.Millisecond
	var e windowEdge
	if _, held := e.granted(0); held {
		t.Fatal("nothing allowed yet: a grant is held back")
	}
	if e.allow(0, 2, 100*ms) {
		t.Error("an answer lifted a hold that was never set")
	}
	if _, held := e.granted(10 * ms); held {
		t.Error("the first of 2 allowed grants held the next back")
	}
	if next, held := e.granted(20 * ms); !held || next != 100*ms {
		t.Errorf("the second of 2 allowed grants: next at %v (held %v), want held to 100ms", next, held)
	}
	if !e.allow(30*ms, 3, 100*ms) {
		t.Error("an answer allowing 3 more did not lift the hold")
	}
	if _, held := e.granted(40 * ms); held {
		t.Error("the first of 3 allowed after a lift held the next back")
	}
	if e.allow(50*ms, 2, 100*ms) {
		t.Error("an answer lifted a hold that was not set")
	}
	e.granted(60 * ms)
	if _, held := e.granted(70 * ms); !held {
		t.Error("the last of 2 allowed grants did not hold the next back")
	}
	if e.allow(80*ms, 0, 0) {
		t.Error("an answer allowing none lifted the hold")
	}
	if _, held := e.granted(150 * ms); held {
		t.Error("a grant past the window's end was held back")
	}
	if _, held := e.granted(160 * ms); held {
		t.Error("after an answer that allowed none, a grant was held back")
	}
	e.allow(200*ms, 1, 300*ms)
	e.granted(210 * ms)
	if e.allow(310*ms, 5, 1300*ms) {
		t.Error("an answer after the window's end lifted a hold that had run out")
	}
}
