package sluice

import (
	"net/http"
	"testing"
	"testing/synctest"
	"time"
)

// TestLaneStatsCeiling: Ceiling is the configured rate after headroom, and
// stays there while a 429 cuts Rate below it; a lane without WithRate has
// none.
func TestLaneStatsCeiling(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		throttle := true
		base := &fakeBase{answer: func(*http.Request) *http.Response {
			if throttle {
				throttle = false
				return &http.Response{StatusCode: http.StatusTooManyRequests, Header: http.Header{}, Body: http.NoBody}
			}
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody}
		}}
		tr := mustNew(t, base, WithRate(50, time.Second), WithHeadroom(0.8), WithRetry(1))
		defer tr.Close()
		if err := get(t.Context(), tr, ""); err != nil {
			t.Fatal(err)
		}
		ls, ok := tr.LaneStats("api.test")
		if !ok {
			t.Fatal("no lane api.test")
		}
		if ls.Ceiling != 40 {
			t.Errorf("Ceiling = %v, want 40 (50/s x 0.8)", ls.Ceiling)
		}
		if ls.Throttled != 1 || !(ls.Rate > 0 && ls.Rate < ls.Ceiling) {
			t.Errorf("after a 429: Throttled %d, Rate %v, want 1 and a Rate below the ceiling %v", ls.Throttled, ls.Rate, ls.Ceiling)
		}

		bare := mustNew(t, &fakeBase{})
		defer bare.Close()
		if err := get(t.Context(), bare, ""); err != nil {
			t.Fatal(err)
		}
		if ls, _ := bare.LaneStats("api.test"); ls.Ceiling != 0 || ls.Rate != 0 {
			t.Errorf("without WithRate: Ceiling %v, Rate %v, want 0 and 0", ls.Ceiling, ls.Rate)
		}
	})
}
