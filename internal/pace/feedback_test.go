package pace

import (
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/verdict"
)

// TestPacerCutsToGrantsSinceCut: a lane cut at 1 s to 25/s probes up and
// is refused at 120/s 1.14 s later, having been granted 58 attempts since
// the cut: the server took at most 58 / 1.14 s, and that is the rate that
// failed, not the pace; the lane goes to the plateau under it and creeps
// up over seconds. A cooldown since the cut, a count under the rate
// the cut set, or a pace under 1.5 times the count leave the pace's rule.
func TestPacerCutsToGrantsSinceCut(t *testing.T) {
	cut := func(pace float64, grants int, cool bool) feedback {
		f := newFeedback(0, 0)
		f.throttle, f.fail, f.cutTo, f.failAt, f.probing, f.okRun = pace, 25, 25, time.Second, true, 12
		if cool {
			f.coolFrom, f.coolTo = time.Second, 1500*time.Millisecond
		}
		at := 2140 * time.Millisecond
		f.cut(at, refusal{sent: at, pace: pace, grants: grants})
		return f
	}
	count := 58 / 1.14
	if f := cut(120, 58, false); math.Abs(f.fail-count) > 1e-9 || math.Abs(f.throttle-f.plateau()) > 1e-9 ||
		f.plateau() >= count || !f.edge || f.creep != countCreep {
		t.Errorf("refused at 120/s after 58 grants in 1.14 s: fail %.1f, throttle %.1f (plateau %.1f), edge %v, creep %v; "+
			"want fail %.1f, the plateau under it, creeping over %v", f.fail, f.throttle, f.plateau(), f.edge, f.creep, count, countCreep)
	}
	for _, c := range []struct {
		name   string
		pace   float64
		grants int
		cool   bool
	}{
		{"a cooldown since the cut", 120, 58, true},
		{"a count under the cut's rate", 120, 20, false},
		{"a pace under 1.5 times the count", 70, 58, false},
	} {
		if f := cut(c.pace, c.grants, c.cool); f.fail < 0.9*min(c.pace, 120) {
			t.Errorf("%s: fail %.1f, want the pace's rule (about %.0f)", c.name, f.fail, c.pace)
		}
	}

	// The grants counted are those up to the refused attempt's: later ones
	// were sent after it.
	p := New(50, 1, time.Minute, true, 0)
	for i := range 10 {
		p.used(time.Duration(i) * 20 * time.Millisecond)
	}
	if n := p.grantsTo(200*time.Millisecond, 140*time.Millisecond); n != 8 {
		t.Errorf("grants up to the 8th: %d", n)
	}
	if n := p.grantsTo(200*time.Millisecond, 60*time.Millisecond); n != 3 {
		t.Errorf("grants up to one no longer held, 140 ms before now at 50/s: %d, want 10 - 7", n)
	}
}

// TestPacerFirstEstimateCountsInFlight: a lane with no rate whose calls
// take 400 ms has had 26 accepted by 1.2 s, the first sent at 0, and 20
// more in flight when a 429 comes at once: the server took 46 in 1.2 s,
// where the acceptances alone tell 26 a second.
func TestPacerFirstEstimateCountsInFlight(t *testing.T) {
	for _, c := range []struct {
		inFlight int // the lane's, the refused attempt's included
		want     float64
	}{
		{21, 46 / 1.2},
		{1, 26}, // nothing else in flight: the acceptances over a second
	} {
		p := New(0, 1, time.Minute, true, 0)
		for i := range 26 {
			sent := time.Duration(i) * 30 * time.Millisecond
			p.Settle(sent+400*time.Millisecond, sent, verdict.Served)
		}
		at := 1200 * time.Millisecond
		p.Observe(at, Reply{Status: http.StatusTooManyRequests, Sent: at}, c.inFlight)
		if math.Abs(p.fb.fail-c.want) > 1e-9 || p.Rate() <= 0 || p.Rate() > c.want {
			t.Errorf("%d in flight: first estimate %.2f, pace %.2f; want %.2f and a pace at most that",
				c.inFlight, p.fb.fail, p.Rate(), c.want)
		}
	}
}
