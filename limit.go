package sluice

import (
	"math"
	"time"

	"github.com/sluice-go/sluice/internal/verdict"
)

// The adaptive limit's constants. Why these values: docs/design.md, "The
// in-flight limit".
const (
	littleMargin = 0.1     // share added to λ·W + devWeight·sqrt(λ·D)
	devWeight    = 3       // standard deviations of the in-flight count allowed over its mean
	latencyGain  = 1.0 / 8 // weight of a sample in the smoothed latency (RFC 6298)
	devGain      = 1.0 / 4 // weight of a sample in the smoothed deviation (RFC 6298)

	// A window closes at its first sample after windowLength, once it
	// holds windowSamples samples.
	windowLength  = time.Second
	windowSamples = 16

	baselineWindows = 8    // the baseline is the least mean of this many windows
	tolerance       = 0.25 // a change in latency or throughput under this share is noise
	rateShort       = 0.9  // a paced lane completing under this share of its rate is short of it
	backoff         = 0.75 // a cut goes this far under the upstream's estimated capacity
	initialUnpaced  = 4    // the first limit of a lane with no rate
	slowExit        = 0.5  // slow start ends at a latency this share above the smoothed one

	// An overload at the limit's floor pauses the lane: for the first
	// pause, then twice as long at each in a row, up to the last.
	firstOverloadPause = 50 * time.Millisecond
	lastOverloadPause  = 5 * time.Second
)

// limiter is a lane's in-flight limit: its slots and the controller that
// sizes them from latency samples. A paced lane's limit is Little's law's
//
//	ceil((λ·W + 3·sqrt(λ·D)) · 1.1)
//
// for rate λ, smoothed latency W and its mean deviation D, under a cap that
// the controller sets when latency rises above a no-load baseline while the
// completion rate stays flat (the upstream queues what the lane sends). An
// unpaced lane's limit is that cap alone, from initialUnpaced. The limit
// stays within the bounds given to newLimiter. See docs/design.md, "The
// in-flight limit".
//
// Times are on the lane's clock. A limiter is not safe for concurrent use
// (the lane's mutex guards it); its methods neither block nor allocate.
type limiter struct {
	slots
	min, max int // the limit's bounds

	w, dev float64 // smoothed latency and its mean deviation, in seconds

	// longAt is when the next attempt in flight may turn long (see long);
	// 0: at the next look.
	longAt time.Duration

	// The current window, from start; started is false before the first
	// sample.
	start   time.Duration
	started bool
	bound   bool // a completion found every slot taken and requests waiting
	suspect bool // the last window looked like queueing, and did not act on it
	// held: cap is no finding of the gradient but where a lane with no
	// rate started (initialUnpaced) or where its rate went; a rate, once
	// known, sizes the limit by Little's law at once instead. With the
	// flags above and below, in their padding: a lane is at its size
	// class's end, with the allocation header (TestLaneHeap).
	held bool
	slow bool // slow start is on (see slowStart)
	// Slow start's spreading (see spreadRate): spreading, it may be on
	// in the lane's pacer; grew, the last sample grew the cap, and the
	// lane's sends are spread until the next.
	spreading, grew bool

	n    int32   // timed completions (samples)
	done int32   // completions, timed or not: the completion rate
	sumW float64 // latencies (s)
	sumL float32 // in-flight counts at completion
	// The samples of attempts counted long (see long), and the latencies
	// of the others (see windowLatency).
	nLong    int32
	sumShort float64

	means [baselineWindows]float64 // means of recent windows, 0: none
	next  int32                    // where the next mean goes in means
	// long counts the attempts in flight that outlasted outlier when the
	// lane looked (see lane.markLongLocked), until they end. A paced
	// lane's limit is Little's law's for the others, plus one for each:
	// the rare call of 30 s among calls of 200 ms, or a stream held
	// (HoldStream), would otherwise keep the places that W, back at
	// 200 ms within a few samples, sizes for the quick calls, and the lane
	// would fall short of its rate.
	long  int32
	prevX float32 // completions per second of the previous window
	prevL float32 // mean in-flight count of the previous window

	cap      int   // cap on the limit from the gradient; 0: none
	sinceCut int32 // windows since the last cut, from 1; 0: none yet
	knee     int32 // the upstream's capacity in calls, estimated by the last cut

	// over caps the limit after the server answered overloaded (see
	// onOverload); 0: no cap. overAt is when it was last cut, overGrew
	// when it last grew.
	over             int
	overAt, overGrew time.Duration
	pause            time.Duration // the next overload pause; 0: firstOverloadPause
}

// newLimiter returns the limiter of a lane whose limit stays within [lo,
// hi]. A paced lane starts at hi: its rate bounds what leaves before the
// first answer. An unpaced one starts at initialUnpaced.
func newLimiter(lo, hi int, paced bool) limiter {
	s := limiter{slots: slots{limit: hi}, min: lo, max: hi}
	if !paced {
		s.cap = max(lo, min(initialUnpaced, hi))
		s.limit = s.cap
		s.held, s.slow, s.spreading = true, true, true
	}
	return s
}

// A limitChange is what the limiter did on a sample: the limit moved from
// from to to (equal if it did not move), and, if the sample closed a window
// that found something, what it found, for the lane to log.
type limitChange struct {
	from, to int
	found    finding
	pause    time.Duration // the lane should send nothing for this long
	// sooner: the sample brought forward when the next attempt in flight
	// may turn long (see longAt): a dispatcher sleeping until then must
	// look again.
	sooner bool
}

// A finding is what a closed window concluded; the zero value is none worth
// a log.
type finding struct {
	kind              findingKind
	latency, baseline time.Duration // the window's mean latency, and the baseline it was compared with
	cap               int           // with foundQueueing, the cap set
}

type findingKind uint8

const (
	foundNothing  findingKind = iota
	foundQueueing             // latency up at a flat completion rate: the limit was capped
	foundSlower               // the calls got slower: the baseline is measured afresh
)

// set sets the limit to n, clamped to the bounds. Lowering it cancels
// nothing: in-flight attempts drain.
func (s *limiter) set(n int) limitChange {
	from := s.limit
	s.limit = max(s.min, min(n, s.max))
	return limitChange{from: from, to: s.limit}
}

// onSample takes the completion at now of a timed attempt that held a slot
// (counted in inUse) for latency and ended as k; long: it was counted long
// (see long). waiting says whether requests wait for the lane; rate is its
// rate, 0 if not paced; ahead is how many of the slots in use were taken
// ahead for grants not handed out yet (see prepaid.go), which are not in
// flight. It returns what became of the limit. What is not the server's
// work (a refusal, an overload, a transport error; see verdict.Kind.Sample)
// is no sample and changes nothing.
func (s *limiter) onSample(now, latency time.Duration, k verdict.Kind, long, waiting bool, rate float64, ahead int) limitChange {
	if !k.Sample() {
		return limitChange{from: s.limit, to: s.limit}
	}
	s.pause = 0
	s.growOver(now)
	x := max(latency.Seconds(), 0)
	w := s.w // before this sample
	o := s.outlier()
	if !s.started {
		// RFC 6298's start: the deviation is unknown, assume it large.
		s.w, s.dev, s.start, s.started = x, x/2, now, true
	} else {
		d := x - s.w
		s.w += d * latencyGain
		s.dev += (math.Abs(d) - s.dev) * devGain
	}
	s.n++
	s.done++
	s.sumW += x
	if long {
		s.nLong++
	} else {
		s.sumShort += x
	}
	s.sumL += float32(s.inUse - ahead)
	s.checkBound(waiting)
	s.slowStart(x, w, waiting)
	var f finding
	if s.n >= windowSamples && now-s.start >= windowLength {
		f = s.endWindow(now, rate)
	}
	ch := s.set(s.target(rate))
	ch.found = f
	// longAt was set by the outlier time of its look: the attempts in
	// flight turn long sooner by as much as that time shrank.
	if n := s.outlier(); s.longAt > 0 && n < o {
		s.longAt -= o - n
		ch.sooner = true
	}
	return ch
}

// slowStart grows the cap of a lane with no rate by one at each sample
// that finds requests waiting and every slot taken, or the lane's sends
// spread (see spreadRate: what waits then waits for the round's growth),
// as TCP's slow start grows its window: the limit doubles each round trip
// from its start, where a quarter a window would take seconds to reach
// what the server serves. It ends for good at the first sign of the
// server's limits: a latency slowExit above the smoothed one (the server
// queues; the mean latency of the window's samples so far is the
// gradient's first baseline), an overload (see onOverload), or a rate (learned from a
// refusal, or stated: Little's law then sizes the limit).
func (s *limiter) slowStart(x, w float64, waiting bool) {
	if !s.slow {
		return
	}
	spread := s.grew
	s.grew = false
	switch {
	case !s.held:
		s.slow = false
	case w > 0 && x > w*(1+slowExit):
		// The server queues what the lane adds. The mean of the
		// window's samples so far (slow start's, and this one) is the
		// gradient's first baseline: the whole window's would hold the
		// queueing of slow start's last round.
		s.slow = false
		s.push(s.sumW / float64(s.n))
	case (s.inUse >= s.limit || spread) && waiting && s.cap < s.max:
		s.cap++
		s.grew = true
	}
}

// spreadRate returns the pace at which the lane spreads its sends while
// slow start grows its limit: two limits per smoothed latency, a round
// trip's sends (each completion frees its slot and the growth adds one)
// spread over the round trip, as TCP paces its slow start. Calls that end
// together (a burst of them, or a server whose latency is fixed) would
// otherwise send the next round at once, and a server with a bucket
// refuses what it cannot take of it before its first refusal is back. It
// returns +Inf while the last sample grew nothing (the callers, not the
// limit, bound what is sent, or the limit is at its maximum) or before
// the first sample, and 0 once slow start is over, for good: spreading
// then ends.
func (s *limiter) spreadRate() float64 {
	switch {
	case !s.slow:
		s.spreading = false
		return 0
	case !s.grew || s.w <= 0:
		return math.Inf(1)
	}
	return 2 * float64(s.limit) / s.w
}

// onOverload takes an attempt sent at sent that the server answered at now
// as overloaded (see verdict.Overloaded): such answers come fast for want
// of work, so they are no latency samples, and what they say is that less
// must be in flight. The limit is cut to backoff times what is in flight,
// and capped there; an attempt sent before the last cut says nothing of
// it (the overloads of one round of calls are one signal). Round trips
// without overload raise the cap by a quarter each (see growOver) until it
// no longer binds.
//
// At the limit's floor, a cut can do no more, and answers that come fast
// would let even one call in flight send thousands a second: the lane is
// paused instead, from firstOverloadPause, twice as long at each overload
// in a row, until a sample says the server works again.
func (s *limiter) onOverload(now, sent time.Duration) limitChange {
	if s.over > 0 && sent < s.overAt {
		return limitChange{from: s.limit, to: s.limit}
	}
	s.slow = false
	floor := s.limit <= s.min
	s.over = max(s.min, min(s.limit, int(backoff*float64(s.inUse))))
	s.overAt, s.overGrew = now, now
	ch := s.set(s.over)
	if floor {
		ch.pause = max(s.pause, firstOverloadPause)
		s.pause = min(2*ch.pause, lastOverloadPause)
	}
	return ch
}

// growOver grows the overload's cap (see onOverload) by a quarter, at
// least one, if a round trip (the smoothed latency, at least windowLength)
// went by without an overload since it was cut or last grew, and drops it
// once it no longer binds. A round trip, not a window of samples: at one
// call of 20 s in flight, a window's 16 samples take minutes.
func (s *limiter) growOver(now time.Duration) {
	if s.over == 0 || now-s.overGrew < max(windowLength, secs(s.w)) {
		return
	}
	s.overGrew = now
	if s.over += max(1, s.over/4); s.over >= s.max {
		s.over = 0
	}
}

// onUntimed takes the completion of an attempt that was not timed (see
// lane.timeNext), with the arguments of onSample: it counts toward the
// window's completion rate and binding check, which must see every
// completion.
func (s *limiter) onUntimed(k verdict.Kind, waiting bool) {
	if k.Sample() {
		s.onDone(1, waiting)
	}
}

// onDone is n calls of onUntimed at once, for attempts whose kind is a
// sample (see verdict.Kind.Sample).
func (s *limiter) onDone(n int, waiting bool) {
	if !s.started {
		return // no window yet: it starts at the first sample
	}
	s.done += int32(n)
	s.checkBound(waiting)
}

// checkBound records that a completion found every slot taken and requests
// waiting.
func (s *limiter) checkBound(waiting bool) {
	if s.inUse >= s.limit && waiting {
		s.bound = true
	}
}

// target returns the limit the lane should have now, at rate.
func (s *limiter) target(rate float64) int {
	if rate == 0 {
		if s.cap == 0 { // the rate has gone: hold the limit, then move it by the gradient
			s.cap, s.held = s.limit, true
		}
		if s.over > 0 {
			return min(s.cap, s.over)
		}
		return s.cap
	}
	if s.held {
		// A rate is known now (stated by the server, or learned): Little's
		// law sizes the limit from the first latency, where growing from
		// the held cap a quarter a window would take seconds.
		s.cap, s.held, s.slow = 0, false, false
	}
	n := s.max
	if f := math.Ceil((rate*s.w+devWeight*math.Sqrt(rate*s.dev))*(1+littleMargin)) + float64(s.long); f < float64(n) {
		n = int(f)
	}
	if s.cap > 0 {
		n = min(n, s.cap)
	}
	if s.over > 0 {
		n = min(n, s.over)
	}
	return n
}

// outlier returns how long an attempt may be in flight before it counts
// as long (see long): TCP's retransmission timeout, W + 4·D (RFC 6298).
// It returns 0 (none counts) before the first sample.
func (s *limiter) outlier() time.Duration {
	if !s.started {
		return 0
	}
	return secs(s.w + 4*s.dev)
}

// callTime returns the time most attempts take once sent: the smoothed
// latency plus its mean deviation (see lane.refuseLocked); 0 before the
// first sample.
func (s *limiter) callTime() time.Duration {
	if !s.started {
		return 0
	}
	return secs(s.w + s.dev)
}

// addLong counts n more attempts in flight as long, and returns what
// became of the limit at rate.
func (s *limiter) addLong(n int32, rate float64) limitChange {
	s.long += n
	return s.set(s.target(rate))
}

// endWindow closes the current window at now: it updates the baseline and
// the gradient's cap, and starts the next window.
func (s *limiter) endWindow(now time.Duration, r float64) finding {
	mean, inFlight := s.windowLatency(), float64(s.sumL)/float64(s.n)
	x := float64(s.done) / (now - s.start).Seconds()
	base := s.baseline()
	elevated := base > 0 && mean > base*(1+tolerance)
	fell, rose := x*(1+tolerance) < float64(s.prevX), x > float64(s.prevX)*(1+tolerance)
	grew := inFlight > float64(s.prevL)*(1+tolerance)
	short := r == 0 || x < r*rateShort
	suspect := false
	var f finding
	if s.sinceCut > 0 {
		s.sinceCut++
	}
	switch {
	case !elevated:
		switch {
		case s.cap > 0 && r > 0 && !s.bound:
			s.cap, s.sinceCut = 0, 0
		case s.cap > 0 && s.bound:
			// Back to the estimated capacity at once after a cut (its
			// window has refreshed the baseline), then probe above it.
			s.cap = min(max(s.cap+max(1, s.cap/4), int(s.knee)), s.max)
			s.knee = 0
		}
		s.push(mean)
	case rose:
		// More concurrency is buying throughput: not saturated, and too
		// early to tell more.
		s.push(mean)
	case !fell && short && (s.bound || grew):
		// Slower at a flat completion rate under the rate, with our
		// in-flight count binding or growing: the upstream queues what we
		// add, or the calls just got slower and the limit is catching up.
		// Act on the second such window in a row: back off to under what
		// the upstream served at baseline latency.
		if s.suspect {
			s.knee = int32(inFlight * base / mean)
			s.cap, s.held = max(s.min, int(backoff*inFlight*base/mean)), false
			s.sinceCut = 1
			f = finding{kind: foundQueueing, latency: secs(mean), baseline: secs(base), cap: s.cap}
		}
		suspect = !s.suspect
		s.push(mean)
	default:
		// Slower at a lower completion rate, at the full rate, or with
		// nothing of ours piling up: the calls, not a queue of ours. The
		// window mixes old and new latencies; the next one is the
		// baseline. With a rate, Little's law alone sizes the lane again.
		s.means = [baselineWindows]float64{}
		s.sinceCut = 0
		if r > 0 {
			s.cap = 0
		}
		f = finding{kind: foundSlower, latency: secs(mean), baseline: secs(base)}
	}
	s.prevX, s.prevL, s.suspect = float32(x), float32(inFlight), suspect
	s.start, s.n, s.done, s.sumW, s.sumL, s.bound = now, 0, 0, 0, 0, false
	s.nLong, s.sumShort = 0, 0
	return f
}

// windowLatency returns the current window's mean latency in seconds. The
// samples of attempts counted long are left out while they are a
// minority: they are calls of another kind (the rare call of 30 s among
// calls of 200 ms, a stream held), which long gives slots of their own,
// and a few would raise the mean of a window of quick calls manyfold, read
// as the upstream queueing. When most are long, the calls as a whole got
// slower: they all count.
func (s *limiter) windowLatency() float64 {
	if 2*s.nLong < s.n {
		return s.sumShort / float64(s.n-s.nLong)
	}
	return s.sumW / float64(s.n)
}

func (s *limiter) push(mean float64) {
	s.means[s.next] = mean
	s.next = (s.next + 1) % baselineWindows
}

// baseline returns the no-load latency estimate in seconds, 0 if unknown.
func (s *limiter) baseline() float64 {
	b := 0.0
	for _, m := range s.means {
		if m > 0 && (b == 0 || m < b) {
			b = m
		}
	}
	return b
}

// fill adds the controller's state to a stats snapshot.
func (s *limiter) fill(ls *LaneStats) {
	ls.Latency = secs(s.w)
	ls.Baseline = secs(s.baseline())
	ls.Saturated = s.sinceCut > 0 && s.sinceCut <= baselineWindows
}

func secs(s float64) time.Duration { return time.Duration(math.Round(s * float64(time.Second))) }
