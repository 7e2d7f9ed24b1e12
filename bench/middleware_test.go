package main

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestRealMiddlewareBesidePeers guards sluice against the real middleware
// with a window of a second, at each of realRates, on real loopback:
// every sluice client (at R, with no WithRate, at 2R) beside x/time/rate
// + 16 slots at R, one run after another in the same test (runs in
// parallel would share the two cores and distort each other), with the
// second half measured: 5 s runs, 8 s at 10/s so that the half holds 40
// requests. The bounds are ratios to the pair with slack for a loaded
// runner, never absolute rates: sluice serves at least floor × what the
// pair serves, and refuses at most 2% of its attempts more than the pair
// does.
//
// The floors are what holds today, not what should: the default is 0.85,
// and the cells listed in realGaps hold only the lower bounds given there,
// each a known shortfall of sluice against that middleware. Runs this
// short measure seconds 2.5 to 5 of a cold lane, where sluice's start
// against strict servers costs most.
func TestRealMiddlewareBesidePeers(t *testing.T) {
	if testing.Short() {
		t.Skip("real-clock runs")
	}
	for _, r := range realRates {
		t.Run(fmt.Sprintf("%d per second", r), func(t *testing.T) {
			d := 5 * time.Second
			if r < 20 {
				d = 8 * time.Second
			}
			besidePeers(t, realAt(r), 6, d)
		})
	}
}

// TestRealMinuteWindowsBesidePeers is TestRealMiddlewareBesidePeers for the
// windows of a minute, scaled to 6 s (see minuteScale), of the middleware
// that count in windows: 18 s runs, so that the half measured holds a
// window and a half after the lane's first.
func TestRealMinuteWindowsBesidePeers(t *testing.T) {
	if testing.Short() {
		t.Skip("real-clock runs")
	}
	for _, r := range realRates {
		t.Run(fmt.Sprintf("%d per second", r), func(t *testing.T) {
			besidePeers(t, realMinuteAt(r), 3, 18*time.Second)
		})
	}
}

// besidePeers runs the n models whose names match models against each
// sluice client and x/time/rate at R, runs of d, and holds each cell to its
// floor (see realFloor).
func besidePeers(t *testing.T, models string, n int, d time.Duration) {
	ms, cs, err := selectRuns(models, "^(sluice at R|sluice, no WithRate|sluice at 2R|x/time/rate at R)")
	if err != nil || len(ms) != n || len(cs) != 4 {
		t.Fatalf("selectRuns: %d models, %d clients, %v", len(ms), len(cs), err)
	}
	pair, sluices := cs[3], cs[:3]
	cfg := config{d: d, workers: 32, latency: 20 * time.Millisecond}
	var table strings.Builder
	for _, m := range ms {
		t.Run(m.name, func(t *testing.T) {
			if m.redis {
				requireRedis(t)
			}
			x := run(t.Context(), cfg, m, pair)
			if x.err != nil || x.attempts == 0 {
				t.Fatalf("x/time/rate at R: %+v", x)
			}
			fmt.Fprintf(&table, "| %s | %v |", m.name, x)
			for _, c := range sluices {
				s := run(t.Context(), cfg, m, c)
				fmt.Fprintf(&table, " %v |", s)
				if s.err != nil || s.attempts == 0 {
					t.Errorf("%s: %+v", c.name, s)
					continue
				}
				floor, refused := realFloor(m.name, c.name)
				if s.ratio < floor*x.ratio || s.refused > x.refused+refused {
					t.Errorf("%s: %.2f of R with %.1f%% refused; x/time/rate %.2f with %.1f%%; want at least %.2f of its share, at most %.0f%% more refused",
						c.name, s.ratio, s.refused, x.ratio, x.refused, floor, refused)
				}
			}
			table.WriteString("\n")
		})
	}
	t.Logf("%v runs, second half:\n| server | x/time/rate at R + 16 slots | sluice at R | sluice, no WithRate | sluice at 2R |\n%s", d, table.String())
}

// realMinuteAt selects the real middleware that count in windows, at r
// requests a second with a window of a minute scaled.
func realMinuteAt(r int) string {
	return fmt.Sprintf(`^(go-chi/httprate|sethvargo/go-limiter|ulule/limiter), %d per %v \(a minute scaled\)$`, r*60/minuteScale, minuteWindow)
}

// realAt selects the real middleware at r requests a second with a window
// of a second.
func realAt(r int) string {
	return fmt.Sprintf(`^(throttled GCRA, MaxBurst 5, %[1]d/s|go-chi/httprate, %[1]d per 1 s|sethvargo/go-limiter, %[1]d per 1 s|ulule/limiter "%[1]d-S"|didip/tollbooth, %[1]d/s|go-redis/redis_rate PerSecond\(%[1]d\))$`, r)
}

// realGaps are the cells of TestRealMiddlewareBesidePeers where sluice
// is known to fall short of x/time/rate, by a regexp on the model's name
// and the client's, with the floor (a share of what the pair serves) that
// holds today.
var realGaps = []struct {
	model, client string
	floor         float64 // share of the pair's rate
	refused       float64 // % of attempts refused beyond the pair's
	why           string
}{
	{"^sethvargo/go-limiter", "no WithRate", 0.5, 2,
		"a cold lane with no WithRate tells the window apart at a refill it sees; most 5 s runs measure 1.00 of R, one in about ten 0.58, the window not yet told apart in the measured half"},
}

// realFloor returns the share of the pair's rate that sluice must reach
// with client c against model m, and the share of attempts it may see
// refused beyond the pair's.
func realFloor(m, c string) (floor, refused float64) {
	for _, g := range realGaps {
		if regexp.MustCompile(g.model).MatchString(m) && regexp.MustCompile(g.client).MatchString(c) {
			return g.floor, g.refused
		}
	}
	return 0.85, 2
}

func TestRealGapsMatch(t *testing.T) {
	var ms []model
	var cs []client
	for _, r := range realRates {
		for sel, n := range map[string]int{realAt(r): 6, realMinuteAt(r): 3} {
			m, c, err := selectRuns(sel, "^sluice")
			if err != nil || len(m) != n {
				t.Fatalf("%s selects %d models (%v), want %d", sel, len(m), err, n)
			}
			ms, cs = append(ms, m...), c
		}
	}
	for _, g := range realGaps {
		n := 0
		for _, m := range ms {
			for _, c := range cs {
				if regexp.MustCompile(g.model).MatchString(m.name) && regexp.MustCompile(g.client).MatchString(c.name) {
					n++
				}
			}
		}
		if n == 0 || g.floor <= 0 || g.floor >= 0.85 || g.refused < 2 || g.why == "" {
			t.Errorf("gap %q, %q: matches %d cells, floor %.2f, why %q", g.model, g.client, n, g.floor, g.why)
		}
	}
}

// requireRedis skips t when redis-server is missing, or fails it when
// SLUICE_REQUIRE_REDIS=1 (as CI sets it).
func requireRedis(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("SLUICE_REQUIRE_REDIS") == "1" {
			t.Fatalf("SLUICE_REQUIRE_REDIS=1 but %v", err)
		}
		t.Skipf("skipping: redis-server not found (apt-get install redis-server): %v", err)
	}
}
