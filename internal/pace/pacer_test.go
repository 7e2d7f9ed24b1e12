package pace

import (
	"math"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/verdict"
)

// TestPacerRefusalIsNotAccepted: GitHub refuses for its rate with 403 and
// nothing remaining. The pacer counts it as throttled, cools the lane until
// the reset, and does not cut the rate (a quota explains it); the lane then
// settles the attempt as a 429 (see TestGitHub403IsNotAccepted), which
// counts toward neither the run of accepted responses that makes the next
// 429 one at the edge nor the acceptance rate, where a 200 would count
// toward both.
func TestPacerRefusalIsNotAccepted(t *testing.T) {
	p := New(10, 1, time.Minute, true, 0)
	now := time.Second
	c := p.Observe(now, Reply{Status: http.StatusForbidden, Sent: now, HasQuota: true,
		Quota: headers.Quota{Remaining: 0, Reset: time.Second, Source: "github"}}, 1)
	if !c.Throttled || !c.Refused || c.Cause != CauseHeader {
		t.Errorf("403 with nothing remaining: %+v, want throttled and refused, no cut", c)
	}
	if !c.Cool.Extended || !c.Cool.Fresh || c.Cool.Until != now+time.Second || p.NotBefore() != now+time.Second {
		t.Errorf("cooldown %+v, not before %v; want a new one until %v", c.Cool, p.NotBefore(), now+time.Second)
	}
	if p.Stats().Throttled != 1 || p.Rate() != 10 {
		t.Errorf("throttled %d, rate %v; want 1 and 10", p.Stats().Throttled, p.Rate())
	}
	p.Settle(now, now, verdict.Throttled)
	if p.Accepted(now) != 0 {
		t.Errorf("after a refusal: accepted %d, want 0", p.Accepted(now))
	}
	p.Settle(now, now, verdict.Served)
	if p.Accepted(now) != 1 {
		t.Errorf("after an acceptance: accepted %d, want 1", p.Accepted(now))
	}

	// A run of one short of edgeRun acceptances and a refusal settled is
	// not a run at the edge; edgeRun acceptances are.
	for _, c := range []struct {
		served, refused int
		edge            bool
	}{{edgeRun - 1, 1, false}, {edgeRun, 0, true}} {
		p := New(10, 1, time.Minute, true, 0)
		now := cutAtTheCeiling(t, &p, time.Second)
		for range c.served {
			now += 50 * time.Millisecond
			p.Settle(now, now, verdict.Served)
		}
		for range c.refused {
			now += 50 * time.Millisecond
			p.Settle(now, now, verdict.Throttled)
		}
		if got := atTheEdge(&p, now+50*time.Millisecond); got != c.edge {
			t.Errorf("%d accepted and %d refused since the cut: the next 429 at the edge %v, want %v",
				c.served, c.refused, got, c.edge)
		}
	}
}

// cutAtTheCeiling has p, paced at its configured rate, refused at now for
// an attempt sent then, and returns now.
func cutAtTheCeiling(t *testing.T, p *Pacer, now time.Duration) time.Duration {
	t.Helper()
	r := p.Rate()
	if c := p.Observe(now, Reply{Status: http.StatusTooManyRequests, Sent: now}, 1); c.Cause != CauseCut || p.Rate() >= r {
		t.Fatalf("429 at the configured rate %v: cause %q, rate %v; want a cut", r, c.Cause, p.Rate())
	}
	return now
}

// atTheEdge has p refused at now, for an attempt sent then and named no
// Retry-After, then has the server accept an attempt every 50 ms for 3 s,
// and reports whether the refusal was read as one at the edge of the
// server's limit: the lane creeps back toward the pace refused, and is
// still under it, where a refusal read as a guess's is probed past within
// a second or two.
func atTheEdge(p *Pacer, now time.Duration) bool {
	refused := p.Rate()
	p.Observe(now, Reply{Status: http.StatusTooManyRequests, Sent: now}, 1)
	for end := now + 3*time.Second; now < end; {
		now += 50 * time.Millisecond
		p.Settle(now, now, verdict.Served)
	}
	return p.Rate() < refused
}

// TestRunCountsAttemptsSentAfterCut: only an attempt sent after the last
// cut counts toward the run of accepted responses that makes the next 429
// one at the edge: answers to attempts already on their way say nothing of
// the new pace. Both count toward the acceptance rate.
func TestRunCountsAttemptsSentAfterCut(t *testing.T) {
	for _, c := range []struct {
		before int // of the edgeRun answers, those to attempts sent before the cut
		edge   bool
	}{{0, true}, {1, false}} {
		p := New(10, 1, time.Minute, true, 0)
		cut := cutAtTheCeiling(t, &p, time.Minute)
		now := cut
		for i := range edgeRun {
			now += 50 * time.Millisecond
			sent := now
			if i < c.before {
				sent = cut - time.Millisecond
			}
			p.Settle(now, sent, verdict.Served)
		}
		if got := p.Accepted(now); got != edgeRun {
			t.Errorf("accepted %d, want %d: every answer counts toward the acceptance rate", got, edgeRun)
		}
		if got := atTheEdge(&p, now+50*time.Millisecond); got != c.edge {
			t.Errorf("%d answers, %d to attempts sent before the cut: the next 429 at the edge %v, want %v",
				edgeRun, c.before, got, c.edge)
		}
	}
}

// TestPacerCutIsNotRepeated: a 429 for an attempt sent before the last cut
// was already on its way, and does not cut again.
func TestPacerCutIsNotRepeated(t *testing.T) {
	p := New(50, 1, time.Minute, true, 0)
	at := 10 * time.Second
	p.Observe(at, Reply{Status: http.StatusTooManyRequests, Sent: at - time.Millisecond}, 1)
	r := p.Rate()
	if r >= 50 {
		t.Fatalf("rate %v after a 429, want a cut", r)
	}
	c := p.Observe(at+time.Millisecond, Reply{Status: http.StatusTooManyRequests, Sent: at - time.Millisecond}, 1)
	if p.Rate() != r || c.Raised {
		t.Errorf("a 429 sent before the cut moved the rate: %v -> %v", r, p.Rate())
	}
	p.Observe(at+2*time.Millisecond, Reply{Status: http.StatusTooManyRequests, Sent: at + time.Millisecond}, 1)
	if p.Rate() >= r {
		t.Errorf("a 429 sent after the cut: rate %v, want below %v", p.Rate(), r)
	}
}

// TestPacerCooldown: a cooldown holds every token until it ends; a later
// one extends it, an earlier one does not; one after the last has ended is
// a new one; the Backend is told each end once.
func TestPacerCooldown(t *testing.T) {
	p := New(100, 1, time.Minute, true, 0)
	if _, ok := p.ToShare(); ok {
		t.Error("a cooldown to share before any")
	}
	c := p.Cool(time.Second, 3*time.Second, "retry-after")
	if !c.Extended || !c.Fresh || c.Until != 3*time.Second || c.Why != "retry-after" {
		t.Errorf("first cooldown: %+v", c)
	}
	if p.Ready(2 * time.Second) {
		t.Error("ready inside the cooldown")
	}
	if !p.Ready(3 * time.Second) {
		t.Error("not ready at the cooldown's end")
	}
	if c := p.Cool(2*time.Second, 2500*time.Millisecond, "earlier"); c.Extended || p.Cooldown() != 3*time.Second {
		t.Errorf("an earlier end moved the cooldown: %+v, ends %v", c, p.Cooldown())
	}
	if c := p.Cool(2*time.Second, 4*time.Second, "later"); !c.Extended || c.Fresh || c.Why != "later" {
		t.Errorf("an extension: %+v", c)
	}
	if d, ok := p.ToShare(); !ok || d != 4*time.Second {
		t.Errorf("to share: %v %v, want 4s", d, ok)
	}
	if _, ok := p.ToShare(); ok {
		t.Error("the same cooldown shared twice")
	}
	if c := p.Cool(5*time.Second, 6*time.Second, "again"); !c.Fresh {
		t.Errorf("a cooldown after the last ended: %+v, want a new one", c)
	}
	if ls := p.Stats(); ls.Cooldowns != 2 || ls.Rate != 100 || ls.Ceiling != 100 {
		t.Errorf("stats %+v", ls)
	}
}

// TestPacerHold: a hold for another lane's cooldown keeps every token
// until it ends, as a cooldown does, but is not counted as one, and its
// end keeps no token back: the bucket's burst is there at once.
func TestPacerHold(t *testing.T) {
	p := New(1, 2, time.Minute, true, 0)
	p.Hold(time.Second, 3*time.Second)
	p.Hold(time.Second, 2*time.Second) // earlier: no change
	if p.Ready(2*time.Second) || p.Cooldown() != 3*time.Second {
		t.Errorf("inside the hold: ready %v, cooldown to %v, want held to 3s", p.Ready(2*time.Second), p.Cooldown())
	}
	for i := range 2 {
		if !p.Take(3*time.Second, false) {
			t.Errorf("token %d of the burst of 2 not there at the hold's end", i+1)
		}
	}
	if ls := p.Stats(); ls.Cooldowns != 0 {
		t.Errorf("%d cooldowns counted for a hold, want 0", ls.Cooldowns)
	}
}

// TestPacerNotBefore: nothing is sent before the cooldown and the Backend's
// wait both end; the wait is held to the cap on named waits.
func TestPacerNotBefore(t *testing.T) {
	p := New(0, 1, 30*time.Second, false, 0)
	if p.Paced() || p.NotBefore() > 0 {
		t.Fatalf("new unpaced pacer: paced %v, not before %v", p.Paced(), p.NotBefore())
	}
	p.SetWait(time.Second, time.Hour)
	if p.BackendWait() != 31*time.Second || p.NotBefore() != 31*time.Second {
		t.Errorf("Backend wait %v, not before %v; want 31s (capped)", p.BackendWait(), p.NotBefore())
	}
	p.Cool(time.Second, 40*time.Second, "retry-after")
	if p.NotBefore() != 40*time.Second {
		t.Errorf("not before %v, want the cooldown's 40s", p.NotBefore())
	}
	if !p.Pending(39*time.Second) || p.Pending(40*time.Second) {
		t.Errorf("pending at 39s %v, at 40s %v; want true, false", p.Pending(39*time.Second), p.Pending(40*time.Second))
	}
}

// TestPacerPending: a lane's pacer loses something if forgotten while its
// bucket is not full again or a header rate is in force.
func TestPacerPending(t *testing.T) {
	p := New(10, 2, time.Minute, true, 0)
	if p.Pending(0) {
		t.Error("a new pacer has something pending")
	}
	p.Take(0, false)
	if !p.Pending(0) || p.Pending(100*time.Millisecond) {
		t.Errorf("a token short: pending %v, a token's time later %v; want true, false", p.Pending(0), p.Pending(100*time.Millisecond))
	}
	// A bucket's quota, finer than the second: it refills 4.5 a second
	// (the missing 5, less half a token, over the second to its reset),
	// holds 10, and paces the lane for the time it takes to fill.
	q := headers.Quota{Limit: 10, Remaining: 5, Reset: time.Second, Source: "openai"}
	p.Observe(time.Second, Reply{Status: http.StatusOK, Sent: time.Second, Quota: q, HasQuota: true}, 1)
	rho := 4.5
	until := time.Second + time.Duration(10/rho*float64(time.Second))
	if want := rho * (1 + 4.0/10); math.Abs(p.Rate()-want) > 1e-9 {
		t.Fatalf("header rate %v, want %v", p.Rate(), want)
	}
	// The lane's bucket is full again by then: what is pending is the
	// header rate.
	if !p.Pending(2*time.Second) || !p.Pending(until-time.Millisecond) || p.Pending(until) {
		t.Errorf("header rate until %v: pending at 2s %v, just before %v, at its end %v; want true, true, false",
			until, p.Pending(2*time.Second), p.Pending(until-time.Millisecond), p.Pending(until))
	}
}

// TestPacerTakeAndRefund: a token taken and given back leaves the bucket
// as it was; a Backend's token is not given back to the local bucket.
func TestPacerTakeAndRefund(t *testing.T) {
	p := New(1, 1, time.Minute, true, 0)
	if !p.Take(0, false) || p.Take(0, false) {
		t.Fatal("burst 1: want one token, then none")
	}
	if d := p.TokenDelay(0); d != time.Second {
		t.Errorf("token due in %v, want 1s", d)
	}
	p.Refund(0, false, p.Granted())
	if p.Held(0) != 0 {
		t.Errorf("a Backend's token refunded to the local bucket: %v held", p.Held(0))
	}
	p.Refund(0, true, p.Granted())
	if p.Held(0) != 1 || !p.Take(0, false) {
		t.Errorf("after a refund: %v held, want 1", p.Held(0))
	}
	if r := (&Pacer{}).Held(0); !math.IsInf(r, 1) {
		t.Errorf("an unpaced pacer holds %v, want +Inf", r)
	}
}

// TestPacerShare: a Leaser's share paces the lane with its own bucket:
// nothing before the first grant, then the lower of the two rates. A share
// set to a larger burst holds no more yet; a take the lane's bucket refuses
// leaves the share as it was, and a refund gives a token back to both.
func TestPacerShare(t *testing.T) {
	p := New(100, 1, time.Minute, true, 0)
	if p.Sharing() {
		t.Fatal("sharing before join")
	}
	p.Join()
	if !p.Sharing() || p.Take(0, false) {
		t.Error("a token before the first share")
	}
	p.SetShare(0, 10, 0)
	if p.PaceRate() != 10 || !p.Take(0, false) || p.Take(0, false) {
		t.Errorf("share 10/s burst 1: pace %v", p.PaceRate())
	}
	if d := p.TokenDelay(0); d != 100*time.Millisecond {
		t.Errorf("next token in %v, want the share's 100ms", d)
	}
	// Set to 1/s and a burst of 5 holding its one token: one grant, and
	// the next a second later, not at the lane's next token.
	now := time.Second
	p.SetShare(now, 1, 5)
	if !p.Take(now, false) || p.Take(now+10*time.Millisecond, false) {
		t.Error("a share set to a burst of 5 holding one token: want one grant, then none at the lane's next token")
	}
	if d := p.TokenDelay(now); d != time.Second {
		t.Errorf("next token in %v, want the share's 1s", d)
	}
	// Five seconds on, the share is full (5) and the lane's bucket holds
	// one. A second take at once is refused by the lane's bucket, and the
	// first is given back: the share holds 5 again, and the lane is
	// granted one a token's time (10 ms) until it has spent them.
	now = 6 * time.Second
	if !p.Take(now, false) || p.Take(now, false) {
		t.Fatal("want one grant, then the lane's bucket empty")
	}
	p.Refund(now, true, p.Granted())
	var granted []int // the grants, in tokens' time of the lane
	for i := range 10 {
		if p.Take(now+time.Duration(i)*10*time.Millisecond, false) {
			granted = append(granted, i)
		}
	}
	if !slices.Equal(granted, []int{0, 1, 2, 3, 4}) {
		t.Errorf("after the refund, grants at tokens %v of the lane; want 0-4, one at once and the share's 5 spent", granted)
	}
}

// TestPacerLearnsARate: an unpaced lane gets a bucket at the first rate it
// learns, empty (what it sent used it), and reports the change once.
func TestPacerLearnsARate(t *testing.T) {
	p := New(0, 1, time.Minute, true, 0)
	if p.PaceRate() != 0 {
		t.Fatalf("unpaced: %v", p.PaceRate())
	}
	for i := range 5 {
		at := time.Duration(i) * 300 * time.Millisecond
		p.Settle(at, at, verdict.Served)
	}
	now := 1500 * time.Millisecond
	c := p.Observe(now, Reply{Status: http.StatusTooManyRequests, Sent: now, HasRA: true, RetryAfter: time.Second}, 1)
	if c.Cause != CauseCut || !p.Paced() || p.Rate() <= 0 || p.Held(now) != 0 {
		t.Fatalf("first 429 on an unpaced lane: %+v, rate %v, held %v; want a rate, an empty bucket", c, p.Rate(), p.Held(now))
	}
	if from, to, ok := p.Report(c.Cause); !ok || from != 0 || to != p.Rate() {
		t.Errorf("report %v -> %v (%v), want 0 -> %v", from, to, ok, p.Rate())
	}
	if _, _, ok := p.Report(CauseRecovery); ok {
		t.Error("an unchanged rate reported twice")
	}
}

// TestPacerFirstEstimateOnFirstAcceptance: a strict server refuses all but
// one of an unpaced lane's first burst, and the refusals come back before
// the acceptance. The lane makes its first estimate when that acceptance
// arrives, not after a second cooldown and burst.
func TestPacerFirstEstimateOnFirstAcceptance(t *testing.T) {
	p := New(0, 1, time.Minute, true, 0)
	now := time.Millisecond
	c := p.Observe(now, Reply{Status: http.StatusTooManyRequests, Sent: 0, HasRA: true, RetryAfter: time.Second}, 4)
	if p.Paced() || c.Cause != CauseCut || !c.Cool.Extended {
		t.Fatalf("429 before any acceptance: paced %v, %+v; want a cooldown and no pace yet", p.Paced(), c)
	}
	moved, _ := p.Settle(20*time.Millisecond, 0, verdict.Served)
	// One acceptance over the least span counted (a second), at least one
	// per Retry-After: 1/s, less the margin.
	if want := 1 - throttleMargin; moved != CauseCut || !p.Paced() || math.Abs(p.Rate()-want) > 1e-9 {
		t.Fatalf("first acceptance after the 429: moved %q, paced %v, rate %v; want paced at %v", moved, p.Paced(), p.Rate(), want)
	}
	// Later acceptances do not estimate again: they let the rate climb.
	if moved, _ := p.Settle(30*time.Millisecond, 0, verdict.Served); moved != CauseRecovery {
		t.Errorf("a later acceptance: moved %q, want %q", moved, CauseRecovery)
	}
	// The first estimate is probed upward: a second after the cooldown,
	// the rate is firstProbe times as high, not a fifth higher.
	p.Settle(2*time.Second+time.Millisecond, time.Second, verdict.Served)
	if want := firstProbe * (1 - throttleMargin); p.Rate() < 0.99*want {
		t.Errorf("a second after the cooldown: rate %v, want about %v", p.Rate(), want)
	}
}

// TestPacerCutsToCountedRefill: a bucket with a burst takes a pace over its
// rate until the burst is gone, a run that reads as the edge. A refusal
// that ends a count of its quotas cuts to the refill rate counted, not to
// 90% of the pace.
func TestPacerCutsToCountedRefill(t *testing.T) {
	p := New(100, 1, time.Minute, true, 0)
	q := func(rem int64) headers.Quota {
		return headers.Quota{Limit: 10, Remaining: rem, Reset: time.Second, Coarse: true, Source: "x-ratelimit"}
	}
	// At 100/s, a bucket of 10 refilled at 50/s loses 1 token every 20 ms:
	// remaining 8 at 0, 7 at 20 ms, ..., 0 at 160 ms, refused at 180 ms.
	for i := range 9 {
		sent := time.Duration(i) * 20 * time.Millisecond
		for j := range 2 {
			s := sent + time.Duration(j)*10*time.Millisecond
			p.Settle(s+20*time.Millisecond, s, verdict.Served)
			p.Observe(s+20*time.Millisecond, Reply{Status: http.StatusOK, Sent: s, HasQuota: true, Quota: q(int64(8 - i))}, 1)
		}
	}
	at := 180 * time.Millisecond
	c := p.Observe(at, Reply{Status: http.StatusTooManyRequests, Sent: at, HasRA: true, RetryAfter: time.Second,
		HasQuota: true, Quota: q(0)}, 1)
	if c.Cause != CauseCut {
		t.Fatalf("429: %+v, want a cut", c)
	}
	if r := p.Rate(); r < throttleCutKnown*45 || r > throttleCutKnown*56 {
		t.Errorf("rate %v, want %v of the refill counted, about 50", r, throttleCutKnown)
	}
	// Counted over 180 ms to a refusal, the refill is rough: a window's
	// first fill spent fast reads the same. The lane probes up from it
	// rather than creeping for minutes from an edge (a sliding window at
	// 2R held at 0.18 of R, nothing refused).
	before := p.Rate()
	p.Settle(at+2*time.Second, at+1500*time.Millisecond, verdict.Served)
	if p.Rate() < 2*before {
		t.Errorf("a second after the cooldown: rate %v, want at least twice %v", p.Rate(), before)
	}
}

// TestPacerFollowsARecountedRefill: a sliding window counts what a lane
// sent a window before, so a count taken while the lane climbed is low, and
// a refusal cut to it (real loopback: a lane at 2R held at 17/s of 50 for
// the rest of the run, nothing refused). While the quotas show tokens to
// spare, the lane may pace a step over the failed rate, and the failed
// rate follows the count up.
func TestPacerFollowsARecountedRefill(t *testing.T) {
	p := New(100, 1, time.Minute, true, 0)
	q := func(rem int64) headers.Quota {
		return headers.Quota{Limit: 50, Remaining: rem, Reset: time.Second, Coarse: true, Source: "x-ratelimit"}
	}
	now := time.Duration(0)
	// accept sends at rate for d, the server's quota holding at rem.
	accept := func(rate float64, d time.Duration, rem int64) {
		step := time.Duration(float64(time.Second) / rate)
		for end := now + d; now < end; now += step {
			p.Settle(now+20*time.Millisecond, now, verdict.Served)
			p.Observe(now+20*time.Millisecond, Reply{Status: http.StatusOK, Sent: now, HasQuota: true, Quota: q(rem)}, 1)
		}
	}
	// The bucket shows its size first: at 30 remaining it is not full.
	accept(20, 50*time.Millisecond, 49)
	accept(20, 1200*time.Millisecond, 30)
	p.Observe(now, Reply{Status: http.StatusTooManyRequests, Sent: now, HasRA: true, RetryAfter: time.Second,
		HasQuota: true, Quota: q(0)}, 1)
	// The failed rate is the refill counted, 20/s, and the last quota
	// showed tokens to spare: the lane paces a step over it.
	if r := p.Rate(); r < 19*(1+recountStep) || r > 21*(1+recountStep) {
		t.Fatalf("429: rate %v, want a step over the refill counted, %v", r, 20*(1+recountStep))
	}
	now += time.Second // the cooldown
	accept(20, 100*time.Millisecond, 30)
	// A step over the failed rate, not the quotas' whole pace (31.6/s):
	// a window's carry spent as a burst after each cooldown is refused.
	if want := 20 * (1 + recountStep); math.Abs(p.Rate()-want) > 1e-6 {
		t.Errorf("29 tokens to spare: rate %v, want a step over the failed rate, %v", p.Rate(), want)
	}
	// The window's count falls by what the faster pace holds, then counts
	// it: the failed rate is 30/s, and the lane paces a step over it.
	accept(30, 2200*time.Millisecond, 20)
	failed := p.Rate() / (1 + recountStep)
	if failed < 29 || failed > 31 {
		t.Errorf("counted 30/s with tokens to spare: rate %v, want a step over 30/s, %v", p.Rate(), 30*(1+recountStep))
	}
	// With no token to spare, the step goes: the lane paces at the plateau
	// under the failed rate (creeping up from it), not at the count.
	accept(30, 100*time.Millisecond, 1)
	if r := p.Rate(); r < (1-throttleMargin)*failed || r > (1-throttleMargin/2)*failed {
		t.Errorf("no token to spare: rate %v, want the plateau under %v, %v", r, failed, (1-throttleMargin)*failed)
	}
}

// slidingQuota is a quota of a sliding window of 50 a second whose reset
// is the end of each second, seen at now with rem remaining.
func slidingQuota(now time.Duration, rem int64) headers.Quota {
	end := now.Truncate(time.Second) + time.Second
	return headers.Quota{Limit: 50, Remaining: rem, Reset: end - now, Coarse: true, Instant: true, Source: "x-ratelimit"}
}

// slidingFirstWindow feeds p the first window of slidingQuota: remaining
// falls from 40 to 20 while 24 are sent over 0.84 s, before the window's
// instant came. It returns when the last was sent.
func slidingFirstWindow(p *Pacer) time.Duration {
	now := time.Duration(0)
	for i := range 25 {
		at := now + 20*time.Millisecond
		p.Settle(at, now, verdict.Served)
		p.Observe(at, Reply{Status: http.StatusOK, Sent: now, HasQuota: true, Quota: slidingQuota(at, int64(40-i*20/24))}, 1)
		now += 35 * time.Millisecond
	}
	return now
}

// TestPacerPacesASlidingWindowAtItsLimit: once the quotas show a sliding
// window (a reset stated as the end of each second, replaced when it
// comes, requests counted), the lane paces at its limit a window less half,
// and what refusals taught it before, reading the window as a bucket,
// goes: a cut at a refusal in its first window, or an edge cut during a
// climb (0.34 of R at 2R, held by the creep).
func TestPacerPacesASlidingWindowAtItsLimit(t *testing.T) {
	for _, c := range []struct {
		name string
		// cut makes the pacer's first cut, and returns when it ended.
		cut func(t *testing.T, p *Pacer) time.Duration
	}{
		{"a cut before it was told apart", func(t *testing.T, p *Pacer) time.Duration {
			// The first window, then a refusal, before the window's
			// instant came.
			now := slidingFirstWindow(p)
			// A window told sliding would explain its exhausted count: no
			// cut.
			c := p.Observe(now, Reply{Status: http.StatusTooManyRequests, Sent: now, HasRA: true, RetryAfter: time.Second,
				HasQuota: true, Quota: slidingQuota(now, 0)}, 1)
			if c.Cause != CauseCut {
				t.Fatalf("429: cause %q; want a cut before the window is told apart", c.Cause)
			}
			return now
		}},
		{"an edge cut", func(t *testing.T, p *Pacer) time.Duration {
			// The lane comes down to the limit by refusals at the edge,
			// each after a run the server took, to one under 20/s.
			now := 2 * time.Second
			for p.Rate() >= 20 {
				if c := p.Observe(now, Reply{Status: http.StatusTooManyRequests, Sent: now}, 1); c.Cause != CauseCut {
					t.Fatalf("429 at %v: %+v, want a cut", now, c)
				}
				for range edgeRun + 5 {
					now += 50 * time.Millisecond
					p.Settle(now, now, verdict.Served)
				}
			}
			// Its creep would hold the lane under 20/s for minutes.
			if !atTheEdge(p, now) || p.Rate() >= 20 {
				t.Fatalf("rate %v; want an edge cut under 20/s", p.Rate())
			}
			return now + 3*time.Second
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := New(100, 1, time.Minute, true, 0)
			now := c.cut(t, &p) + time.Second // the cooldown
			step := time.Second / 20
			for end := now + 3500*time.Millisecond; now < end; now += step {
				at := now + 20*time.Millisecond
				p.Settle(at, now, verdict.Served)
				p.Observe(at, Reply{Status: http.StatusOK, Sent: now, HasQuota: true, Quota: slidingQuota(at, 20)}, 1)
			}
			// Told a sliding window of 1 s (see TestQuotaKinds), the lane
			// paces at its limit less half a request, over the window,
			// whatever the cut before it said.
			if math.Abs(p.Rate()-(50-slidingSpare)) > 1e-9 {
				t.Errorf("rate %v, want the window's %v/s", p.Rate(), 50-slidingSpare)
			}
			// The cut is gone: once the window's pace lapses (an answer
			// with no quota, a window later), the lane paces at its
			// configured rate.
			now += 2 * time.Second
			p.Settle(now, now, verdict.Served)
			if p.Rate() != 100 {
				t.Errorf("with no quota for a window: rate %v, want the configured 100/s, the cut gone", p.Rate())
			}
		})
	}
}

// TestPacerSpacesTheGrantAfterACooldown: the grant after a cooldown's first
// waits two tokens' time, once: an idle server reads the first request late
// and a strict one then refuses the next, paced right, with another
// cooldown (real loopback: a lane at 47/s refused after every 1 s cooldown,
// the two requests 12-15 ms apart at the server).
func TestPacerSpacesTheGrantAfterACooldown(t *testing.T) {
	p := New(50, 1, time.Minute, true, 0)
	now := time.Second
	p.Observe(now, Reply{Status: http.StatusTooManyRequests, Sent: now, HasRA: true, RetryAfter: time.Second}, 1)
	end := p.NotBefore()
	if end != now+time.Second {
		t.Fatalf("cooldown until %v, want %v", end, now+time.Second)
	}
	r := p.Rate()
	one := time.Duration(float64(time.Second) / r)
	if !p.Take(end, false) {
		t.Fatal("no token at the cooldown's end")
	}
	if p.Take(end+2*one-time.Millisecond, true) {
		t.Errorf("a second grant %v after the first; want it two tokens (%v) after", 2*one-time.Millisecond, 2*one)
	}
	if !p.Take(end+2*one+time.Microsecond, true) {
		t.Errorf("no grant two tokens after the first")
	}
	// Once per cooldown: the next comes a token later.
	next := end + 2*one + time.Microsecond + one + time.Microsecond
	if !p.Take(next, true) {
		t.Errorf("no grant one token after the second")
	}
}

// TestPacerSpacesGrantsFromWrites: once a server refused a pace, a request
// written late puts off the next grant by its lateness beyond the least
// lately seen, up to a token's time: the two would otherwise reach a strict
// server closer together than the pace (real loopback: requests written
// 3-12 ms late, the next on time, refused at 50/s). A lane no server refused
// ignores writes, as does one whose budget a Backend holds, and one whose
// server states a burst: it takes a request early by a token's time.
func TestPacerSpacesGrantsFromWrites(t *testing.T) {
	const lag = 100 * time.Microsecond // the usual time to a write
	// steady makes n grants a token apart from at, each written lag after
	// it, and returns the instant of the next.
	steady := func(p *Pacer, at, one time.Duration, n int) time.Duration {
		t.Helper()
		for range n {
			if !p.Take(at, false) {
				t.Fatalf("no token at %v", at)
			}
			p.Wrote(at+lag, at)
			at += one
		}
		return at
	}
	cut := func(local bool) *Pacer {
		p := New(50, 1, time.Minute, local, 0)
		cutAtTheCeiling(t, &p, time.Second)
		return &p
	}

	p := cut(true)
	one := TokenTime(p.Rate()) + time.Microsecond // a token's time, rounded up
	at := steady(p, 2*time.Second, one, 20)
	// Written 5 ms later than usual: the next grant waits 5 ms more.
	if !p.Take(at, false) {
		t.Fatalf("no token at %v", at)
	}
	p.Wrote(at+lag+5*time.Millisecond, at)
	if p.Take(at+one+5*time.Millisecond-50*time.Microsecond, false) {
		t.Errorf("a grant less than a token and the write's 5 ms lateness after the late one")
	}
	at += one + 5*time.Millisecond
	at = steady(p, at, one, 5)
	// Written three tokens late: the next waits one token more, not three.
	if !p.Take(at, false) {
		t.Fatalf("no token at %v", at)
	}
	w := at + lag + 3*one
	p.Wrote(w, at)
	if p.Take(w+one-50*time.Microsecond, false) {
		t.Errorf("a grant less than a token after a write three tokens late")
	}
	if !p.Take(w+one+time.Microsecond, false) {
		t.Errorf("no grant a token after a write three tokens late: the delay is capped at a token")
	}

	for _, c := range []struct {
		name string
		p    *Pacer
	}{
		{"no server refused", func() *Pacer { p := New(50, 1, time.Minute, true, 0); return &p }()},
		{"a Backend's budget", cut(false)},
		{"a server that states a burst of 10", func() *Pacer {
			p := cut(true)
			p.Observe(time.Second, Reply{Status: http.StatusOK, Sent: time.Second, HasQuota: true,
				Quota: headers.Quota{Limit: 10, Remaining: 5, Reset: time.Second, Coarse: true, Source: "x-ratelimit"}}, 1)
			return p
		}()},
	} {
		one := TokenTime(c.p.Rate()) + time.Microsecond
		at := steady(c.p, 2*time.Second, one, 5)
		c.p.Take(at, false)
		c.p.Wrote(at+lag+5*time.Millisecond, at)
		if !c.p.Take(at+one, false) {
			t.Errorf("%s: a late write put off the next grant", c.name)
		}
	}
}

// TestPacerCutsAtTheKeptPace: a lane whose grants came slower than its pace
// (slots, late timers) and that a server refused at the edge failed at the
// pace it kept, not at the bound it never reached (real loopback, no
// WithRate: a probe at 52/s whose grants kept 48/s was refused, the cut
// took 51.5/s for the limit of 50/s, and a second refusal followed).
// A pause before the refused grant is not a slower pace.
func TestPacerCutsAtTheKeptPace(t *testing.T) {
	for _, c := range []struct {
		name     string
		every    time.Duration // grants' spacing
		n        int           // grants, the last refused
		pauses   bool          // a second's pause before every 5th
		min, max float64       // the failed rate
	}{
		{"grants at the pace", 20 * time.Millisecond, 40, false, 49.9, 50.1},
		{"grants a quarter slower", 25 * time.Millisecond, 40, false, 39, 41},
		{"grants at the pace, with pauses", 20 * time.Millisecond, 40, true, 49.9, 50.1},
		{"refused right after a pause", 20 * time.Millisecond, 36, true, 49.9, 50.1},
	} {
		p := New(50, 1, time.Minute, true, 0)
		at := time.Second
		for i := range c.n {
			if c.pauses && i%5 == 0 {
				at += time.Second
			}
			if !p.Take(at, false) {
				t.Fatalf("%s: no token at %v", c.name, at)
			}
			at += c.every
		}
		// A refusal at the edge cuts to throttleCutKnown of the pace that
		// failed.
		p.Observe(at, Reply{Status: http.StatusTooManyRequests, Sent: at - c.every}, 1)
		if failed := p.Rate() / throttleCutKnown; failed < c.min || failed > c.max {
			t.Errorf("%s: rate %.2f, the failed rate %.2f; want %v-%v", c.name, p.Rate(), failed, c.min, c.max)
		}
	}
}

// TestPacerStrictPlateau: a late grant keeps its spacing from the plateau
// only where the server states no burst (a strict server refuses two
// requests closer than its rate); a bucket or window of two or more takes
// them, and holding the lateness back there cost a sliding window at 48/s
// 2% of its pace on real loopback.
func TestPacerStrictPlateau(t *testing.T) {
	// A burst is what the quotas showed remaining after a request, not the
	// limit they state: a limit of 50 with nothing ever remaining is a
	// rate (redis_rate's), and the server is strict.
	for _, c := range []struct {
		limit, held int64 // the quota stated; limit 0: none
		strict      bool
	}{{0, 0, true}, {1, 0, true}, {50, 0, true}, {2, 1, false}, {50, 49, false}} {
		// Refused at 50/s, the lane's plateau is 49/s, and it paces there
		// once the ramp is over.
		p := New(50, 1, time.Minute, true, 0)
		now := cutAtTheCeiling(t, &p, time.Second)
		if c.limit > 0 {
			p.Observe(now, Reply{Status: http.StatusOK, Sent: now, HasQuota: true,
				Quota: headers.Quota{Limit: c.limit, Remaining: c.held, Reset: time.Second, Coarse: true, Source: "x-ratelimit"}}, 1)
		}
		now += throttleRamp + time.Second
		p.Settle(now, now, verdict.Served)
		if want := (1 - throttleMargin) * 50; math.Abs(p.Rate()-want) > 1e-9 {
			t.Fatalf("limit %d, %d seen remaining: rate %v, want the plateau %v", c.limit, c.held, p.Rate(), want)
		}
		// A grant on time, then one whose dispatcher woke half a token
		// late: a strict server's next grant is a whole token after the
		// late one, else a token after the one it was due at.
		one := TokenTime(p.Rate())
		if !p.Take(now, false) || !p.Take(now+one+one/2, true) {
			t.Fatalf("limit %d, %d seen remaining: no grant on time", c.limit, c.held)
		}
		want := one / 2
		if c.strict {
			want = one
		}
		if d := p.TokenDelay(now + one + one/2); (d - want).Abs() > time.Microsecond {
			t.Errorf("limit %d, %d seen remaining: next grant %v after the late one, want %v", c.limit, c.held, d, want)
		}
	}
}

// TestPacerRefusedAtATruncatedReset follows ulule/limiter's first window
// from a cold lane: ten answers within 25 ms, then a refusal with nothing
// remaining and a reset 874 ms on, a Unix time truncated to the second.
// The attempt sent at that instant is refused too, the window not over:
// the lane tries again within the second after the instant, a step
// later, and takes no rate from it (the refusal says when the window
// ends, not how fast the server takes requests).
func TestPacerRefusedAtATruncatedReset(t *testing.T) {
	const inst = 900 * time.Millisecond // the stated reset, on the lane's clock
	q := func(now time.Duration, left int64) headers.Quota {
		return headers.Quota{Limit: 10, Remaining: left, Reset: max(0, inst-now), Passed: max(0, now-inst), Coarse: true, Instant: true, Source: "x-ratelimit"}
	}
	p := New(0, 1, time.Minute, true, 0)
	for i := range 10 {
		at := time.Duration(i) * 2 * time.Millisecond
		c := p.Observe(at+20*time.Millisecond, Reply{Status: http.StatusOK, Sent: at, HasQuota: true, Quota: q(at+20*time.Millisecond, int64(9-i))}, 1)
		p.Settle(at+20*time.Millisecond, at, c.Kind)
	}
	now := 26 * time.Millisecond
	p.Observe(now, Reply{Status: http.StatusTooManyRequests, Sent: now, HasQuota: true, Quota: q(now, 0)}, 1)
	if got := p.NotBefore(); got != inst {
		t.Fatalf("after the first refusal the lane waits until %v, want the stated reset %v", got, inst)
	}
	before := p.Rate()
	c := p.Observe(inst, Reply{Status: http.StatusTooManyRequests, Sent: inst, HasQuota: true, Quota: q(inst, 0)}, 1)
	if got := p.NotBefore(); got <= inst || got > inst+coarseProbe {
		t.Errorf("refused at the truncated reset, the lane waits until %v; want after %v, by %v at most", got, inst, inst+coarseProbe)
	}
	if c.Cause == CauseCut || p.Rate() < before {
		t.Errorf("refused at the truncated reset, the rate went from %.2f/s to %.2f/s (cause %q); want it kept", before, p.Rate(), c.Cause)
	}
	// Refused through the second after the instant, the lane tries again
	// close before its end, not only at it: a window that starts at its
	// first request and is opened by a try past that second states an
	// instant a second later than its period would.
	var tries []time.Duration
	for at := p.NotBefore(); at < inst+time.Second && len(tries) < 10; at = p.NotBefore() {
		tries = append(tries, at)
		p.Observe(at, Reply{Status: http.StatusTooManyRequests, Sent: at, HasQuota: true, Quota: q(at, 0)}, 1)
	}
	if n := len(tries); n == 0 || n > 6 || tries[n-1] < inst+time.Second-resetSlack {
		t.Errorf("refused through the second after the instant %v, the lane tried at %v; want at most 6 tries, the last within %v of the second's end", inst, tries, resetSlack)
	}
}

// TestPacerSlidingWindowRefusedAtItsPace: a lane told a sliding window of
// 50 a second apart paces at its limit less half a request; a refusal at
// that pace (a counter that does not round its estimate) keeps a whole
// request under the limit from then on, and a refusal before the window
// was told apart does not.
func TestPacerSlidingWindowRefusedAtItsPace(t *testing.T) {
	p := New(100, 1, time.Minute, true, 0)
	serve := func(from, to time.Duration, rem int64) time.Duration {
		for now := from; now < to; now += time.Second / 20 {
			at := now + 20*time.Millisecond
			p.Settle(at, now, verdict.Served)
			p.Observe(at, Reply{Status: http.StatusOK, Sent: now, HasQuota: true, Quota: slidingQuota(at, rem)}, 1)
		}
		return to
	}
	refuse := func(now time.Duration) time.Duration {
		p.Observe(now, Reply{Status: http.StatusTooManyRequests, Sent: now, HasRA: true, RetryAfter: time.Second,
			HasQuota: true, Quota: slidingQuota(now, 0)}, 1)
		return now + time.Second
	}
	// A refusal ends the first window; the windows after tell it apart.
	now := slidingFirstWindow(&p)
	now = serve(refuse(now), now+4500*time.Millisecond, 20)
	if want := 50 - slidingSpare; math.Abs(p.Rate()-want) > 1e-9 {
		t.Fatalf("told apart after a refusal before it: rate %v, want %v/s", p.Rate(), want)
	}
	serve(refuse(now), now+3*time.Second, 20)
	if math.Abs(p.Rate()-49) > 1e-9 {
		t.Errorf("refused at its pace: rate %v, want 49/s", p.Rate())
	}
}

// TestPacerHoldsToAWindowEnd: a lane paced to what remains of a window
// whose end it measured makes no more grants before that end than the last
// answer left it, even with a token in hand, at whatever rate it is cut to
// meanwhile; an answer that leaves it more lets the next go an interval
// later, not at the end.
func TestPacerHoldsToAWindowEnd(t *testing.T) {
	const now, end = time.Second, time.Second + 200*time.Millisecond
	held := func(t *testing.T) *Pacer {
		p := New(100, 2, time.Minute, true, 0)
		p.quota.edge = &windowEdge{told: true, end: end, period: time.Second}
		p.Observe(now, Reply{Status: http.StatusOK, Sent: now - 20*time.Millisecond, HasQuota: true, Quota: windowQuota(1)}, 1)
		if !p.Take(now, false) {
			t.Fatal("one request left and a token in hand: no grant")
		}
		if d := p.TokenDelay(now); d < end-now-time.Millisecond {
			t.Fatalf("the one request left granted, the next token is due in %v; want at the window's end, %v", d, end-now)
		}
		return &p
	}
	t.Run("lifted", func(t *testing.T) {
		p := held(t)
		// An answer to an attempt sent before: the server counted it, and
		// the grant just made is in flight; 4 remain beyond it.
		at := now + 10*time.Millisecond
		p.Observe(at, Reply{Status: http.StatusOK, Sent: now - 10*time.Millisecond, HasQuota: true, Quota: windowQuota(5)}, 2)
		interval := time.Duration(float64(end-at) / 5)
		if d := p.TokenDelay(at); d > interval+time.Millisecond {
			t.Errorf("4 left after an answer allowing more, the next token is due in %v; want within an interval (%v)", d, interval)
		}
	})
	t.Run("cut", func(t *testing.T) {
		p := held(t)
		before, at := p.Rate(), now+5*time.Millisecond
		p.Observe(at, Reply{Status: http.StatusTooManyRequests, Sent: now - 15*time.Millisecond}, 2)
		if p.Rate() >= before {
			t.Fatalf("a refusal left the rate at %.2f/s, want it cut from %.2f/s", p.Rate(), before)
		}
		if d := p.TokenDelay(at); d > end-at+time.Millisecond {
			t.Errorf("cut from %.2f/s to %.2f/s, the next token is due in %v; want at the window's end, %v", before, p.Rate(), d, end-at)
		}
	})
}

// windowQuota is what ulule/limiter states of a window of 50 with left
// remaining, its reset read as a second away.
func windowQuota(left int64) headers.Quota {
	return headers.Quota{Limit: 50, Remaining: left, Reset: time.Second, Coarse: true, Source: "x-ratelimit"}
}

// TestWindowHoldWithinMaxWait: a server that behaves as a fixed window of
// ten a second (Unix-time resets, measured ends), then states its next
// reset 300 days away: the hold that keeps the next grant for the window's
// end is no longer than a cooldown may be (maxWait, 10 minutes).
func TestWindowHoldWithinMaxWait(t *testing.T) {
	const maxWait = 10 * time.Minute
	p := New(0, 1, maxWait, true, 0)
	q := func(rem int64, reset time.Duration) headers.Quota {
		return headers.Quota{Limit: 10, Remaining: rem, Reset: reset, Source: "x-ratelimit", Coarse: true, Instant: true}
	}
	now := time.Second
	end := now + time.Second
	for i := int64(1); i <= 10; i++ {
		now += 50 * time.Millisecond
		p.Take(now, false)
		p.Observe(now+time.Millisecond, Reply{Status: 200, Sent: now, Quota: q(10-i, end-now), HasQuota: true}, 1)
		p.Settle(now+time.Millisecond, now, verdict.Served)
	}
	now = end + 10*time.Millisecond
	end = now + 300*24*time.Hour
	for rem := int64(9); rem >= 0; rem-- {
		for !p.Ready(now) || !p.Take(now, false) {
			now += min(p.TokenDelay(now), 2*maxWait) + time.Millisecond
		}
		p.Observe(now+time.Millisecond, Reply{Status: 200, Sent: now, Quota: q(rem, end-now), HasQuota: true}, 1)
		p.Settle(now+time.Millisecond, now, verdict.Served)
		if d := p.TokenDelay(now); d > maxWait+time.Second {
			t.Fatalf("remaining %d: the next grant is %v away, past maxWait (%v)", rem, d, maxWait)
		}
	}
}
