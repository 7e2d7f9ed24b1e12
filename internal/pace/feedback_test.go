package pace

import (
	"math"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/verdict"
)

// TestFeedbackCutsToGrantsSinceCut: a lane cut at 1 s to 25/s probes up and
// is refused at 120/s 1.14 s later, having been granted 58 attempts since
// the cut: the server took at most 58 / 1.14 s, and that is the rate that
// failed, not the pace; the lane goes to the plateau under it and creeps
// up over seconds. A cooldown since the cut, a count under the rate
// the cut set, or a pace under 1.5 times the count leave the pace's rule.
func TestFeedbackCutsToGrantsSinceCut(t *testing.T) {
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
}

// TestPacerProbeCrossingIsTheEdge: a lane probing up from a guess that the
// server took until a 429 crossed the limit just then: the failed rate is
// the middle of the last two paces' step, whatever the run's length, and the
// lane creeps from under it rather than probing on.
func TestPacerProbeCrossingIsTheEdge(t *testing.T) {
	var f feedback = newFeedback(0, 0)
	f.throttle, f.fail, f.probing, f.okRun, f.failAt = 50, 20, true, 3, 0
	f.cut(time.Second, refusal{sent: time.Second, pace: 50, ra: time.Second})
	want := 50 * math.Pow(firstProbe, -0.5/50)
	if math.Abs(f.fail-want) > 1e-9 || !f.edge || f.probing || f.creep == 0 {
		t.Errorf("fail %v edge %v probing %v creep %v; want fail %v at the edge, creeping", f.fail, f.edge, f.probing, f.creep, want)
	}
	if f.throttle >= want || f.throttle < 0.85*want {
		t.Errorf("throttle %v, want a cut under %v", f.throttle, want)
	}

	// The refused request was sent 20 ms before its answer: the probe
	// crossed at the pace then, 2.8% under the pace at the answer.
	f = newFeedback(0, 0)
	f.throttle, f.fail, f.probing, f.okRun, f.failAt, f.cutTo = 50, 20, true, 3, 0, 20
	f.cut(time.Second, refusal{sent: time.Second - 20*time.Millisecond, pace: 50, ra: time.Second})
	then := 50 * math.Pow(firstProbe, -0.02)
	if want := then * math.Pow(firstProbe, -0.5/then); math.Abs(f.fail-want) > 1e-9 {
		t.Errorf("refused 20 ms after it was sent: fail %v, want %v, half a token under the pace then (%v)", f.fail, want, then)
	}
}

// TestFeedbackCutsToTheCountedRefill: a refusal of a pace over the refill
// rate counted from the quotas cuts to that rate, whatever the run before:
// at the edge, creeping for minutes, when it was counted over a second or
// more; as a guess, probed upward, when a refusal ended its count sooner
// (a window's first fill, spent fast, reads the same).
func TestFeedbackCutsToTheCountedRefill(t *testing.T) {
	for _, rough := range []bool{false, true} {
		f := newFeedback(100, 0)
		f.cut(time.Second, refusal{sent: time.Second, pace: 100, refill: 50, rough: rough})
		if f.fail != 50 || f.rate(time.Second) != throttleCutKnown*50 || !f.counted {
			t.Errorf("rough %v: failed rate %v, rate %v, counted %v; want 50, %v, true", rough, f.fail, f.rate(time.Second), f.counted, throttleCutKnown*50)
		}
		if f.edge == rough || f.probing != rough || (f.creep == edgeCreep) == rough {
			t.Errorf("rough %v: edge %v, probing %v, creep %v; want a guess probed upward if rough, else an edge", rough, f.edge, f.probing, f.creep)
		}
	}
}

// TestPacerCutsToGrantsSinceCut: the grants a lane counts since its
// last cut, at a refusal, are those up to the refused attempt's: later ones
// were sent after it. The count is exact while the refused grant is among
// the last few held, and estimated from the pace since when it is not. An
// unpaced lane's first estimate, 24.5/s, probes up to 100/s over about a
// second, its grants each accepted: the server took about 52/s since, and
// the refusal cuts to the plateau under that (see
// TestFeedbackCutsToGrantsSinceCut).
func TestPacerCutsToGrantsSinceCut(t *testing.T) {
	for _, c := range []struct {
		later int     // grants after the refused one
		slack float64 // in grants: the count is estimated
	}{{0, 0}, {2, 0}, {6, 1}} {
		p := New(0, 1, time.Minute, true, 0)
		for i := range 25 {
			sent := time.Duration(i) * 40 * time.Millisecond
			p.Settle(sent+20*time.Millisecond, sent, verdict.Served)
		}
		cut := time.Second
		if ch := p.Observe(cut, Reply{Status: http.StatusTooManyRequests, Sent: cut}, 1); ch.Cause != CauseCut || p.Rate() != 24.5 {
			t.Fatalf("the first 429: %+v, rate %v; want a first estimate of 24.5/s", ch, p.Rate())
		}
		var grants []time.Duration
		now := cut
		for p.Rate() < 100 {
			now += p.TokenDelay(now)
			if !p.Take(now, false) {
				t.Fatalf("no token at %v", now)
			}
			grants = append(grants, now)
			p.Settle(now, now, verdict.Served)
		}
		n := len(grants) - c.later // the refused attempt's grant, counted from 1
		sent := grants[n-1]
		p.Observe(now+time.Millisecond, Reply{Status: http.StatusTooManyRequests, Sent: sent}, 1)
		dt := (sent - cut).Seconds()
		lo, hi := (float64(n)-c.slack)/dt, (float64(n)+c.slack)/dt
		if r := p.Rate() / (1 - throttleMargin); r < lo-1e-9 || r > hi+1e-9 {
			t.Errorf("refused grant %d of %d since the cut, %v after it: rate %.2f, the failed rate %.2f; want %.2f-%.2f",
				n, len(grants), sent-cut, p.Rate(), r, lo, hi)
		}
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
		// The first estimate is probed upward from the margin under it.
		if want := (1 - throttleMargin) * c.want; math.Abs(p.Rate()-want) > 1e-9 {
			t.Errorf("%d in flight: pace %.2f; want %.2f, the margin under the first estimate %.2f",
				c.inFlight, p.Rate(), want, c.want)
		}
	}
}

// TestFeedbackJitterKeepsTheFailedRate: a lane cut at its ceiling of
// 100/s climbs back to the plateau under it, and the server takes that
// pace for 5 s. A refusal then, its grants' spacing (kept) 90/s, is the
// transit's jitter, not a limit under the plateau: the failed rate stands.
// The margin widens only where refusals that far apart cost more than it
// would (a cooldown of a second; not one of 10 ms), and narrows again
// after a run long enough to pay for a refusal. Where the quotas show a
// burst, the refusal is the bucket's, and the pace the grants kept is cut
// to. Refusals that go on after short runs widen the margin to its most,
// then cut the failed rate down again.
// TestFeedbackJitterUnderAStatedLimit: a lane with no rate of its own,
// whose first refusal took the limit the quotas state (50/s, no burst),
// and which then ran five seconds at the plateau under it, reads a 429 as
// the requests' jitter, as at an edge: the stated rate stands, and the
// pace goes back to the plateau, not to 0.9 of the spacing of the grants
// before the refusal.
func TestFeedbackJitterUnderAStatedLimit(t *testing.T) {
	f := newFeedback(0, 0)
	now := 100 * time.Millisecond
	for range 3 {
		f.accept(now, now, false, quotaView{})
		now += time.Millisecond
	}
	f.cut(now, refusal{sent: now, stated: 50})
	if f.fail != 50 {
		t.Fatalf("first refusal, quotas stating 50/s: failed rate %.2f, want 50", f.fail)
	}
	pace := f.rate(now)
	for end := now + 5*time.Second; now < end; {
		now += time.Duration(float64(time.Second) / pace)
		f.accept(now, now, true, quotaView{})
	}
	f.cool(now, now+10*time.Millisecond, "retry-after")
	f.cut(now, refusal{sent: now, pace: f.rate(now), kept: 46.5, stated: 50})
	if f.fail != 50 || math.Abs(f.rate(now)-pace) > 1e-9 {
		t.Errorf("refused after a run of 5 s at %.2f: failed rate %.2f, pace %.2f; want 50 and %.2f", pace, f.fail, f.rate(now), pace)
	}
}

// A lane probing up from a first guess that the quotas' pace stops under
// their limit runs there, and a refusal after that run is the jitter too:
// the pace it ran at is the failed rate, and the lane goes back to the
// plateau under it. A refusal early in the probe, before the server took
// the pace for long, still cuts to the spacing kept.
func TestFeedbackJitterAfterAProbe(t *testing.T) {
	for _, c := range []struct {
		name string
		run  time.Duration
		fail float64 // want; 0: cut under the spacing kept
	}{
		{"after a run of 5 s at the quotas' pace", 5 * time.Second, 99},
		{"before the probe reached it", 300 * time.Millisecond, 0},
	} {
		f := newFeedback(0, 0)
		now := 100 * time.Millisecond
		for range 3 {
			f.accept(now, now, false, quotaView{})
			now += time.Millisecond
		}
		f.cut(now, refusal{sent: now})
		if !f.probing || f.fail <= 0 || f.fail >= 99 {
			t.Fatalf("%s: first refusal: probing %v, failed rate %.2f; want a probe from a guess under 99", c.name, f.probing, f.fail)
		}
		f.heard(now, quotaPace{rate: 99, until: time.Hour}, 0)
		for end := now + c.run; now < end; {
			pace := f.rate(now)
			now += time.Duration(float64(time.Second) / pace)
			f.accept(now, now, true, quotaView{perSecond: 100})
			f.grow(now)
		}
		pace := f.rate(now)
		if c.fail > 0 && pace != 99 {
			t.Fatalf("%s: pace %.2f, want the quotas' 99", c.name, pace)
		}
		f.cool(now, now+10*time.Millisecond, "retry-after")
		f.cut(now, refusal{sent: now, pace: pace, kept: 87, stated: 100})
		switch {
		case c.fail > 0 && (f.fail != c.fail || math.Abs(f.rate(now)-(1-throttleMargin)*c.fail) > 1e-9):
			t.Errorf("%s: failed rate %.2f, pace %.2f; want %.2f and the plateau %.2f", c.name, f.fail, f.rate(now), c.fail, (1-throttleMargin)*c.fail)
		case c.fail == 0 && f.fail > 87:
			t.Errorf("%s: failed rate %.2f, want at most the spacing kept, 87", c.name, f.fail)
		}
	}
}

func TestFeedbackJitterKeepsTheFailedRate(t *testing.T) {
	// atPlateau returns a lane cut at 1 s at its ceiling, then served a
	// request every 10 ms for run, and when the run ended.
	atPlateau := func(run time.Duration) (feedback, time.Duration) {
		f := newFeedback(100, 0)
		f.cut(time.Second, refusal{sent: time.Second, pace: 100})
		now := time.Second
		for end := now + run; now < end; {
			now += 10 * time.Millisecond
			f.accept(now, now, true, quotaView{})
		}
		return f, now
	}
	for _, c := range []struct {
		name   string
		cool   time.Duration
		burst  bool
		fail   float64
		margin float64
	}{
		{"a cooldown of 10 ms", 10 * time.Millisecond, false, 100, throttleMargin},
		{"a cooldown of 1 s", time.Second, false, 100, 2 * throttleMargin},
		{"quotas that show a burst", 10 * time.Millisecond, true, 90, throttleMargin},
	} {
		f, now := atPlateau(5 * time.Second)
		pace := f.rate(now)
		if math.Abs(pace-f.plateau()) > 0.01*pace || f.fail != 100 {
			t.Fatalf("%s: after the run, pace %.2f, failed rate %.2f; want the plateau %.2f under 100", c.name, pace, f.fail, f.plateau())
		}
		f.cool(now, now+c.cool, "retry-after")
		f.cut(now, refusal{sent: now, pace: pace, kept: 90, burst: c.burst})
		if math.Abs(f.fail-c.fail) > 1e-9 || f.margin != c.margin {
			t.Errorf("%s: failed rate %.2f, margin %.2f; want %.2f and %.2f", c.name, f.fail, f.margin, c.fail, c.margin)
		}
		if want := (1 - c.margin) * c.fail; c.fail == 100 && math.Abs(f.rate(now)-want) > 1e-9 {
			t.Errorf("%s: pace %.2f, want the plateau %.2f", c.name, f.rate(now), want)
		}
		if c.margin == throttleMargin {
			continue
		}
		// A widened margin narrows once a refusal per run would have
		// cost less than the narrower one: a second's cooldown at 96/s
		// and the attempt, 97 requests, over a run of 4,850 or more at
		// the narrower margin's 2%.
		for n := 1; n <= 6000; n++ {
			now += 10 * time.Millisecond
			f.accept(now, now, true, quotaView{})
			if narrowed := f.margin == throttleMargin; narrowed != (n >= 4850) && (n < 4800 || n > 4900) {
				t.Fatalf("%s: margin %.2f after a run of %d; want it narrowed after about 4,850", c.name, f.margin, n)
			}
		}
		if r := f.rate(now); r < 0.98*100 {
			t.Errorf("%s: pace %.2f a minute after the margin narrowed; want back to the plateau %.2f", c.name, r, 0.98*100.0)
		}
	}

	// Refused after every run of edgeRun, short of jitterRun: each is
	// cut as any edge 429, so the margin widens to its most and the
	// failed rate comes down.
	f, now := atPlateau(3 * time.Second)
	for range 12 {
		pace := f.rate(now)
		f.cool(now, now+10*time.Millisecond, "retry-after")
		f.cut(now, refusal{sent: now, pace: pace, kept: pace})
		for range edgeRun {
			now += 50 * time.Millisecond
			f.accept(now, now, true, quotaView{})
		}
		now += 3 * time.Second // the ramp back to the plateau
		f.grow(now)
	}
	if f.margin != maxMargin || f.fail > 80 {
		t.Errorf("refused after every run of %d: margin %.2f, failed rate %.2f; want %.2f and the rate cut under 80", edgeRun, f.margin, f.fail, maxMargin)
	}
}

// TestAcceptNIsManyAccepts: n acceptances taken at once leave a paced
// lane's feedback as n taken one by one at the same instant would, in
// recovery after a cut (where each acceptance grows the throttle) and
// with answers to attempts sent before the cut (which do not count toward
// the run since it).
func TestAcceptNIsManyAccepts(t *testing.T) {
	build := func() *feedback {
		f := newFeedback(0, 0)
		now := 100 * time.Millisecond
		for range 50 {
			f.accept(now, now, true, quotaView{})
			now += 10 * time.Millisecond
		}
		f.cut(now, refusal{sent: now, pace: 100, kept: 90})
		return &f
	}
	for _, c := range []struct {
		name      string
		now, sent time.Duration
	}{
		{"sent after the cut", 2 * time.Second, 1900 * time.Millisecond},
		{"sent before the cut", 2 * time.Second, 50 * time.Millisecond},
		{"at the cut", 600 * time.Millisecond, 600 * time.Millisecond},
	} {
		for _, n := range []int{1, 2, 31} {
			one, many := build(), build()
			var want string
			for range n {
				want = one.accept(c.now, c.sent, true, quotaView{})
			}
			if got := many.acceptN(c.now, c.sent, true, quotaView{}, n); got != want {
				t.Errorf("%s, n=%d: cause %q, want %q", c.name, n, got, want)
			}
			if one.throttle == 0 {
				t.Fatalf("%s: the feedback is not in recovery: the case tests nothing", c.name)
			}
			if !reflect.DeepEqual(one, many) {
				t.Errorf("%s, n=%d: acceptN left\n%+v\none by one\n%+v", c.name, n, *many, *one)
			}
		}
	}
}

// TestFeedbackClimbStopsAtWhatIsUsed: a lane with no ceiling that probes
// up from a first estimate while it sends 10 a second climbs to usedRoom
// times what the server accepts, no further, and the floor the next cut
// leaves follows what the server took, not the pace it refused.
func TestFeedbackClimbStopsAtWhatIsUsed(t *testing.T) {
	f := newFeedback(0, 0)
	now := time.Duration(0)
	for range 4 {
		f.accept(now, now, false, quotaView{})
		now += 100 * time.Millisecond
	}
	f.cut(now, refusal{sent: now, ra: time.Second})
	if f.throttle == 0 || !f.probing {
		t.Fatalf("the first cut left throttle %g, probing %v: the case tests nothing", f.throttle, f.probing)
	}
	for range 600 { // a minute at 10 a second
		now += 100 * time.Millisecond
		f.accept(now, now, true, quotaView{})
	}
	if hi := usedRoom * max(f.fail, 10); f.throttle > hi*1.01 {
		t.Errorf("after a minute of 10 accepted a second the throttle rate is %g; want at most %g", f.throttle, hi)
	}
	if f.throttle < 20 {
		t.Errorf("the throttle rate is %g: the climb stopped under twice what was used", f.throttle)
	}
	f.cut(now, refusal{sent: now, pace: f.throttle, kept: f.throttle})
	if fl := f.floor(); fl > ThrottleFloor*10*1.01 {
		t.Errorf("after a cut of a pace of 10 accepted a second the floor is %g; want at most %g", fl, ThrottleFloor*10)
	}
}
