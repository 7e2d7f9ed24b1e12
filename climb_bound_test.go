package sluice

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// refillBucket is a token bucket server: rate a second, burst tokens.
type refillBucket struct {
	mu           sync.Mutex
	tokens, rate float64
	burst        float64
	last         time.Time
}

func (b *refillBucket) take() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	if !b.last.IsZero() {
		b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	}
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return true
	}
	return false
}

// TestUnpacedClimbIsBounded: a lane with no WithRate that a 429
// once cut probes up from its first estimate at 4x a second. With no
// ceiling the growth never stopped: after a minute of acceptances its
// rate was ~1e35 (+Inf after ~9 minutes), the next 429 took the floor
// (5% of the "highest rate known") up with it, and no 429 could slow the
// lane again: against a 20/s bucket it was refused ~900 times a minute
// where a fresh lane is refused ~25.
func TestUnpacedClimbIsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		srv := &refillBucket{rate: 20, burst: 20, tokens: 20}
		var limited atomic.Bool
		var refused atomic.Int64
		base := rtFunc(func(r *http.Request) (*http.Response, error) {
			time.Sleep(20 * time.Millisecond)
			status, h := 200, http.Header{}
			switch {
			case time.Since(start) < 10*time.Second:
				status = 429 // an outage's refusals: the lane's first cut
				h.Set("Retry-After", "1")
			case limited.Load() && !srv.take():
				status = 429
				h.Set("Retry-After", "1")
				refused.Add(1)
			}
			return &http.Response{StatusCode: status, Header: h, Body: io.NopCloser(strings.NewReader("x")), Request: r}, nil
		})
		tr := mustNew(t, base, WithRetry(0))
		run := func(d time.Duration) {
			ctx, cancel := context.WithTimeout(t.Context(), d)
			defer cancel()
			var wg sync.WaitGroup
			for range 16 {
				wg.Go(func() {
					for ctx.Err() == nil {
						if err := get(ctx, tr, ""); err != nil && ctx.Err() == nil {
							time.Sleep(10 * time.Millisecond)
						}
					}
				})
			}
			wg.Wait()
		}
		run(70 * time.Second) // 10 s of 429s, then 60 s of acceptances
		s, _ := tr.Stats().Lane("api.test")
		// 16 callers at 20 ms send at most 800/s.
		if s.Rate > 1e4 {
			t.Errorf("after a minute of acceptances the lane paces to %g/s; at most 800/s were ever sent", s.Rate)
		}
		srv.last = time.Now()
		limited.Store(true)
		run(60 * time.Second)
		n := refused.Load()
		s, _ = tr.Stats().Lane("api.test")
		t.Logf("against a 20/s bucket: %d refusals in 60 s; rate then %.1f/s", n, s.Rate)
		if n > 300 {
			t.Errorf("against a 20/s bucket: %d refusals in 60 s (a fresh lane: ~25); rate %g", n, s.Rate)
		}
	})
}
