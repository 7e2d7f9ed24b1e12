package main

import (
	"testing"
	"time"
)

// Hosts with several limits, on loopback: sluice, learning the limits from
// the headers (or told a model's name), serves each group as x/time/rate +
// semaphore does with one limiter per limit set by hand to its rate, run
// beside it, within a tenth for a loaded runner (and a request and a half
// of a slow limit's, whose windows the half run cuts), and refuses no
// more.
func TestSublimitsBesidePeers(t *testing.T) {
	if testing.Short() {
		t.Skip("about 36 s on the real clock")
	}
	const d = 6 * time.Second
	rows := runSublimits(d, "x/time/rate per limit")
	byHand := map[string]SubRow{}
	for _, r := range rows {
		if r.Client != "sluice" {
			byHand[r.Scenario+"/"+r.Group] = r
		}
	}
	for _, r := range rows {
		if r.Client != "sluice" {
			continue
		}
		h := byHand[r.Scenario+"/"+r.Group]
		t.Logf("%s / %s: sluice %.2f of its limit, %d refused; by hand %.2f, %d refused",
			r.Scenario, r.Group, r.Share, r.Refused, h.Share, h.Refused)
		slack := 0.1 + 1.5/(r.Rate/r.Share*(d/2).Seconds())
		if r.Share < h.Share-slack || r.Refused > h.Refused+3 {
			t.Errorf("%s / %s: sluice %.2f of its limit with %d refused, by hand %.2f with %d",
				r.Scenario, r.Group, r.Share, r.Refused, h.Share, h.Refused)
		}
	}
}
