package headers

import (
	"math"
	"net/http"
	"time"
)

// Canonical names of the fields RetryAfter reads; see field.
const (
	hdrRetryAfterMs   = "Retry-After-Ms"
	hdrMSRetryAfterMs = "X-Ms-Retry-After-Ms"
	hdrRetryAfter     = "Retry-After"
	hdrDate           = "Date"
)

// RetryAfter reports how long the server asked the client to wait, from the
// first of these fields in h that holds a usable value:
//
//   - "retry-after-ms": milliseconds, an integer or decimal such as "250" or
//     "12.5";
//   - "x-ms-retry-after-ms": milliseconds, in the same syntax;
//   - "Retry-After": delay-seconds, an integer or decimal such as "120",
//     "2.0" or "1.5"; or an HTTP-date in any of the three forms accepted by
//     [http.ParseTime], or in the layout of [time.RFC1123] for a time in
//     UTC ("Tue, 02 Jan 2024 15:04:05 UTC").
//
// An HTTP-date names a whole second, and the instant the server meant lies
// somewhere in it (servers format a finer time by truncating it), so the
// wait runs to the end of that second. It is measured against the
// response's own Date field when that parses, so that skew between the
// client's and the server's clocks cancels out, and against now otherwise.
//
// Like h.Values, RetryAfter expects h's keys in canonical form, as
// net/http and Header.Add and Header.Set store them. Only the first line
// of each field is read. Numbers must be plain ASCII
// digits with at most one '.' between digits; signs, exponents, hex, "NaN"
// and "Inf" are rejected, as are values longer than 4 KiB.
//
// ok is false when no usable value is present: negative, zero, NaN, Inf,
// empty or malformed values, numbers too long to parse as an int64, and
// dates whose second has ended. A well-formed delay too large for a
// [time.Duration] (such as "99999999999" seconds) is a server asking for a
// very long wait, so it saturates and is capped like any other large value.
// A positive value above max is capped to max;
// max <= 0 means no cap, which lets the server choose a wait of up to
// about 292 years, so callers should pass a positive max. When ok is true,
// d > 0, and d <= max if max > 0.
func RetryAfter(h http.Header, now time.Time, max time.Duration) (d time.Duration, ok bool) {
	if v, ok := field(h, hdrRetryAfterMs); ok {
		if d, ok := parseDelay(v, time.Millisecond); ok && d > 0 {
			return capDelay(d, max), true
		}
	}
	if v, ok := field(h, hdrMSRetryAfterMs); ok {
		if d, ok := parseDelay(v, time.Millisecond); ok && d > 0 {
			return capDelay(d, max), true
		}
	}
	v, ok := field(h, hdrRetryAfter)
	if !ok {
		return 0, false
	}
	if d, ok := parseDelay(v, time.Second); ok {
		if d > 0 {
			return capDelay(d, max), true
		}
		return 0, false
	}
	t, ok := parseDate(v)
	if !ok {
		return 0, false
	}
	d = dateEnd(t).Sub(refTime(h, now))
	// Sub saturates instead of overflowing; a saturated result is as
	// unusable as an overflowing number.
	if d <= 0 || d == math.MaxInt64 {
		return 0, false
	}
	return capDelay(d, max), true
}

func capDelay(d, max time.Duration) time.Duration {
	if max > 0 && d > max {
		return max
	}
	return d
}

// parseDelay parses s, a non-negative integer or decimal count of unit,
// into a Duration, truncating below a nanosecond. It fails on bad syntax;
// a value that does not fit in a Duration saturates to the largest one.
func parseDelay(s string, unit time.Duration) (time.Duration, bool) {
	whole, frac, ok := parseDecimal(s)
	if !ok {
		return 0, false
	}
	if whole > math.MaxInt64/int64(unit) {
		return math.MaxInt64, true
	}
	d := whole * int64(unit)
	f := frac * int64(unit) / 1e9 // frac < 1e9 and unit <= 1e9: no overflow
	if d > math.MaxInt64-f {
		return math.MaxInt64, true
	}
	return time.Duration(d + f), true
}

// refTime is the instant absolute times in a response are measured from:
// now, unless the response's Date field shows the server's clock off ours
// by more than dateSkew beyond Date's whole-second resolution; then Date,
// so that the server's instants are read on its own clock. Date alone
// would make every reset up to a second late: a one-second window's
// reset would read as a whole window.
func refTime(h http.Header, now time.Time) time.Time {
	if v, ok := field(h, hdrDate); ok {
		if t, ok := parseHTTPDate(v); ok {
			if d := now.Sub(t); d < -dateSkew || d >= time.Second+dateSkew {
				return t
			}
		}
	}
	return now
}

// dateSkew is the clock skew, beyond a Date field's resolution, that
// refTime ignores: a response's Date is stamped before its headers cross
// the network.
const dateSkew = time.Second

// dateEnd returns the end of the second t names: a date states an instant
// to the second only, and a server formatting a finer instant truncates
// it, so the end of the second is the first instant sure not to be
// before the one the server meant.
func dateEnd(t time.Time) time.Time { return t.Add(time.Second) }
