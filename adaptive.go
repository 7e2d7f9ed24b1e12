package sluice

import (
	"context"
	"log/slog"
	"math"
	"net/http"
	"time"
)

// The adaptive in-flight limit.
//
// Sizing. By Little's law a lane paced at λ requests per second whose
// attempts take W seconds has λ·W attempts in flight on average. The limit is
//
//	ceil((λ·W + 3·sqrt(λ·D)) · (1 + littleMargin))
//
// clamped to WithConcurrency's bounds, where W is the smoothed latency and D
// its smoothed mean deviation. λ·W is the mean; a limit that binds before the
// clock wastes tokens (the bucket, of size burst, overflows while requests
// wait for a slot), so the limit must cover the count's peaks too. With
// sends evenly paced, the count at an instant is a sum of one indicator per
// recent send (still running or not), whose variance is at most λ times the
// mean absolute deviation of latency: 3·sqrt(λ·D) is three standard
// deviations of it, zero when latency does not vary, and what dominates
// when λ·W is small. The 10% margin covers the rest (rounding, the time from
// a release to the next grant). With fixed latency the limit is
// ceil(1.1·λ·W): 500/min at 800 ms with 0.8 headroom gives 6. λ is read on
// every update, because feedback from the server moves it at run time.
//
// Latency rising. When calls get slower the slots fill and samples arrive
// late, only as the slow calls finish. But each one moves W an eighth of the
// way (TCP's smoothing, RFC 6298) and D a quarter, and the limit follows
// on every completion; a larger limit lets more calls out, whose
// completions come sooner and move it further. The growth compounds: at
// 50/s, from 40 ms to 400 ms, the rate is back within a second or so.
//
// Saturation. Latency that rises because the calls got slower is answered by
// more concurrency; latency that rises because the upstream queues our own
// requests must be answered by less, or sluice would feed a saturated server
// ever more work (λ·W grows with W, which grows with the queue). The two
// differ in throughput: a queue adds latency at a flat completion rate, the
// server's capacity, below the rate; slower calls lower the completion rate,
// or, once Little's law has re-sized the lane, leave it at the full rate.
// So once per window (at least a second and 16 samples) the controller
// compares the window's mean latency with a no-load baseline and, when it is
// more than 25% above it:
//
//   - completion rate up by a quarter: more concurrency is buying
//     throughput; wait for the next window.
//   - completion rate flat and, with a rate, under 90% of it, and our
//     in-flight count binding (every slot taken while requests wait) or
//     growing: the upstream is queueing what we add. On the second such
//     window in a row (the first may be a lane still catching up with
//     slower calls), the limit is capped at 0.75 × in-flight ×
//     baseline/latency: under what the upstream serves at baseline latency,
//     so that the next window measures the no-load latency again.
//   - otherwise (completion rate down, or the full rate, or nothing of ours
//     piling up): the calls are slower. The baseline is void and the next
//     window measures it afresh; with a rate, any cap is dropped and
//     Little's law alone sizes the lane.
//
// When latency is near the baseline, a cap that binds grows: back to the
// estimated capacity at once after a cut, then by a quarter (at least 1) per
// window; with a rate, a cap that no longer binds is dropped. Against an
// upstream serving K at a time this is a sawtooth around K: just under it
// latency is at baseline, just over it the queue shows. With no rate there
// is no λ·W: the cap alone is the limit, starting at initialUnpaced.
//
// The baseline is the minimum of the last baselineWindows window means. A
// window mean averages at least 16 samples, so one lucky fast response (a
// cached answer, an error page) cannot set it. A saturated lane is brought
// under the upstream's capacity every few windows, so the minimum is
// refreshed at no-load latency and does not drift up with the queue during a
// long incident; it moves up only when the calls themselves got slower, as
// above, or after baselineWindows windows without a lower one.
//
// Above sampleAbove requests a second only one attempt in sampleEvery is
// timed (see lane.timeNext), so "every completion" above means every timed
// one; at such rates that is still over a hundred samples a second.
//
// Refused attempts (429, 503) and transport errors are not samples: they say
// nothing about how long work takes, and fast refusals would shrink the
// limit just when the lane must slow down, which the rate's own feedback
// handles.
const (
	// littleMargin is the share added to λ·W + 3·sqrt(λ·D). 10% keeps the
	// semaphore from binding before the clock at fixed latency, and keeps
	// the limit near λ·W, where it still bounds what is outstanding when
	// latency jumps.
	littleMargin = 0.1
	// devWeight is how many standard deviations of the in-flight count the
	// limit allows for over its mean.
	devWeight = 3
	// latencyGain and devGain are the weights of a new sample in the
	// smoothed latency and deviation: TCP's (RFC 6298), which track a change
	// within about 8 samples without following every outlier.
	latencyGain = 1.0 / 8
	devGain     = 1.0 / 4

	// A window closes at the first sample after windowLength once it holds
	// windowSamples samples: long enough for its mean and its completion rate
	// to mean something, short enough to react within seconds.
	windowLength  = time.Second
	windowSamples = 16
	// baselineWindows is how many window means the baseline is the minimum
	// of: several saturation sawtooth periods, so the minimum always holds a
	// no-load window.
	baselineWindows = 8
	// tolerance is how far latency may exceed the baseline, and throughput
	// move, before the controller takes it for a change rather than noise.
	tolerance = 0.25
	// rateShort: a paced lane completing under 90% of its rate is short of
	// it. Queueing is only suspected then: at the full rate, whatever the
	// latency, the concurrency Little's law asks for is what the rate needs.
	// An upstream whose capacity is within 10% of the rate therefore goes
	// undetected; its queue grows by at most a tenth of the rate per second.
	rateShort = 0.9
	// backoff is how far under the upstream's estimated capacity a cut goes.
	backoff = 0.75
	// initialUnpaced is the first limit of a lane with no rate, clamped to
	// WithConcurrency's bounds. With no rate nothing else bounds the first
	// burst, so it starts small and grows by a quarter per window while the
	// limit binds. A paced lane starts at the maximum: the rate bounds what
	// leaves before the first answer, and a lower start would throttle slow
	// calls below the rate until they return.
	initialUnpaced = 4
)

// controller re-derives a lane's in-flight limit from observed latency; see
// above. The lane calls its methods with its mutex held; they do not block
// and do not allocate.
type controller struct {
	w, dev float64 // smoothed latency and its mean deviation, in seconds

	// The current window; start is zero before the first sample.
	start      time.Time
	n          int     // timed completions (samples)
	done       int     // completions, timed or not: the completion rate
	sumW, sumL float64 // latencies (s), in-flight counts at completion
	bound      bool    // a completion found every slot taken and requests waiting

	means [baselineWindows]float64 // means of recent windows, 0: none
	next  int                      // where the next mean goes in means
	prevX float64                  // completions per second of the previous window
	prevL float64                  // mean in-flight count of the previous window

	cap      int  // cap on the limit from the gradient; 0: none
	suspect  bool // the last window looked like queueing, and did not act on it
	knee     int  // the upstream's capacity in calls, estimated by the last cut
	sinceCut int  // windows since the last cut, from 1; 0: none yet
}

// init is called once, when the lane is created.
func (c *controller) init(l *lane) {
	if !l.pace.paced() {
		c.cap = max(l.cfg.minConc, min(initialUnpaced, l.cfg.maxConc))
		l.slot.limit = c.cap // not yet shared: no lock, nothing to wake or log
	}
}

// onDone is called when an attempt finishes: its response body was read to
// EOF or closed (status is the response's status code), or the base
// transport failed (status 0). latency runs from the send to that moment.
func (c *controller) onDone(l *lane, now time.Time, latency time.Duration, status int) {
	switch status {
	case 0, http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return
	}
	s := max(latency.Seconds(), 0)
	if c.start.IsZero() {
		// RFC 6298's start: the deviation is unknown, assume it large.
		c.w, c.dev, c.start = s, s/2, now
	} else {
		d := s - c.w
		c.w += d * latencyGain
		c.dev += (math.Abs(d) - c.dev) * devGain
	}
	c.n++
	c.done++
	c.sumW += s
	c.sumL += float64(l.slot.inUse) // includes this attempt
	c.checkBound(l)
	if c.n >= windowSamples && now.Sub(c.start) >= windowLength {
		c.endWindow(l, now)
	}
	l.setLimitLocked(c.limit(l))
}

// onUntimed is called instead of onDone when an attempt that was not timed
// finishes (see lane.timeNext): it counts toward the window's completion
// rate and its binding check, which must see every completion, not only
// the sampled ones.
func (c *controller) onUntimed(l *lane, status int) {
	switch status {
	case 0, http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return
	}
	if c.start.IsZero() {
		return // no window yet: it starts at the first sample
	}
	c.done++
	c.checkBound(l)
}

// checkBound records that a completion found every slot taken and requests
// waiting.
func (c *controller) checkBound(l *lane) {
	if l.slot.inUse >= l.slot.limit && l.q.len() > 0 {
		c.bound = true
	}
}

// limit returns the in-flight limit the lane should have now.
func (c *controller) limit(l *lane) int {
	r := l.currentRate()
	if r == 0 {
		if c.cap == 0 { // the rate has gone: hold the limit, then move it by the gradient
			c.cap = l.slot.limit
		}
		return c.cap
	}
	n := l.cfg.maxConc
	if f := math.Ceil((r*c.w + devWeight*math.Sqrt(r*c.dev)) * (1 + littleMargin)); f < float64(n) {
		n = int(f)
	}
	if c.cap > 0 {
		n = min(n, c.cap)
	}
	return n
}

// endWindow closes the current window at now: it updates the baseline and
// the gradient's cap, and starts the next window.
func (c *controller) endWindow(l *lane, now time.Time) {
	n := float64(c.n)
	mean, inFlight := c.sumW/n, c.sumL/n
	x := float64(c.done) / now.Sub(c.start).Seconds()
	base := c.baseline()
	r := l.currentRate()
	elevated := base > 0 && mean > base*(1+tolerance)
	fell, rose := x*(1+tolerance) < c.prevX, x > c.prevX*(1+tolerance)
	grew := inFlight > c.prevL*(1+tolerance)
	short := r == 0 || x < r*rateShort
	suspect := false
	if c.sinceCut > 0 {
		c.sinceCut++
	}
	switch {
	case !elevated:
		switch {
		case c.cap > 0 && r > 0 && !c.bound:
			c.cap, c.sinceCut = 0, 0
		case c.cap > 0 && c.bound:
			// Back to the estimated capacity at once after a cut (its
			// window has refreshed the baseline), then probe above it.
			c.cap = min(max(c.cap+max(1, c.cap/4), c.knee), l.cfg.maxConc)
			c.knee = 0
		}
		c.push(mean)
	case rose:
		// More concurrency is buying throughput: not saturated, and
		// too early to tell more.
		c.push(mean)
	case !fell && short && (c.bound || grew):
		// Slower at a flat completion rate under the rate, with our
		// in-flight count binding or growing: the upstream is queueing
		// what we add. Or the calls just got slower and the limit is
		// still catching up, which the next window shows at the full
		// rate: act on the second such window in a row. Back off to
		// under what the upstream served at baseline latency.
		if c.suspect {
			c.knee = int(inFlight * base / mean)
			c.cap = max(l.cfg.minConc, int(backoff*inFlight*base/mean))
			c.sinceCut = 1
			if l.cfg.logger.Enabled(context.Background(), slog.LevelDebug) {
				l.cfg.logger.Debug("sluice: upstream queueing; limit capped", "lane", l.key,
					"latency", secs(mean), "baseline", secs(base), "cap", c.cap)
			}
		}
		suspect = !c.suspect
		c.push(mean)
	default:
		// Slower at a lower completion rate, at the full rate, or with
		// nothing of ours piling up: the calls, not a queue of ours. The
		// window mixes old and new latencies; the next one is the
		// baseline. With a rate, Little's law alone sizes the lane again.
		c.means = [baselineWindows]float64{}
		c.sinceCut = 0
		if r > 0 {
			c.cap = 0
		}
		if l.cfg.logger.Enabled(context.Background(), slog.LevelDebug) {
			l.cfg.logger.Debug("sluice: calls slower; new baseline", "lane", l.key,
				"latency", secs(mean), "baseline", secs(base))
		}
	}
	c.prevX, c.prevL, c.suspect = x, inFlight, suspect
	c.start, c.n, c.done, c.sumW, c.sumL, c.bound = now, 0, 0, 0, 0, false
}

func (c *controller) push(mean float64) {
	c.means[c.next] = mean
	c.next = (c.next + 1) % baselineWindows
}

// baseline returns the no-load latency estimate in seconds, 0 if unknown.
func (c *controller) baseline() float64 {
	b := 0.0
	for _, m := range c.means {
		if m > 0 && (b == 0 || m < b) {
			b = m
		}
	}
	return b
}

// fill adds the controller's state to a stats snapshot.
func (c *controller) fill(s *LaneStats) {
	s.Latency = secs(c.w)
	s.Baseline = secs(c.baseline())
	s.Saturated = c.sinceCut > 0 && c.sinceCut <= baselineWindows
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
