package sluice

import (
	"math"
	"net/http"
	"time"

	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/verdict"
)

// A pacer decides when a lane may send: it owns the lane's token bucket,
// the pace the bucket keeps (see feedback), a Leaser's share of the key's
// rate, and when sending may resume: the end of the cooldown a server or
// another process set, and of the wait a Backend named, read as one
// instant by notBefore. Its methods take times on the lane's clock and
// what responses said, and return what changed, for the lane to wake its
// dispatcher, emit events and log.
//
// It holds no lock: the lane calls it with its own held. Create it with
// newPacer.
type pacer struct {
	lim     *bucket       // nil: not paced
	rate    float64       // lim's rate; 0 if nil or unlimited
	share   *bucket       // a Leaser's share; nil when no share paces the lane
	wait    time.Duration // a Backend's wait: nothing is taken from it before
	shared  time.Duration // the latest cooldown passed to the Backend; longAgo: none
	maxWait time.Duration // the cap on a wait a server or a Backend names
	burst   int32         // lim's, held to math.MaxInt32 (beside the flags below, in one word)
	local   bool          // no Backend: the lane's bucket holds its whole budget

	// cold: a cooldown was set, and the first grant after it spaces the
	// next by two tokens' time (see take).
	cold bool
	// grants holds the instants of the last grants, the latest at
	// (ngrants-1) % len(grants); see kept.
	grants  [4]time.Duration
	ngrants int
	// lagFloor is about the least time a granted request has lately taken
	// to be written to its connection (see wrote); 0: none seen yet.
	lagFloor time.Duration
	// spread spaces the sends of a lane with no rate while slow start
	// grows its limit (see spreadAt); nil otherwise.
	spread *bucket

	fb feedback // what the server said, and the cooldown
}

// newPacer returns the pacer of a lane paced at rate (0: not paced until
// the server says) with burst, whose epoch is origin in Unix nanoseconds.
// local says no Backend holds the lane's budget; maxWait caps the waits
// servers and Backends name.
func newPacer(rate float64, burst int, maxWait time.Duration, local bool, origin int64) pacer {
	p := pacer{burst: int32(min(burst, math.MaxInt32)), local: local, maxWait: maxWait, shared: longAgo}
	if rate > 0 {
		p.lim, p.rate = newBucket(rate, burst), rate
	} else {
		rate = 0
	}
	p.fb = newFeedback(rate, origin)
	return p
}

// paced reports whether the lane's own bucket paces it.
func (p *pacer) paced() bool { return p.lim != nil }

// ready reports whether now is past the cooldown.
func (p *pacer) ready(now time.Duration) bool { return now >= p.fb.coolTo }

// cooldown returns when the latest cooldown ends (longAgo: none yet).
func (p *pacer) cooldown() time.Duration { return p.fb.coolTo }

// backendWait returns the instant before which the Backend is not asked
// for a token (see setWait).
func (p *pacer) backendWait() time.Duration { return p.wait }

// notBefore returns the instant before which nothing is sent: the end of
// the cooldown or of the Backend's wait, whichever is later.
func (p *pacer) notBefore() time.Duration { return max(p.fb.coolTo, p.wait) }

// take takes a token at now from the lane's bucket and its share, if both
// have one, and reports whether it did. late says the lane's dispatcher
// slept until a token was due (see bucket.takeLate).
func (p *pacer) take(now time.Duration, late bool) bool {
	if p.share == nil && !late && !p.cold {
		// The fast path: no share to take from first, no lateness.
		if p.lim == nil {
			return p.spread == nil || p.spread.take(now)
		}
		if !p.lim.take(now) {
			return false
		}
		p.used(now)
		return true
	}
	if !p.takeAll(now, late) {
		return false
	}
	if p.cold && p.lim != nil {
		// The first request after a cooldown finds the server idle, and
		// an idle server reads it late (by milliseconds on a busy host):
		// a strict one then counts the next, paced right, as early, and
		// refuses it with another cooldown. One token's time once per
		// cooldown is cheap insurance.
		p.lim.set(now, p.lim.advance(now)-1)
	}
	p.cold = false
	p.used(now)
	return true
}

// used records a grant at now (see kept).
func (p *pacer) used(now time.Duration) {
	p.grants[p.ngrants%len(p.grants)] = now
	p.ngrants++
}

// kept returns the pace at which the lane granted the attempt granted at
// sent and the one before it, or 0 if it cannot tell: sent is not among
// the last grants, or a pause (idle, a cooldown) came between them. A
// lane's grants may keep under its pace (slots, late timers, a share),
// and a strict server judges the spacing it sees, not the lane's bound.
func (p *pacer) kept(sent time.Duration) float64 {
	// i runs over the grants whose second predecessor is still held.
	n := len(p.grants)
	for i := p.ngrants - 1; i >= max(2, p.ngrants-n+2); i-- {
		if p.grants[i%n] != sent {
			continue
		}
		span := (sent - p.grants[(i-2)%n]).Seconds()
		if span <= 0 || p.rate > 0 && span*p.rate > 2.5 {
			return 0
		}
		return 2 / span
	}
	return 0
}

// grantsTo returns the lane's grants up to and including the one at sent,
// counted from its first paced grant: found among the last grants, or
// estimated from its pace since.
func (p *pacer) grantsTo(now, sent time.Duration) int {
	n := len(p.grants)
	for i := p.ngrants - 1; i >= max(0, p.ngrants-n); i-- {
		if p.grants[i%n] == sent {
			return i + 1
		}
	}
	return max(0, p.ngrants-int(p.rate*(now-sent).Seconds()))
}

func (p *pacer) takeAll(now time.Duration, late bool) bool {
	var share bucket
	if p.share != nil {
		// Taken from a copy first: the lane's bucket may still refuse.
		share = *p.share
		if late && share.rate > 0 {
			if !share.takeLate(now, tokenTime(share.rate)) {
				return false
			}
		} else if !share.take(now) {
			return false
		}
	}
	if p.lim != nil {
		if late {
			if !p.lim.takeLate(now, lateLag(p.lim.rate, p.strictPlateau())) {
				return false
			}
		} else if !p.lim.take(now) {
			return false
		}
	} else if p.spread != nil && !p.spread.take(now) {
		return false
	}
	if p.share != nil {
		*p.share = share
	}
	return true
}

// spaces reports whether the lane's grants are spaced from the writes of
// the requests granted before them (see wrote): once a server refused a
// pace, unless its quotas state a limit of two or more (a burst, which
// takes a request early by a token's time), and only when the lane's own
// bucket holds its whole budget.
func (p *pacer) spaces() bool {
	return p.fb.fail > 0 && !p.fb.quota.statesBurst() && p.local && p.lim != nil && !math.IsInf(p.lim.rate, 1)
}

// wrote records at now that the request of a grant made at at was written
// to its connection. Two requests granted a token apart, the first written
// late and the second on time, reach the server closer together than the
// pace, and a strict (burst 1) server refuses the second whatever the
// margin: the next grant is put off by the lateness beyond the least lately
// seen, by at most a token's time.
func (p *pacer) wrote(now, at time.Duration) {
	lag := now - at
	if lag <= 0 || !p.spaces() {
		return
	}
	if p.lagFloor == 0 {
		p.lagFloor = lag
	}
	late := min(lag-p.lagFloor, tokenTime(p.lim.rate))
	// The floor drops at once and rises an eighth of the way: the least
	// lag is what the next request may well take.
	p.lagFloor = min(lag, p.lagFloor+(lag-p.lagFloor)/8)
	if late > 0 {
		p.lim.set(now, p.lim.tokensAt(now)-late.Seconds()*p.lim.rate)
	}
}

// refund gives back at now a token taken and not used: to the share, and
// to the lane's bucket when it gave it (own: not a Backend). nth is the
// count of grants (see granted) just after the one given back; a token is
// given back only if no grant came after it. A later grant may have been
// charged late, up to a token's time before its hand-off (see
// bucket.takeLate), and a token given back at now, on top of that, would
// let one more grant into a window than rate x T + burst + 1. Losing the
// token instead costs a lane at most one grant per cancellation that races
// its grant.
func (p *pacer) refund(now time.Duration, own bool, nth int) {
	if nth != p.ngrants {
		return
	}
	if p.share != nil {
		p.share.refund(now)
	}
	if p.lim != nil && own {
		// The bucket caps its tokens at burst on its next read, so a
		// refund can never raise it above a full one: the state is as if
		// the grant had not been made.
		p.lim.refund(now)
	} else if p.spread != nil {
		p.spread.refund(now)
	}
}

// granted returns the count of grants the pacer has made; see refund.
func (p *pacer) granted() int { return p.ngrants }

// lateLag is how far back a late token of a bucket at rate may be charged
// (see bucket.takeLate): a token's time, less a token's time at safe, the
// plateau under the pace a server last refused (0: none did). Two grants
// are then never closer together than the plateau's spacing: a strict
// (burst 1) server refuses any spacing under its own, and the margin is
// what absorbs the requests' jitter in transit.
func lateLag(rate, safe float64) time.Duration {
	lag := tokenTime(rate)
	if safe > 0 {
		lag = max(0, lag-tokenTime(safe))
	}
	return lag
}

// strictPlateau returns the plateau a late grant keeps its spacing from
// (see lateLag), or 0 where the server states a burst.
func (p *pacer) strictPlateau() float64 {
	if p.fb.quota.statesBurst() {
		return 0
	}
	return p.fb.plateau()
}

// tokenDelay returns how long after now a token is due.
func (p *pacer) tokenDelay(now time.Duration) time.Duration {
	var d time.Duration
	if p.lim != nil {
		d = tokensDelay(1-p.lim.tokensAt(now), p.lim.rate)
	} else if p.spread != nil {
		d = tokensDelay(1-p.spread.tokensAt(now), p.spread.rate)
	}
	if p.share != nil {
		d = max(d, tokensDelay(1-p.share.tokensAt(now), p.share.rate))
	}
	return d
}

// held returns the tokens the lane's bucket and share hold at now, the
// fewer of the two; +Inf if neither paces.
func (p *pacer) held(now time.Duration) float64 {
	h := math.Inf(1)
	if p.lim != nil {
		h = p.lim.tokensAt(now)
	}
	if p.share != nil {
		h = min(h, p.share.tokensAt(now))
	}
	return h
}

// paceRate returns the rate that paces the lane's grants: its own, or its
// share's if lower; 0 if neither paces.
func (p *pacer) paceRate() float64 {
	r := math.Inf(1)
	if p.lim != nil {
		r = p.lim.rate
	}
	if p.share != nil {
		r = min(r, p.share.rate)
	}
	if math.IsInf(r, 1) {
		return 0
	}
	return r
}

// pending reports whether anything the pacer holds at now would be lost if
// the lane were forgotten: a cooldown, a Backend's wait or a header rate
// still in force, or a bucket not yet full again.
func (p *pacer) pending(now time.Duration) bool {
	return now < p.notBefore() || now < p.fb.headerUntil ||
		p.lim != nil && p.lim.tokensAt(now) < p.lim.burst
}

// A coolChange is what setting a cooldown changed.
type coolChange struct {
	extended bool          // the cooldown now ends later, at until
	fresh    bool          // and it is a new one, not an extension
	until    time.Duration // its end
	why      string        // its cause
}

// cool extends the cooldown to until, at now, for why.
func (p *pacer) cool(now, until time.Duration, why string) coolChange {
	ext, fresh := p.fb.cool(now, until, why)
	p.cold = p.cold || ext
	return coolChange{extended: ext, fresh: fresh, until: p.fb.coolTo, why: p.fb.coolWhy}
}

// setWait records at now that the Backend named wait before it is asked
// again, held to maxWait.
func (p *pacer) setWait(now, wait time.Duration) {
	p.wait = now + min(wait, p.maxWait)
}

// toShare returns the cooldown's end, if it is later than the last one
// returned, for the lane to pass to its Backend.
func (p *pacer) toShare() (time.Duration, bool) {
	if p.fb.coolTo <= p.shared {
		return 0, false
	}
	p.shared = p.fb.coolTo
	return p.shared, true
}

// join makes the lane wait for a Leaser's first share: nothing is sent
// before it.
func (p *pacer) join() { p.share = &bucket{} }

// sharing reports whether a Leaser's share paces the lane.
func (p *pacer) sharing() bool { return p.share != nil }

// setShare sets the Leaser's share to rate and burst at now; see sharing.
func (p *pacer) setShare(now time.Duration, rate float64, burst int) {
	b := float64(max(burst, 1))
	if p.share.burst == 0 {
		// The first grant: the share starts full, as a lane's bucket does.
		*p.share = bucket{rate: max(rate, 0), burst: b, tokens: b, last: now}
	} else {
		p.share.setRate(now, max(rate, 0))
	}
	// A lower burst caps what is held now: tokens of a larger share are not
	// spent on top of the smaller one; a larger one holds no more yet.
	held := p.share.tokensAt(now)
	p.share.burst = b
	p.share.set(now, min(held, b))
}

// A reply is what a response says of the lane's pace: its status and the
// rate-limit fields of its headers, read by readReply.
type reply struct {
	status              int
	sent                time.Duration // when its attempt was granted, on the lane's clock
	quota, tokens       headers.Quota // requests' and tokens' quotas
	hasQuota, hasTokens bool
	retryAfter          time.Duration // 0 if none
	hasRA               bool
	budgetOut           bool           // a budget of the lane ran out (see WithBudget)
	body                verdict.Signal // what its body says (see verdict.Body)
}

// kind classifies the reply (see verdict.Classify).
func (r reply) kind() verdict.Kind {
	return verdict.Classify(r.status, r.hasRA, r.hasQuota && r.quota.Remaining == 0, r.body)
}

// readReply reads resp's status and headers, at wall, with Retry-After
// held to maxWait. Headers state times on the wall clock; one reading
// serves all.
func readReply(resp *http.Response, wall time.Time, maxWait time.Duration) reply {
	h := resp.Header
	r := reply{status: resp.StatusCode}
	r.quota, r.hasQuota = headers.Parse(h, wall)
	r.tokens, r.hasTokens = headers.ParseTokens(h, wall)
	r.retryAfter, r.hasRA = headers.RetryAfter(h, wall, maxWait)
	return r
}

// A paceChange is what a response changed.
type paceChange struct {
	kind      verdict.Kind
	throttled bool   // kind is Throttled: refused for its rate (a 429, or a 403 that says so)
	refused   bool   // throttled, or paused (see verdict.Kind.Refused)
	cause     string // of any change of the rate: RateCut or RateHeader
	raised    bool   // the lane's bucket now fills faster
	cool      coolChange
}

// observe applies what r, seen at now with inFlight attempts of the lane
// in flight (this one included), says.
//
// Only a refusal or a Retry-After stops the lane: a 429; a 403 with
// Retry-After (GitHub's secondary limits) or with nothing remaining
// (GitHub's primary limit); a 503 with Retry-After. The pause is the
// Retry-After, else the wait of the quota that says nothing remains (the
// token budget's, or the requests'; see quotaModel.refusalWait). Any other
// quota paces the lane (see quotaModel).
func (p *pacer) observe(now time.Duration, r reply, inFlight int) paceChange {
	f := &p.fb
	exhausted := r.hasQuota && r.quota.Remaining == 0
	tokensOut := r.budgetOut || r.hasTokens && r.tokens.Remaining == 0
	c := paceChange{cause: RateHeader, kind: r.kind()}
	c.throttled = c.kind == verdict.Throttled
	c.refused = c.kind.Refused()
	if c.throttled {
		f.throttled++
		if f.refused == nil {
			f.refused = newAcceptWindow()
		}
		f.refused.AddNano(f.origin+int64(now), 1)
	}
	if !c.refused {
		if r.hasQuota {
			c.cool = p.pace(now, r.sent, f.quota.observe(now, r.sent, r.quota, inFlight))
		}
		c.raised = p.applyRate(now)
		return c
	}
	// The cooldown a refusal brings lets the server's bucket fill again.
	f.draining = false
	if r.hasQuota && f.quota.seeEdge(now, r.sent, r.quota, false) {
		// What the refusals before taught, of a window read as a bucket,
		// no longer holds.
		f.forget()
	}
	switch {
	case r.hasRA && exhausted && f.quota.edgeTold():
		// A window's measured end bounds a Retry-After stated to the
		// second (sethvargo/go-limiter's is its reset, a date read as the
		// end of its second): the window refills then.
		c.cool = p.cool(now, now+min(r.retryAfter, f.quota.refusalWait(now, r.quota)), "retry-after")
	case r.hasRA && f.quota.wholeWindow(r.retryAfter):
		// A sliding window's count falls as requests leave it: its
		// refusal waits until one has.
		c.cool = p.cool(now, now+min(r.retryAfter, f.quota.refusalWait(now, r.quota)), "retry-after")
	case r.hasRA:
		c.cool = p.cool(now, now+r.retryAfter, "retry-after")
	case tokensOut && r.tokens.Reset > 0:
		c.cool = p.cool(now, now+min(r.tokens.Reset, p.maxWait), r.tokens.Resource+" remaining 0")
	case exhausted && (r.quota.Reset > 0 || f.quota.edgeTold()):
		c.cool = p.cool(now, now+min(f.quota.refusalWait(now, r.quota), p.maxWait), "remaining 0")
	case r.body.Secondary:
		// GitHub: wait at least a minute, then longer at each repeat.
		f.penalty = min(max(2*f.penalty, secondaryPause), p.maxWait)
		c.cool = p.cool(now, now+f.penalty, "secondary rate limit")
	}
	// A 429 is over a rate the throttle rate must learn, unless a window's
	// exhausted quota (it refills at its reset, whatever the pace) or a
	// token budget explains it. A bucket's remaining 0 does not: its refill
	// rate is what was exceeded. A 403 that is not a quota (GitHub's
	// secondary limits) is a penalty, not a pace.
	// A GraphQL throttle in a 200 or a 4xx is a 429 in another form.
	if (r.status == http.StatusTooManyRequests || r.body.GraphQL) && !tokensOut && !r.body.Secondary &&
		!(exhausted && f.quota.kind == kindWindow) {
		if r.hasQuota {
			f.quota.refused(r.sent, r.quota, inFlight-1)
		}
		f.cut(now, refusal{sent: r.sent, pace: p.rate, kept: p.kept(r.sent), ra: r.retryAfter,
			refill: f.quota.counts, rough: f.quota.rough, grants: p.grantsTo(now, r.sent), inFlight: inFlight - 1})
		c.cause = RateCut
	}
	c.raised = p.applyRate(now)
	return c
}

// pace applies what a quota stated by the response to an attempt sent at
// sent says.
func (p *pacer) pace(now, sent time.Duration, qp quotaPace) coolChange {
	var c coolChange
	p.fb.spare, p.fb.draining = qp.spare, qp.draining
	if qp.told {
		p.fb.forget()
	}
	if qp.outrun {
		// The count the header rate was read from is outrun: the server
		// takes more than it said.
		p.fb.header, p.fb.headerUntil = 0, 0
	}
	switch {
	case qp.stop > now:
		c = p.cool(now, min(qp.stop, now+p.maxWait), "remaining 0 until the window resets")
	case qp.rate > 0:
		p.fb.header, p.fb.headerUntil = qp.rate, qp.until
		p.fb.recount()
	}
	if qp.empty && p.lim != nil && p.local {
		// The server's bucket was empty when the attempt reached it: its
		// next token came a token's time after, and the lane's may not
		// come sooner.
		p.lim.set(now, min(p.lim.tokensAt(now), (now-sent).Seconds()*p.lim.rate))
	}
	return c
}

// settle counts an attempt sent at sent that finished at now as k: an
// accepted one feeds the acceptance rate and the throttle rate's recovery.
// It returns why the rate may have moved ("": it did not), and whether the
// bucket now fills faster.
func (p *pacer) settle(now, sent time.Duration, k verdict.Kind) (moved string, raised bool) {
	if !k.Accepted() {
		return "", false
	}
	f := &p.fb
	// Only an attempt sent after the last cut says the new pace is
	// accepted; answers to attempts already on their way when it was made
	// (many, when calls are slow) say nothing about it.
	if sent >= f.failAt {
		f.okRun++
	}
	f.penalty = 0
	if f.firstSeen == longAgo {
		f.firstSeen = now
		f.firstLag = int32(min((now - sent).Microseconds(), math.MaxInt32))
	}
	f.accepted.AddNano(f.origin+int64(now), 1)
	if p.lim == nil && f.firstAccepted(now, sent) {
		return RateCut, p.applyRate(now)
	}
	if f.throttle > 0 || f.header > 0 {
		f.peak = max(f.peak, f.acceptedRate(now))
		f.grow(now)
		return RateRecovery, p.applyRate(now)
	}
	return "", false
}

// applyRate sets the bucket to the pace feedback asks for at now, and
// reports whether it now fills faster.
func (p *pacer) applyRate(now time.Duration) (raised bool) {
	r := p.fb.rate(now)
	if r > 0 {
		r = max(r, minRate)
	}
	switch {
	case p.lim == nil && r == 0:
		return false
	case p.lim == nil:
		p.lim = newBucket(r, int(p.burst))
		p.rate = r
		// A new bucket starts full; what the lane just sent used it.
		p.lim.drain(now)
		return false
	}
	lim := r
	if r == 0 {
		lim = math.Inf(1)
	}
	old := p.lim.rate
	if old == lim || (!math.IsInf(old, 1) && !math.IsInf(lim, 1) && math.Abs(lim-old) < 1e-4*old) {
		return false
	}
	p.lim.setRate(now, lim)
	p.rate = r
	return lim > old
}

// report returns the rate to report to Observers, from the one last
// reported, for cause: only if it moved by 1% or more since the last report
// (a recovering rate creeps up with every response, and an event each time
// would say nothing), or on a cut.
func (p *pacer) report(cause string) (from, to float64, ok bool) {
	from, to = p.fb.reported, p.rate
	if to == from || cause != RateCut && from != 0 && to != 0 && math.Abs(to-from) < 0.01*from {
		return 0, 0, false
	}
	p.fb.reported = to
	return from, to, true
}

// fill fills in ls's pace: the rate, the ceiling and the counts of
// refusals and cooldowns.
func (p *pacer) fill(ls *LaneStats) {
	ls.Rate, ls.Ceiling = p.rate, p.fb.ceiling
	ls.Throttled, ls.Cooldowns = p.fb.throttled, p.fb.cooldowns
}

