package sluice

import (
	"net/http"
	"sync"
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

// TestWaitQuantilesAreRecent: a backlog's long waits show in WaitP99 for a
// minute or two, then give way to the waits of now.
func TestWaitQuantilesAreRecent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, nopBase{}, WithRate(10, time.Second))
		defer tr.Close()
		// 50 at once: the last waits about 5 s.
		var wg sync.WaitGroup
		for range 50 {
			wg.Go(func() { get(t.Context(), tr, "") })
		}
		wg.Wait()
		p99 := func() time.Duration {
			ls, _ := tr.LaneStats("api.test")
			return ls.Levels[Normal].WaitP99
		}
		if w := p99(); w < 4*time.Second {
			t.Fatalf("WaitP99 after the backlog = %v, want about 5s", w)
		}
		// Then one request every 200 ms for three minutes: none waits.
		for range 3 * 60 * 5 {
			time.Sleep(200 * time.Millisecond)
			get(t.Context(), tr, "")
		}
		if w := p99(); w > 10*time.Millisecond {
			t.Errorf("WaitP99 three minutes later = %v, want about 0: the backlog is old", w)
		}
	})
}
