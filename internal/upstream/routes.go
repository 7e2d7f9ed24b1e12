package upstream

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Routes is a [Limiter] of several limits behind one host: Route names the
// limit each request counts against, Limits holds one Limiter per name, and
// Global, if set, is a limit of the whole host that a request must pass
// first. A request whose name has no Limiter is accepted. Routes serves
// GitHub's resources (one [GitHub] per resource), Discord's buckets (see
// [NewDiscordBucket] and [NewDiscordGlobal]) and per-model LLM limits.
type Routes struct {
	Route  func(*http.Request) string
	Limits map[string]Limiter
	Global Limiter
}

// Admit implements [Limiter].
func (rs *Routes) Admit(now time.Time, r *http.Request) Decision {
	if rs.Global != nil {
		if d := rs.Global.Admit(now, r); !d.Accepted {
			return d
		}
	}
	if l := rs.Limits[rs.Route(r)]; l != nil {
		return l.Admit(now, r)
	}
	return Decision{Accepted: true}
}

// NewGitHubResources returns GitHub's core and search limits on one host,
// told apart only by X-RateLimit-Resource: paths under /search/ count
// against search (search requests per window), every other path against
// core (core per window).
func NewGitHubResources(core, search int, window time.Duration) *Routes {
	return &Routes{
		Route: func(r *http.Request) string {
			if strings.HasPrefix(r.URL.Path, "/search/") {
				return "search"
			}
			return "core"
		},
		Limits: map[string]Limiter{
			"core":   NewGitHub(GitHubConfig{Limit: core, Window: window}),
			"search": NewGitHub(GitHubConfig{Limit: search, Window: window, Resource: "search"}),
		},
	}
}

// DiscordBucket models one of Discord's per-route buckets: Limit requests
// per Per, in a window that starts at the first request after the last
// one ended. Every response carries
//
//	X-RateLimit-Limit, X-RateLimit-Remaining
//	X-RateLimit-Reset: <end of the window, Unix seconds with milliseconds>
//	X-RateLimit-Reset-After: <seconds until then, with milliseconds>
//	X-RateLimit-Bucket: <Name>
//
// and a refusal is a 429 with Retry-After (seconds, rounded up),
// X-RateLimit-Scope "user" and a JSON body, as Discord sends.
type DiscordBucket struct {
	name  string
	limit int
	per   time.Duration

	mu    sync.Mutex
	end   time.Time
	used  int
	count int // refusals
}

// NewDiscordBucket returns a bucket. It panics if limit or per is not
// positive.
func NewDiscordBucket(name string, limit int, per time.Duration) *DiscordBucket {
	if limit <= 0 || per <= 0 {
		panic(fmt.Sprintf("upstream: Discord bucket %d per %v", limit, per))
	}
	return &DiscordBucket{name: name, limit: limit, per: per}
}

// Rate returns the bucket's rate in requests per second.
func (b *DiscordBucket) Rate() float64 { return float64(b.limit) / b.per.Seconds() }

// Refused returns how many requests the bucket refused.
func (b *DiscordBucket) Refused() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.count
}

// Admit implements [Limiter].
func (b *DiscordBucket) Admit(now time.Time, _ *http.Request) Decision {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !now.Before(b.end) {
		b.end, b.used = now.Add(b.per), 0
	}
	d := Decision{Header: http.Header{}}
	if b.used < b.limit {
		b.used++
		d.Accepted = true
	} else {
		b.count++
		d.Body = `{"message": "You are being rate limited.", "retry_after": ` +
			strconv.FormatFloat(b.end.Sub(now).Seconds(), 'f', 3, 64) + `, "global": false}`
		d.Header.Set("Retry-After", ceilSecondsStr(b.end.Sub(now)))
		d.Header.Set("X-RateLimit-Scope", "user")
	}
	h := d.Header
	h.Set("X-RateLimit-Limit", itoa(int64(b.limit)))
	h.Set("X-RateLimit-Remaining", itoa(int64(b.limit-b.used)))
	h.Set("X-RateLimit-Reset", strconv.FormatFloat(float64(b.end.UnixMilli())/1000, 'f', 3, 64))
	h.Set("X-RateLimit-Reset-After", strconv.FormatFloat(b.end.Sub(now).Seconds(), 'f', 3, 64))
	h.Set("X-RateLimit-Bucket", b.name)
	return d
}

// DiscordGlobal models Discord's global limit: a token bucket of Rate
// requests a second with a burst of Rate, whose refusal is a 429 with
// X-RateLimit-Global "true", X-RateLimit-Scope "global" and Retry-After.
// Accepted requests carry no header of it.
type DiscordGlobal struct {
	mu sync.Mutex
	b  bucket
}

// NewDiscordGlobal returns a global limit of rate requests a second.
func NewDiscordGlobal(rate int) *DiscordGlobal {
	return &DiscordGlobal{b: newBucket(int64(rate), time.Second)}
}

// Admit implements [Limiter].
func (g *DiscordGlobal) Admit(now time.Time, _ *http.Request) Decision {
	g.mu.Lock()
	defer g.mu.Unlock()
	d := g.b.admit(now)
	if !d.Accepted {
		d.Body = `{"message": "You are being rate limited.", "global": true}`
		d.Header.Set("X-RateLimit-Global", "true")
		d.Header.Set("X-RateLimit-Scope", "global")
	}
	return d
}
