package upstream

import (
	"fmt"
	"net/http"
	"sync"
	"time"
)

// GitHubConfig configures a [GitHub] server model.
type GitHubConfig struct {
	// Limit requests are accepted per fixed Window (the primary limit:
	// GitHub's is 5,000 per hour; tests use a window of a second or a
	// few). Windows are aligned to multiples of Window since the Unix
	// epoch, so with a whole number of seconds X-RateLimit-Reset is exact.
	// Both must be positive.
	Limit  int
	Window time.Duration

	// Resource is the X-RateLimit-Resource value; default "core".
	Resource string

	// Status of a refusal, primary or secondary: 403 (the default) or 429.
	// GitHub documents both for both limits.
	Status int

	// Secondary limit. When MaxConcurrent > 0, a request that arrives while
	// MaxConcurrent accepted requests are in service starts a penalty of
	// Penalty (default one minute, GitHub's usual minimum). A penalty can
	// also be started with [GitHub.Trigger].
	MaxConcurrent int
	Penalty       time.Duration
}

// GitHub models GitHub's REST API rate limits.
//
// The primary limit is a fixed window: every response carries
//
//	X-RateLimit-Limit: <Limit>
//	X-RateLimit-Remaining: <requests left in the window>
//	X-RateLimit-Used: <requests accepted in the window>
//	X-RateLimit-Reset: <end of the window, Unix epoch seconds, rounded up>
//	X-RateLimit-Resource: core
//
// and a request beyond the limit gets Status (403 by default) with
// remaining 0 and no Retry-After, as GitHub documents ("you should not
// retry your request until after the time specified by the
// x-ratelimit-reset header").
//
// The secondary limit is a penalty: while it lasts, every request gets
// Status with Retry-After (whole seconds until the penalty ends, rounded
// up) although X-RateLimit-Remaining shows quota left. Requests that arrive
// during a penalty are counted by [GitHub.PenaltyArrivals]. Refused requests consume no quota.
type GitHub struct {
	cfg GitHubConfig

	mu            sync.Mutex
	winIdx        int64
	used          int64
	inFlight      int
	penaltyEnd    time.Time
	penaltyCount  int
	penaltyEvents int
}

// NewGitHub returns a GitHub model. It panics if cfg is invalid.
func NewGitHub(cfg GitHubConfig) *GitHub {
	switch {
	case cfg.Limit <= 0:
		panic(fmt.Sprintf("upstream: GitHub Limit %d, want > 0", cfg.Limit))
	case cfg.Window <= 0:
		panic(fmt.Sprintf("upstream: GitHub Window %v, want > 0", cfg.Window))
	case cfg.Status != 0 && cfg.Status != http.StatusForbidden && cfg.Status != http.StatusTooManyRequests:
		panic(fmt.Sprintf("upstream: GitHub Status %d, want 403 or 429", cfg.Status))
	case cfg.MaxConcurrent < 0 || cfg.Penalty < 0:
		panic("upstream: GitHub MaxConcurrent and Penalty must not be negative")
	}
	if cfg.Resource == "" {
		cfg.Resource = "core"
	}
	if cfg.Status == 0 {
		cfg.Status = http.StatusForbidden
	}
	if cfg.Penalty == 0 {
		cfg.Penalty = time.Minute
	}
	return &GitHub{cfg: cfg, winIdx: -1}
}

// Trigger starts a secondary-limit penalty of d from now (or extends the
// current one to end no earlier than now+d).
func (g *GitHub) Trigger(d time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.startPenaltyLocked(time.Now(), d)
}

func (g *GitHub) startPenaltyLocked(now time.Time, d time.Duration) {
	if !now.Before(g.penaltyEnd) {
		g.penaltyEvents++
	}
	if end := now.Add(d); end.After(g.penaltyEnd) {
		g.penaltyEnd = end
	}
}

// PenaltyArrivals returns how many requests arrived during a secondary
// penalty (from [GitHub.Trigger] on, or after the request whose arrival
// started it, which is not counted). Each was refused.
func (g *GitHub) PenaltyArrivals() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.penaltyCount
}

// Penalties returns how many secondary penalties have started.
func (g *GitHub) Penalties() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.penaltyEvents
}

// Rate returns the published primary limit in requests per second.
func (g *GitHub) Rate() float64 { return float64(g.cfg.Limit) / g.cfg.Window.Seconds() }

// Admit implements [Limiter].
func (g *GitHub) Admit(now time.Time, _ *http.Request) Decision {
	g.mu.Lock()
	defer g.mu.Unlock()

	w := int64(g.cfg.Window)
	idx := now.UnixNano() / w
	if now.UnixNano() < 0 && now.UnixNano()%w != 0 {
		idx-- // floor division for instants before 1970
	}
	if idx != g.winIdx {
		g.winIdx, g.used = idx, 0
	}
	end := time.Unix(0, (idx+1)*w)

	d := Decision{Header: http.Header{}}
	inPenalty := now.Before(g.penaltyEnd)
	switch {
	case inPenalty:
		g.penaltyCount++
		d.Status = g.cfg.Status
		d.Body = githubBody(secondaryMessage, g.cfg.Status)
		d.Header.Set("Retry-After", ceilSecondsStr(g.penaltyEnd.Sub(now)))
	case g.cfg.MaxConcurrent > 0 && g.inFlight >= g.cfg.MaxConcurrent:
		g.startPenaltyLocked(now, g.cfg.Penalty)
		d.Status = g.cfg.Status
		d.Body = githubBody(secondaryMessage, g.cfg.Status)
		d.Header.Set("Retry-After", ceilSecondsStr(g.penaltyEnd.Sub(now)))
	case g.used >= int64(g.cfg.Limit):
		d.Status = g.cfg.Status
		d.Body = githubBody("API rate limit exceeded.", g.cfg.Status)
	default:
		d.Accepted = true
		g.used++
		g.inFlight++
		d.Done = func() {
			g.mu.Lock()
			g.inFlight--
			g.mu.Unlock()
		}
	}

	h := d.Header
	h.Set("X-RateLimit-Limit", itoa(int64(g.cfg.Limit)))
	h.Set("X-RateLimit-Remaining", itoa(int64(g.cfg.Limit)-g.used))
	h.Set("X-RateLimit-Used", itoa(g.used))
	h.Set("X-RateLimit-Reset", itoa(ceilTime(end).Unix()))
	h.Set("X-RateLimit-Resource", g.cfg.Resource)
	return d
}

const secondaryMessage = "You have exceeded a secondary rate limit. Please wait a few minutes before you try again."

// githubBody is the JSON error body GitHub sends with a refusal.
func githubBody(message string, status int) string {
	return fmt.Sprintf(`{"message":%q,"status":"%d"}`, message, status)
}
