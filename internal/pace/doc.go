// Package pace is the pace a server allows a lane, learned from its
// responses: the lane's token bucket and the rate it keeps, the throttle
// rate learned from refusals, the kind of limit the quota headers describe
// and the refill rate counted from them, the end of a fixed window, and the
// cooldowns a server names.
//
// Its values are pure: they hold no lock and start no goroutine, and their
// times are readings of the caller's clock, as a time.Duration since an
// epoch the caller picks. The lane that owns a Pacer locks around every
// call and acts on what the calls return: a Change, a CoolChange, a wait.
// Inside the package each part (the bucket, the feedback from refusals, the
// quota model, the window edge) owns its state, and the others reach it
// through its methods.
//
// The model's tuning constants are in tuning.go, each with the reason for
// it; the measurements behind them are in docs/design.md.
package pace

// Why a lane's rate moved, as a Change's Cause and Pacer.Settle report it.
// The values are those of the root package's RateCut, RateHeader and
// RateRecovery, which the lane passes on to Observers as they are.
const (
	CauseCut      = "429"      // a refusal cut the rate
	CauseHeader   = "header"   // what the rate-limit headers say
	CauseRecovery = "recovery" // accepted responses let the rate climb back
)
