package pace

import (
	"math"
	"time"

	"github.com/sluice-go/sluice/internal/headers"
)

// An overlong weighs a refusal's Retry-After against the reset of the
// quota the refusal exhausted. go-chi/httprate answers every refusal with
// a Retry-After of its whole window (a minute, by its documentation's
// set-up), whatever its count, which falls as the window moves, and its
// X-RateLimit-Reset states when the current window ends; throttled and
// redis_rate round a GCRA's wait of milliseconds up to a Retry-After of a
// second. Where the quota says the server takes a request sooner (see
// sooner), the lane waits only until then; the first answer to an attempt
// sent after that says which was meant. An acceptance confirms the quota;
// a refusal of an attempt that went alone (see Pacer.Observe) says the
// server meant its Retry-After (a penalty, or a limit the quota does not
// describe), and every Retry-After after it is honoured in full.
//
// The zero value is not ready: use newOverlong. It holds no lock.
type overlong struct {
	// probe is the end of the last shortened wait not yet answered;
	// longAgo: none; meant: the server refused after one, and its
	// Retry-After is meant. One word: the lane is within a size class of
	// growing (TestLaneHeap in the root package).
	probe time.Duration
}

// meant is overlong.probe once a Retry-After was seen meant.
const meant = time.Duration(math.MaxInt64)

func newOverlong() overlong { return overlong{probe: longAgo} }

// shorten returns how long after now a refusal that states ra pauses the
// lane, where what the lane knows of the server says it takes a request
// again after to: to, if it is shorter and no shortened wait was refused,
// else ra. It records a shortened wait's end.
func (o *overlong) shorten(now, ra, to time.Duration) time.Duration {
	if o.probe == meant || to >= ra {
		return ra
	}
	to = max(to, 0)
	o.probe = max(o.probe, now+to)
	return to
}

// sooner returns when q says the server takes a request again, if that is
// before ra, else ra: at its reset and the reset's grain, where ra outlasts
// that; and, for a Retry-After of one second that the quota, of more than
// one request and not told to be a window's, says is the time to refill
// within a second, one request's share of that time. throttled and
// redis_rate round a GCRA's waits up to the second (Retry-After: 1 and a
// reset of 1 where the next request is a few milliseconds away); a bucket
// full again within its reset refills at least limit per reset. A window
// not yet told, which refills only at its reset, refuses the attempt sent
// then, and the lane honours every Retry-After after.
func sooner(ra time.Duration, q headers.Quota, windowed bool) time.Duration {
	until := ra
	if q.Reset > 0 || q.Passed > 0 {
		at := q.Reset - q.Passed // one of the two is 0
		if q.Coarse {
			// Stated to the second, the true reset may be a second later
			// (a window's end truncated, as httprate's is) or earlier.
			at += time.Second
		}
		if at > 0 {
			until = min(until, at)
		}
	}
	if !windowed && q.Limit > 1 && ra == time.Second && q.Reset > 0 && q.Reset <= ra {
		until = min(until, q.Reset/time.Duration(q.Limit))
	}
	return until
}

// answered takes the answer to an attempt sent at sent: refused (throttled)
// or accepted. The first answer to one sent after a shortened wait ended
// settles what the server meant.
func (o *overlong) answered(sent time.Duration, refused bool) {
	if o.probe == longAgo || o.probe == meant || sent < o.probe {
		return
	}
	o.probe = longAgo
	if refused {
		o.probe = meant
	}
}
