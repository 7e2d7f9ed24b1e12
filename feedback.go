package sluice

import (
	"context"
	"math"
	"net/http"
	"time"

	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/stats"
)

// What the server says sets a lane's pace. Three sources bound the rate;
// the lane paces to the smallest that applies:
//
//   - the configured rate (WithRate x headroom), the ceiling;
//   - the throttle rate, learned from 429s (AIMD, below);
//   - the header rate: what the quota headers say, by the kind of limit
//     they describe (see quotaModel), valid for a while.
//
// A refusal (see observe) sets the lane's cooldown instead, as does a fixed
// window with nothing left: nothing of any priority is sent before it ends.
//
// The throttle rate. A 429 means the lane sent faster than the server
// accepts. What it says depends on what came before it:
//
//   - An edge 429 comes after a run of at least edgeRun accepted responses
//     since the last cut, or is the first 429 of a lane still at its
//     configured rate: the lane is at the server's limit, and lost to the
//     jitter between its clock and the server's (a strict GCRA limiter
//     refuses a request that arrives even 1 ms early). The rate it failed
//     at, r_f, is the pace itself.
//   - Any other 429 (one right after a cut: the server took at most a few
//     requests before refusing again) means the lane is well above the
//     limit. r_f is the share of the pace the server accepted over the last
//     acceptWindow (pace x accepted / answered), or, for a lane not yet
//     paced, the rate at which the server accepted its requests over that
//     window (how a lane with no configured rate learns one).
//
// The first 429 at the configured rate is taken for an edge because the
// configured rate is the published allowance: a 429 there is more often
// jitter than a wrong rate, and one refusal after one acceptance is all a
// strict limiter lets the lane see either way (1 of 2 accepted, at R with
// jitter and at 2R alike). A wrong configured rate shows on the next 429,
// which comes at once.
//
// The rate drops to throttleCutKnown x r_f (throttleCut x r_f when nothing
// tells r_f from the pace), then, counting only time after the cooldown
// ends (nothing is sent before):
//
//  1. climbs back linearly to the plateau, (1 - margin) x r_f, within
//     throttleRamp, because most of the loss is behind it;
//  2. after an edge 429, creeps from the plateau to r_f at throttleMargin
//     x r_f per creep period; after any other, skips this step: r_f was an
//     estimate, not a rate that failed;
//  3. beyond r_f grows by throttleProbe per second, multiplicatively, so a
//     lane that a wrong configured rate or an outage drove low is back
//     within seconds (an outage: from the floor in about 15 s), not hours;
//     at the ceiling the throttle rate is dropped.
//
// An edge 429 after an edge 429 adapts steps 1 and 2: one that came during
// the creep (between the plateau and r_f) doubles the creep period, so a
// lane creeps back to a rate that failed ever more slowly; one at or under
// the plateau, after a cut from a sustained pace (edgeRun accepted or
// more), doubles the margin, because the jitter is wider than the margin
// allowed for. Such a 429 counts as an edge even when it comes right after
// the cooldown: the server took a faster pace for a while, so the lane is
// not far over. Only once, though: a second in a row is an outage or a
// lowered limit, and cuts on the accepted share. Any other 429 resets the
// margin and the creep.
//
// A 429 for an attempt sent before the last cut is not a new signal (it was
// already on its way) and does not cut again. The rate never drops below
// the floor, throttleFloor of the highest rate known for the lane, so a run
// of 429s cannot stop a lane.
const (
	// throttleCut is the cut when the 429 says nothing of r_f (the lane is
	// paced but no answers were counted): TCP-like, deep enough that the
	// next try is likely under the limit, shallow enough that a lane at
	// the limit loses little.
	throttleCut = 0.8
	// throttleCutKnown is the cut from a known r_f: the ramp climbs from
	// it to the plateau, so the lane's first sends after a cooldown are
	// below the limit even when r_f is a little high.
	throttleCutKnown = 0.9
	// ratioSamples is the fewest answers (accepted and refused) the
	// accepted share of the pace is computed from. Two is enough because
	// it is used only for a 429 right after a cut, when the server has
	// just refused a pace the lane had already lowered: the share of 1 of
	// 2 halves the pace, as AIMD does.
	ratioSamples = 2
	// ratioTrusted and edgeShare: with at least ratioTrusted answers in
	// the window and under edgeShare of them accepted, the server refuses
	// too much of the pace for the 429 to be jitter at the edge, even the
	// first one at the configured rate. Jitter at the edge refuses a few
	// percent; a pace of 2R over a strict limiter, half.
	ratioTrusted = 20
	edgeShare    = 0.9
	// minAcceptedSample is the fewest accepted responses an acceptance
	// rate is computed from.
	minAcceptedSample = 4
	// edgeRun is how many accepted responses since the last cut make the
	// next 429 an edge 429: the server took a sustained run at this pace.
	// A strict limiter over the pace refuses the second request after a
	// cooldown; a bursty one refuses after about its burst.
	edgeRun = 10
	// throttleMargin is how far under r_f the plateau first sits: 2% of a
	// 50/s pace is 400 us a request, twice the 200 us of jitter the
	// virtual-time test injects; wider jitter doubles it (below). A 429
	// costs the whole cooldown (Retry-After in whole seconds: 50 tokens at
	// 50/s) while sitting 2% low costs 1 token a second, so the plateau
	// errs low. A margin read from the spread of observed latencies was
	// tried and lost: the estimate dipped under the true spread, and each
	// dip cost a 429 (0.948 of R instead of 0.965 at R).
	throttleMargin = 0.02
	// maxMargin bounds the doubling of the margin: 16% covers 3 ms of
	// jitter at 50/s.
	maxMargin = 0.16
	// throttleRamp is how long the climb from the cut to the plateau takes.
	throttleRamp = 2 * time.Second
	// edgeCreep is the first creep period from the plateau to r_f after an
	// edge 429. The creep gains at most throttleMargin of the rate, 1% on
	// average, and ends in a 429 when r_f was the limit, which costs a
	// cooldown (at least a second) and a ramp: it pays only over minutes.
	// Measured at 50/s with 200 us of jitter, a 1-minute creep meets the
	// limit after 30 s and brings a second cooldown into every minute.
	edgeCreep = 4 * time.Minute
	// maxCreep bounds the doubling of the creep period, so that a lane
	// under a limit the server has since raised finds out within the hour.
	maxCreep = 32 * time.Minute
	// throttleProbe is the growth per second beyond r_f. A lane cut on an
	// estimate (half its pace after a 429 right after a cut, or the floor
	// after an outage) climbs from it to the limit in seconds, and the 429
	// that ends the climb is an edge 429, which settles the lane. Measured
	// at 50/s with 200 us of jitter, lanes configured at 1.5R to 5R reach
	// 0.937-0.956 of R over seconds 5-60 with 5% a second, 0.953-0.964
	// with 20%; after a 10 s outage, 20% is back near R in about 12 s.
	throttleProbe = 0.2
	// throttleFloor is the share of the highest known rate the throttle
	// rate never goes under.
	throttleFloor = 0.05
	minRate       = 0.01 // per second: one request per 100 s, whatever is known

	acceptWindow = 2 * time.Second
	// minFirstSpan is the shortest span firstRate counts acceptances over.
	minFirstSpan = time.Second
)

type feedback struct {
	ceiling float64 // configured rate after headroom; 0 if none

	throttle float64   // AIMD rate; 0 while no 429 applies
	fail     float64   // r_f of the last cut
	cutTo    float64   // the rate the last cut set
	failAt   time.Time // when the last cut was made
	grown    time.Time // when throttle was last grown
	peak     float64   // highest rate known: ceiling, or accepted rate seen
	margin   float64   // share of fail the plateau is below it
	okRun    int       // responses accepted since the last cut
	// sustained: fail is a pace the server took for edgeRun responses or
	// more, so a 429 at or under it is jitter, not a pace far too high.
	sustained bool
	edge      bool          // the last cut was at the edge: a 429 after a run the server took
	probing   bool          // the last cut was a lane's first estimate: grow fast until the next
	creep     time.Duration // how long the last cut's creep from plateau to fail takes; 0: no creep

	coolFrom, coolTo time.Time // the latest cooldown
	coolWhy          string    // and its cause
	reported         float64   // the rate last reported to Observers

	header      float64 // rate from rate-limit headers; 0 if none
	headerUntil time.Time
	quota       quotaModel

	accepted  stats.Window  // accepted responses over acceptWindow
	refused   *stats.Window // throttled responses over acceptWindow; nil before the first
	firstSeen time.Time

	throttled, cooldowns uint64
}

func newAcceptWindow() *stats.Window {
	w := stats.NewWindow(acceptWindow)
	return &w
}

// acceptedRate returns the rate at which the server accepted requests over
// the last acceptWindow (or since the lane's first response, if younger),
// not counting the time the lane spent in its latest cooldown, when it sent
// nothing. It returns 0 when that span is too short to tell.
func (f *feedback) acceptedRate(now time.Time) float64 {
	n := f.accepted.Sum(now)
	from := now.Add(-min(acceptWindow, now.Sub(f.firstSeen)))
	span := now.Sub(from)
	if lo, hi := later(from, f.coolFrom), earlier(now, f.coolTo); hi.After(lo) {
		span -= hi.Sub(lo)
	}
	if n < minAcceptedSample || span < acceptWindow/20 {
		return 0
	}
	return float64(n) / span.Seconds()
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// firstRate estimates the limit of a server that refused a lane not yet
// paced, or returns 0 if it accepted nothing yet: the rate at which it
// accepted the lane's requests, from as little as one acceptance (a strict
// server accepts about one request per cooldown), and at least one request
// per Retry-After (or per second).
func (f *feedback) firstRate(now time.Time, ra time.Duration) float64 {
	n := f.accepted.Sum(now)
	if n == 0 {
		return 0
	}
	r := 1 / max(ra, time.Second).Seconds()
	from := now.Add(-min(acceptWindow, now.Sub(f.firstSeen)))
	span := now.Sub(from)
	if lo, hi := later(from, f.coolFrom), earlier(now, f.coolTo); hi.After(lo) {
		span -= hi.Sub(lo)
	}
	// Counted over a second at least: a bucket's burst, taken at once,
	// says nothing of its rate.
	r = max(r, float64(n)/max(span, minFirstSpan).Seconds())
	return r
}

// floor is the lowest throttle rate.
func (f *feedback) floor() float64 {
	return max(minRate, throttleFloor*f.peak)
}

// cut lowers the throttle rate after a 429 for an attempt sent at sent,
// which said to retry after ra (0 if it did not say).
func (f *feedback) cut(now, sent time.Time, current float64, ra time.Duration) {
	if !f.failAt.IsZero() && !sent.After(f.failAt) {
		return // sent before the last cut took effect: not news
	}
	const same = 1e-3 // rates within 0.1% are one level: float noise
	acc, thr := f.accepted.Sum(now), uint64(0)
	if f.refused != nil {
		thr = f.refused.Sum(now)
	}
	share := float64(acc) / float64(max(1, acc+thr))
	atCeiling := f.throttle == 0 && f.ceiling > 0 && current >= f.ceiling*(1-1e-9)
	rf, cut, edge := current, throttleCut, false
	switch {
	case current == 0:
		// Not paced yet: the first estimate of the server's limit, from
		// which the lane probes upward (see grow).
		rf, cut = f.firstRate(now, ra), 1
	case acc+thr >= ratioTrusted && share < edgeShare:
		// Answers enough to show the server refusing much of the pace
		// (many were in flight): the lane is well over, whatever came
		// before.
		rf, cut = current*share, throttleCutKnown
	case atCeiling || f.okRun >= edgeRun || (f.sustained && current <= f.fail*(1+same)):
		rf, cut, edge = current, throttleCutKnown, true
	case acc > 0 && acc+thr >= ratioSamples:
		rf, cut = current*share, throttleCutKnown
	}
	if rf <= 0 {
		if current == 0 {
			return // nothing known to cut from: the cooldown alone applies
		}
		rf = f.floor()
	}
	plateau := (1 - f.margin) * f.fail
	switch {
	case edge && f.edge && rf > plateau*(1+same) && rf <= f.fail*(1+same):
		// Failed again while creeping back: creep more slowly.
		f.creep = min(2*f.creep, maxCreep)
	case edge && f.sustained && rf <= plateau*(1+same):
		// Failed again at or under the plateau, below a pace the server
		// took: the jitter is wider than the margin.
		f.margin, f.creep = min(2*f.margin, maxMargin), edgeCreep
	case edge:
		f.margin, f.creep = throttleMargin, edgeCreep
	default:
		f.margin, f.creep = throttleMargin, 0
	}
	f.edge, f.sustained, f.okRun = edge, edge && f.okRun >= edgeRun, 0
	f.probing = current == 0
	f.peak = max(f.peak, rf)
	f.fail, f.failAt, f.grown = rf, now, now
	f.throttle = max(f.floor(), min(cut, 1-f.margin)*rf)
	f.cutTo = f.throttle
}

// grow advances the throttle rate's recovery to now.
func (f *feedback) grow(now time.Time) {
	if f.throttle == 0 {
		return
	}
	// The lane sends nothing while it cools down: recovery starts after.
	from := later(f.grown, f.coolTo)
	f.grown = later(now, f.grown)
	dt := now.Sub(from).Seconds()
	if dt <= 0 {
		return
	}
	plateau := (1 - f.margin) * f.fail
	switch {
	case f.throttle < plateau:
		step := (plateau - f.cutTo) / throttleRamp.Seconds()
		f.throttle = min(plateau, f.throttle+step*dt)
	case f.throttle < f.fail && f.creep > 0:
		f.throttle = min(f.fail, f.throttle+throttleMargin*f.fail/f.creep.Seconds()*dt)
	case f.probing:
		f.throttle *= math.Pow(2, dt)
	default:
		f.throttle *= 1 + throttleProbe*dt
	}
	if f.ceiling > 0 && f.throttle >= f.ceiling {
		f.throttle = 0
	}
}

// rate returns the pace the lane should keep now: the smallest applicable
// bound, or 0 if none applies (not paced).
func (f *feedback) rate(now time.Time) float64 {
	r := f.ceiling
	if b := f.throttle; b > 0 && (r == 0 || b < r) {
		r = b
	}
	if b := f.headerRate(now); b > 0 && (r == 0 || b < r) {
		r = b
	}
	return r
}

func (f *feedback) headerRate(now time.Time) float64 {
	if f.header > 0 && now.Before(f.headerUntil) {
		return f.header
	}
	return 0
}

// limitHeaderPrefixes are the canonical header-name prefixes of every field
// headers.Parse and headers.RetryAfter read.
var limitHeaderPrefixes = []string{"Ratelimit", "X-Ratelimit", "X-Rate-Limit", "Anthropic-Ratelimit", "Retry-After", "X-Ms-Retry-After"}

// signals reports whether resp may say something about rate limits: a
// status that does, or a header that might. Most responses say nothing, and
// this lets them skip parsing and the lane's lock.
func signals(resp *http.Response) bool {
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable, http.StatusForbidden:
		return true
	}
	for k := range resp.Header {
		for _, p := range limitHeaderPrefixes {
			if len(k) >= len(p) && k[:len(p)] == p {
				return true
			}
		}
	}
	return false
}

// observe reads what a response says, when its headers arrive: the attempt
// was sent at sent. It is called only for responses for which signals is
// true; the parsing happens before the lane's lock is taken. It reports
// whether the response refused the attempt for its rate (a 429, or a 403
// that says so).
//
// Only a refusal or a Retry-After stops the lane: a 429; a 403 with
// Retry-After (GitHub's secondary limits) or with nothing remaining
// (GitHub's primary limit); a 503 with Retry-After. The pause is the
// Retry-After, else the wait of the quota that says nothing remains (the
// token budget's, or the requests'; see quotaModel.refusalWait). Any other
// quota paces the lane (see quotaModel).
func (l *lane) observe(ctx context.Context, resp *http.Response, sent time.Time, p Priority, ch *charge) (throttled bool) {
	h := resp.Header
	// Headers state times on the wall clock; one reading serves all.
	wall := time.Now()
	q, hasQuota := headers.Parse(h, wall)
	tq, hasTokens := headers.ParseTokens(h, wall)
	ra, hasRA := headers.RetryAfter(h, wall, l.cfg.maxRetryAfter)
	exhausted := hasQuota && q.Remaining == 0
	tokensOut := hasTokens && tq.Remaining == 0
	status := resp.StatusCode
	throttled = status == http.StatusTooManyRequests ||
		status == http.StatusForbidden && (hasRA || exhausted)
	refused := throttled || status == http.StatusServiceUnavailable && hasRA

	var left [maxBudgets]int64 // what remains of each budget; -1: not stated
	for i := range l.budgets.len() {
		left[i] = -1
		if bq, ok := headers.ParseTokenBudget(h, wall, l.budgets.name(i)); ok {
			left[i] = bq.Remaining
		}
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	cause := RateHeader
	if ev := l.cfg.events; ev != nil {
		cool := l.cooldown
		defer func() { l.changed(ctx, ev, cool, cause) }()
	}
	if l.budgets.observe(now.Sub(l.epoch), sent.Sub(l.epoch), &left, ch) {
		tokensOut = true // a budget had less left than the attempt cost
	}
	f := &l.fb
	if throttled {
		f.throttled++
		l.levels[p].throttled++
		if f.refused == nil {
			f.refused = newAcceptWindow()
		}
		f.refused.Add(now, 1)
	}
	if refused && l.cfg.events != nil {
		l.cfg.events.push(ctx, Event{Kind: EventThrottled, Lane: l.key, Priority: p, Tenant: TenantFrom(ctx), Status: status})
	}
	if !refused {
		if hasQuota {
			l.paceLocked(now, sent, f.quota.observe(now, q, l.slot.inUse))
		}
		l.applyRate(now)
		return false
	}
	switch {
	case hasRA:
		l.coolLocked(now.Add(ra), "retry-after")
	case tokensOut && tq.Reset > 0:
		l.coolLocked(now.Add(min(tq.Reset, l.cfg.maxRetryAfter)), tq.Resource+" remaining 0")
	case exhausted && q.Reset > 0:
		l.coolLocked(now.Add(min(f.quota.refusalWait(q), l.cfg.maxRetryAfter)), "remaining 0")
	}
	// A 429 is over a rate the throttle rate must learn, unless a window's
	// exhausted quota (it refills at its reset, whatever the pace) or a
	// token budget explains it. A bucket's remaining 0 does not: its refill
	// rate is what was exceeded. A 403 that is not a quota (GitHub's
	// secondary limits) is a penalty, not a pace.
	if status == http.StatusTooManyRequests && !tokensOut && !(exhausted && f.quota.kind == kindWindow) {
		f.cut(now, sent, l.currentRate(), ra)
		cause = RateCut
	}
	l.applyRate(now)
	return throttled
}

// paceLocked applies what a quota stated by the response to an attempt sent
// at sent says to the lane. mu must be held.
func (l *lane) paceLocked(now, sent time.Time, qp quotaPace) {
	f := &l.fb
	switch {
	case qp.stop.After(now):
		l.coolLocked(earlier(qp.stop, now.Add(l.cfg.maxRetryAfter)), "remaining 0 until the window resets")
	case qp.rate > 0:
		f.header, f.headerUntil = qp.rate, qp.until
	}
	if qp.empty && l.lim != nil && l.be == nil {
		// The server's bucket was empty when the attempt reached it: its
		// next token came a token's time after, and the lane's may not
		// come sooner.
		t := now.Sub(l.epoch)
		l.lim.set(t, min(l.lim.tokensAt(t), now.Sub(sent).Seconds()*l.lim.rate))
	}
}

// settle is called, with mu held, when an attempt sent at sent finishes at
// now (both on the lane's clock) with status (0: the base transport
// failed): an accepted request feeds the acceptance rate and the throttle
// rate's recovery.
func (l *lane) settle(now, sent time.Duration, status int) {
	if status == 0 || status == http.StatusTooManyRequests || status >= 500 {
		return
	}
	f := &l.fb
	// Only an attempt sent after the last cut says the new pace is
	// accepted; answers to attempts already on their way when it was made
	// (many, when calls are slow) say nothing about it.
	if f.failAt.IsZero() || sent >= f.failAt.Sub(l.epoch) {
		f.okRun++
	}
	if f.firstSeen.IsZero() {
		f.firstSeen = l.timeOf(now)
	}
	f.accepted.AddNano(l.epochNS+int64(now), 1)
	if f.throttle > 0 || f.header > 0 {
		t := l.timeOf(now)
		f.peak = max(f.peak, f.acceptedRate(t))
		f.grow(t)
		l.applyRate(t)
		if ev := l.cfg.events; ev != nil {
			l.rateChanged(context.Background(), ev, RateRecovery)
		}
	}
}

// currentRate returns the lane's pace now, 0 if not paced. mu must be held.
func (l *lane) currentRate() float64 {
	// A copy of the limiter's rate, kept under mu: reading the limiter
	// takes its own lock, and this is on the path of every response.
	return l.rate
}

// coolLocked extends the lane's cooldown to until. mu must be held.
func (l *lane) coolLocked(until time.Time, why string) {
	if !until.After(l.cooldown) {
		return
	}
	last := l.timeOf(l.last)
	if !l.cooldown.After(last) { // a new cooldown, not an extension
		l.fb.cooldowns++
		l.cfg.logger.Info("sluice: lane cooling down", "lane", l.key, "for", until.Sub(last).Round(time.Millisecond), "why", why)
		l.fb.coolFrom = last
	}
	l.fb.coolWhy = why
	l.fb.coolTo = until
	l.cooldown = until
	l.coolTick = until.Sub(l.epoch)
}

// changed reports to ev what a response changed: the lane's cooldown,
// which was cool, and its rate, for cause. mu must be held.
func (l *lane) changed(ctx context.Context, ev *events, cool time.Time, cause string) {
	if l.cooldown.After(cool) {
		ev.push(ctx, Event{Kind: EventCooldown, Lane: l.key, Until: l.cooldown,
			Wait: l.cooldown.Sub(l.timeOf(l.last)), Cause: l.fb.coolWhy})
	}
	l.rateChanged(ctx, ev, cause)
}

// rateChanged reports the lane's rate to ev if it moved by 1% or more
// since the last report: a recovering rate creeps up with every response,
// and an event each time would say nothing. A cut is always reported. mu
// must be held.
func (l *lane) rateChanged(ctx context.Context, ev *events, cause string) {
	from, to := l.fb.reported, l.rate
	if to == from || cause != RateCut && from != 0 && to != 0 && math.Abs(to-from) < 0.01*from {
		return
	}
	l.fb.reported = to
	ev.push(ctx, Event{Kind: EventRateChanged, Lane: l.key, From: from, To: to, Cause: cause})
}

// applyRate sets the limiter to the pace feedback asks for. mu must be held.
func (l *lane) applyRate(now time.Time) {
	r := l.fb.rate(now)
	if r > 0 {
		r = max(r, minRate)
	}
	switch {
	case l.lim == nil && r == 0:
		return
	case l.lim == nil:
		l.lim = newBucket(r, l.cfg.burst)
		l.rate = r
		// A new bucket starts full; what the lane just sent used it.
		l.lim.drain(now.Sub(l.epoch))
		return
	}
	lim := r
	if r == 0 {
		lim = math.Inf(1)
	}
	old := l.lim.rate
	if old == lim || (!math.IsInf(old, 1) && !math.IsInf(lim, 1) && math.Abs(lim-old) < 1e-4*old) {
		return
	}
	l.lim.setRate(now.Sub(l.epoch), lim)
	l.rate = r
	if lim > old && l.q.len() > 0 {
		l.wake()
	}
}
