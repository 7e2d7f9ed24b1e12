package pace

import (
	"math"
	"time"

	"github.com/sluice-go/sluice/internal/stats"
)

// longAgo is an instant before any on a lane's clock: no cut, no cooldown,
// nothing seen yet.
const longAgo = time.Duration(math.MinInt64)

// feedback is what a lane learned from its server's answers: the throttle
// rate (AIMD on 429s), the header rate, the latest cooldown, and the
// acceptance counts they are computed from. Times are on the lane's clock;
// the windows count on the Unix clock from origin, the lane's epoch. It
// holds no lock; create it with newFeedback.
//
// Three rates bound a lane's pace, and it paces to the smallest that
// applies: the configured rate (the ceiling), the throttle rate learned
// from 429s, and the header rate the quota headers state (see quotaModel);
// a throttle rate cut to a counted refill rate gives way by a step while
// the quotas show tokens to spare (see feedback.rate). A 429 cuts the
// throttle rate (see feedback.cut), which then climbs back over time (see
// feedback.grow); a refusal also sets a cooldown, before which nothing is
// sent. The rules and why: docs/design.md, "Feedback from 429s"; the
// constants: tuning.go.
type feedback struct {
	// The latest cooldown: nothing is sent before coolTo (longAgo: none
	// yet); it began at coolFrom, for coolWhy.
	coolTo, coolFrom time.Duration
	coolWhy          string
	// penalty is the last secondary-limit pause (see Pacer.Observe); 0
	// once an attempt is accepted.
	penalty time.Duration

	ceiling float64 // configured rate after headroom; 0 if none
	origin  int64   // the lane's epoch, in Unix nanoseconds

	throttle float64       // AIMD rate; 0 while no 429 applies
	fail     float64       // r_f of the last cut
	cutTo    float64       // the rate the last cut set
	failAt   time.Duration // when the last cut was made; longAgo: none yet
	grown    time.Duration // when throttle was last grown
	peak     float64       // highest rate known: ceiling, or accepted rate seen
	margin   float64       // share of fail the plateau is below it
	okRun    int32         // responses accepted since the last cut
	// headerLeft is how many more acceptances the header rate allows (see
	// quotaPace.allow): one more says the server takes more than the
	// quota said remained, and the rate is dropped. In okRun's padding.
	headerLeft int32
	// sustained: fail is a pace the server took for edgeRun responses or
	// more, so a 429 at or under it is jitter, not a pace far too high.
	sustained bool
	edge      bool // the last cut was at the edge: a 429 after a run the server took
	probing   bool // the last cut was a lane's first estimate: grow fast until the next
	// stated: the last cut took the limit the quotas state (see cut),
	// which a run under it confirms as a run confirms an edge.
	stated bool
	// cutGrants is the lane's paced grants when the last cut was made,
	// modulo 2^32 (see sinceCut); in the bools' padding.
	cutGrants int32
	// firstRA >= 0: a 429 (which said to retry after firstRA) came before
	// any acceptance, and the first will make the lane's first estimate.
	firstRA time.Duration
	creep   time.Duration // how long the last cut's creep from plateau to fail takes; 0: no creep

	reported float64 // the rate last reported to Observers

	header      float64 // rate from rate-limit headers; 0 if none
	headerUntil time.Duration
	spare       bool // header spends tokens the server's bucket holds to spare
	draining    bool // the last quota showed the server's bucket below the most it held
	// counted: the last cut took the server's refill rate counted from its
	// quotas (see recount).
	counted bool
	// firstLag is how long the first accepted attempt took, in
	// microseconds (see firstSends); in the bools' padding.
	firstLag int32

	accepted  stats.Window  // accepted responses over acceptWindow
	refused   *stats.Window // throttled responses over acceptWindow; nil before the first
	firstSeen time.Duration // the first acceptance; longAgo: none yet

	throttled, cooldowns uint64
}

func newFeedback(ceiling float64, origin int64) feedback {
	return feedback{
		ceiling: ceiling, peak: ceiling, reported: ceiling, origin: origin,
		failAt: longAgo, coolTo: longAgo, firstSeen: longAgo, firstRA: -1,
		accepted: stats.NewWindow(acceptWindow),
	}
}

func newAcceptWindow() *stats.Window {
	w := stats.NewWindow(acceptWindow)
	return &w
}

// acceptedAt returns the responses accepted over the acceptWindow that ends
// at now.
func (f *feedback) acceptedAt(now time.Duration) uint64 {
	return f.accepted.SumNano(f.origin + int64(now))
}

// countSpan returns the span the acceptance counts at now cover: the last
// acceptWindow (or since the first acceptance, if later), not counting the
// time spent in the latest cooldown, when the lane sent nothing.
func (f *feedback) countSpan(now time.Duration) time.Duration {
	age := acceptWindow
	if f.firstSeen != longAgo {
		age = min(acceptWindow, now-f.firstSeen)
	}
	from := now - age
	span := age
	if lo, hi := max(from, f.coolFrom), min(now, f.coolTo); hi > lo {
		span -= hi - lo
	}
	return span
}

// acceptedRate returns the rate at which the server accepted requests over
// countSpan, or 0 when that span is too short to tell.
func (f *feedback) acceptedRate(now time.Duration) float64 {
	n := f.acceptedAt(now)
	span := f.countSpan(now)
	if n < minAcceptedSample || span < acceptWindow/20 {
		return 0
	}
	return float64(n) / span.Seconds()
}

// firstRate estimates the limit of a server that refused a lane not yet
// paced, or returns 0 if it accepted nothing yet: the rate at which it
// accepted the lane's requests, from as little as one acceptance (a strict
// server accepts about one request per cooldown), and at least one request
// per Retry-After (or per second).
func (f *feedback) firstRate(now, ra time.Duration) float64 {
	n := f.acceptedAt(now)
	if n == 0 {
		return 0
	}
	r := 1 / max(ra, time.Second).Seconds()
	// Counted over a second at least: a bucket's burst, taken at once,
	// says nothing of its rate.
	return max(r, float64(n)/max(f.countSpan(now), minFirstSpan).Seconds())
}

// firstSends estimates the limit of a server that refused a lane not yet
// paced, with inFlight other attempts on their way, from what the lane
// sent: the attempts accepted since the first was sent (all still
// counted) and those in flight, which a refusal answered at once would
// have been refused with, over at least a second. Where calls are slow,
// a lane's slow start has most of what it sent in flight, and the
// acceptances alone tell half the rate. It returns 0 if it cannot tell.
func (f *feedback) firstSends(now time.Duration, inFlight int) float64 {
	if f.firstSeen == longAgo || now-f.firstSeen > acceptWindow || inFlight <= 0 {
		return 0
	}
	n := f.acceptedAt(now) + uint64(inFlight)
	span := now - f.firstSeen + time.Duration(f.firstLag)*time.Microsecond
	return float64(n) / max(span, minFirstSpan).Seconds()
}

// firstAccepted makes the lane's first estimate at now, from the first
// acceptance after a 429 that found nothing accepted to estimate from, and
// reports whether it did: a strict server refuses all but one of a
// lane's first burst, and its Retry-After would otherwise cost another
// cooldown and burst before the lane is paced.
func (f *feedback) firstAccepted(now, sent time.Duration, q quotaView) bool {
	if f.firstRA < 0 {
		return false
	}
	f.cut(now, refusal{sent: sent, ra: f.firstRA, stated: q.perSecond, burst: q.burst})
	return f.throttle > 0
}

// paceBefore returns the pace half a token's time before the pace current,
// when the throttle rate grows beyond what failed: the server took the
// request a token before the one it refused, so its limit lies between
// the two paces (2.8% apart at 50/s when probing), and the middle is off by
// less than the margin under the plateau.
func (f *feedback) paceBefore(current float64) float64 {
	switch {
	case f.throttle == 0 || current <= 0:
		return current
	case f.probing:
		return current * math.Pow(firstProbe, -0.5/current)
	case f.throttle > f.fail:
		return current / (1 + 0.5*throttleProbe/current)
	}
	return current
}

// plateau is the pace the throttle rate settles at after a cut: the margin
// under the rate that failed; 0 before any cut.
func (f *feedback) plateau() float64 {
	return (1 - f.margin) * f.fail
}

// paceAt returns the pace age before now, for the pace current: while
// probing, the throttle rate grows by firstProbe a second, and a refusal
// answers a request sent a latency or more ago, so the limit it crossed is
// the pace then, not the one reached since (4% higher at 50/s and 20 ms).
func (f *feedback) paceAt(current float64, age time.Duration) float64 {
	if !f.probing || f.throttle == 0 || age <= 0 {
		return current
	}
	return min(current, max(f.cutTo, f.throttle*math.Pow(firstProbe, -age.Seconds())))
}

// floor is the lowest throttle rate.
func (f *feedback) floor() float64 {
	return max(minRate, ThrottleFloor*f.peak)
}

// A refusal is what a 429 tells feedback.cut of the pace it refused.
type refusal struct {
	sent   time.Duration // when the refused attempt was granted
	pace   float64       // the lane's pace then (0: not paced)
	kept   float64       // the pace its grants kept, at most pace (0: not known)
	ra     time.Duration // the Retry-After it named; 0 if none
	refill float64       // the server's refill rate counted from its quotas; 0 if none
	stated float64       // the quotas' limit per second (see quotaView); 0 if none
	burst  bool          // the quotas showed a burst (see quotaView)
	rough  bool          // refill was counted over a fraction of a second, to the refusal
	grants int           // the lane's paced grants up to the refused attempt's (see sinceCut)
	// inFlight is the lane's other attempts in flight (see firstSends).
	inFlight int
}

// cut lowers the throttle rate after a 429 at now for r. A refill rate
// counted from the server's quotas is its limit: a pace above it failed for
// being over the rate, whatever the run before.
func (f *feedback) cut(now time.Duration, r refusal) {
	current, sent := r.pace, r.sent
	if sent <= f.failAt {
		return // sent before the last cut took effect: not news
	}
	const same = 1e-3 // rates within 0.1% are one level: float noise
	acc, thr := f.acceptedAt(now), uint64(0)
	if f.refused != nil {
		thr = f.refused.SumNano(f.origin + int64(now))
	}
	share := float64(acc) / float64(max(1, acc+thr))
	atCeiling := f.throttle == 0 && f.ceiling > 0 && current >= f.ceiling*(1-1e-9)
	// At the edge, what the server refused is the pace the grants kept:
	// slots, late timers or a share may have held them under the lane's
	// pace, and a bound not reached says nothing of the limit.
	kept := current
	if r.kept > 0 {
		kept = min(kept, r.kept)
	}
	rf, cut, edge := current, throttleCut, false
	jitter := false  // refused at the plateau after a run there (see below)
	guess := false   // rf is a rough refill count: probe up from it
	stated := false  // rf is the first estimate, from what the quotas state
	counted := false // rf is the refill count (see recount)
	// A refusal after a run long enough that such refusals are 1% of the
	// attempts at most, by quotas that show no burst (a strict server
	// judges each request's spacing), while the margin may still widen:
	// the transit's jitter, where the pace is one the server took (below).
	longRun := f.okRun >= jitterRun && !r.burst && f.margin < maxMargin
	switch {
	case current == 0:
		// Not paced yet: the first estimate of the server's limit, from
		// which the lane probes upward (see grow). Where the quotas state
		// more and showed no burst (nothing ever remained after a
		// request: their limit is no bucket's size, so it is a rate),
		// their limit per window, or per the time to their reset (at
		// least a second), from which the lane creeps as from an edge.
		// The quotas only raise the estimate, never lower it.
		rf, cut = max(f.firstRate(now, r.ra), f.firstSends(now, r.inFlight)), 1
		if s := r.stated; s > rf && !r.burst && (rf > 0 || f.acceptedAt(now) > 0) {
			rf, stated = s, true
		}
	case longRun && (f.edge || f.stated) && current <= f.fail*(1+same) && (f.sustained || current >= f.plateau()*(1-same)):
		// Refused under the last edge (or the limit the quotas state),
		// at the plateau or creeping from it (or on the way back to it,
		// where the last cut came after a run too), after a long run:
		// the requests' jitter in transit crossed the margin, not the
		// pace the limit. The failed rate stands, and the margin may
		// widen (see jitterWidens); the spacing of
		// the few grants before the refusal (see Pacer.kept) is that
		// jitter, not the limit, and cutting to it would cost the run's
		// rate for minutes to save a refusal.
		rf, cut, edge, jitter = f.fail, 1, true, true
	case longRun && r.stated > 0 && current <= r.stated*(1+same) && f.acceptedRate(now) >= (1-maxMargin)*current:
		// The same jitter, after a run that no cut made an edge yet (a
		// probe that the quotas' limit stopped): the server took the
		// refused pace, under the limit they state, for as long as the
		// acceptances are counted over. That pace is the failed rate.
		rf, cut, edge, jitter = current, 1, true, true
	case acc+thr >= ratioTrusted && share < edgeShare:
		// Answers enough to show the server refusing much of the pace
		// (many were in flight): the lane is well over, whatever came
		// before.
		rf, cut = current*share, throttleCutKnown
	case atCeiling || f.okRun >= edgeRun || (f.sustained && current <= f.fail*(1+same)) ||
		f.probing && f.okRun > 0:
		// At the edge, or past it on the way up from a guess: a probe
		// that the server took until now crossed the limit just now.
		rf, cut, edge = min(kept, f.paceBefore(f.paceAt(current, now-sent))), throttleCutKnown, true
	case acc > 0 && acc+thr >= ratioSamples:
		rf, cut = current*share, throttleCutKnown
	}
	took := false // rf is the count of grants since the last cut (see sinceCut)
	if s := f.sinceCut(r); s*overshoot <= rf && s >= f.cutTo {
		// Far over what the server took since the last cut: that count is
		// its rate, to within a request over the time counted, or under it
		// where the server's bucket overflowed while the lane sent little.
		// Go back to the plateau under it at once, and creep as from an
		// edge, in seconds rather than minutes.
		rf, cut, edge, took = s, 1, true, true
	}
	if refill := r.refill; refill > 0 && current > 0 && rf > refill*(1+refillSlack) {
		// A bucket with a burst takes a pace over its rate for as long as
		// the burst lasts, a run that reads as the edge: cut to the rate
		// it refills at, the limit a pace can keep.
		rf, cut, edge, guess, counted = refill, throttleCutKnown, !r.rough, r.rough, true
	}
	f.counted = counted
	if rf <= 0 {
		if current == 0 {
			// Nothing accepted yet to estimate from: the first acceptance
			// will (see firstAccepted); the cooldown alone applies till then.
			f.firstRA = r.ra
			return
		}
		rf = f.floor()
	}
	f.firstRA = -1
	plateau := f.plateau()
	switch {
	case jitter:
		if f.jitterWidens(current) {
			f.margin = min(2*f.margin, maxMargin)
		}
		f.creep = edgeCreep
	case edge && f.edge && rf > plateau*(1+same) && rf <= f.fail*(1+same):
		// Failed again while creeping back: creep more slowly.
		f.creep = min(2*f.creep, maxCreep)
	case edge && f.sustained && rf <= plateau*(1+same):
		// Failed again at or under the plateau, below a pace the server
		// took: the jitter is wider than the margin.
		f.margin, f.creep = min(2*f.margin, maxMargin), edgeCreep
	case took && !counted:
		f.margin, f.creep = throttleMargin, countCreep
	case edge || stated:
		f.margin, f.creep = throttleMargin, edgeCreep
	default:
		f.margin, f.creep = throttleMargin, 0
	}
	f.edge, f.stated, f.sustained, f.okRun = edge, stated, edge && f.okRun >= edgeRun, 0
	// A first estimate, or one from the share of a handful of answers,
	// is a guess: the lane probes up from it fast (see grow).
	// A rough count is a guess too: a window's first fill, spent fast,
	// reads as a bucket that refills at a fraction of the window's rate.
	f.probing = current == 0 && !stated || guess || !edge && !stated && acc+thr < ratioTrusted
	// The floor follows rates the server took; rf was refused.
	f.peak = max(f.peak, min(rf, f.acceptedRate(now)))
	f.fail, f.failAt, f.grown, f.cutGrants = rf, now, now, int32(r.grants)
	f.throttle = max(f.floor(), min(cut, 1-f.margin)*rf)
	f.cutTo = f.throttle
}

// jitterWidens reports whether a refusal of the pace current, which the
// transit's jitter explains (see cut), widens the margin: if refusals
// that far apart cost more than the margin would. A refusal costs its
// attempt and the cooldown it set, at the pace; a margin costs its share
// of every request since the last refusal.
func (f *feedback) jitterWidens(current float64) bool {
	return f.refusalCost(current) > float64(f.okRun)*f.margin
}

// refusalCost returns what the latest refusal cost a lane at pace, in
// requests: the refused attempt, and its cooldown at the pace.
func (f *feedback) refusalCost(pace float64) float64 {
	if f.coolTo <= f.coolFrom {
		return 1
	}
	return 1 + (f.coolTo-f.coolFrom).Seconds()*pace
}

// narrow halves a margin widened by refusals at the plateau (see cut)
// while the run the server took since the last cut is long enough that a
// refusal per run would cost less than the narrower margin: the jitter
// comes in spells, and a margin widened in one would otherwise hold for
// the minutes of its creep.
func (f *feedback) narrow() {
	if f.margin <= throttleMargin || !f.edge || f.probing {
		return
	}
	lost := f.refusalCost(f.throttle)
	for f.margin > throttleMargin && f.okRun >= jitterRun && float64(f.okRun)*f.margin/2 > lost {
		f.margin = max(throttleMargin, f.margin/2)
	}
}

// sinceCut returns the most the server can have accepted per second
// since the last cut, from the refusal r: that cut answered a refusal, so
// the server had no token to spare then, and it had none for r's attempt
// either; the tokens it made between went to the lane's attempts granted
// since (if no other client took them), the refused one aside. It returns
// +Inf when it cannot tell: no cut of a paced lane before, a cooldown
// since it, fewer than two grants since it, or r's attempt sent within a
// token's time of it.
func (f *feedback) sinceCut(r refusal) float64 {
	if f.failAt == longAgo || r.pace == 0 || r.sent <= f.failAt || f.coolTo > f.failAt {
		return math.Inf(1)
	}
	n, dt := int32(r.grants)-f.cutGrants, (r.sent - f.failAt).Seconds()
	if n < 2 || dt*r.pace < 1 {
		return math.Inf(1)
	}
	return float64(n) / dt
}

// recount follows the refill rate counted from the server's quotas
// (counts) up,
// when the last cut took an earlier count: a sliding window not yet told
// apart counts what the lane sent a window before, low after a climb.
// While the quotas show tokens to spare, the lane may pace a step over the
// failed rate (see rate), and the count rises with what it sends.
func (f *feedback) recount(counts float64) {
	if !f.counted || !f.spare || counts <= f.fail*(1+refillSlack) {
		return
	}
	f.fail, f.peak = counts, max(f.peak, counts)
	f.throttle = max(f.throttle, f.plateau())
}

// forget drops the throttle rate: what the 429s before now said was read
// under a wrong model of the server's limit (see quotaPace.told). The
// next 429 cuts afresh.
func (f *feedback) forget() {
	f.throttle, f.counted, f.probing = 0, false, false
}

// grow advances the throttle rate's recovery to now.
func (f *feedback) grow(now time.Duration) {
	if f.throttle == 0 {
		return
	}
	// The lane sends nothing while it cools down: recovery starts after.
	from := max(f.grown, f.coolTo)
	f.grown = max(now, f.grown)
	dt := (now - from).Seconds()
	if dt <= 0 {
		return
	}
	f.narrow()
	before, plateau := f.throttle, f.plateau()
	switch {
	case f.throttle < plateau && !f.probing:
		step := (plateau - f.cutTo) / throttleRamp.Seconds()
		f.throttle = min(plateau, f.throttle+step*dt)
	case f.throttle < f.fail && f.creep > 0:
		f.throttle = min(f.fail, f.throttle+throttleMargin*f.fail/f.creep.Seconds()*dt)
	case f.probing && f.draining:
		// The server's bucket is emptying: the pace is over its refill
		// rate already, and growing on would only spend the burst sooner.
	case f.probing:
		f.throttle *= math.Pow(firstProbe, dt)
	default:
		f.throttle *= 1 + throttleProbe*dt
	}
	if f.ceiling > 0 && f.throttle >= f.ceiling {
		f.throttle = 0
	} else if f.ceiling == 0 && f.throttle > before {
		// With no ceiling to end the climb, a pace the lane does not
		// use says nothing of the server's limit: the climb stops at
		// usedRoom times what the server accepted (or what failed), or
		// it grows without bound while the lane sends little, and the
		// floor it lifts makes every later cut too small.
		f.throttle = max(before, min(f.throttle, usedRoom*max(f.fail, f.acceptedRate(now))))
	}
}

// rate returns the pace the lane should keep now: the smallest applicable
// bound, or 0 if none applies (not paced).
func (f *feedback) rate(now time.Duration) float64 {
	r := f.ceiling
	h := f.headerRate(now)
	b := f.throttle
	if f.counted && f.spare && h > 0 && b > 0 {
		// A throttle rate cut to a counted refill rate lets the quotas'
		// pace past it, by a step over the failed rate, while they show
		// tokens to spare: the next count follows (see recount). More
		// would spend a window's carry as a burst after each cooldown.
		b = max(b, min(h, f.fail*(1+recountStep)))
	}
	if b > 0 && (r == 0 || b < r) {
		r = b
	}
	if h > 0 && (r == 0 || h < r) {
		r = h
	}
	return r
}

func (f *feedback) headerRate(now time.Duration) float64 {
	if f.header > 0 && now < f.headerUntil {
		return f.header
	}
	return 0
}

// cool extends the cooldown to until, at now, for why. It reports whether
// it did, and whether the cooldown is a new one rather than an extension of
// one still running.
func (f *feedback) cool(now, until time.Duration, why string) (extended, fresh bool) {
	if until <= f.coolTo {
		return false, false
	}
	if f.coolTo <= now {
		f.cooldowns++
		f.coolFrom = now
		fresh = true
	}
	f.coolWhy, f.coolTo = why, until
	return true, fresh
}

// The methods below are what the pacer asks of feedback and tells it:
// plain values in and out.

// coolEnd returns when the latest cooldown ends (longAgo: none yet).
func (f *feedback) coolEnd() time.Duration { return f.coolTo }

// coolCause returns why the latest cooldown was set.
func (f *feedback) coolCause() string { return f.coolWhy }

// hasCut reports whether a 429 ever cut the throttle rate.
func (f *feedback) hasCut() bool { return f.fail > 0 }

// headerPending reports whether a header rate is in force at now.
func (f *feedback) headerPending(now time.Duration) bool { return now < f.headerUntil }

// counts returns the configured ceiling and the refusals and cooldowns
// counted.
func (f *feedback) counts() (ceiling float64, throttled, cooldowns uint64) {
	return f.ceiling, f.throttled, f.cooldowns
}

// report returns the rate last reported to Observers, and reports whether
// to, the lane's rate now, is to be reported for cause: only if it moved by
// reportStep or more since the last report, or on a cut. If so, to is the
// rate last reported from now on.
func (f *feedback) report(to float64, cause string) (from float64, ok bool) {
	from = f.reported
	if to == from || cause != CauseCut && from != 0 && to != 0 && math.Abs(to-from) < reportStep*from {
		return 0, false
	}
	f.reported = to
	return from, true
}

// throttledAt counts a response at now that refused an attempt for its
// rate.
func (f *feedback) throttledAt(now time.Duration) {
	f.throttled++
	if f.refused == nil {
		f.refused = newAcceptWindow()
	}
	f.refused.AddNano(f.origin+int64(now), 1)
}

// pausedByRefusal records a refusal's cooldown: it lets the server's
// bucket fill again, so the bucket is no longer draining.
func (f *feedback) pausedByRefusal() { f.draining = false }

// secondary returns the pause of a secondary rate limit stated only in a
// body: at least secondaryPause, twice the last one at each repeat until
// an attempt is accepted, at most maxWait.
func (f *feedback) secondary(maxWait time.Duration) time.Duration {
	f.penalty = min(max(2*f.penalty, secondaryPause), maxWait)
	return f.penalty
}

// blind returns the pause of a 429 that states nothing, to an attempt
// sent at sent by a lane not paced yet with nothing accepted: at least
// blindPause, twice the last one at each round refused (an attempt sent
// after the last pause began), until an attempt is accepted, at most
// maxWait.
func (f *feedback) blind(sent, maxWait time.Duration) time.Duration {
	if f.penalty == 0 || sent >= f.coolFrom {
		f.penalty = min(max(2*f.penalty, blindPause), maxWait)
	}
	return f.penalty
}

// heard takes what a quota said, at now, that did not stop the lane
// (qp.stop is not after now): whether the server's bucket holds tokens to
// spare and is draining, whether the model of its limit was wrong, whether
// the header rate was outrun, and the header rate itself; counts is the
// refill rate counted from the quotas (see recount).
func (f *feedback) heard(now time.Duration, qp quotaPace, counts float64) {
	f.spare, f.draining = qp.spare, qp.draining
	if qp.told {
		f.forget()
	}
	if qp.outrun {
		// The count the header rate was read from is outrun: the server
		// takes more than it said.
		f.header, f.headerUntil = 0, 0
	}
	if qp.stop <= now && qp.rate > 0 {
		f.header, f.headerUntil = qp.rate, qp.until
		f.headerLeft = math.MaxInt32
		if qp.allow > 0 {
			f.headerLeft = int32(min(qp.allow, math.MaxInt32))
		}
		f.recount(counts)
	}
}

// accept counts an attempt sent at sent that the server accepted, seen at
// now, for a lane whose own bucket paces it or not (paced); q is what its
// quotas taught. It returns why the rate may have moved: CauseCut for the
// lane's first estimate (see firstAccepted), CauseRecovery when the
// throttle or header rate may climb, "" otherwise.
func (f *feedback) accept(now, sent time.Duration, paced bool, q quotaView) (cause string) {
	return f.acceptN(now, sent, paced, q, 1)
}

// acceptN is n calls of accept at once, for a paced lane: their results
// would not differ (grow moves nothing twice at one instant).
func (f *feedback) acceptN(now, sent time.Duration, paced bool, q quotaView, n int) (cause string) {
	// Only an attempt sent after the last cut says the new pace is
	// accepted; answers to attempts already on their way when it was made
	// (many, when calls are slow) say nothing about it.
	if sent >= f.failAt {
		f.okRun += int32(n)
	}
	dropped := false
	if f.header > 0 {
		if f.headerLeft -= int32(n); f.headerLeft < 0 {
			// Accepted past what the quota said remained, with no quota
			// since (a later one would have set the count again): the
			// reading is stale, or of a limit the responses no longer
			// state (another route's).
			f.header, f.headerUntil, dropped = 0, 0, true
		}
	}
	f.penalty = 0
	if f.firstSeen == longAgo {
		f.firstSeen = now
		f.firstLag = int32(min((now - sent).Microseconds(), math.MaxInt32))
	}
	f.accepted.AddNano(f.origin+int64(now), uint64(n))
	if !paced && f.firstAccepted(now, sent, q) {
		return CauseCut
	}
	if f.throttle > 0 || f.header > 0 || dropped {
		f.peak = max(f.peak, f.acceptedRate(now))
		f.grow(now)
		return CauseRecovery
	}
	return ""
}
