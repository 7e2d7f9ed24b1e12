package sluice

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestPrepaidQuotaReadWithoutThem: a busy lane that prepaid grants reads
// the first quota its server states, 20 left of a 60 s window. The grants
// taken ahead are nobody's, not in flight: the lane goes on at the pace
// the quota leaves, where counting their slots in flight would read 20
// less 31 as nothing left and pause for the whole window.
func TestPrepaidQuotaReadWithoutThem(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var speak atomic.Bool
		base := rtFunc(func(req *http.Request) (*http.Response, error) {
			h := http.Header{}
			if speak.Swap(false) {
				// IETF draft 7: a fixed window of 60 s with 20 left.
				h.Set("RateLimit-Limit", "100000")
				h.Set("RateLimit-Remaining", "20")
				h.Set("RateLimit-Reset", "60")
			}
			return &http.Response{StatusCode: 200, Header: h, Body: io.NopCloser(strings.NewReader("")), Request: req}, nil
		})
		var prepaid atomic.Int64
		testHookPrepay = func(_ *lane, n int) {
			if prepaid.Add(1) == 3 {
				speak.Store(true) // the response to the timed grant that prepaid
			}
		}
		defer func() { testHookPrepay = nil }()
		tr := mustNew(t, base, WithRate(1e6, time.Second), WithBurst(1000), WithConcurrency(40, 40))
		for i := 0; prepaid.Load() < 3; i++ {
			if i == 10000 {
				t.Fatal("the lane prepaid too few grants")
			}
			if err := get(t.Context(), tr, ""); err != nil {
				t.Fatal(err)
			}
		}
		if speak.Load() {
			t.Fatal("the quota was not sent")
		}
		s, _ := tr.Stats().Lane("api.test")
		if !s.Cooldown.IsZero() {
			t.Errorf("the lane cools down until %v (%v) after a quota of 20 remaining with nothing else in flight",
				time.Until(s.Cooldown), s.Cooldown)
		}
		start := time.Now()
		if err := get(t.Context(), tr, ""); err != nil {
			t.Fatal(err)
		}
		// 20 left over 60 s: one every 3 s at most.
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("the next request waited %v", d)
		}
	})
}
