package pace

import (
	"cmp"
	"math"
	"net/http"
	"time"

	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/verdict"
)

// A Pacer decides when a lane may send: it owns the lane's token bucket,
// the pace the bucket keeps (see feedback), a Leaser's share of the key's
// rate, and when sending may resume: the end of the cooldown a server or
// another process set, and of the wait a Backend named, read as one
// instant by NotBefore. Its methods take times on the lane's clock and
// what responses said, and return what changed, for the lane to wake its
// dispatcher, emit events and log.
//
// It holds no lock: the lane calls it with its own held. Create it with
// New.
type Pacer struct {
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
	// strict: a sliding window told apart refused an attempt, at its
	// pace of half a request a window under its limit: its counter does
	// not round, or the grants came too unevenly for it, and a whole
	// request a window is kept from then on. In the word of burst.
	strict bool
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

	fb    feedback   // what the server said, and the cooldown
	quota quotaModel // the kind of limit the quotas describe, and their pace
	ra    overlong   // whether a Retry-After the lane shortened is meant
}

// New returns the pacer of a lane paced at rate (0: not paced until
// the server says) with burst, whose epoch is origin in Unix nanoseconds.
// local says no Backend holds the lane's budget; maxWait caps the waits
// servers and Backends name.
func New(rate float64, burst int, maxWait time.Duration, local bool, origin int64) Pacer {
	p := Pacer{burst: int32(min(burst, math.MaxInt32)), local: local, maxWait: maxWait, shared: longAgo}
	if rate > 0 {
		p.lim, p.rate = newBucket(rate, burst), rate
	} else {
		rate = 0
	}
	p.fb = newFeedback(rate, origin)
	p.ra = newOverlong()
	return p
}

// Paced reports whether the lane's own bucket paces it.
func (p *Pacer) Paced() bool { return p.lim != nil }

// Ready reports whether now is past the cooldown.
func (p *Pacer) Ready(now time.Duration) bool { return now >= p.fb.coolEnd() }

// Cooldown returns when the latest cooldown ends (before any instant of
// the clock: none yet).
func (p *Pacer) Cooldown() time.Duration { return p.fb.coolEnd() }

// BackendWait returns the instant before which the Backend is not asked
// for a token (see SetWait).
func (p *Pacer) BackendWait() time.Duration { return p.wait }

// NotBefore returns the instant before which nothing is sent: the end of
// the cooldown or of the Backend's wait, whichever is later.
func (p *Pacer) NotBefore() time.Duration { return max(p.fb.coolEnd(), p.wait) }

// Take takes a token at now from the lane's bucket and its share, if both
// have one, and reports whether it did. late says the lane's dispatcher
// slept until a token was due (see bucket.takeLate).
func (p *Pacer) Take(now time.Duration, late bool) bool {
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

// used records a grant at now (see kept), and holds the next one back to
// a window's end when it took the last the window has left (see
// quotaModel.granted).
func (p *Pacer) used(now time.Duration) {
	p.grants[p.ngrants%len(p.grants)] = now
	p.ngrants++
	if next, held := p.quota.granted(now); held && p.lim != nil {
		// Held no longer than a cooldown may be: a window's end is
		// measured, not stated, and a server may state any reset.
		next = min(next, now+p.maxWait)
		p.lim.set(now, min(p.lim.tokensAt(now), 1-p.lim.perSecond()*(next-now).Seconds()))
	}
}

// kept returns the pace at which the lane granted the attempt granted at
// sent and the one before it, or 0 if it cannot tell: sent is not among
// the last grants, or a pause (idle, a cooldown) came between them. A
// lane's grants may keep under its pace (slots, late timers, a share),
// and a strict server judges the spacing it sees, not the lane's bound.
func (p *Pacer) kept(sent time.Duration) float64 {
	// i runs over the grants whose second predecessor is still held.
	n := len(p.grants)
	for i := p.ngrants - 1; i >= max(2, p.ngrants-n+2); i-- {
		if p.grants[i%n] != sent {
			continue
		}
		span := (sent - p.grants[(i-2)%n]).Seconds()
		if span <= 0 || p.rate > 0 && span*p.rate > keptSpan {
			return 0
		}
		return 2 / span
	}
	return 0
}

// grantsTo returns the lane's grants up to and including the one at sent,
// counted from its first paced grant: found among the last grants, or
// estimated from its pace since.
func (p *Pacer) grantsTo(now, sent time.Duration) int {
	n := len(p.grants)
	for i := p.ngrants - 1; i >= max(0, p.ngrants-n); i-- {
		if p.grants[i%n] == sent {
			return i + 1
		}
	}
	return max(0, p.ngrants-int(p.rate*(now-sent).Seconds()))
}

func (p *Pacer) takeAll(now time.Duration, late bool) bool {
	var share bucket
	if p.share != nil {
		// Taken from a copy first: the lane's bucket may still refuse.
		share = *p.share
		if late && share.perSecond() > 0 {
			if !share.takeLate(now, TokenTime(share.perSecond())) {
				return false
			}
		} else if !share.take(now) {
			return false
		}
	}
	if p.lim != nil {
		if late {
			if !p.lim.takeLate(now, lateLag(p.lim.perSecond(), p.strictPlateau())) {
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

// Spaces reports whether the lane's grants are spaced from the writes of
// the requests granted before them (see wrote): once a server refused a
// pace, unless its quotas state a limit of two or more (a burst, which
// takes a request early by a token's time), and only when the lane's own
// bucket holds its whole budget.
func (p *Pacer) Spaces() bool {
	return p.fb.hasCut() && !p.quota.statesBurst() && p.local && p.lim != nil && !math.IsInf(p.lim.perSecond(), 1)
}

// Wrote records at now that the request of a grant made at at was written
// to its connection. Two requests granted a token apart, the first written
// late and the second on time, reach the server closer together than the
// pace, and a strict (burst 1) server refuses the second whatever the
// margin: the next grant is put off by the lateness beyond the least lately
// seen, by at most a token's time.
func (p *Pacer) Wrote(now, at time.Duration) {
	lag := now - at
	if lag <= 0 || !p.Spaces() {
		return
	}
	if p.lagFloor == 0 {
		p.lagFloor = lag
	}
	late := min(lag-p.lagFloor, TokenTime(p.lim.perSecond()))
	// The floor drops at once and rises an eighth of the way: the least
	// lag is what the next request may well take.
	p.lagFloor = min(lag, p.lagFloor+(lag-p.lagFloor)/8)
	if late > 0 {
		p.lim.set(now, p.lim.tokensAt(now)-late.Seconds()*p.lim.perSecond())
	}
}

// Refund gives back at now a token taken and not used: to the share, and
// to the lane's bucket when it gave it (own: not a Backend). nth is the
// count of grants (see Granted) just after the one given back; a token is
// given back only if no grant came after it. A later grant may have been
// charged late, up to a token's time before its hand-off (see
// bucket.takeLate), and a token given back at now, on top of that, would
// let one more grant into a window than rate x T + burst + 1. Losing the
// token instead costs a lane at most one grant per cancellation that races
// its grant.
func (p *Pacer) Refund(now time.Duration, own bool, nth int) {
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

// Prepay takes up to n tokens at now for grants the lane hands out later
// without its lock, and returns how many it took. It takes none unless
// the lane's own bucket paces it alone and nothing a server said is in
// force: no cut, no cooldown, no share, no first grant after a cooldown.
// The tokens count against the bucket's size until Spend or Unprepay
// counts them back, so that grants made from them keep within rate x T +
// burst + 1. They are not counted as grants (see Granted), nor listed
// among the grants a refusal is read against (see kept).
func (p *Pacer) Prepay(now time.Duration, n int) int {
	if n <= 0 || p.lim == nil || !p.local || p.share != nil || p.spread != nil || p.cold || p.fb.hasCut() || !p.Ready(now) {
		return 0
	}
	return p.lim.prepay(now, n)
}

// Spend counts at now n prepaid tokens as handed out.
func (p *Pacer) Spend(now time.Duration, n int) { p.lim.spend(now, n) }

// Unprepay gives back at now n prepaid tokens that were not handed out.
func (p *Pacer) Unprepay(now time.Duration, n int) { p.lim.unprepay(now, n) }

// Granted returns the count of grants the pacer has made; see Refund.
func (p *Pacer) Granted() int { return p.ngrants }

// lateLag is how far back a late token of a bucket at rate may be charged
// (see bucket.takeLate): a token's time, less a token's time at safe, the
// plateau under the pace a server last refused (0: none did). Two grants
// are then never closer together than the plateau's spacing: a strict
// (burst 1) server refuses any spacing under its own, and the margin is
// what absorbs the requests' jitter in transit.
func lateLag(rate, safe float64) time.Duration {
	lag := TokenTime(rate)
	if safe > 0 {
		lag = max(0, lag-TokenTime(safe))
	}
	return lag
}

// strictPlateau returns the plateau a late grant keeps its spacing from
// (see lateLag), or 0 where the server states a burst.
func (p *Pacer) strictPlateau() float64 {
	if p.quota.statesBurst() {
		return 0
	}
	return p.fb.plateau()
}

// TokenDelay returns how long after now a token is due.
func (p *Pacer) TokenDelay(now time.Duration) time.Duration {
	var d time.Duration
	if p.lim != nil {
		d = TokensDelay(1-p.lim.tokensAt(now), p.lim.perSecond())
	} else if p.spread != nil {
		d = TokensDelay(1-p.spread.tokensAt(now), p.spread.perSecond())
	}
	if p.share != nil {
		d = max(d, TokensDelay(1-p.share.tokensAt(now), p.share.perSecond()))
	}
	return d
}

// Held returns the tokens the lane's bucket and share hold at now, the
// fewer of the two; +Inf if neither paces.
func (p *Pacer) Held(now time.Duration) float64 {
	h := math.Inf(1)
	if p.lim != nil {
		h = p.lim.tokensAt(now)
	}
	if p.share != nil {
		h = min(h, p.share.tokensAt(now))
	}
	return h
}

// PaceRate returns the rate that paces the lane's grants: its own, or its
// share's if lower; 0 if neither paces.
func (p *Pacer) PaceRate() float64 {
	r := math.Inf(1)
	if p.lim != nil {
		r = p.lim.perSecond()
	}
	if p.share != nil {
		r = min(r, p.share.perSecond())
	}
	if math.IsInf(r, 1) {
		return 0
	}
	return r
}

// Pending reports whether anything the pacer holds at now would be lost if
// the lane were forgotten: a cooldown, a Backend's wait or a header rate
// still in force, or a bucket not yet full again.
func (p *Pacer) Pending(now time.Duration) bool {
	return now < p.NotBefore() || p.fb.headerPending(now) ||
		p.lim != nil && p.lim.tokensAt(now) < p.lim.size()
}

// A CoolChange is what setting a cooldown changed.
type CoolChange struct {
	Extended bool          // the cooldown now ends later, at Until
	Fresh    bool          // and it is a new one, not an extension
	Until    time.Duration // its end
	Why      string        // its cause
}

// Cool extends the cooldown to until, at now, for why; the first grant
// after it keeps a token back (see Take).
func (p *Pacer) Cool(now, until time.Duration, why string) CoolChange {
	return p.cool(now, until, why, true)
}

// cool is Cool; cold says whether the first grant after an extended
// cooldown keeps a token back.
func (p *Pacer) cool(now, until time.Duration, why string, cold bool) CoolChange {
	ext, fresh := p.fb.cool(now, until, why)
	p.cold = p.cold || cold && ext
	return CoolChange{Extended: ext, Fresh: fresh, Until: p.fb.coolEnd(), Why: p.fb.coolCause()}
}

// Hold holds back every grant until until, at now, as a cooldown does,
// for a cooldown of another lane (a sub-limit's host): it is not counted
// as one of this lane's, nor does its end keep a token back.
func (p *Pacer) Hold(now, until time.Duration) {
	if until <= p.fb.coolTo {
		return
	}
	if p.fb.coolTo <= now {
		p.fb.coolFrom = now
	}
	p.fb.coolTo = until
}

// SetWait records at now that the Backend named wait before it is asked
// again, held to maxWait.
func (p *Pacer) SetWait(now, wait time.Duration) {
	p.wait = now + min(wait, p.maxWait)
}

// ToShare returns the cooldown's end, if it is later than the last one
// returned, for the lane to pass to its Backend.
func (p *Pacer) ToShare() (time.Duration, bool) {
	if p.fb.coolEnd() <= p.shared {
		return 0, false
	}
	p.shared = p.fb.coolEnd()
	return p.shared, true
}

// Join makes the lane wait for a Leaser's first share: nothing is sent
// before it.
func (p *Pacer) Join() { p.share = &bucket{} }

// Sharing reports whether a Leaser's share paces the lane.
func (p *Pacer) Sharing() bool { return p.share != nil }

// SetShare sets the Leaser's share to rate and burst at now; see Sharing.
func (p *Pacer) SetShare(now time.Duration, rate float64, burst int) {
	b := float64(max(burst, 1))
	if p.share.size() == 0 {
		// The first grant: the share starts full, as a lane's bucket does.
		*p.share = fullAt(max(rate, 0), b, now)
	} else {
		p.share.setRate(now, max(rate, 0))
	}
	// A lower burst caps what is held now: tokens of a larger share are not
	// spent on top of the smaller one; a larger one holds no more yet.
	p.share.resize(now, b)
}

// A Reply is what a response says of the lane's pace: its status and the
// rate-limit fields of its headers, read by ReadReply, and what the lane
// adds: when its attempt was granted and what its body and budgets said.
type Reply struct {
	Status              int
	Sent                time.Duration // when its attempt was granted, on the lane's clock
	Quota, Tokens       headers.Quota // requests' and tokens' quotas
	HasQuota, HasTokens bool
	RetryAfter          time.Duration // 0 if none
	HasRA               bool
	BudgetOut           bool           // a budget of the lane ran out
	Body                verdict.Signal // what its body says (see verdict.Body)
}

// kind classifies the reply (see verdict.Classify).
func (r Reply) kind() verdict.Kind {
	return verdict.Classify(r.Status, r.HasRA, r.HasQuota && r.Quota.Remaining == 0, r.Body)
}

// ReadReply reads resp's status and headers, at wall, with Retry-After
// held to maxWait. Headers state times on the wall clock; one reading
// serves all.
func ReadReply(resp *http.Response, wall time.Time, maxWait time.Duration) Reply {
	h := resp.Header
	r := Reply{Status: resp.StatusCode}
	r.Quota, r.HasQuota = headers.Parse(h, wall)
	r.Tokens, r.HasTokens = headers.ParseTokens(h, wall)
	r.RetryAfter, r.HasRA = headers.RetryAfter(h, wall, maxWait)
	return r
}

// A Change is what a response changed.
type Change struct {
	Kind      verdict.Kind
	Throttled bool   // Kind is Throttled: refused for its rate (a 429, or a 403 that says so)
	Refused   bool   // throttled, or paused (see verdict.Kind.Refused)
	Cause     string // of any change of the rate: CauseCut or CauseHeader
	Raised    bool   // the lane's bucket now fills faster
	Cool      CoolChange
}

// Observe applies what r, seen at now with inFlight attempts of the lane
// in flight (this one included), says.
//
// Only a refusal or a Retry-After stops the lane: a 429; a 403 with
// Retry-After (GitHub's secondary limits) or with nothing remaining
// (GitHub's primary limit); a 503 with Retry-After. The pause is the
// Retry-After, else the wait of the quota that says nothing remains (the
// token budget's, or the requests'; see quotaModel.refusalWait). Any other
// quota paces the lane (see quotaModel).
func (p *Pacer) Observe(now time.Duration, r Reply, inFlight int) Change {
	f := &p.fb
	exhausted := r.HasQuota && r.Quota.Remaining == 0
	tokensOut := r.BudgetOut || r.HasTokens && r.Tokens.Remaining == 0
	c := Change{Cause: CauseHeader, Kind: r.kind()}
	c.Throttled = c.Kind == verdict.Throttled
	c.Refused = c.Kind.Refused()
	if c.Throttled {
		f.throttledAt(now)
	}
	if !c.Refused {
		if r.HasQuota {
			qp := p.quota.observe(now, r.Sent, r.Quota, inFlight)
			if p.strict && p.quota.sliding() {
				// The quota's pace is the sliding window's, which keeps
				// half a request (see quotaModel.slidingRate).
				qp.rate = p.quota.slidingRate(1)
			}
			c.Cool = p.pace(now, r.Sent, qp)
		}
		c.Raised = p.applyRate(now)
		return c
	}
	// The cooldown a refusal brings lets the server's bucket fill again.
	f.pausedByRefusal()
	if p.quota.sliding() {
		p.strict = true // before this refusal's quota is read
	}
	if r.HasQuota && p.quota.seeEdge(now, r.Sent, r.Quota, false) {
		// What the refusals before taught, of a window read as a bucket,
		// no longer holds.
		f.forget()
	}
	// A refusal with nothing remaining, no Retry-After, and a reset stated
	// to the second that is now or passed less than a second ago, of a
	// window whose end is not measured: the stated instant was truncated
	// (ulule/limiter's Unix time), and the window or bucket it names
	// resets within the second after it. It says when, not how fast: the
	// lane tries again a step later, within that second, and cuts no rate.
	early := exhausted && !r.HasRA && r.Quota.Coarse && r.Quota.Instant && r.Quota.Reset <= 0 &&
		r.Quota.Passed < time.Second && !p.quota.edgeTold()
	if r.HasQuota {
		p.quota.learnRefused(now, r.Quota)
	}
	if c.Throttled && inFlight <= 1 {
		// A refusal says a shortened wait was meant only of an attempt
		// that went alone: a strict server refuses what follows another
		// closely, at once, before the other's acceptance comes back
		// (the slots an unpaced lane fills at a wait's end).
		p.ra.answered(r.Sent, true)
	}
	switch {
	case r.HasRA && exhausted && p.quota.edgeTold():
		// A window's measured end bounds a Retry-After stated to the
		// second (sethvargo/go-limiter's is its reset, a date read as the
		// end of its second): the window refills then.
		c.Cool = p.Cool(now, now+p.ra.shorten(now, r.RetryAfter, p.quota.refusalWait(now, r.Quota)), "retry-after")
	case r.HasRA && p.quota.wholeWindow(r.RetryAfter):
		// A sliding window's count falls as requests leave it: its
		// refusal waits until one has.
		c.Cool = p.Cool(now, now+min(r.RetryAfter, p.quota.refusalWait(now, r.Quota)), "retry-after")
	case r.HasRA && exhausted:
		c.Cool = p.Cool(now, now+p.ra.shorten(now, r.RetryAfter, sooner(r.RetryAfter, r.Quota, p.quota.windowed())), "retry-after")
	case r.HasRA:
		c.Cool = p.Cool(now, now+r.RetryAfter, "retry-after")
	case tokensOut && r.Tokens.Reset > 0:
		c.Cool = p.Cool(now, now+min(r.Tokens.Reset, p.maxWait), r.Tokens.Resource+" remaining 0")
	case exhausted && (r.Quota.Reset > 0 || p.quota.edgeTold()):
		c.Cool = p.Cool(now, now+min(p.quota.refusalWait(now, r.Quota), p.maxWait), "remaining 0")
	case early:
		c.Cool = p.Cool(now, coarseRetry(now, r.Quota.Passed), "remaining 0 past a reset to the second")
	case r.Body.Secondary:
		// GitHub: wait at least a minute, then longer at each repeat.
		c.Cool = p.Cool(now, now+f.secondary(p.maxWait), "secondary rate limit")
	case c.Throttled && p.rate == 0 && f.acceptedAt(now) == 0:
		// Nothing stated and nothing accepted to estimate a rate from
		// (see feedback.cut): only a pause stops a lane not paced yet,
		// which would send as fast as its slots turn.
		c.Cool = p.Cool(now, now+f.blind(r.Sent, p.maxWait), "refused, nothing accepted")
	}
	// A 429 is over a rate the throttle rate must learn, unless a window's
	// exhausted quota (it refills as the window moves, whatever the pace) or a
	// token budget explains it. A bucket's remaining 0 does not: its refill
	// rate is what was exceeded. A 403 that is not a quota (GitHub's
	// secondary limits) is a penalty, not a pace.
	// A GraphQL throttle in a 200 or a 4xx is a 429 in another form.
	if (r.Status == http.StatusTooManyRequests || r.Body.GraphQL) && !tokensOut && !r.Body.Secondary &&
		!(exhausted && p.quota.windowed()) && !early {
		if r.HasQuota {
			p.quota.refused(r.Sent, r.Quota, inFlight-1)
		}
		q := p.quota.view()
		f.cut(now, refusal{sent: r.Sent, pace: p.rate, kept: p.kept(r.Sent), ra: r.RetryAfter,
			refill: q.refill, rough: q.rough, stated: q.perSecond, burst: q.burst,
			grants: p.grantsTo(now, r.Sent), inFlight: inFlight - 1})
		c.Cause = CauseCut
	}
	c.Raised = p.applyRate(now)
	return c
}

// pace applies what a quota stated by the response to an attempt sent at
// sent says.
func (p *Pacer) pace(now, sent time.Duration, qp quotaPace) CoolChange {
	var c CoolChange
	p.fb.heard(now, qp, p.quota.view().refill)
	if qp.stop > now {
		// A window refills at once when it ends: its first request then
		// is not measured against a pace, as a strict GCRA's is, so no
		// token is kept back after it (see Take); kept back, it lost half
		// a request a window.
		c = p.cool(now, min(qp.stop, now+p.maxWait), "remaining 0 until the window resets", false)
	}
	if qp.lift && p.lim != nil {
		// The hold set when the grants the last answer allowed went (see
		// used) no longer holds: the next grant is an interval away.
		p.lim.set(now, max(p.lim.tokensAt(now), 0))
	}
	if qp.empty && p.lim != nil && p.local {
		// The server's bucket was empty when the attempt reached it: its
		// next token came a token's time after, and the lane's may not
		// come sooner.
		p.lim.set(now, min(p.lim.tokensAt(now), (now-sent).Seconds()*p.lim.perSecond()))
	}
	return c
}

// Settle counts an attempt sent at sent that finished at now as k: an
// accepted one feeds the acceptance rate and the throttle rate's recovery.
// It returns why the rate may have moved ("": it did not), and whether the
// bucket now fills faster.
func (p *Pacer) Settle(now, sent time.Duration, k verdict.Kind) (moved string, raised bool) {
	if !k.Accepted() {
		return "", false
	}
	p.ra.answered(sent, false)
	if moved = p.fb.accept(now, sent, p.lim != nil, p.quota.view()); moved == "" {
		return "", false
	}
	return moved, p.applyRate(now)
}

// SettleServed is n calls of Settle(now, sent, verdict.Served) at once.
func (p *Pacer) SettleServed(now, sent time.Duration, n int) (moved string, raised bool) {
	if p.lim == nil {
		// Unpaced, the first acceptances are told apart (see
		// feedback.firstAccepted).
		for range n {
			m, r := p.Settle(now, sent, verdict.Served)
			moved, raised = cmp.Or(m, moved), raised || r
		}
		return moved, raised
	}
	p.ra.answered(sent, false)
	if moved = p.fb.acceptN(now, sent, true, p.quota.view(), n); moved == "" {
		return "", false
	}
	return moved, p.applyRate(now)
}

// applyRate sets the bucket to the pace feedback asks for at now, and
// reports whether it now fills faster.
func (p *Pacer) applyRate(now time.Duration) (raised bool) {
	r := p.fb.rate(now)
	if r > 0 {
		// The floor never lifts the pace above the configured rate:
		// WithRate(100, 24*time.Hour) is under minRate.
		floor := minRate
		if c := p.fb.ceiling; c > 0 {
			floor = min(floor, c)
		}
		r = max(r, floor)
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
	old := p.lim.perSecond()
	if old == lim || (!math.IsInf(old, 1) && !math.IsInf(lim, 1) && math.Abs(lim-old) < 1e-4*old) {
		return false
	}
	p.lim.setRate(now, lim)
	p.rate = r
	if end, held := p.quota.heldTo(now); held && !math.IsInf(lim, 1) {
		// The hold (see used) is a time, not a count of tokens: the next
		// grant waits for the window's end at any rate.
		p.lim.set(now, 1-lim*(min(end, now+p.maxWait)-now).Seconds())
	}
	return lim > old
}

// Report returns the rate to report to Observers, from the one last
// reported, for cause: only if it moved by 1% or more since the last report
// (a recovering rate creeps up with every response, and an event each time
// would say nothing), or on a cut.
func (p *Pacer) Report(cause string) (from, to float64, ok bool) {
	from, ok = p.fb.report(p.rate, cause)
	if !ok {
		return 0, 0, false
	}
	return from, p.rate, true
}

// Stats returns the lane's pace, for its LaneStats: the rate (0: not
// paced), the ceiling and the counts of refusals and cooldowns.
func (p *Pacer) Stats() Stats {
	ceiling, throttled, cooldowns := p.fb.counts()
	return Stats{Rate: p.rate, Ceiling: ceiling, Throttled: throttled, Cooldowns: cooldowns}
}

// Stats is a pacer's part of a lane's statistics (see Pacer.Stats).
type Stats struct {
	Rate, Ceiling        float64
	Throttled, Cooldowns uint64
}

// Accepted returns how many responses the server accepted over the
// acceptance window that ends at now.
func (p *Pacer) Accepted(now time.Duration) uint64 { return p.fb.acceptedAt(now) }

// LagFloor returns about the least time a granted request has lately taken
// to be written to its connection (see Wrote); 0 before any is timed.
func (p *Pacer) LagFloor() time.Duration { return p.lagFloor }

// Rate returns the rate the lane's bucket paces to; 0 if not paced.
func (p *Pacer) Rate() float64 { return p.rate }

// coarseRetry returns when a lane refused with nothing remaining, passed
// after a reset stated to the second, tries again: coarseProbe later,
// within the second after the instant. The last tries go shortly before
// that second is out, not at its end: a window that starts at its first
// request (ulule/limiter's) and is opened by a try past the second states
// an instant a second further on than its period, and the step between
// the two instants would read as a period a second longer.
func coarseRetry(now, passed time.Duration) time.Duration {
	out := now - passed + time.Second
	for _, last := range [...]time.Duration{out - resetSlack, out - resetSlack/4} {
		if now < last {
			return min(now+coarseProbe, last)
		}
	}
	return min(now+coarseProbe, out)
}
