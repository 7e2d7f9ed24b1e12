package pace

import (
	"math"
	"time"

	"github.com/sluice-go/sluice/internal/headers"
)

// limitKind is the kind of limit a server's quota headers describe.
type limitKind uint8

const (
	// kindUnknown: not told apart yet. It is read as a bucket, whose
	// mistakes cost one refusal, where a bucket read as a window stalls
	// the lane until each reset.
	kindUnknown limitKind = iota
	// kindWindow: a fixed window (GitHub's primary limit, Envoy, Kong).
	// Remaining counts down to a reset instant that stays put, and refills
	// only when that instant passes.
	kindWindow
	// kindBucket: a token bucket or GCRA (OpenAI, Anthropic, throttled,
	// redis_rate, IETF draft-11 and later). It refills continuously; its
	// reset is when it is full again, or when more quota comes, and moves
	// later with each request. Remaining 0 means "no burst left".
	kindBucket
	// kindSliding: a sliding-window counter (go-chi/httprate, Cloudflare).
	// Its reset is a fixed window's end, replaced by the next window's
	// when it comes, but remaining does not refill then: it comes back as
	// the requests of a window before leave the count. It takes about its
	// limit per window at any pace, and its remaining, refilled by the
	// lane's own past sends, says nothing of a rate.
	kindSliding
)

func (k limitKind) String() string {
	switch k {
	case kindWindow:
		return "window"
	case kindBucket:
		return "bucket"
	case kindSliding:
		return "sliding"
	}
	return "unknown"
}

// priorKind is the kind a header family is known to describe, until the
// evidence says otherwise.
func priorKind(source string) limitKind {
	switch source {
	case "github", "ietf-draft07":
		return kindWindow
	case "openai", "anthropic", "ietf":
		return kindBucket
	}
	return kindUnknown
}

// quotaModel learns, from the request quotas a lane's responses state,
// which kind of limit the server keeps, and turns each quota into a pace.
// Times are on the lane's clock. It holds no lock; its zero value reads
// its first quota.
//
// The evidence is read from a run of responses that starts at one quota
// and is compared with the later ones:
//   - the reset instant moved later while its time had not come: a bucket
//     (a window's reset stays put);
//   - the reset instant passed and remaining did not refill (it is still
//     under half the limit and no higher than at the run's start): a
//     bucket, whose reset was only when it would be full;
//   - the reset instant stayed put for longer than the slack allows while
//     remaining fell: a window;
//   - a reset stated as an instant (passed or not) was replaced by one a
//     step later when it came, the count having fallen by three or more
//     before and half the limit or more still counted after: a sliding
//     window of that step, where a family has no prior (a bucket is full
//     when its instant comes). So are two steps in a row, three or more
//     counted after each, the longer a whole number (up to four) of the
//     shorter, which is the window (a lane held across a window sees two
//     at once). A fixed window, refilled when its instant comes, is
//     rarely read so, and paced as one it keeps to its limit.
//
// Evidence overrides the family's prior (see priorKind).
type quotaModel struct {
	kind     limitKind
	evidence bool // kind comes from evidence, not from the prior
	// The flags of the groups below, kept together to keep the lane small.
	run      bool // a run is under way (see learn)
	runMoved bool // a reset stated as an instant moved before it came
	counting bool // a count is under way (see count)
	// rough: counts is from a count a refusal ended, over less than
	// countSpan (see refused).
	rough   bool
	hasLast bool // lastAt and lastLeft hold a quota (see outrun)
	// carried: a reset stated as an instant came and the next window's
	// first quota still counted half the limit or more of the one
	// before: not a bucket (one is full when its instant comes), so no
	// refill rate is counted (see count).
	carried bool

	limit int64 // the last limit stated (a bucket's burst); 0: none yet
	// perSecond is the last quota's limit over its window, else over the
	// time to its reset, at least a second; 0 if it stated neither.
	perSecond float64
	// held is the most remaining any quota stated: the bucket holds at
	// least one more when full. A stated limit may be a rate, not the
	// bucket's size (redis_rate states its rate), so it alone does not
	// say when the bucket may be full.
	held int64

	runSeen  time.Duration // when the run's first quota was seen
	runReset time.Duration // its reset instant
	runLeft  int64         // its remaining

	// A reset stated as an instant and replaced when it came, with
	// requests counted before and after: the step from the instant to the
	// next (jump), and the window it measures once two steps agree (0
	// until then).
	jump, window time.Duration

	// The refill rate counted from the quotas themselves (see count).
	countFrom time.Duration // when it began
	countLeft int64         // remaining then
	counted   int32         // responses seen since
	// runLeast is the least remaining the run's quotas stated (see
	// learn), at most math.MaxInt32; it sits here, beside counted, to
	// keep the lane small.
	runLeast int32
	counts   float64 // the refill rate counted, 0 until known
	// The last quota counted (see outrun): when its attempt was sent,
	// and what remained.
	lastAt   time.Duration
	lastLeft int64

	// edge tells a window that refills at once apart, and measures its
	// end (see windowEdge); nil until a quota states a reset whose window's
	// end is measured (see measured), which most lanes never see.
	edge *windowEdge
}

// A quotaPace is what one response's quota says to do.
type quotaPace struct {
	// rate > 0 caps the lane's pace until until.
	rate  float64
	until time.Duration
	// stop > now: nothing more may be sent before stop (a window with
	// nothing left).
	stop time.Duration
	// empty: the server's bucket holds no token now; the next is one
	// token's time away at the lane's pace.
	empty bool
	// spare: the bucket holds tokens beyond the last one kept, and rate
	// spends them over its refill rate.
	spare bool
	// draining: the bucket holds less than the most the quotas ever
	// showed it hold: the lane took more than it refilled lately.
	draining bool
	// outrun: this quota showed the server refilled faster than the rate
	// counted from its quotas (see quotaModel.outrun): a pace read from
	// that count no longer holds.
	outrun bool
	// told: this quota told a sliding window apart. What the lane learned
	// of the rate from refusals before it, reading the window as a bucket
	// (a count, a climb cut short), no longer holds.
	told bool
	// lift: this quota allows grants again before the window's measured
	// end, after the lane held its next grant back to that end (see
	// quotaModel.granted).
	lift bool
	// allow > 0: a window's rate, which spreads what remains, holds for
	// this many acceptances at most: what the quota said remained, and
	// the attempts then in flight, which it may not have counted. 0: no
	// bound (a bucket refills as it goes).
	allow int64
}

// observe reads q, stated by a response (not a refusal) seen at now to an
// attempt sent at sent, with inFlight attempts of the lane in flight, this
// one included, and returns the pace it implies.
func (m *quotaModel) observe(now, sent time.Duration, q headers.Quota, inFlight int) quotaPace {
	if !m.evidence {
		m.kind = priorKind(q.Source)
	}
	if q.Limit > 0 {
		if m.limit > 0 && q.Limit != m.limit {
			m.held = 0 // of the limit that was
		}
		m.limit = q.Limit
		m.perSecond = 0
		if per := max(q.Window, q.Reset); per > 0 {
			m.perSecond = float64(q.Limit) / max(per, time.Second).Seconds()
		}
	}
	if q.Remaining < 0 {
		if q.Limit > 0 && q.Window > 0 {
			// A policy without a count: its mean rate, for its window.
			return quotaPace{rate: float64(q.Limit) / q.Window.Seconds(), until: now + q.Window}
		}
		return quotaPace{}
	}
	// Held to the limit less the request counted: one answer that states
	// more (an exempt route's, or another limiter's) would otherwise make
	// every later one look like the bucket draining, for good.
	rem := q.Remaining
	if q.Limit > 0 {
		rem = min(rem, q.Limit-1)
	}
	m.held = max(m.held, rem)
	was := m.kind
	told := m.seeEdge(now, sent, q, true)
	carried := m.carried
	if (q.Reset > 0 || q.Passed > 0) && !m.edgeTold() {
		m.learn(now, q)
	}
	// A count dropped as not a bucket's is outrun too: the header rate
	// read from it no longer holds.
	outrun := m.count(sent, q) || m.carried && !carried
	// Attempts in flight other than this one may not be counted by the
	// server yet: count them as used.
	left := q.Remaining - int64(max(inFlight-1, 0))
	allow := q.Remaining + int64(max(inFlight, 1))
	if m.kind == kindSliding {
		return quotaPace{rate: m.slidingRate(slidingSpare), until: now + m.window, told: was != kindSliding}
	}
	if m.edgeTold() {
		// A window whose end was measured (see windowEdge): what remains
		// goes over left+1 intervals until then, as under a precise reset,
		// and no more than what remains (see granted).
		switch until := m.edge.until(now); {
		case left <= 0:
			m.edge.allow(now, 0, 0)
			return quotaPace{stop: now + until, told: told}
		case until <= 0:
			m.edge.allow(now, 0, 0)
			return quotaPace{told: told}
		default:
			lift := m.edge.allow(now, left, now+until)
			return quotaPace{rate: float64(left+1) / until.Seconds(), until: now + until, told: told, lift: lift, allow: allow}
		}
	}
	if m.kind == kindWindow {
		switch {
		case q.Reset <= 0:
			return quotaPace{}
		case left <= 0:
			return quotaPace{stop: now + q.Reset}
		}
		// A precise reset: what remains goes over left+1 intervals, so the
		// last goes one interval before the reset, not at it, where it
		// would open the next window (a window that starts at its first
		// request, as Discord's do, would lose one request in each).
		spread, n := q.Reset, left+1
		if q.Coarse {
			// A reset rounded up to the second: spreading what remains over
			// half a second less is still within the quota (it is what
			// remains) and does not leave it unused.
			spread, n = max(q.Reset-time.Second/2, q.Reset/2), left
		}
		return quotaPace{rate: float64(n) / spread.Seconds(), until: now + q.Reset, allow: allow}
	}
	rho, fill := bucketRate(q)
	if rho == 0 && m.counts > 0 && q.Limit > 0 {
		rho, fill = m.counts, time.Duration(float64(q.Limit)/m.counts*float64(time.Second))
		if q.Reset > 0 {
			// What the quota says holds until its reset at most: a count
			// taken in a window's tail, before the window is told apart,
			// is no refill rate past it.
			fill = min(fill, q.Reset)
		}
	}
	p := quotaPace{empty: left <= 0, outrun: outrun, draining: q.Remaining < m.held}
	if rho > 0 {
		p.spare = left > 1
		// What the bucket holds may go out over the time it takes to
		// fill, besides what it gains meanwhile: the pace falls to the
		// refill rate as the bucket empties, and never below it. The last
		// token is kept: paced over the rate with one left, a lane whose
		// responses lag empties the bucket before it hears so.
		p.rate = rho * (1 + float64(max(left-1, 0))/float64(q.Limit))
		p.until = now + max(fill, time.Second)
	}
	return p
}

// bucketRate returns the refill rate a bucket's quota states, and the time
// the bucket takes to fill from empty, or 0s when it states neither: a
// policy's quota per window, or what is missing over the time until full
// when that time is stated finer than the second. A reset rounded up to the
// second only bounds the rate from below, by as much as the rate itself,
// and must not slow the lane: it is not used.
func bucketRate(q headers.Quota) (float64, time.Duration) {
	switch {
	case q.Limit <= 0:
		return 0, 0
	case q.Window > 0:
		return float64(q.Limit) / q.Window.Seconds(), q.Window
	case !q.Coarse && q.Reset > 0 && q.Remaining >= 0 && q.Remaining < q.Limit:
		// Remaining is whole tokens, rounded down, and the reset is the
		// time until the bucket is full from what it truly holds: what is
		// missing is half a token less than limit - remaining on average.
		// Read as whole, it overstated a 50/s bucket's rate by 1% (a
		// refusal in 20 s at 2R on real loopback). Beside a single missing
		// token, the half would be most of it.
		missing := float64(q.Limit - q.Remaining)
		if missing >= 2 {
			missing -= 0.5
		}
		rho := missing / q.Reset.Seconds()
		return rho, time.Duration(float64(q.Limit) / rho * float64(time.Second))
	}
	return 0, 0
}

// count measures a bucket's refill rate from the quotas of the responses to
// accepted requests when their reset is too coarse to state it: between two
// quotas a second or more apart, the bucket gained what remains now, less
// what remained then, plus what the requests in between took (one each).
// A count that may have seen the bucket full (it gains nothing then)
// starts over. Its instants are when the attempts were sent, near when the
// server counted them (a response comes a latency later, a refusal at
// once).
// It reports whether q outran the count known before (see outrun).
func (m *quotaModel) count(now time.Duration, q headers.Quota) (outrun bool) {
	if q.Remaining >= 0 {
		outrun = m.outrun(now, q)
	}
	// After a request took its token, a bucket that was full holds one
	// less than its size: only what is below says the bucket gained all
	// it could. Its size is at most the limit and, as far as the quotas
	// show, one more than the most they stated remaining: a bucket that
	// never stated more than 0 may hold one request, and a count of it
	// would only count what the lane sent.
	if m.kind == kindWindow || m.kind == kindSliding || m.carried || q.Limit <= 0 || q.Remaining < 0 || q.Remaining >= min(q.Limit-1, m.held) {
		m.counting = false
		return outrun
	}
	if !m.counting {
		m.counting, m.countFrom, m.countLeft, m.counted = true, now, q.Remaining, 0
		return outrun
	}
	m.counted++
	if d := now - m.countFrom; d >= countSpan {
		if gained := q.Remaining - m.countLeft + int64(m.counted); gained > 0 {
			m.counts, m.rough = float64(gained)/d.Seconds(), false
		}
		m.countFrom, m.countLeft, m.counted = now, q.Remaining, 0
	}
	return outrun
}

// outrun drops the counted refill rate when q, stated to an attempt sent
// at now, shows the bucket gained more since the last quota counted than
// that rate allows (two requests' slack for answers out of order): the
// server refilled faster than counted (a window refilled at once, a count
// made over a fraction of a second), and a pace at the count would hold
// the lane under what the server takes.
// It reports whether it dropped the count.
func (m *quotaModel) outrun(now time.Duration, q headers.Quota) (dropped bool) {
	if m.hasLast && m.counts > 0 && now > m.lastAt {
		gained := float64(q.Remaining-m.lastLeft+1) - 2
		if gained > m.counts*(1+refillSlack)*(now-m.lastAt).Seconds() {
			m.counts, m.rough, m.counting, dropped = 0, false, false, true
		}
	}
	if !m.hasLast || now >= m.lastAt {
		m.lastAt, m.lastLeft, m.hasLast = now, q.Remaining, true
	}
	return dropped
}

// refused ends the count under way at a refusal seen at now that states q,
// with inFlight other attempts of the lane in flight: the bucket was empty
// (nothing the refused attempt took). Over refusedSpan or more, what it
// gained over that time is its refill rate, rougher than a count over
// countSpan (whole tokens over a shorter time), so it is taken only while
// none is known. No count starts at a refusal: the cooldown it brings lets
// the bucket fill, and a count across it would miss what overflowed (a
// burst-1 GCRA read as one request per cooldown).
func (m *quotaModel) refused(now time.Duration, q headers.Quota, inFlight int) {
	counting := m.counting
	m.counting = false
	if m.kind == kindWindow || m.kind == kindSliding || q.Limit <= 0 || q.Remaining != 0 || !counting || m.counts > 0 {
		return
	}
	if d := now - m.countFrom; d >= refusedSpan {
		// A refusal is answered at once, before the attempts in flight,
		// which the bucket may have paid for: they count as taken.
		gained := q.Remaining - m.countLeft + int64(m.counted) + int64(inFlight)
		rho := float64(gained) / d.Seconds()
		// A bucket that refills at rho is full again Limit/rho after it
		// ran dry; a refusal that states it so far sooner than that (by
		// half) is a window's, spent before it ends (nothing refills
		// until the reset), which rho would take for a trickle.
		if q.Reset > 0 && rho < float64(q.Limit)/q.Reset.Seconds()/2 {
			return
		}
		if gained > 0 {
			m.counts, m.rough = rho, true
		}
	}
}

// slidingRate returns the pace of a sliding window told apart that keeps
// spare requests a window under its limit. A counter that rounds its
// estimate (httprate) takes a steady pace up to half a request under it
// (see slidingSpare); one that does not, a whole request under it. m.limit,
// not a quota's: a quota may omit it.
func (m *quotaModel) slidingRate(spare float64) float64 {
	return max(float64(m.limit)-spare, 1) / m.window.Seconds()
}

// sliding reports whether the quotas told a sliding window apart.
func (m *quotaModel) sliding() bool { return m.kind == kindSliding }

// learnRefused reads the quota of a refusal seen at now for the kind of
// limit alone (see learn): a window whose first answers include a
// refusal, the count of the window before still there, is not refilled
// at once, and a sliding window's first refusal often comes just there.
func (m *quotaModel) learnRefused(now time.Duration, q headers.Quota) {
	if (q.Reset > 0 || q.Passed > 0) && q.Remaining >= 0 && !m.edgeTold() {
		m.learn(now, q)
	}
}

// learn compares q, seen at now, with the run's start; see quotaModel.
func (m *quotaModel) learn(now time.Duration, q headers.Quota) {
	// A stated instant, passed or not: a sliding window's end truncated
	// to the second (httprate's, whose windows start where the limiter
	// was made) passes before the window ends, and states its window
	// only as a passed instant for most of it.
	reset := now + q.Reset - q.Passed
	slack := resetSlack
	if q.Coarse {
		slack += time.Second
	}
	if !m.run {
		m.run, m.runSeen, m.runReset, m.runLeft, m.runLeast = true, now, reset, q.Remaining, clamp32(q.Remaining)
		return
	}
	if q.Instant && (reset < m.runReset-slack || m.kind == kindSliding && reset < m.runReset-resetSlack) {
		// An answer from a window before the run's, out of order: a
		// refusal is answered at once, before attempts sent earlier. A
		// sliding window's instants are a step apart: one that states
		// an earlier instant is from a window before, even a second
		// before where the instants are stated to the second.
		return
	}
	if q.Instant && (reset-m.runReset).Abs() > resetSlack && now < m.runReset-resetSlack {
		// The instant moved before it came: not a window's end.
		m.runMoved, m.jump = true, 0
	}
	prior := priorKind(q.Source)
	var kind limitKind
	switch {
	case q.Instant && !m.runMoved && now >= m.runReset-resetSlack && reset > m.runReset+resetSlack:
		// The instant came and a later one replaced it.
		jump := reset - m.runReset
		// Busy: three or more taken of a count that was seen to fall (a
		// bucket of one, whose remaining is always 0 and whose reset
		// rounded up to the second jumps a second at a time, is not a
		// counter).
		busy := q.Limit >= 4 && max(int64(m.runLeast), q.Remaining) <= q.Limit-3 && m.held >= 2
		if busy && prior == kindUnknown && !m.carried && 2*q.Remaining < q.Limit {
			// Half the limit or more still counted: not a bucket, nor a
			// window refilled at once whose first answers came after
			// those of attempts sent with them. What was counted of its
			// refill was the lane's own past sends.
			m.carried, m.counts, m.rough, m.counting = true, 0, false, false
			kind, m.window = kindSliding, jump
		}
		// Once a window carried its count over, a step after a window
		// the lane spent held by a Retry-After (the next one fresh) is a
		// step too.
		steps := busy || m.carried
		if w := commonStep(jump, m.jump); steps && prior == kindUnknown && w > 0 {
			kind, m.window = kindSliding, w
			// What it counted was the lane's own past sends.
			m.counts, m.rough, m.counting = 0, false, false
		}
		m.jump = 0
		if steps {
			m.jump = jump
		}
	case now > m.runReset+slack:
		// Weak evidence: a short window may have refilled and been drained
		// again since its reset, which reads the same. It decides only
		// where the family has no prior.
		if q.Limit > 0 && 2*q.Remaining < q.Limit && q.Remaining <= m.runLeft && prior == kindUnknown {
			kind = kindBucket
		}
	case reset > m.runReset+slack && (prior != kindWindow || now < m.runReset):
		// Against a window's prior, only a reset that moved before the
		// stated one came: a short window's next reset, a window later,
		// is within a coarse reset's slack.
		kind = kindBucket
	case now-m.runSeen > 2*slack && q.Remaining < m.runLeft:
		// A sliding window's count also falls to a reset that stays put:
		// what told it apart stands.
		if m.kind != kindSliding {
			kind = kindWindow
		}
	default:
		m.runLeast = min(m.runLeast, clamp32(q.Remaining))
		return // the run goes on
	}
	if kind != kindUnknown {
		m.kind, m.evidence = kind, true
	}
	m.runSeen, m.runReset, m.runLeft, m.runLeast, m.runMoved = now, reset, q.Remaining, clamp32(q.Remaining), false
}

// clamp32 returns n, at most math.MaxInt32.
func clamp32(n int64) int32 { return int32(min(n, math.MaxInt32)) }

// commonStep returns the shorter of two steps of a sliding window's
// instant, a and b, when the longer is a whole number of it, up to four
// (within resetSlack a step): a lane paused across a window (a refusal's
// Retry-After) sees its instant step two windows at once. It returns 0
// otherwise, or when either is 0.
func commonStep(a, b time.Duration) time.Duration {
	a, b = min(a, b), max(a, b)
	if a <= 2*resetSlack {
		return 0
	}
	k := (b + a/2) / a
	if k > 4 || (b-k*a).Abs() > time.Duration(k)*resetSlack {
		return 0
	}
	return a
}

// statesBurst reports whether the server's quotas showed a burst: a
// bucket or window that takes two requests closer than its rate, seen to
// have one request or more remaining after one was taken. A stated limit
// alone does not say so: it may be a rate (redis_rate's, an IETF policy's
// quota), and a strict server that states its rate as a limit refuses the
// grants a burst would let bunch.
func (m *quotaModel) statesBurst() bool { return m.held >= 1 }

// seeEdge passes q, stated at now by the answer to an attempt sent at
// sent (accepted, or refused), to the window edge (see windowEdge) where
// its window's end is measured (see measured), and reports whether it
// told a window that refills at once apart just now: the kind is a window
// from then on, and what was counted of a bucket's refill rate no longer
// holds.
func (m *quotaModel) seeEdge(now, sent time.Duration, q headers.Quota, accepted bool) bool {
	if m.kind == kindSliding || m.carried || !measured(q) {
		// A window that carried its count over at its instant does not
		// refill at once.
		return false
	}
	if m.edge == nil {
		m.edge = new(windowEdge)
	}
	was := m.edge.isTold()
	if !m.edge.observe(now, sent, q, accepted) {
		if was && !m.edge.isTold() {
			// Contradicted: a window of a stated step, whose next one
			// still counted half the limit or more of the one before, is
			// a sliding window; else the kind is learned afresh.
			m.kind, m.evidence, m.run = kindUnknown, false, false
			if period, exact := m.edge.statedPeriod(); exact {
				m.kind, m.evidence, m.window = kindSliding, true, period
			}
		}
		return false
	}
	m.kind, m.evidence = kindWindow, true
	m.counts, m.rough, m.counting = 0, false, false
	return true
}

// measured reports whether the end of q's window is measured (see
// windowEdge), not read from its reset: where the reset is an instant to
// the second, which may be off by a second either way, of a family with
// no prior kind (see priorKind); and where it is draft-07's delay, rounded
// up to the second (express-rate-limit's), which puts the window's end up
// to a second late, a whole window of a second. Spreading what remains
// over that, or stopping the lane until it, serves a lane at the window's
// rate under it.
func measured(q headers.Quota) bool {
	switch {
	case q.Instant:
		return priorKind(q.Source) == kindUnknown
	case q.Source == "ietf-draft07":
		return q.Coarse
	}
	return false
}

// wholeWindow reports whether ra, a refusal's Retry-After, names the
// whole window of a sliding window told apart by evidence, to the second:
// go-chi/httprate states its window's length whatever its count, which
// falls continuously, and counts no refused request. Honoured, it would
// stop the lane a whole window (a minute) at each refusal. A longer one
// names something else (a penalty, whose refusals also keep the count
// from refilling, as a sliding window's does), and is left to overlong.
func (m *quotaModel) wholeWindow(ra time.Duration) bool {
	return m.kind == kindSliding && m.evidence && m.window > 0 && ra > 0 &&
		ra >= m.window.Truncate(time.Second) && ra <= m.window+time.Second
}

// granted counts a grant the lane made at now, and returns when its next
// may go if the window whose end the lane measures has none left for it
// before then: the rate spreads what remains over that many intervals
// and one more, assuming the next grant an interval away, and a token the
// lane held at once would let one more go than remains (refused, a
// request a window or two), before the answer saying so comes back.
func (m *quotaModel) granted(now time.Duration) (next time.Duration, held bool) {
	if m.edge == nil {
		return 0, false
	}
	return m.edge.granted(now)
}

// heldTo returns when the lane's next grant may go, and whether it waits
// at now for a window's end (see granted).
func (m *quotaModel) heldTo(now time.Duration) (end time.Duration, held bool) {
	if m.edge == nil {
		return 0, false
	}
	return m.edge.heldTo(now)
}

// edgeTold reports whether the server keeps a window that refills at once,
// whose end the lane measures (see windowEdge).
func (m *quotaModel) edgeTold() bool { return m.edge != nil && m.edge.isTold() }

// refusalWait returns how long after now a refusal that states q (nothing
// remains) pauses the lane when it names no Retry-After: until a window's
// measured end (see windowEdge) or its reset, or one token's time of a
// bucket whose rate is known, else until its reset.
func (m *quotaModel) refusalWait(now time.Duration, q headers.Quota) time.Duration {
	if m.edgeTold() {
		return m.edge.until(now)
	}
	if m.kind == kindSliding && m.window > 0 && m.limit > 0 {
		// The count falls as the window before's requests leave it: by
		// one request each window/limit at a steady pace.
		return TokensDelay(1, float64(m.limit)/m.window.Seconds())
	}
	if m.kind != kindWindow {
		if rho, _ := bucketRate(q); rho > 0 {
			return min(q.Reset, time.Duration(float64(time.Second)/rho))
		}
	}
	return q.Reset
}

// A quotaView is what the quotas taught of the server's limit, as plain
// values for feedback (see quotaModel.view).
type quotaView struct {
	perSecond float64 // the last quota's limit per second (see quotaModel); 0 if none
	burst     bool    // the quotas showed a burst (see statesBurst)
	refill    float64 // the refill rate counted from the quotas (see count); 0 if none
	rough     bool    // refill was counted to a refusal, over less than countSpan
}

// view returns what the quotas taught so far.
func (m *quotaModel) view() quotaView {
	return quotaView{perSecond: m.perSecond, burst: m.statesBurst(), refill: m.counts, rough: m.rough}
}

// windowed reports whether the server counts requests in windows, by its
// prior or the evidence: a fixed window's exhausted quota refills at its
// reset, and a sliding window's as the window before's requests leave its
// count, whatever the pace.
func (m *quotaModel) windowed() bool { return m.kind == kindWindow || m.kind == kindSliding }
