package pace

import (
	"math"
	"time"
)

// SpreadAt sets the pace at which the sends of a lane with no rate are
// spread at now: r (the lane's slow start decides it), +Inf for none for
// now, 0 for none again. What goes at once is what r makes in
// spreadGrain, at least two sends.
func (p *Pacer) SpreadAt(now time.Duration, r float64) {
	switch {
	case r == 0:
		p.spread = nil
	case p.spread == nil && math.IsInf(r, 1):
	case p.spread == nil:
		b := max(2, r*spreadGrain.Seconds())
		s := fullAt(r, b, now)
		p.spread = &s
	default:
		p.spread.setRate(now, r)
		if !math.IsInf(r, 1) {
			p.spread.setBurst(max(2, r*spreadGrain.Seconds()))
		}
	}
}
