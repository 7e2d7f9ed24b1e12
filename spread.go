package sluice

import "time"

// spreadLocked passes to the lane's pacer, at a sample at now that the
// limiter took, the pace at which slow start spreads the lane's sends (see
// limiter.spreadRate).
func (l *lane) spreadLocked(now time.Duration) {
	l.pace.SpreadAt(now, l.slot.spreadRate())
}
