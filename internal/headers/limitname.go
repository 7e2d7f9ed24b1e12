package headers

import (
	"net/http"
	"strings"
)

const (
	hdrXRateLimitBucket = "X-Ratelimit-Bucket" // Discord
	hdrXRateLimitGlobal = "X-Ratelimit-Global" // Discord, on a global 429
	hdrXRateLimitScope  = "X-Ratelimit-Scope"  // Discord: "user", "global" or "shared"

	// MaxLimitName bounds the length of a limit's name: a longer one is
	// not a name a server uses for a limit, and is ignored.
	MaxLimitName = 64
)

// LimitName reads which of several limits behind one host a response
// counted against, as the server names it:
//
//   - GitHub's X-RateLimit-Resource ("core", "search", "graphql", ...);
//   - Discord's X-RateLimit-Bucket, an opaque id shared by the routes of
//     one limit.
//
// An IETF policy name is not read as one: servers name their policies
// ("burst", "daily") whatever the route, so a name says which window, not
// which routes.
//
// bucket reports a name from X-RateLimit-Bucket: Discord keeps such a
// limit per bucket and per major parameter of the route (a channel, a
// guild). global reports a refusal the server says is of the whole host:
// Discord's X-RateLimit-Global "true" or X-RateLimit-Scope "global"; a
// global response names no limit. A name longer than MaxLimitName, or with
// bytes outside printable ASCII, is ignored; name is "" if none is read.
func LimitName(h http.Header) (name string, bucket, global bool) {
	if v, ok := field(h, hdrXRateLimitGlobal); ok && strings.EqualFold(v, "true") {
		return "", false, true
	}
	if v, ok := field(h, hdrXRateLimitScope); ok && strings.EqualFold(v, "global") {
		return "", false, true
	}
	if v, ok := field(h, hdrXRateLimitResource); ok && validName(v) {
		return v, false, false
	}
	if v, ok := field(h, hdrXRateLimitBucket); ok && validName(v) {
		return v, true, false
	}
	return "", false, false
}

// validName reports whether s can name a limit: 1 to MaxLimitName bytes of
// printable ASCII.
func validName(s string) bool {
	if s == "" || len(s) > MaxLimitName {
		return false
	}
	for i := range len(s) {
		if c := s[i]; c <= ' ' || c > '~' {
			return false
		}
	}
	return true
}
