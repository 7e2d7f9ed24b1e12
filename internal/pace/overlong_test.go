package pace

import (
	"net/http"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/headers"
)

// TestOverlongWait: a Retry-After longer than the stated reset and its
// grain waits for the reset and its grain; one within them, or a quota
// with no reset, waits for the Retry-After.
func TestOverlongWait(t *testing.T) {
	for _, c := range []struct {
		name string
		ra   time.Duration
		q    headers.Quota
		want time.Duration
	}{
		{"reset to the second, a minute's Retry-After", time.Minute, headers.Quota{Remaining: 0, Reset: 2 * time.Second, Coarse: true, Instant: true}, 3 * time.Second},
		{"reset to the millisecond", time.Minute, headers.Quota{Remaining: 0, Reset: 2 * time.Second}, 2 * time.Second},
		{"reset passed, to the second", 6 * time.Second, headers.Quota{Remaining: 0, Passed: 400 * time.Millisecond, Coarse: true, Instant: true}, 600 * time.Millisecond},
		{"reset passed a second ago", 6 * time.Second, headers.Quota{Remaining: 0, Passed: time.Second, Coarse: true, Instant: true}, 6 * time.Second},
		{"Retry-After within the reset's grain", 3 * time.Second, headers.Quota{Remaining: 0, Reset: 2 * time.Second, Coarse: true}, 3 * time.Second},
		{"Retry-After before the reset", time.Second, headers.Quota{Remaining: 0, Reset: 30 * time.Second}, time.Second},
		{"no reset", time.Minute, headers.Quota{Remaining: 0}, time.Minute},
		{"a GCRA's waits rounded up to the second", time.Second, headers.Quota{Limit: 6, Remaining: 0, Reset: time.Second, Coarse: true}, time.Second / 6},
		{"a GCRA's waits rounded up, a burst of one", time.Second, headers.Quota{Limit: 1, Remaining: 0, Reset: time.Second, Coarse: true}, time.Second},
		{"a Retry-After of two seconds", 2 * time.Second, headers.Quota{Limit: 6, Remaining: 0, Reset: time.Second, Coarse: true}, 2 * time.Second},
	} {
		o := newOverlong()
		if got := o.shorten(10*time.Second, c.ra, sooner(c.ra, c.q, false)); got != c.want {
			t.Errorf("%s: wait %v, want %v", c.name, got, c.want)
		}
	}
	o := newOverlong()
	if got := o.shorten(0, time.Second, sooner(time.Second, headers.Quota{Limit: 6, Remaining: 0, Reset: time.Second, Coarse: true}, true)); got != time.Second {
		t.Errorf("a window's Retry-After of one second: wait %v, want it whole", got)
	}
}

// TestOverlongAnswered: the first answer to an attempt sent after a
// shortened wait ended settles it: an acceptance keeps shortening the next
// ones, a refusal makes every later Retry-After meant. Answers to attempts
// sent before the wait ended say nothing.
func TestOverlongAnswered(t *testing.T) {
	q := headers.Quota{Remaining: 0, Reset: 2 * time.Second}
	o := newOverlong()
	if w := o.shorten(0, time.Minute, sooner(time.Minute, q, false)); w != 2*time.Second {
		t.Fatalf("first wait %v", w)
	}
	o.answered(time.Second, true) // sent before the wait ended
	o.answered(2*time.Second, false)
	if w := o.shorten(3*time.Second, time.Minute, sooner(time.Minute, q, false)); w != 2*time.Second {
		t.Fatalf("after an acceptance: wait %v, want the reset's 2s", w)
	}
	o.answered(4*time.Second, true) // sent before the wait ended at 5s
	if w := o.shorten(4*time.Second, time.Minute, sooner(time.Minute, q, false)); w != 2*time.Second {
		t.Fatalf("after a refusal of an attempt sent within the wait: wait %v, want 2s", w)
	}
	o.answered(6*time.Second, true)
	if w := o.shorten(6*time.Second, time.Minute, sooner(time.Minute, q, false)); w != time.Minute {
		t.Fatalf("after a refusal past the reset: wait %v, want the Retry-After", w)
	}
	o.answered(70*time.Second, false)
	if w := o.shorten(70*time.Second, time.Minute, sooner(time.Minute, q, false)); w != time.Minute {
		t.Fatalf("an acceptance after: wait %v, want the Retry-After still", w)
	}
}

// TestPacerRetryAfterPastTheReset: a 429 whose quota is exhausted until a
// reset two seconds away, stated to the second, but whose Retry-After is a
// minute (go-chi/httprate's whole window) cools the lane until the reset
// and its grain; when the first attempt sent after that is refused too,
// the next Retry-After holds in full. A Retry-After with quota left
// (GitHub's secondary limits) always does.
func TestPacerRetryAfterPastTheReset(t *testing.T) {
	refusal := func(sent time.Duration, remaining int64) Reply {
		return Reply{Status: http.StatusTooManyRequests, Sent: sent, HasRA: true, RetryAfter: time.Minute, HasQuota: true,
			Quota: headers.Quota{Limit: 300, Remaining: remaining, Reset: 2 * time.Second, Coarse: true, Instant: true, Source: "x-ratelimit"}}
	}
	p := New(0, 1, 10*time.Minute, true, 0)
	if c := p.Observe(time.Second, refusal(time.Second-20*time.Millisecond, 0), 1); c.Cool.Until != 4*time.Second {
		t.Fatalf("cooled until %v, want 4s: the reset and its grain", c.Cool.Until)
	}
	if c := p.Observe(5*time.Second, refusal(4*time.Second, 0), 1); c.Cool.Until != 65*time.Second {
		t.Fatalf("refused past the reset: cooled until %v, want 65s", c.Cool.Until)
	}

	p = New(0, 1, 10*time.Minute, true, 0)
	if c := p.Observe(time.Second, refusal(time.Second-20*time.Millisecond, 5), 1); c.Cool.Until != 61*time.Second {
		t.Fatalf("quota left: cooled until %v, want the Retry-After's 61s", c.Cool.Until)
	}
}

// TestPacerRetryAfterProbeNotAlone: a strict GCRA of 100 a second whose
// refusals state Retry-After: 1 and a quota full within a second (the
// GCRA's wait of milliseconds rounded up) pauses an unpaced lane for one
// request's share; at the pause's end the lane sends what its slots allow,
// and the server refuses the second at once, while the first is still in
// flight to be accepted. That refusal does not make the Retry-After meant:
// the next is shortened too. A refusal of an attempt sent after the wait
// that went alone does.
func TestPacerRetryAfterProbeNotAlone(t *testing.T) {
	const ms = time.Millisecond
	refusal := func(sent time.Duration) Reply {
		return Reply{Status: http.StatusTooManyRequests, Sent: sent, HasRA: true, RetryAfter: time.Second, HasQuota: true,
			Quota: headers.Quota{Limit: 100, Remaining: 0, Reset: time.Second, Coarse: true, Source: "x-ratelimit"}}
	}
	p := New(0, 1, time.Minute, true, 0)
	if c := p.Observe(2*ms, refusal(0), 2); c.Cool.Until != 12*ms {
		t.Fatalf("first refusal: cooled until %v, want 12ms", c.Cool.Until)
	}
	if c := p.Observe(13*ms, refusal(12*ms), 2); c.Cool.Until != 23*ms {
		t.Fatalf("refusal of the second sent at the wait's end: cooled until %v, want 23ms", c.Cool.Until)
	}
	if c := p.Observe(25*ms, refusal(23*ms), 2); c.Cool.Until != 35*ms {
		t.Fatalf("the same at the next wait's end: cooled until %v, want 35ms: the Retry-After not meant", c.Cool.Until)
	}
	if c := p.Observe(37*ms, refusal(36*ms), 1); c.Cool.Until != 37*ms+time.Second {
		t.Errorf("after a refusal of an attempt alone past the wait: cooled until %v, want the Retry-After's %v", c.Cool.Until, 37*ms+time.Second)
	}
}
