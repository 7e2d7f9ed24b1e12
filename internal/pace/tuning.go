package pace

import "time"

// The model's tuning, in one place. Each constant says what it sets and why
// it is that value; the rules they tune, and the runs that measured them,
// are in docs/design.md under the section named in each group's heading.
// Changing one changes what the lane decides: the tests of this package
// and the lane's (TestLearnFromStrictGCRA, TestServerModels) are what hold
// them. A share that is the rule itself, as its doc comment states it (half
// the limit still counted, an eighth of the limit gained), is written in
// the rule's code.

// Feedback from 429s: cutting the throttle rate (feedback.cut).
const (
	// throttleCut is the cut when nothing tells the failed rate r_f from
	// the pace: a 429 far over the limit may be well above it.
	throttleCut = 0.8
	// throttleCutKnown is the cut from a known r_f: a cooldown costs far
	// more than sitting a tenth low for the ramp's two seconds.
	throttleCutKnown = 0.9
	// ratioSamples is the fewest answers the accepted share is computed
	// from: one answer is no share.
	ratioSamples = 2
	// ratioTrusted is the answers enough to rule out jitter: with under
	// edgeShare accepted, the lane is well over, even at its configured rate.
	ratioTrusted = 20
	// edgeShare is the accepted share under which trusted answers say the
	// lane is well over the limit, not at it.
	edgeShare = 0.9
	// minAcceptedSample is the fewest acceptances an acceptance rate is
	// computed from: fewer over a short span say nothing of a rate.
	minAcceptedSample = 4
	// edgeRun is the acceptances since the last cut that make a 429 an
	// edge 429: a run the server took says the lane is at its limit.
	edgeRun = 10
	// jitterRun is the acceptances since the last cut that make a 429 at
	// the plateau a strict server's jitter rather than its limit (see
	// feedback.cut): refusals that far apart are 1% of the attempts at
	// most, the share a lane may be refused.
	jitterRun = 100
	// overshoot: a pace this far over what the server took since the last
	// cut overshot it, and that count is its rate (see feedback.sinceCut).
	overshoot = 1.5
)

// Feedback from 429s: the climb back (feedback.grow) and its bounds.
const (
	// throttleMargin is how far under r_f the plateau first sits: 2% of
	// 50/s leaves 400 µs of transit jitter between requests.
	throttleMargin = 0.02
	// maxMargin bounds the margin's doubling when the jitter is wider.
	maxMargin = 0.16
	// throttleRamp is the climb from the cut to the plateau.
	throttleRamp = 2 * time.Second
	// edgeCreep is the first creep period from the plateau to r_f: the
	// creep gains at most the margin and ends in a 429 when r_f was the
	// limit, so it pays only over minutes.
	edgeCreep = 4 * time.Minute
	// countCreep is the same from a count of grants (see feedback.sinceCut),
	// which errs low where the server's bucket overflowed: seconds.
	countCreep = 10 * time.Second
	// maxCreep bounds the creep period's doubling, so that a limit the
	// server has since raised is found within the hour.
	maxCreep = 32 * time.Minute
	// throttleProbe is the growth per second beyond r_f: a lane cut on an
	// estimate, or driven to the floor by an outage, is back in seconds.
	throttleProbe = 0.2
	// firstProbe is the growth per second from a guess, until the next
	// 429, which is then the edge.
	firstProbe = 4
	// usedRoom bounds the climb of a lane with no configured rate to this
	// multiple of the rate the server accepted: room for firstProbe's
	// growth, whose average over acceptWindow trails the pace by 3x.
	usedRoom = 4
	// minRate is the least pace, whatever is known: one request per 100 s.
	minRate = 0.01
)

// ThrottleFloor is the share of the highest rate known for a lane that its
// throttle rate keeps, however many 429s come (Feedback from 429s): a lane
// driven down by an outage probes back up from there within seconds.
const ThrottleFloor = 0.05

// Feedback from 429s: the acceptance counts the rates are computed from.
const (
	// acceptWindow is the span acceptances and refusals are counted over.
	acceptWindow = 2 * time.Second
	// minFirstSpan is the shortest span a first estimate counts
	// acceptances over: a bucket's burst, taken at once, is not its rate.
	minFirstSpan = time.Second
)

// Quota kinds: counting a bucket's refill from its quotas (quotaModel.count).
const (
	// countSpan is the least time a refill rate is counted over: long
	// enough that a few responses out of order (they leave the server in
	// another order than they reach it) are a few percent of the count.
	countSpan = time.Second
	// refusedSpan is the least a refusal's count is taken over: the bucket
	// is known empty then, and a lane at twice the rate empties a bucket
	// of six at 50/s in 0.11 s; without a count each refusal cut only a
	// tenth off, each with a second of Retry-After.
	refusedSpan = countSpan / 16
	// refillSlack is a counted refill rate's error: rates within it are
	// one, and a quota must outrun the count by more to drop it.
	refillSlack = 0.05
	// recountStep is how far over a counted failed rate a lane may pace
	// while the quotas show tokens to spare, so that a count taken while
	// the lane climbed is corrected by the next; more would spend a
	// window's carry as a burst after each cooldown (see feedback.rate).
	recountStep = 0.1
)

// Quota kinds: reading reset instants.
const (
	// resetSlack is how far apart two readings of one reset instant may
	// be: the time between a server's clock read and ours. A reset stated
	// to the second may be up to a second further off.
	resetSlack = 50 * time.Millisecond
	// edgeGuard: a window's end is put a period/edgeGuard past the latest
	// attempt it answered, when that attempt was sent after the end
	// thought the latest (transit between the lane's clock and the
	// server's). See windowEdge.
	edgeGuard = 32
	// edgeGuardMin: the least guard a window's measured end takes (see
	// windowEdge.guard), a period over it: a transit's spread of a millisecond
	// or two on a window of a second (a goroutine woken late between the
	// grant and the write, on a loaded machine), 0.4% of what the window
	// serves.
	edgeGuardMin = 256
	// coarseProbe: after a refusal at a reset stated to the second that has
	// just passed (a truncated instant), the lane tries again this much
	// later, until the second after the instant is out, and twice more
	// shortly before its end (see coarseRetry): at most six refusals, and
	// a quarter second lost at most, where waiting out the second loses
	// half a second on average.
	coarseProbe = time.Second / 4
)

// Quota kinds: pacing a sliding window (quotaModel.slidingRate).
const (
	// slidingSpare is what a lane paced under a sliding window keeps of
	// a request a window below its limit: a counter that rounds its
	// estimate takes a steady pace up to half a request under the limit.
	// The lane goes up to that, with nothing left for the grants'
	// jitter, a few milliseconds at most on a loopback or most networks;
	// a refusal at that pace keeps a whole request from then on (see
	// Pacer.strict).
	slidingSpare = 0.5
)

// Cooldowns and Retry-After.
const (
	// secondaryPause: a secondary rate limit stated only in a body pauses
	// a lane this long, then twice as long at each repeat until an attempt
	// is accepted: what GitHub's documentation asks of clients.
	secondaryPause = time.Minute
	// blindPause: a 429 that states nothing, to a lane not paced yet with
	// nothing accepted to estimate a rate from (a key over its quota
	// from the start), pauses it this long, then twice as long at each
	// round refused, until an attempt is accepted. Short: a strict
	// server's refusals of a lane's first burst may come back before
	// the acceptance that paces the lane (see feedback.firstAccepted).
	blindPause = 250 * time.Millisecond
)

// Spacing for strict servers, and reporting.
const (
	// keptSpan is, in tokens' time at the lane's pace, the most two
	// grants apart are read as kept at a pace (see Pacer.kept): a longer
	// gap is a pause (idle, a cooldown), which says nothing of the pace a
	// strict server refused.
	keptSpan = 2.5
	// reportStep is how far a rate moves, as a share of the rate last
	// reported, before Observers hear of it: a recovering rate creeps up
	// with every response, and an event each time would say nothing.
	reportStep = 0.01
)

// The in-flight limit (slow start): spreading an unpaced lane's sends.
const (
	// spreadGrain is how much of its pace slow start's spreading lets out
	// at once: what the pace makes in two timer grains (a Go timer on
	// Linux fires up to a millisecond late), and at least two sends. A
	// dispatcher whose timer fires a grain late then loses none of its
	// pace, and where a round trip lasts two grains or less, the bucket
	// holds a whole round's sends: spreading changes nothing.
	spreadGrain = 2 * time.Millisecond
)
