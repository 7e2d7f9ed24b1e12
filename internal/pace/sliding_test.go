package pace

import (
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/headers"
)

// TestSlidingStaysTold: a sliding window told apart stays so while its
// count falls to a reset that stays put, as a fixed window's does; and a
// refusal whose Retry-After names its whole window (go-chi/httprate's, to
// the second) waits one request's time at its limit per window, while a
// shorter Retry-After, or one from a server not told sliding, is a
// server's word.
func TestSlidingStaysTold(t *testing.T) {
	const w = 6 * time.Second
	var m quotaModel
	q := func(now time.Duration, rem int64) headers.Quota {
		end := now.Truncate(w) + w
		return headers.Quota{Limit: 300, Remaining: rem, Reset: end - now, Coarse: true, Instant: true, Source: "x-ratelimit"}
	}
	if m.wholeWindow(w) {
		t.Fatal("a Retry-After overstated before any quota")
	}
	now := 10 * time.Millisecond
	for i := range 290 {
		m.observe(now, now, q(now, int64(298-i)), 1)
		now += 20 * time.Millisecond
	}
	// Three windows with most of the window before still counted at the
	// start of each, and the count falling through each.
	for now = w + 10*time.Millisecond; now < 4*w; now += 20 * time.Millisecond {
		m.observe(now, now, q(now, max(1, 40-int64((now%w)/(150*time.Millisecond)))), 1)
		if now > 2*w && m.kind != kindSliding {
			t.Fatalf("at %v: kind %v; want sliding, as told at the window before", now, m.kind)
		}
	}
	if !m.wholeWindow(w) || m.wholeWindow(w/2) || m.wholeWindow(0) {
		t.Errorf("Retry-After read as naming the whole window: %v for 6s, %v for 3s, %v for none; want true, false, false", m.wholeWindow(w), m.wholeWindow(w/2), m.wholeWindow(0))
	}
	if d := m.refusalWait(now, q(now, 0)); d != 20*time.Millisecond {
		t.Errorf("a refusal waits %v; want one request's time at 300 a 6s, 20ms", d)
	}
}

// TestSlidingLateAnswer: a sliding window of 200 a second, its windows a
// quarter second off the second and its instants truncated to the second
// (go-chi/httprate's), told apart by its count carried over, stays told
// when, at each step, an answer from the window before comes after the
// first answer from the new one (a refusal answered at once, overtaken by
// transit jitter): its instant is a step before the run's, not a reset
// that moved before it came.
func TestSlidingLateAnswer(t *testing.T) {
	const limit = 200
	q := func(now time.Duration, win int64, rem int64) headers.Quota {
		// Window win runs from win-0.75 s to win+0.25 s; it states the
		// instant win, passed for its last quarter second.
		inst := time.Duration(win) * time.Second
		qq := headers.Quota{Limit: limit, Remaining: rem, Coarse: true, Instant: true, Source: "x-ratelimit"}
		if now < inst {
			qq.Reset = inst - now
		} else {
			qq.Passed = now - inst
		}
		return qq
	}
	window := func(now time.Duration) int64 { return int64((now + 750*time.Millisecond) / time.Second) }
	var m quotaModel
	told := false
	for now := 10 * time.Millisecond; now < 8*time.Second; now += 5 * time.Millisecond {
		w := window(now)
		m.observe(now, now, q(now, w, int64(now/(5*time.Millisecond))%3), 1)
		if w != window(now-5*time.Millisecond) {
			// The window before's refusal, 2 ms after the new window's
			// first answer.
			late := now + 2*time.Millisecond
			m.learnRefused(late, q(late, w-1, 0))
		}
		if m.kind == kindSliding {
			told = true
		} else if told {
			t.Fatalf("at %v: kind %v, told sliding before", now, m.kind)
		}
	}
	if !told {
		t.Fatal("never told sliding")
	}
}
