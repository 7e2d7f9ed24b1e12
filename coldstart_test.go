package sluice

import (
	"math"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/internal/upstream"
	"github.com/sluice-go/sluice/internal/verdict"
)

// TestColdStartFitsLittle: a lane with no configured rate that learns 50/s
// from its server's quota headers (a fixed window of 50 a second), calls of
// 400 ms: Little's law asks for 20 in flight. The in-flight limit fits as
// soon as the rate and a latency are known, where growing a quarter a
// window from its unpaced start of 4 served 0.28 of the rate in the first
// 6 s. (The pace read from the window's headers, not the limit, keeps the
// run under 0.90: see the quota kinds in docs/design.md.)
func TestColdStartFitsLittle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		res := load{
			up: upstream.Config{Quota: 50, PolicyWindow: time.Second,
				Latency: func(int, *http.Request) time.Duration { return 400 * time.Millisecond }},
			workers: 64,
			dur:     6 * time.Second,
		}.run(t)
		n := 0
		for _, a := range res.arrivals {
			if a.Accepted {
				n++
			}
		}
		got := float64(n) / (6 * 50)
		t.Logf("first 6 s: %d accepted (%.2f of the rate), %d refused", n, got, res.rejected)
		if got < 0.75 {
			t.Errorf("first 6 s served at %.2f of the rate, want at least 0.75", got)
		}
		if share := float64(res.rejected) / float64(n+res.rejected); share > 0.01 {
			t.Errorf("%.1f%% refused, want at most 1%%", 100*share)
		}
	})
}

// TestSlowStart: a lane with neither a configured rate nor rate-limit
// headers, against a server that allows 50 requests a second (a bucket of
// 20, answering 429 without headers beyond it): calls of 400 ms for 6 s,
// then of 40 ms for 6 s. Little's law asks for 20, then 2, in flight. The
// in-flight limit doubles each round trip from its start while nothing
// says the server is queueing or refusing, so each phase serves at least
// 0.90 of the server's rate, where growing a quarter a window served 0.30
// in the first. Slow start's last round and the throttle rate's learning
// of the server's rate (see docs/design.md, "Feedback from 429s") are
// refused at most 1% of the calls together.
//
// The calls take each phase's latency within ±10%, or exactly (the calls
// of a round then end together, as on loopback): slow start spreads each
// round's sends over its round trip, or the last round would reach the
// server at once, and the server would refuse what its bucket cannot take
// of it before the first refusal is back.
func TestSlowStart(t *testing.T) {
	for _, c := range []struct {
		name   string
		jitter float64 // calls take the phase's latency within ±jitter
	}{
		{"±10%", 0.1},
		{"fixed", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { slowStart(t, c.jitter) })
		})
	}
}

func slowStart(t *testing.T, jitter float64) {
	start := time.Now()
	res := load{
		up: upstream.Config{Rate: 50, Burst: 20, RetryAfter: upstream.RetryAfterNone,
			Latency: func(n int, _ *http.Request) time.Duration {
				w := 400 * time.Millisecond
				if time.Since(start) >= 6*time.Second {
					w = 40 * time.Millisecond
				}
				_, f := math.Modf(float64(n) * 0.618034)
				return time.Duration(float64(w) * (1 + jitter*(2*f-1)))
			}},
		workers: 64,
		dur:     12 * time.Second,
	}.run(t)
	var n [2]int
	for _, a := range res.arrivals {
		if a.Accepted {
			n[min(int(a.At.Sub(res.start)/(6*time.Second)), 1)]++
		}
	}
	total := n[0] + n[1]
	for i, k := range n {
		got := float64(k) / (6 * 50)
		t.Logf("phase %d (%v): %d accepted, %.2f of the rate", i+1, []string{"400 ms", "40 ms"}[i], k, got)
		if got < 0.90 {
			t.Errorf("phase %d served %.2f of the rate, want at least 0.90", i+1, got)
		}
	}
	// Slow start ends at the first refusal, which makes the lane learn a
	// rate: what it sent over the server's rate until then is its own
	// overshoot. The refusals after are the throttle rate's learning of a
	// rate no header states.
	paced := res.start.Add(12 * time.Second)
	for _, smp := range res.samples {
		if smp.s.Rate > 0 {
			paced = res.start.Add(smp.at)
			break
		}
	}
	own := 0
	for _, a := range res.arrivals {
		if !a.Accepted && !a.At.After(paced) {
			own++
		}
	}
	t.Logf("%d refused of %d: %d until the lane learned a rate", res.rejected, total+res.rejected, own)
	if share := float64(own) / float64(total+res.rejected); share > 0.01 {
		t.Errorf("slow start's overshoot: %.1f%% refused, want at most 1%%", 100*share)
	}
	if share := float64(res.rejected) / float64(total+res.rejected); share > 0.01 {
		t.Errorf("%.1f%% refused, want at most 1%%", 100*share)
	}
}

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
	p := newPacer(50, 1, time.Minute, true, 0)
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
		p := newPacer(0, 1, time.Minute, true, 0)
		for i := range 26 {
			sent := time.Duration(i) * 30 * time.Millisecond
			p.settle(sent+400*time.Millisecond, sent, verdict.Served)
		}
		at := 1200 * time.Millisecond
		p.observe(at, reply{status: http.StatusTooManyRequests, sent: at}, c.inFlight)
		if math.Abs(p.fb.fail-c.want) > 1e-9 || p.rate <= 0 || p.rate > c.want {
			t.Errorf("%d in flight: first estimate %.2f, pace %.2f; want %.2f and a pace at most that",
				c.inFlight, p.fb.fail, p.rate, c.want)
		}
	}
}
