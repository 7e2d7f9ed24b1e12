// Package headers parses what an HTTP server says about rate limits: how
// long to wait before retrying ([RetryAfter]) and how much of a request
// budget is left ([Parse]).
//
// The input comes from servers that may be buggy or hostile, so every
// function here is total: it never panics, looks at a bounded amount of
// input, and rejects anything outside documented ranges instead of
// guessing.
package headers

import (
	"math/bits"
	"net/http"
	"strings"
	"time"
)

const (
	// maxFieldLen bounds the bytes of one field's value (all its lines
	// joined, for list fields). Longer values are ignored entirely: real
	// rate-limit fields are a few dozen bytes, and parsing a truncated
	// value could yield a wrong number.
	maxFieldLen = 4 << 10

	// maxListMembers bounds the members of a structured-field List or
	// Dictionary (e.g. IETF policies). A field with more is ignored
	// entirely; real servers send one to three policies, and the bound
	// keeps matching RateLimit entries to policies cheap.
	maxListMembers = 32

	// maxCount bounds request counts (Limit, Remaining). Larger values are
	// ignored: no API grants a trillion requests per window, and the bound
	// keeps arithmetic on counts far from overflow.
	maxCount = 1e12

	// maxDuration bounds Reset and Window. Longer values are ignored: no
	// quota window is longer than a year, and a server that says otherwise
	// must not be able to stall a client indefinitely.
	maxDuration = 366 * 24 * time.Hour

	// epochThreshold splits x-ratelimit-reset values into delays and Unix
	// times; see Parse.
	epochThreshold = 1e9
)

// Canonical names of the fields Parse reads. The package indexes
// http.Header directly with these names, which is what h.Values does after
// canonicalising the key, without paying for the canonicalisation.
const (
	hdrRateLimitPolicy    = "Ratelimit-Policy"
	hdrRateLimit          = "Ratelimit"
	hdrRateLimitLimit     = "Ratelimit-Limit"
	hdrRateLimitRemaining = "Ratelimit-Remaining"
	hdrRateLimitReset     = "Ratelimit-Reset"

	hdrXRateLimitLimit      = "X-Ratelimit-Limit"
	hdrXRateLimitRemaining  = "X-Ratelimit-Remaining"
	hdrXRateLimitReset      = "X-Ratelimit-Reset"
	hdrXRateLimitUsed       = "X-Ratelimit-Used"
	hdrXRateLimitResource   = "X-Ratelimit-Resource"
	hdrXRateLimitResetAfter = "X-Ratelimit-Reset-After" // Discord

	hdrTwitterLimit     = "X-Rate-Limit-Limit"
	hdrTwitterRemaining = "X-Rate-Limit-Remaining"
	hdrTwitterReset     = "X-Rate-Limit-Reset"

	hdrOpenAILimit     = "X-Ratelimit-Limit-Requests"
	hdrOpenAIRemaining = "X-Ratelimit-Remaining-Requests"
	hdrOpenAIReset     = "X-Ratelimit-Reset-Requests"

	hdrAnthropicLimit     = "Anthropic-Ratelimit-Requests-Limit"
	hdrAnthropicRemaining = "Anthropic-Ratelimit-Requests-Remaining"
	hdrAnthropicReset     = "Anthropic-Ratelimit-Requests-Reset"
)

// Quota is what a response says about the request budget (requests, not
// tokens or bytes).
type Quota struct {
	Limit     int64         // requests allowed per window; -1 if not stated
	Remaining int64         // requests left in the current window; -1 if not stated
	Reset     time.Duration // time from now until the window resets (Remaining is refilled); 0 if not stated or already past
	Window    time.Duration // the policy's window length (e.g. w=60 in IETF RateLimit-Policy); 0 if not stated
	Source    string        // which family was read: "ietf", "ietf-draft07", "x-ratelimit", "github", "openai", "anthropic"
	Resource  string        // GitHub's x-ratelimit-resource, the IETF policy name, or the token budget's name, if any
	// Coarse reports that Reset was stated to the second only (whole
	// seconds, or an instant in whole seconds): the true reset may be up
	// to a second earlier, as servers round up (a date, which servers
	// truncate, is read as the end of its second for this reason).
	Coarse bool
	// Instant reports that Reset was stated as an instant (a Unix time or
	// a date), not as a delay: a window's end, which the server states the
	// same until it comes.
	Instant bool
	// Passed is, for a reset stated as an instant (Instant) that is
	// already past, how long ago it was, at most a day; 0 otherwise.
	// Reset is 0 then. A server that truncates its window's end to the
	// second states an instant that passes before the window ends, and
	// Passed tells one such instant from the next.
	Passed time.Duration
}

// Parse reads rate-limit fields from h, a response's header received at
// client time now. Like h.Values, it expects h's keys in canonical form,
// as net/http and Header.Add and Header.Set store them, which makes field
// names case-insensitive. It understands these families:
//
//   - "ietf": RateLimit-Policy and RateLimit as in
//     draft-ietf-httpapi-ratelimit-headers-08 to -10, structured-field Lists
//     such as `"burst";q=100;w=60, "daily";q=1000;w=86400` and
//     `"burst";r=50;t=30`, matched by policy name. q is Limit, w is Window
//     in seconds, r is Remaining, t is Reset in seconds. Policies whose qu
//     parameter is not "requests" are skipped.
//   - "ietf-draft07": RateLimit-Limit, RateLimit-Remaining and
//     RateLimit-Reset (integers, Reset in seconds), or RateLimit as a
//     Dictionary `limit=100, remaining=50, reset=30`.
//   - "x-ratelimit": X-RateLimit-Limit, -Remaining and -Reset, or the
//     X-Rate-Limit-* spelling.
//   - "github": the X-RateLimit-* fields with X-RateLimit-Resource, which
//     becomes Resource. If Remaining is absent it is derived from
//     X-RateLimit-Used.
//   - "openai": x-ratelimit-limit-requests, -remaining-requests and
//     -reset-requests, where Reset is a Go duration such as "6m0s" or
//     "20ms". The *-tokens fields are ignored.
//   - "anthropic": anthropic-ratelimit-requests-limit, -remaining and
//     -reset, where Reset is an RFC 3339 timestamp.
//
// An x-ratelimit or x-rate-limit reset value is a number of seconds,
// possibly fractional, or a date. A number of at least 1e9 (2001-09-09 as
// a Unix time) is a Unix time; a smaller one is a delay from now. A date
// is an HTTP-date, or the layout of [time.RFC1123] for a time in UTC
// ("Tue, 02 Jan 2024 15:04:05 UTC"), as middleware that formats its reset
// with that layout sends; it names a whole second, and is read as the end
// of that second, since servers truncate the instant they format. Absolute times (Unix times, dates and RFC 3339
// timestamps) are measured against the response's Date
// field when it parses, so that clock skew between client and server
// cancels out, and against now otherwise. An absolute reset time in the
// past gives Reset 0, meaning the window has already been refilled.
//
// Counts must be integers in [0, 1e12] and durations must lie in
// [0, 366 days]; a field that is malformed or out of range is ignored, and
// a family is ignored only if none of its fields is usable. Fields longer
// than 4 KiB and lists of more than 32 members are ignored. For
// single-valued fields only the first line is read.
//
// When several families or IETF policies parse, Parse returns the most
// restrictive quota:
//
//  1. among quotas with Remaining 0, the one with the longest Reset, since
//     nothing may be sent until it resets (an unknown Reset ranks below
//     any known one, and a known Reset of 0 means the quota has already
//     been refilled, so it does not count here);
//  2. otherwise, among quotas with known Remaining and a positive Reset,
//     the one with the smallest Remaining/Reset ratio, that is the lowest
//     sustainable rate;
//  3. otherwise, the one with the smallest known Remaining.
//
// Ties go to the family listed first above. ok is false if no family
// parses.
func Parse(h http.Header, now time.Time) (q Quota, ok bool) {
	ref := refClock{h: h, now: now}
	return parse(h, &ref, presentFamilies(h))
}

// families is a set of the field families Parse understands, one bit each.
type families uint8

const (
	famIETF       families = 1 << iota // RateLimit-Policy, RateLimit, RateLimit-Limit/-Remaining/-Reset
	famXRateLimit                      // X-RateLimit-*, GitHub's included
	famTwitter                         // X-Rate-Limit-*
	famOpenAI                          // X-RateLimit-*-Requests
	famAnthropic                       // Anthropic-RateLimit-Requests-*

	allFamilies = famIETF | famXRateLimit | famTwitter | famOpenAI | famAnthropic
)

// maxGateKeys is the largest header presentFamilies scans. Ranging over a
// map costs more per key than looking up an absent field costs per field,
// except in a map of at most eight entries, which Go keeps in one group
// that it must search key by key on every lookup. On Go 1.26, skipping the
// absent families saves 60 to 150 ns on a header of up to eight fields and
// nothing from about ten on, where the scan costs as much as the lookups it
// saves; real responses carry more than ten fields. A larger header is
// therefore parsed as though every family were present, which also keeps
// the cost of Parse independent of the header's size.
const maxGateKeys = 8

// presentFamilies returns the families that have at least one of the
// fields parse reads present in h, or allFamilies if h has more than
// maxGateKeys keys. Parse runs on every response, and looking up each of
// its twenty-odd fields costs a hash or a scan of the header per field;
// when the header is small, one pass over its keys costs less and lets
// parse skip every absent family. Only the exact canonical names count,
// since only they are read: a key in any other spelling is ignored here as
// it is everywhere else.
func presentFamilies(h http.Header) families {
	if len(h) > maxGateKeys {
		return allFamilies
	}
	var f families
	for k := range h {
		switch k {
		case hdrRateLimitPolicy, hdrRateLimit, hdrRateLimitLimit, hdrRateLimitRemaining, hdrRateLimitReset:
			f |= famIETF
		case hdrXRateLimitLimit, hdrXRateLimitRemaining, hdrXRateLimitReset, hdrXRateLimitUsed, hdrXRateLimitResource, hdrXRateLimitResetAfter:
			f |= famXRateLimit
		case hdrTwitterLimit, hdrTwitterRemaining, hdrTwitterReset:
			f |= famTwitter
		case hdrOpenAILimit, hdrOpenAIRemaining, hdrOpenAIReset:
			f |= famOpenAI
		case hdrAnthropicLimit, hdrAnthropicRemaining, hdrAnthropicReset:
			f |= famAnthropic
		}
	}
	return f
}

// parse is Parse reading only the families in fams, with ref for the
// response's reference time. A family none of whose fields is present
// yields no candidate, so leaving it out changes nothing.
func parse(h http.Header, ref *refClock, fams families) (q Quota, ok bool) {
	var p picker
	if fams&famIETF != 0 {
		parseIETF(h, &p)
	}
	if fams&famXRateLimit != 0 {
		parseXRateLimit(h, ref, &p, hdrXRateLimitLimit, hdrXRateLimitRemaining, hdrXRateLimitReset, true)
	}
	if fams&famTwitter != 0 {
		parseXRateLimit(h, ref, &p, hdrTwitterLimit, hdrTwitterRemaining, hdrTwitterReset, false)
	}
	if fams&famOpenAI != 0 {
		parseOpenAI(h, &p)
	}
	if fams&famAnthropic != 0 {
		parseAnthropic(h, ref, &p)
	}
	return p.best.Quota, p.ok
}

// refClock finds the reference time of a response (see refTime) the first
// time it is needed. Only absolute times need it, and parsing the Date
// field costs about as much as the rest of Parse on a response with none.
type refClock struct {
	h    http.Header
	now  time.Time
	t    time.Time
	done bool
}

func (r *refClock) get() time.Time {
	if !r.done {
		r.t, r.done = refTime(r.h, r.now), true
	}
	return r.t
}

// candidate is a Quota with the one bit the Quota cannot express: whether
// Reset was stated.
type candidate struct {
	Quota
	resetKnown bool
}

func newCandidate(source string) candidate {
	return candidate{Quota: Quota{Limit: -1, Remaining: -1, Source: source}}
}

// stated reports whether any field of c was usable.
func (c *candidate) stated() bool {
	return c.Limit >= 0 || c.Remaining >= 0 || c.resetKnown || c.Window > 0
}

// picker keeps the most restrictive of the candidates offered to it.
type picker struct {
	best candidate
	ok   bool
}

func (p *picker) offer(c candidate) {
	if !c.stated() {
		return
	}
	if !p.ok || moreRestrictive(c, p.best) {
		p.best, p.ok = c, true
	}
}

// rank classifies a candidate: 0 exhausted (Remaining 0 and not known to
// have reset), 1 known positive rate, 2 everything else.
func rank(c candidate) int {
	switch {
	case c.Remaining == 0 && !(c.resetKnown && c.Reset == 0):
		return 0
	case c.Remaining > 0 && c.resetKnown && c.Reset > 0:
		return 1
	}
	return 2
}

// moreRestrictive reports whether a is strictly more restrictive than b.
func moreRestrictive(a, b candidate) bool {
	ra, rb := rank(a), rank(b)
	if ra != rb {
		return ra < rb
	}
	switch ra {
	case 0:
		return resetKey(a) > resetKey(b)
	case 1:
		// a.Remaining/a.Reset < b.Remaining/b.Reset, cross-multiplied in
		// 128 bits: both factors are positive and the products may
		// exceed 64 bits (1e12 * 366 days in ns is about 3e28).
		ah, al := bits.Mul64(uint64(a.Remaining), uint64(b.Reset))
		bh, bl := bits.Mul64(uint64(b.Remaining), uint64(a.Reset))
		if ah != bh || al != bl {
			return ah < bh || ah == bh && al < bl
		}
		return a.Reset > b.Reset
	}
	if a.Remaining >= 0 && b.Remaining >= 0 {
		return a.Remaining < b.Remaining
	}
	return a.Remaining >= 0 && b.Remaining < 0
}

func resetKey(c candidate) time.Duration {
	if c.resetKnown {
		return c.Reset
	}
	return -1
}

// parseIETF reads the draft-08+ policy lists and the draft-07 fields.
func parseIETF(h http.Header, p *picker) {
	pol, polOK := listField(h, hdrRateLimitPolicy)
	rl, rlOK := listField(h, hdrRateLimit)
	var dict string
	if rlOK && looksLikeDict(rl) {
		dict, rl, rlOK = rl, "", false
	}
	if polOK || rlOK {
		parsePolicies(pol, rl, p)
	}
	parseDraft07(h, dict, p)
}

// parsePolicies reads RateLimit-Policy and RateLimit (drafts 08-10).
func parsePolicies(pol, rl string, p *picker) {
	var polBuf, rlBuf [maxListMembers]sfItem
	pols, ok := parseSFList(pol, polBuf[:0])
	if !ok {
		pols = nil
	}
	rls, ok := parseSFList(rl, rlBuf[:0])
	if !ok {
		rls = nil
	}
	var matched [maxListMembers]bool // rls[i] belongs to some policy
	for i, pol := range pols {
		name, ok := pol.name()
		if !ok || indexName(pols[:i], name) >= 0 {
			continue // unnamed, or a duplicate: the first one wins
		}
		r := indexName(rls, name)
		if r >= 0 {
			matched[r] = true
		}
		if qu, ok := pol.param("qu"); ok {
			if s, _ := qu.name(); s != "requests" {
				continue // a budget of bytes or concurrency, not requests
			}
		}
		c := newCandidate("ietf")
		c.Resource = name
		if v, ok := pol.param("q"); ok {
			c.Limit = sfCount(v)
		}
		if v, ok := pol.param("w"); ok {
			if w, ok := sfSeconds(v); ok && w > 0 {
				c.Window = w
			}
		}
		if r >= 0 {
			setRemainingReset(&c, rls[r])
		}
		p.offer(c)
	}
	for i, rl := range rls {
		name, ok := rl.name()
		if matched[i] || !ok || indexName(rls[:i], name) >= 0 {
			continue
		}
		c := newCandidate("ietf")
		c.Resource = name
		setRemainingReset(&c, rl)
		p.offer(c)
	}
}

// parseDraft07 reads the draft-07 fields, falling back on dict, a RateLimit
// field in Dictionary form, for fields that are absent.
func parseDraft07(h http.Header, dict string, p *picker) {
	c := newCandidate("ietf-draft07")
	if v, ok := listField(h, hdrRateLimitLimit); ok {
		c.Limit, c.Window = draft07Limit(v)
	}
	if v, ok := field(h, hdrRateLimitRemaining); ok {
		c.Remaining = parseCount(v)
	}
	if v, ok := field(h, hdrRateLimitReset); ok {
		c.Reset, c.resetKnown = parseSeconds(v)
		c.Coarse = c.resetKnown
	}
	if dict != "" {
		fillFromDraft07Dict(&c, dict)
	}
	p.offer(c)
}

// fillFromDraft07Dict fills the fields of c that are unknown from dict, a
// RateLimit Dictionary such as "limit=100, remaining=50, reset=30".
func fillFromDraft07Dict(c *candidate, dict string) {
	var buf [maxListMembers]sfItem
	members, ok := parseSFDict(dict, buf[:0])
	if !ok {
		return
	}
	limit, remaining := int64(-1), int64(-1)
	var reset time.Duration
	resetKnown := false
	for _, m := range members { // the last of repeated keys wins
		switch m.key {
		case "limit":
			limit = sfCount(m)
		case "remaining":
			remaining = sfCount(m)
		case "reset":
			reset, resetKnown = sfSeconds(m)
		}
	}
	if c.Limit < 0 {
		c.Limit = limit
	}
	if c.Remaining < 0 {
		c.Remaining = remaining
	}
	if !c.resetKnown {
		c.Reset, c.resetKnown = reset, resetKnown
		c.Coarse = resetKnown
	}
}

// draft07Limit parses a RateLimit-Limit value. Older drafts follow the
// limit with policies, as in "100, 100;w=60"; a plain integer is a
// one-member list. The window is the w parameter of the first policy whose
// quota equals the limit, or 0.
func draft07Limit(v string) (limit int64, window time.Duration) {
	var buf [maxListMembers]sfItem
	items, ok := parseSFList(v, buf[:0])
	if !ok || len(items) == 0 || items[0].kind != sfInteger {
		return -1, 0
	}
	limit = sfCount(items[0])
	if limit < 0 {
		return -1, 0
	}
	for _, it := range items {
		if it.kind != sfInteger || it.num != limit {
			continue
		}
		if v, ok := it.param("w"); ok {
			if w, ok := sfSeconds(v); ok && w > 0 {
				return limit, w
			}
		}
	}
	return limit, 0
}

// setRemainingReset copies the r and t parameters of a RateLimit entry.
func setRemainingReset(c *candidate, rl sfItem) {
	if v, ok := rl.param("r"); ok {
		c.Remaining = sfCount(v)
	}
	if v, ok := rl.param("t"); ok {
		c.Reset, c.resetKnown = sfSeconds(v)
		c.Coarse = c.resetKnown // t is an Integer of seconds
	}
}

// indexName returns the index of the first item named name, or -1.
func indexName(items []sfItem, name string) int {
	for i, it := range items {
		if n, ok := it.name(); ok && n == name {
			return i
		}
	}
	return -1
}

// sfCount returns an Integer item as a count, or -1 if it is not an Integer
// in [0, maxCount].
func sfCount(it sfItem) int64 {
	if it.kind != sfInteger || it.num < 0 || it.num > maxCount {
		return -1
	}
	return it.num
}

// sfSeconds returns an Integer item as a number of seconds in
// [0, maxDuration].
func sfSeconds(it sfItem) (time.Duration, bool) {
	if it.kind != sfInteger || it.num < 0 {
		return 0, false
	}
	return secondsToDuration(it.num, 0)
}

// parseXRateLimit reads one spelling of the X-RateLimit-* family; github
// says whether to look for GitHub's extra fields.
func parseXRateLimit(h http.Header, ref *refClock, p *picker, limitKey, remainingKey, resetKey string, github bool) {
	c := newCandidate("x-ratelimit")
	if v, ok := field(h, limitKey); ok {
		c.Limit = parseCount(v)
	}
	if v, ok := field(h, remainingKey); ok {
		c.Remaining = parseCount(v)
	}
	if v, ok := field(h, resetKey); ok {
		c.Reset, c.Passed, c.Coarse, c.Instant, c.resetKnown = parseReset(v, ref)
	}
	if github {
		// Discord states the delay to its reset too, to the millisecond:
		// an instant measured against a Date field, which has whole
		// seconds, may be a second off.
		if v, ok := field(h, hdrXRateLimitResetAfter); ok {
			if whole, frac, ok := parseDecimal(v); ok {
				if d, ok := secondsToDuration(whole, frac); ok {
					c.Reset, c.Coarse, c.resetKnown, c.Passed = d, false, true, 0
				}
			}
		}
		if v, ok := field(h, hdrXRateLimitResource); ok && v != "" {
			c.Source, c.Resource = "github", v
		}
		if c.Remaining < 0 && c.Limit >= 0 {
			if v, ok := field(h, hdrXRateLimitUsed); ok {
				if used := parseCount(v); used >= 0 && used <= c.Limit {
					c.Remaining = c.Limit - used
				}
			}
		}
	}
	p.offer(c)
}

// parseReset parses an X-RateLimit-Reset value: seconds, possibly
// fractional, that are a Unix time if at least epochThreshold and a delay
// otherwise; or a date (see parseDate). A Unix time or a date is measured
// from ref's time and clamped at 0; passed is how long ago it was when it
// is past, at most maxPassed. coarse reports a value in whole seconds,
// instant a Unix time or a date.
func parseReset(s string, ref *refClock) (d, passed time.Duration, coarse, instant, ok bool) {
	var t time.Time
	whole, frac, ok := parseDecimal(s)
	switch {
	case !ok:
		date, ok := parseDate(s)
		if !ok {
			return 0, 0, false, false, false
		}
		t, coarse = dateEnd(date), true
	case whole < epochThreshold:
		d, ok = secondsToDuration(whole, frac)
		return d, 0, ok && frac == 0, false, ok
	default:
		t, coarse = time.Unix(whole, frac), frac == 0
	}
	now := ref.get()
	if d, ok = untilTime(t, now); ok && d == 0 {
		passed = min(max(now.Sub(t), 0), maxPassed)
	}
	return d, passed, ok && coarse, ok, ok
}

// maxPassed caps Quota.Passed.
const maxPassed = 24 * time.Hour

// untilTime returns t-ref, clamped at 0 if t is in the past, and fails
// (returning 0) if it exceeds maxDuration.
func untilTime(t, ref time.Time) (time.Duration, bool) {
	d := t.Sub(ref) // saturates rather than overflowing
	switch {
	case d < 0:
		return 0, true
	case d > maxDuration:
		return 0, false
	}
	return d, true
}

// parseOpenAI reads OpenAI's request (not token) budget fields.
func parseOpenAI(h http.Header, p *picker) {
	c := newCandidate("openai")
	if v, ok := field(h, hdrOpenAILimit); ok {
		c.Limit = parseCount(v)
	}
	if v, ok := field(h, hdrOpenAIRemaining); ok {
		c.Remaining = parseCount(v)
	}
	if v, ok := field(h, hdrOpenAIReset); ok {
		c.Reset, c.Coarse, c.resetKnown = parseGoDuration(v)
	}
	p.offer(c)
}

// parseGoDuration parses an OpenAI reset value such as "6m0s" or "20ms";
// coarse reports a whole number of seconds.
func parseGoDuration(v string) (d time.Duration, coarse, ok bool) {
	if !validGoDuration(v) {
		return 0, false, false
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 || d > maxDuration {
		return 0, false, false
	}
	return d, d%time.Second == 0, true
}

// validGoDuration reports whether s is "0" or a sequence of unsigned
// decimal numbers each followed by a unit, as in "1h2m3.5s". It is stricter
// than time.ParseDuration, which also accepts signs, ".5s" and "5.s".
func validGoDuration(s string) bool {
	if s == "0" {
		return true
	}
	if s == "" {
		return false
	}
	for s != "" {
		i := 0
		for i < len(s) && isDigit(s[i]) {
			i++
		}
		if i == 0 {
			return false
		}
		if i < len(s) && s[i] == '.' {
			i++
			j := i
			for i < len(s) && isDigit(s[i]) {
				i++
			}
			if i == j {
				return false
			}
		}
		s = s[i:]
		switch {
		case strings.HasPrefix(s, "ns"), strings.HasPrefix(s, "us"), strings.HasPrefix(s, "ms"):
			s = s[2:]
		case strings.HasPrefix(s, "µs"), strings.HasPrefix(s, "μs"): // U+00B5, U+03BC
			s = s[len("µs"):]
		case strings.HasPrefix(s, "s"), strings.HasPrefix(s, "m"), strings.HasPrefix(s, "h"):
			s = s[1:]
		default:
			return false
		}
	}
	return true
}

// parseAnthropic reads Anthropic's request (not token) budget fields.
func parseAnthropic(h http.Header, ref *refClock, p *picker) {
	c := newCandidate("anthropic")
	if v, ok := field(h, hdrAnthropicLimit); ok {
		c.Limit = parseCount(v)
	}
	if v, ok := field(h, hdrAnthropicRemaining); ok {
		c.Remaining = parseCount(v)
	}
	if v, ok := field(h, hdrAnthropicReset); ok {
		c.Reset, c.Coarse, c.resetKnown = parseRFC3339(v, ref)
		c.Instant = c.resetKnown
	}
	p.offer(c)
}

// parseRFC3339 parses an Anthropic reset instant; coarse reports one in
// whole seconds.
func parseRFC3339(v string, ref *refClock) (d time.Duration, coarse, ok bool) {
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return 0, false, false
	}
	d, ok = untilTime(t, ref.get())
	return d, ok && t.Nanosecond() == 0, ok
}

// field returns the first line of the field key (a canonical name), without surrounding
// spaces and tabs. It fails if the field is absent or longer than
// maxFieldLen.
func field(h http.Header, key string) (string, bool) {
	vs := h[key]
	if len(vs) == 0 || len(vs[0]) > maxFieldLen {
		return "", false
	}
	return trimOWS(vs[0]), true
}

// listField returns all lines of the list field key (a canonical name)
// joined with ", ", without surrounding spaces and tabs. It fails if the
// field is absent or the result would be longer than maxFieldLen.
func listField(h http.Header, key string) (string, bool) {
	vs := h[key]
	if len(vs) == 0 {
		return "", false
	}
	n := -2
	for _, v := range vs {
		if n += 2 + len(v); n > maxFieldLen {
			return "", false
		}
	}
	if len(vs) == 1 {
		return trimOWS(vs[0]), true
	}
	return trimOWS(strings.Join(vs, ", ")), true
}

// trimOWS removes leading and trailing spaces and tabs.
func trimOWS(s string) string {
	for s != "" && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for s != "" && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

// parseCount parses s as a count: ASCII digits only, in [0, maxCount]. It
// returns -1 if s is not such a count.
func parseCount(s string) int64 {
	if s == "" || len(s) > 13 { // maxCount has 13 digits
		return -1
	}
	var n int64
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return -1
		}
		n = n*10 + int64(s[i]-'0')
	}
	if n > maxCount {
		return -1
	}
	return n
}

// parseSeconds parses s as a whole number of seconds in [0, maxDuration].
func parseSeconds(s string) (time.Duration, bool) {
	n := parseCount(s)
	if n < 0 {
		return 0, false
	}
	return secondsToDuration(n, 0)
}

// secondsToDuration converts whole seconds plus frac nanoseconds to a
// Duration, failing if the result exceeds maxDuration.
func secondsToDuration(whole, frac int64) (time.Duration, bool) {
	const maxSeconds = int64(maxDuration / time.Second)
	if whole < 0 || whole > maxSeconds || whole == maxSeconds && frac > 0 {
		return 0, false
	}
	return time.Duration(whole)*time.Second + time.Duration(frac), true
}

// parseDecimal parses s as ASCII digits, optionally followed by '.' and
// more digits: no sign, exponent, or surrounding space. It returns the
// integer part and the fraction in nanoseconds (billionths, truncated). The
// integer part may have at most 18 digits, so it always fits in an int64.
func parseDecimal(s string) (whole, frac int64, ok bool) {
	i := 0
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	if i == 0 || i > 18 {
		return 0, 0, false
	}
	for _, c := range []byte(s[:i]) {
		whole = whole*10 + int64(c-'0')
	}
	if i == len(s) {
		return whole, 0, true
	}
	if s[i] != '.' || i+1 == len(s) {
		return 0, 0, false
	}
	scale := int64(1e8)
	for _, c := range []byte(s[i+1:]) {
		if !isDigit(c) {
			return 0, 0, false
		}
		frac += int64(c-'0') * scale
		scale /= 10
	}
	return whole, frac, true
}

// Token budgets' fields: OpenAI's tokens per minute, and Anthropic's three
// (input, output, and the two together).
var tokenFamilies = [...]struct {
	source, resource        string
	limit, remaining, reset string
}{
	{"openai", "tokens", "X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens"},
	{"anthropic", "tokens", "Anthropic-Ratelimit-Tokens-Limit", "Anthropic-Ratelimit-Tokens-Remaining", "Anthropic-Ratelimit-Tokens-Reset"},
	{"anthropic", "input-tokens", "Anthropic-Ratelimit-Input-Tokens-Limit", "Anthropic-Ratelimit-Input-Tokens-Remaining", "Anthropic-Ratelimit-Input-Tokens-Reset"},
	{"anthropic", "output-tokens", "Anthropic-Ratelimit-Output-Tokens-Limit", "Anthropic-Ratelimit-Output-Tokens-Remaining", "Anthropic-Ratelimit-Output-Tokens-Reset"},
}

// ParseTokens reads what h says about token budgets, as Parse does for
// requests: OpenAI's x-ratelimit-{limit,remaining,reset}-tokens (reset a Go
// duration) and Anthropic's anthropic-ratelimit-{tokens,input-tokens,
// output-tokens}-{limit,remaining,reset} (reset an RFC 3339 instant). The
// result's Resource names the budget ("tokens", "input-tokens" or
// "output-tokens"); when several parse, the most restrictive wins, by
// Parse's rules. The same bounds and validation apply.
func ParseTokens(h http.Header, now time.Time) (q Quota, ok bool) {
	return parseTokens(h, now, "")
}

// ParseTokenBudget is ParseTokens reading only the budget named resource.
func ParseTokenBudget(h http.Header, now time.Time, resource string) (q Quota, ok bool) {
	return parseTokens(h, now, resource)
}

// parseTokens reads the token budgets named resource, or all if it is "".
func parseTokens(h http.Header, now time.Time, resource string) (q Quota, ok bool) {
	ref := refClock{h: h, now: now}
	var p picker
	for _, f := range tokenFamilies {
		if resource != "" && f.resource != resource {
			continue
		}
		if len(h[f.limit]) == 0 && len(h[f.remaining]) == 0 && len(h[f.reset]) == 0 {
			continue
		}
		c := newCandidate(f.source)
		c.Resource = f.resource
		if v, ok := field(h, f.limit); ok {
			c.Limit = parseCount(v)
		}
		if v, ok := field(h, f.remaining); ok {
			c.Remaining = parseCount(v)
		}
		if v, ok := field(h, f.reset); ok {
			if f.source == "openai" {
				c.Reset, c.Coarse, c.resetKnown = parseGoDuration(v)
			} else {
				c.Reset, c.Coarse, c.resetKnown = parseRFC3339(v, &ref)
				c.Instant = c.resetKnown
			}
		}
		p.offer(c)
	}
	return p.best.Quota, p.ok
}
