package upstream

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// SlidingWindowConfig configures a [SlidingWindow] server model.
type SlidingWindowConfig struct {
	// Limit requests per Window; both must be positive. Windows are
	// aligned as time.Time.Truncate aligns them (to the Unix epoch for any
	// Window that divides a day), then moved later by Offset.
	Limit  int
	Window time.Duration
	// Offset moves every window's start later by this much (not
	// negative), modulo Window. httprate's in-memory counter starts its windows where the
	// limiter was made, Offset after a whole Window: its stated reset, the
	// window's end truncated to the second, then comes before the window
	// ends.
	Offset time.Duration
}

// SlidingWindow models a sliding-window counter, the approximation that
// Cloudflare and nginx-style limiters use: the count of the current fixed
// window plus the previous window's count weighted by the part of it that
// the sliding window still covers,
//
//	estimate = previous·(Window - elapsed)/Window + current
//
// It follows github.com/go-chi/httprate (limiter.go, OnLimit and
// calculateRate, at commit 741b4a5) exactly: the estimate is rounded to
// the nearest integer, a request is refused when estimate+1 > Limit, and
// refused requests are not counted. Every response carries
//
//	X-RateLimit-Limit: <Limit>
//	X-RateLimit-Remaining: <Limit - estimate - 1 if accepted, Limit - estimate if refused>
//	X-RateLimit-Reset: <end of the current fixed window, Unix epoch seconds>
//
// and a refusal is 429 with Retry-After: <Window in whole seconds> (as
// httprate sends it, whatever the actual wait).
type SlidingWindow struct {
	cfg SlidingWindowConfig

	mu     sync.Mutex
	start  time.Time // of the current fixed window
	curr   int
	prev   int
	primed bool
}

// NewSlidingWindow returns a SlidingWindow model. It panics if cfg is
// invalid.
func NewSlidingWindow(cfg SlidingWindowConfig) *SlidingWindow {
	if cfg.Limit <= 0 || cfg.Window <= 0 {
		panic(fmt.Sprintf("upstream: invalid SlidingWindowConfig %+v", cfg))
	}
	return &SlidingWindow{cfg: cfg}
}

// Rate returns the published rate in requests per second.
func (m *SlidingWindow) Rate() float64 { return float64(m.cfg.Limit) / m.cfg.Window.Seconds() }

// Admit implements [Limiter].
func (m *SlidingWindow) Admit(now time.Time, _ *http.Request) Decision {
	m.mu.Lock()
	defer m.mu.Unlock()
	w := m.cfg.Window
	off := m.cfg.Offset % w
	start := now.UTC().Add(-off).Truncate(w).Add(off)
	switch {
	case !m.primed:
		m.start, m.primed = start, true
	case start.Equal(m.start.Add(w)):
		m.start, m.prev, m.curr = start, m.curr, 0
	case !start.Equal(m.start):
		m.start, m.prev, m.curr = start, 0, 0
	}
	elapsed := now.Sub(start)
	est := float64(m.prev)*(float64(w)-float64(elapsed))/float64(w) + float64(m.curr)
	rate := int(math.Round(est))

	d := Decision{Header: http.Header{}}
	h := d.Header
	h.Set("X-RateLimit-Limit", strconv.Itoa(m.cfg.Limit))
	h.Set("X-RateLimit-Reset", itoa(start.Add(w).Unix()))
	if rate+1 > m.cfg.Limit {
		h.Set("X-RateLimit-Remaining", strconv.Itoa(m.cfg.Limit-rate))
		h.Set("Retry-After", strconv.Itoa(int(w.Seconds())))
		return d
	}
	m.curr++
	d.Accepted = true
	h.Set("X-RateLimit-Remaining", strconv.Itoa(m.cfg.Limit-rate-1))
	return d
}
