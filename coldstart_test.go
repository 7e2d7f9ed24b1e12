package sluice

import (
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/internal/upstream"
)

// TestColdStartFitsLittle: a lane with no configured rate that learns 50/s
// from its server's quota headers (a fixed window of 50 a second), calls of
// 400 ms: Little's law asks for 20 in flight. The in-flight limit fits as
// soon as the rate and a latency are known, where growing a quarter a
// window from its unpaced start of 4 served 0.28 of the rate in the first
// 6 s. (The pace read from the window's headers, not the limit, keeps the
// run under 0.90: see the quota kinds in docs/design.md.)
func TestColdStartFitsLittle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		res := load{
			up: upstream.Config{Quota: 50, PolicyWindow: time.Second,
				Latency: func(int, *http.Request) time.Duration { return 400 * time.Millisecond }},
			workers: 64,
			dur:     6 * time.Second,
		}.run(t)
		n := 0
		for _, a := range res.arrivals {
			if a.Accepted {
				n++
			}
		}
		got := float64(n) / (6 * 50)
		t.Logf("first 6 s: %d accepted (%.2f of the rate), %d refused", n, got, res.rejected)
		if got < 0.75 {
			t.Errorf("first 6 s served at %.2f of the rate, want at least 0.75", got)
		}
		if share := float64(res.rejected) / float64(n+res.rejected); share > 0.01 {
			t.Errorf("%.1f%% refused, want at most 1%%", 100*share)
		}
	})
}
