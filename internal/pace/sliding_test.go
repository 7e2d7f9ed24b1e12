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
