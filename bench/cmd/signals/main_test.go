package main

import (
	"sync"
	"testing"
)

// TestQuietColdStartBesidePair runs quiet429's cold start on real
// loopback, sluice with no WithRate beside x/time/rate at 50/s + 32 slots,
// both at once, each against a server of its own. The server's calls of
// 400 ms end together, so each round of slow start would leave at once
// but for its spreading. The aim is 0.90 of R in each 6 s phase with at
// most 1% of attempts refused (the pair serves 1.00 with none); the
// bounds are ratios to the pair in the same run, with slack for a loaded
// runner: in each phase sluice serves at least 0.88 of what the pair
// serves, and it refuses at most 2 points of its attempts more than the
// pair does.
func TestQuietColdStartBesidePair(t *testing.T) {
	if testing.Short() {
		t.Skip("real-clock runs")
	}
	cs := []client{sluiceClient("sluice, no WithRate"), pairClient(50, 32)}
	res := make([]quietResult, len(cs))
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Go(func() { res[i] = runQuiet429(c) })
	}
	wg.Wait()
	s, x := res[0], res[1]
	t.Logf("sluice, no WithRate: %v; %s: %v", s, cs[1].name, x)
	if x.ok[0] == 0 || x.ok[1] == 0 {
		t.Fatalf("the pair served nothing in a phase: %+v", x)
	}
	for i, name := range []string{"400 ms", "40 ms"} {
		if s.share(i) < 0.88*x.share(i) {
			t.Errorf("phase %d (%s): sluice served %.2f of R, the pair %.2f; want at least 0.88 of the pair's",
				i+1, name, s.share(i), x.share(i))
		}
	}
	if s.refusedShare() > x.refusedShare()+0.02 {
		t.Errorf("sluice refused %.1f%% of its attempts, the pair %.1f%%; want at most 2 points more",
			100*s.refusedShare(), 100*x.refusedShare())
	}
}
