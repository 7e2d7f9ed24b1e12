package sluice

import (
	"net/http"

	"github.com/sluice-go/sluice/internal/verdict"
)

// limitHeaderPrefixes are the canonical header-name prefixes of every field
// headers.Parse and headers.RetryAfter read.
var limitHeaderPrefixes = []string{"Ratelimit", "X-Ratelimit", "X-Rate-Limit", "Anthropic-Ratelimit", "Retry-After", "X-Ms-Retry-After"}

// limitHeader reports whether h has a field of a rate-limit family.
func limitHeader(h http.Header) bool {
	for k := range h {
		if k == "" || k[0] != 'R' && k[0] != 'X' && k[0] != 'A' {
			continue // no prefix below starts otherwise
		}
		for _, p := range limitHeaderPrefixes {
			if len(k) >= len(p) && k[:len(p)] == p {
				return true
			}
		}
	}
	return false
}

const (
	// A lane whose last quietAfter responses had no rate-limit header
	// looks for one in only one response in quietEvery (a map's range
	// costs about as much as the rest of a request that waits for
	// nothing); a refusal's status is always read, and the first header
	// seen makes it look at every response again. A server that states
	// its limits states them on every response.
	quietAfter = 64
	quietEvery = 16
)

// reads reports whether resp may say something about rate limits: a
// status whose verdict its headers decide (see verdict.Classify), or a
// header that might. Most responses say nothing, and this lets them skip
// parsing and the lane's lock. While l's server sends no such header, it
// looks at the headers of only the responses whose grant said look (see
// lookLocked).
func (l *lane) reads(resp *http.Response, look bool) bool {
	if verdict.HeadersDecide(resp.StatusCode) {
		return true
	}
	if !look {
		return false
	}
	n := l.quiet.Load()
	if limitHeader(resp.Header) {
		if n != 0 {
			l.quiet.Store(0)
		}
		return true
	}
	if n < quietAfter {
		l.quiet.Add(1)
	}
	return false
}

// speaks reports whether resp's status or body may say something of
// limits whatever its headers (see verdict.HeadersDecide and looksAt).
// A response that does not, to a grant that draws on no budget and does
// not look at headers (see lookLocked), is one read finds says nothing:
// most responses.
func speaks(resp *http.Response) bool {
	return verdict.HeadersDecide(resp.StatusCode) || looksAt(resp)
}

// lookLocked reports whether the response to a grant of level p, counted
// already, is to be looked at for rate-limit headers (see quietAfter). The
// choice is made under the lock, where the grants are counted, so that a
// quiet lane's responses write no shared counter.
func (l *lane) lookLocked(p Priority) bool {
	return l.quiet.Load() < quietAfter || l.levels[p].granted%quietEvery == 0
}
