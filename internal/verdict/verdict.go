// Package verdict classifies a response for a lane: one pure decision, from
// its status and what its headers say, that every part of the lane takes as
// it is (the pace, the in-flight limit, the counters) instead of each
// deciding from the status what a refusal is.
//
// A Verdict's Kind says what the attempt was to the server:
//
//	Served      it did the work (1xx-4xx that are not refusals): the
//	            answer is accepted and its latency is a sample
//	Errored     it failed at the work (500, 501, 505 and above, but for
//	            the overload statuses): a latency sample, not an acceptance
//	Throttled   it refused the attempt for the client's rate: 429; 403 with
//	            Retry-After or with a quota that says nothing remains
//	            (GitHub's primary and secondary limits)
//	Paused      it asked for a pause: 502, 503, 504 or 529 with
//	            Retry-After
//	Overloaded  it is struggling: 502, 503, 504 or 529 (Anthropic's
//	            overloaded_error) without Retry-After
//	Failed      no response: the base transport failed
//
// A 403 without either sign is an ordinary answer (a missing permission),
// and changes nothing.
package verdict

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"
)

// Kind is what an attempt was to the server; see the package comment. The
// zero value is Served.
type Kind uint8

const (
	Served Kind = iota
	Errored
	Throttled
	Paused
	Overloaded
	Failed
)

// StatusOverloaded is the status Anthropic's API answers when it is
// overloaded ("overloaded_error"); net/http has no name for it.
const StatusOverloaded = 529

// Sample reports whether the attempt's latency is the server's work: a
// sample for the in-flight limit. A refusal or an overload arrives fast
// for want of work, and would teach the limit that the server is quick.
func (k Kind) Sample() bool { return k == Served || k == Errored }

// Accepted reports whether the server took the attempt within its limits:
// what a lane's pace counts as accepted.
func (k Kind) Accepted() bool { return k == Served }

// Refused reports whether the server refused the attempt and asked the
// client to wait: the lane pauses.
func (k Kind) Refused() bool { return k == Throttled || k == Paused }

func (k Kind) String() string {
	switch k {
	case Served:
		return "served"
	case Errored:
		return "errored"
	case Throttled:
		return "throttled"
	case Paused:
		return "paused"
	case Overloaded:
		return "overloaded"
	case Failed:
		return "failed"
	}
	return "Kind(?)"
}

// HeadersDecide reports whether the kind of a response with status depends
// on its headers (see Classify), so that they must be read whatever they
// are named.
func HeadersDecide(status int) bool {
	switch status {
	case http.StatusTooManyRequests, http.StatusForbidden, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout, StatusOverloaded:
		return true
	}
	return false
}

// Of returns the kind of a response with status that carries no rate-limit
// header (status 0: no response).
func Of(status int) Kind { return Classify(status, false, false, Signal{}) }

// Classify returns the kind of a response with status; retryAfter says it
// carries a Retry-After, exhausted that its quota of requests says nothing
// remains, body what its body says (see Body).
func Classify(status int, retryAfter, exhausted bool, body Signal) Kind {
	switch {
	case status == 0:
		return Failed
	case status == http.StatusTooManyRequests, body.Throttles():
		return Throttled
	case status == http.StatusForbidden && (retryAfter || exhausted):
		return Throttled
	case status == http.StatusBadGateway, status == http.StatusServiceUnavailable,
		status == http.StatusGatewayTimeout, status == StatusOverloaded:
		if retryAfter {
			return Paused
		}
		return Overloaded
	case status >= 500:
		return Errored
	}
	return Served
}

// A Signal is what the first bytes of a response's body say of the
// server's limits where its status and headers do not.
type Signal struct {
	// Secondary: GitHub's secondary rate limit ("You have exceeded a
	// secondary rate limit", formerly "an abuse detection mechanism"),
	// which GitHub asks clients to answer by waiting at least a minute,
	// then longer at each repeat.
	Secondary bool
	// GraphQL: a GraphQL error that says the query was throttled for its
	// rate, in a 200 or a 4xx: GitHub's "RATE_LIMITED" error type,
	// Linear's "RATELIMITED" and Shopify's "THROTTLED" codes.
	GraphQL bool
	// Points: the cost of a GraphQL query in points and the state of the
	// bucket it drew on, as Shopify states them in every answer.
	Points Points
}

// Points is what a GraphQL answer's extensions.cost says (Shopify's):
// the query's requested and actual cost, and throttleStatus, a bucket of
// Max points refilling at Restore a second that held Available after the
// query. Requested or Actual is -1 when not stated (a throttled query's
// actual cost is not: it cost nothing); Stated is false when no throttleStatus was read. Every figure is finite,
// within [0, MaxPoints].
type Points struct {
	Requested, Actual       float64
	Max, Available, Restore float64
	Stated                  bool
}

// MaxPoints caps every figure read into Points.
const MaxPoints = 1e9

// Body returns what prefix, the first bytes of a response's body, says.
func Body(prefix []byte) Signal {
	return Signal{
		Secondary: containsFold(prefix, "secondary rate limit") || containsFold(prefix, "abuse detection mechanism"),
		GraphQL:   graphQLThrottled(prefix),
		Points:    points(prefix),
	}
}

// graphQLCodes are the error codes that say a GraphQL query was throttled:
// GitHub's type RATE_LIMITED, Linear's code RATELIMITED, Shopify's code
// THROTTLED.
var graphQLCodes = [...][]byte{[]byte(`"RATE_LIMITED"`), []byte(`"RATELIMITED"`), []byte(`"THROTTLED"`)}

// graphQLThrottled reports whether b, a GraphQL answer's prefix, holds one
// of graphQLCodes as the value of a "type" or "code" key after its
// "errors" key: the same word elsewhere (a value in data, a job's status, a
// label's name) says nothing of the query.
func graphQLThrottled(b []byte) bool {
	e := bytes.Index(b, []byte(`"errors"`))
	if e < 0 {
		return false
	}
	b = b[e:]
	for _, code := range graphQLCodes {
		for rest, off := b, 0; ; {
			i := bytes.Index(rest, code)
			if i < 0 {
				break
			}
			if errorKeyBefore(b[:off+i]) {
				return true
			}
			rest, off = rest[i+len(code):], off+i+len(code)
		}
	}
	return false
}

// errorKeyBefore reports whether b, what precedes a JSON string value, ends
// with the key "type" or "code" and its colon.
func errorKeyBefore(b []byte) bool {
	b = bytes.TrimRight(b, " \t\r\n")
	if len(b) == 0 || b[len(b)-1] != ':' {
		return false
	}
	b = bytes.TrimRight(b[:len(b)-1], " \t\r\n")
	return bytes.HasSuffix(b, []byte(`"type"`)) || bytes.HasSuffix(b, []byte(`"code"`))
}

// points reads Shopify's extensions.cost from a body's prefix: a bounded
// scan for its keys, not a JSON parse (the prefix may end anywhere).
func points(b []byte) Points {
	i := bytes.Index(b, []byte(`"throttleStatus"`))
	if i < 0 {
		return Points{}
	}
	ts := b[i:min(len(b), i+256)] // throttleStatus's object is short
	p := Points{Actual: -1, Requested: -1}
	var ok [3]bool
	p.Max, ok[0] = number(ts, `"maximumAvailable"`)
	p.Available, ok[1] = number(ts, `"currentlyAvailable"`)
	p.Restore, ok[2] = number(ts, `"restoreRate"`)
	if !ok[0] || !ok[1] || !ok[2] || p.Available > p.Max {
		return Points{}
	}
	// The costs come just before throttleStatus.
	cost := b[max(0, i-256):i]
	if v, ok := number(cost, `"requestedQueryCost"`); ok {
		p.Requested = v
	}
	if v, ok := number(cost, `"actualQueryCost"`); ok {
		p.Actual = v
	}
	p.Stated = true
	return p
}

// number returns the number after the JSON key key in b (key, a colon,
// then a number), if there is one, finite and within [0, MaxPoints].
func number(b []byte, key string) (float64, bool) {
	i := bytes.Index(b, []byte(key))
	if i < 0 {
		return 0, false
	}
	b = bytes.TrimLeft(b[i+len(key):], " \t\r\n")
	if len(b) == 0 || b[0] != ':' {
		return 0, false
	}
	b = bytes.TrimLeft(b[1:], " \t\r\n")
	n := 0
	for n < len(b) && n < 24 && strings.IndexByte("0123456789.eE+-", b[n]) >= 0 {
		n++
	}
	v, err := strconv.ParseFloat(string(b[:n]), 64)
	if err != nil || !(v >= 0 && v <= MaxPoints) {
		return 0, false
	}
	return v, true
}

// Throttles reports whether s says the attempt was throttled.
func (s Signal) Throttles() bool { return s.Secondary || s.GraphQL }

// containsFold reports whether s contains sub, with ASCII letters of either
// case; sub is lower case.
func containsFold(s []byte, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		j := 0
		for ; j < len(sub); j++ {
			c := s[i+j]
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			if c != sub[j] {
				break
			}
		}
		if j == len(sub) {
			return true
		}
	}
	return false
}
