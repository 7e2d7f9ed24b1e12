package pace

import (
	"math"
	"time"
)

// spreadGrain is how much of its pace slow start's spreading lets out at
// once: what the pace makes in two timer grains, and at least two sends.
// A dispatcher whose timer fires a grain late (a Go timer on Linux may) then loses
// none of its pace, and where a round trip lasts two grains or less, the
// bucket holds a whole round's sends: spreading changes nothing.
const spreadGrain = 2 * time.Millisecond

// SpreadAt sets the pace at which the sends of a lane with no rate are
// spread at now: r (the lane's slow start decides it), +Inf for none for now, 0 for
// none again.
func (p *Pacer) SpreadAt(now time.Duration, r float64) {
	switch {
	case r == 0:
		p.spread = nil
	case p.spread == nil && math.IsInf(r, 1):
	case p.spread == nil:
		b := max(2, r*spreadGrain.Seconds())
		p.spread = &bucket{rate: r, burst: b, tokens: b, last: now}
	default:
		p.spread.setRate(now, r)
		if !math.IsInf(r, 1) {
			p.spread.burst = max(2, r*spreadGrain.Seconds())
		}
	}
}
