package sluice

import (
	"math"
	"net/http"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluice-go/sluice/internal/headers"
	"github.com/sluice-go/sluice/internal/stats"
)

// What the server says sets a lane's pace. Three sources bound the rate;
// the lane paces to the smallest that applies:
//
//   - the configured rate (WithRate x headroom), the ceiling;
//   - the throttle rate, learned from 429s (AIMD, below);
//   - the header rate: remaining / time-to-reset from rate-limit headers,
//     valid until that reset.
//
// Retry-After, and a rate-limit header saying nothing remains, set the
// lane's cooldown instead: nothing of any priority is sent before it ends.
//
// The throttle rate. A 429 means the lane sent faster than the server
// accepts. The rate it failed at, r_f, is the share of the current pace the
// server accepted over the last acceptWindow (pace x accepted / answered:
// this is how a configured rate of 2R learns R from its first 429s), or,
// for a lane not yet paced, the rate at which the server accepted its
// requests over that window (how a lane with no configured rate learns
// one). The rate drops to
// throttleCut x r_f, then:
//
//  1. climbs back linearly to throttlePlateau x r_f within throttleRamp,
//     a few seconds, because most of the loss is behind it;
//  2. creeps from there to r_f at throttleCreep of the ceiling per second,
//     a minute for the last 3%, so that a lane paced just under a strict
//     limit stays there instead of probing into a 429 (and a cooldown) every
//     few seconds;
//  3. beyond r_f grows by throttleProbe per second, multiplicatively, so a
//     lane that was driven low by an outage recovers within a minute or so,
//     not hours; at the ceiling the throttle rate is dropped.
//
// A 429 for an attempt sent before the last cut is not a new signal (it was
// already on its way) and does not cut again. The rate never drops below
// the floor, throttleFloor of the highest rate known for the lane, so a run
// of 429s cannot stop a lane.
const (
	throttleCut      = 0.8
	throttleCutKnown = 0.9
	ratioSamples     = 20
	// minAcceptedSample is the fewest accepted responses an acceptance
	// rate is computed from.
	minAcceptedSample = 4
	throttlePlateau   = 0.98
	throttleRamp      = 2 * time.Second
	throttleCreep     = 60 * time.Second
	throttleProbe     = 0.05
	throttleFloor     = 0.05
	minRate           = 0.01 // per second: one request per 100 s, whatever is known

	acceptWindow = 2 * time.Second
)

type feedback struct {
	ceiling float64 // configured rate after headroom; 0 if none

	throttle float64   // AIMD rate; 0 while no 429 applies
	fail     float64   // r_f of the last cut
	cutTo    float64   // the rate the last cut set
	failAt   time.Time // when the last cut was made
	grown    time.Time // when throttle was last grown
	peak     float64   // highest rate known: ceiling, or accepted rate seen

	coolFrom, coolTo time.Time // the latest cooldown

	header      float64 // rate from rate-limit headers; 0 if none
	headerUntil time.Time

	accepted  stats.Window // accepted responses over acceptWindow
	refused   stats.Window // throttled responses over acceptWindow
	firstSeen time.Time

	throttled, cooldowns uint64
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

func (f *feedback) countAccepted(now time.Time) {
	if f.firstSeen.IsZero() {
		f.firstSeen = now
	}
	f.accepted.Add(now, 1)
}

// floor is the lowest throttle rate.
func (f *feedback) floor() float64 {
	return max(minRate, throttleFloor*f.peak)
}

// cut lowers the throttle rate after a 429 for an attempt sent at sent.
func (f *feedback) cut(now, sent time.Time, current float64) {
	if !f.failAt.IsZero() && sent.Before(f.failAt) {
		return // sent before the last cut: not news
	}
	rf, cut := current, throttleCut
	if acc, thr := f.accepted.Sum(now), f.refused.Sum(now); current > 0 && acc+thr >= ratioSamples {
		// Enough answers to tell what share of the pace the server takes.
		rf, cut = current*float64(acc)/float64(acc+thr), throttleCutKnown
	} else if current == 0 {
		// Not paced yet: the rate the server took while the lane was
		// sending is the first estimate of its limit.
		rf = f.acceptedRate(now)
	}
	if rf <= 0 {
		if current == 0 {
			return // nothing known to cut from: the cooldown alone applies
		}
		rf = f.floor()
	}
	f.peak = max(f.peak, rf)
	f.fail, f.failAt, f.grown = rf, now, now
	f.throttle = max(f.floor(), cut*rf)
	f.cutTo = f.throttle
}

// grow advances the throttle rate's recovery to now.
func (f *feedback) grow(now time.Time) {
	if f.throttle == 0 {
		return
	}
	dt := now.Sub(f.grown).Seconds()
	f.grown = now
	if dt <= 0 {
		return
	}
	plateau := throttlePlateau * f.fail
	switch {
	case f.throttle < plateau:
		step := (plateau - f.cutTo) / throttleRamp.Seconds()
		f.throttle = min(plateau, f.throttle+step*dt)
	case f.throttle < f.fail:
		f.throttle = min(f.fail, f.throttle+(1-throttlePlateau)*f.fail/throttleCreep.Seconds()*dt)
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
// true; the parsing happens before the lane's lock is taken.
func (l *lane) observe(resp *http.Response, sent time.Time) {
	h := resp.Header
	q, hasQuota := headers.Parse(h, time.Now())
	ra, hasRA := headers.RetryAfter(h, time.Now(), l.cfg.maxRetryAfter)
	throttled := resp.StatusCode == http.StatusTooManyRequests ||
		// GitHub answers its rate limits with 403 and remaining 0.
		(resp.StatusCode == http.StatusForbidden && hasQuota && q.Remaining == 0)
	preciseQuota := hasQuota && q.Remaining >= 0 && q.Reset > 0
	// A 429 that the quota explains (nothing remains) is paced by the reset;
	// any other 429 means the lane is over some limit the headers do not
	// describe, and the throttle rate must learn it.
	exhausted := hasQuota && q.Remaining == 0

	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	f := &l.fb
	if throttled {
		f.throttled++
		f.refused.Add(now, 1)
	}
	// Retry-After wins over everything.
	if hasRA && (throttled || resp.StatusCode == http.StatusServiceUnavailable) {
		l.coolLocked(now.Add(ra), "retry-after")
		if throttled && !exhausted {
			f.cut(now, sent, l.currentRate())
		}
		l.applyRate(now)
		return
	}
	switch {
	case hasQuota && q.Remaining == 0 && q.Reset > 0:
		l.coolLocked(now.Add(min(q.Reset, l.cfg.maxRetryAfter)), "remaining 0")
	case preciseQuota:
		// What remains must last until the reset. Attempts in flight other
		// than this one may not be counted by the server yet: count them as
		// used.
		left := q.Remaining - int64(l.slot.inUse-1)
		if left <= 0 {
			l.coolLocked(now.Add(min(q.Reset, l.cfg.maxRetryAfter)), "in-flight attempts use what remains")
		} else {
			// Servers round the reset up to whole seconds; spreading what
			// remains over half a second less is still within the quota
			// (it is what remains) and does not leave it unused.
			spread := max(q.Reset-time.Second/2, q.Reset/2)
			f.header, f.headerUntil = float64(left)/spread.Seconds(), now.Add(q.Reset)
		}
	case hasQuota && q.Remaining < 0 && q.Limit > 0 && q.Window > 0:
		f.header, f.headerUntil = float64(q.Limit)/q.Window.Seconds(), now.Add(q.Window)
	}
	if throttled && !exhausted {
		f.cut(now, sent, l.currentRate())
	}
	l.applyRate(now)
}

// settle is called, with mu held, when an attempt finishes with status (0:
// the base transport failed): an accepted request feeds the acceptance rate
// and the throttle rate's recovery.
func (l *lane) settle(now time.Time, status int) {
	if status == 0 || status == http.StatusTooManyRequests || status >= 500 {
		return
	}
	f := &l.fb
	f.countAccepted(now)
	if f.throttle > 0 || f.header > 0 {
		f.peak = max(f.peak, f.acceptedRate(now))
		f.grow(now)
		l.applyRate(now)
	}
}

// currentRate returns the lane's pace now, 0 if not paced. mu must be held.
func (l *lane) currentRate() float64 {
	if l.lim == nil {
		return 0
	}
	// One read: each takes the limiter's own lock, and this is on the path
	// of every response.
	r := l.lim.Limit()
	if r == rate.Inf {
		return 0
	}
	return float64(r)
}

// coolLocked extends the lane's cooldown to until. mu must be held.
func (l *lane) coolLocked(until time.Time, why string) {
	if !until.After(l.cooldown) {
		return
	}
	if !l.cooldown.After(l.last) { // a new cooldown, not an extension
		l.fb.cooldowns++
		l.cfg.logger.Info("sluice: lane cooling down", "lane", l.key, "for", until.Sub(l.last).Round(time.Millisecond), "why", why)
		l.fb.coolFrom = l.last
	}
	l.fb.coolTo = until
	l.cooldown = until
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
		l.lim = rate.NewLimiter(rate.Limit(r), l.cfg.burst)
		// A new limiter starts full; what the lane just sent used it.
		l.lim.AllowN(now, l.cfg.burst)
		return
	}
	lim := rate.Limit(r)
	if r == 0 {
		lim = rate.Inf
	}
	old := l.lim.Limit()
	if old == lim || (old != rate.Inf && lim != rate.Inf && math.Abs(float64(lim-old)) < 1e-4*float64(old)) {
		return
	}
	l.lim.SetLimitAt(now, lim)
	if lim > old && l.q.len() > 0 {
		l.wake()
	}
}
