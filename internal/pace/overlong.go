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
// X-RateLimit-Reset states when the current window ends. Where a
// Retry-After outlasts the stated reset by more than the reset's grain,
// the lane waits only until the reset and its grain; the first answer to
// an attempt sent after that says which was meant. An acceptance confirms
// the reset; a refusal says the server meant its Retry-After (a penalty,
// or a limit the quota does not describe), and every Retry-After after it
// is honoured in full.
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

// wait returns how long after now a refusal that states ra and the quota q,
// with nothing remaining, pauses the lane: ra, or the time until q's stated
// reset and its grain when that is shorter. It records the shortened wait's
// end.
func (o *overlong) wait(now, ra time.Duration, q headers.Quota) time.Duration {
	if o.probe == meant || q.Reset <= 0 && q.Passed <= 0 {
		return ra
	}
	until := q.Reset - q.Passed // one of the two is 0
	if q.Coarse {
		// Stated to the second, the true reset may be a second later
		// (a window's end truncated, as httprate's is) or earlier.
		until += time.Second
	}
	if until <= 0 || until >= ra {
		return ra
	}
	o.probe = max(o.probe, now+until)
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
