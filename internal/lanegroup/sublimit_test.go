package lanegroup

import (
	"fmt"
	"testing"

	"github.com/sluice-go/sluice"
)

// The label cap (New's max) bounds the series an exporter makes,
// sub-limits' included: a Discord bot that writes to a new channel (a
// bucket per channel: a sub-limit each) now and then makes no more series
// than max allows, past which a lane's sub-limits share one.
func TestSublimitLabelsCapped(t *testing.T) {
	const max = 4
	g := New(nil, max)
	var gs []Group
	for ch := range 1000 {
		sub := lane("discord.com:443", 1, 0, 0)
		sub.Sublimit = fmt.Sprintf("b@%d", 100000+ch)
		gs = groups(g, sluice.Stats{Lanes: []sluice.LaneStats{lane("discord.com:443", 1, 0, 0), sub}})
	}
	if len(gs) > max+1 {
		t.Errorf("%d series after 1,000 channels, each written to once; the cap is %d labels (and %q)", len(gs), max, Other)
	}
}
