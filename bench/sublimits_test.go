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
//
// The GitHub crawler calls a new repository each call, a route sluice has
// not filed yet, which it sends under the limit most of the host's routes
// are filed under (core): it takes at least 0.85 of the best peer's rate
// (the two peers are one there: a single limit, the host's) and refuses
// at most 5 more in the measured half. Were each first call sent past an
// exhausted core, sluice with its defaults would send thousands.
func TestSublimitsBesidePeers(t *testing.T) {
	if testing.Short() {
		t.Skip("about 48 s on the real clock")
	}
	const d = 6 * time.Second
	rows := runSublimits(d, "x/time/rate per limit")
	byHand := map[string]SubRow{}
	best := map[string]SubRow{}
	for _, r := range rows {
		if r.Client == "sluice" {
			continue
		}
		k := r.Scenario + "/" + r.Group
		if r.Client == "x/time/rate per limit, by hand" {
			byHand[k] = r
		}
		if b, ok := best[k]; !ok || r.Rate > b.Rate {
			best[k] = r
		}
	}
	for _, r := range rows {
		if r.Client != "sluice" {
			continue
		}
		k := r.Scenario + "/" + r.Group
		h := byHand[k]
		t.Logf("%s / %s: sluice %.2f of its limit, %d refused; by hand %.2f, %d refused",
			r.Scenario, r.Group, r.Share, r.Refused, h.Share, h.Refused)
		if r.Scenario == crawlerScenario {
			b := best[k]
			if r.Rate < 0.85*b.Rate || r.Refused > h.Refused+5 {
				t.Errorf("%s / %s: sluice %.2f/s with %d refused; best peer (%s) %.2f/s, by hand %d refused",
					r.Scenario, r.Group, r.Rate, r.Refused, b.Client, b.Rate, h.Refused)
			}
			continue
		}
		slack := 0.1 + 1.5/(r.Rate/r.Share*(d/2).Seconds())
		if r.Share < h.Share-slack || r.Refused > h.Refused+3 {
			t.Errorf("%s / %s: sluice %.2f of its limit with %d refused, by hand %.2f with %d",
				r.Scenario, r.Group, r.Share, r.Refused, h.Share, h.Refused)
		}
	}
}
