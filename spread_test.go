package sluice

import (
	"context"
	"io"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/internal/verdict"
)

// TestSpreadCostsNoThroughput: slow start spreads a lane's sends only while
// its limit grows, so a lane with no rate against a server with no limit
// loses nothing to the spreading once the limit covers its callers. Over
// the second half of a run it serves at least 0.97 of what the bare base
// serves in the same bubble: 16 callers that keep calls of 1 ms in flight,
// and batches of 64 calls of 20 ms sent at once and awaited (each batch's
// calls end together; spreading that went on would stretch every batch by
// half a round trip, to 0.67 of the base).
func TestSpreadCostsNoThroughput(t *testing.T) {
	for _, c := range []struct {
		name    string
		latency time.Duration
		callers int
		batch   bool
		dur     time.Duration
	}{
		{"16 callers, 1 ms", time.Millisecond, 16, false, time.Second},
		{"batches of 64, 20 ms", 20 * time.Millisecond, 64, true, 4 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				run := func(wrap func(http.RoundTripper) http.RoundTripper) int64 {
					rt := wrap(&fakeBase{latency: c.latency})
					return spreadLoad(t, rt, c.callers, c.batch, c.dur)
				}
				bare := run(func(b http.RoundTripper) http.RoundTripper { return b })
				var tr *Transport
				got := run(func(b http.RoundTripper) http.RoundTripper {
					tr = mustNew(t, b, WithRetry(0))
					return tr
				})
				st, _ := tr.LaneStats("api.test")
				t.Logf("second half: sluice with no rate %d calls, the bare base %d (%.3f); limit %d",
					got, bare, float64(got)/float64(bare), st.Limit)
				if float64(got) < 0.97*float64(bare) {
					t.Errorf("sluice with no rate served %.3f of the bare base's calls, want at least 0.97",
						float64(got)/float64(bare))
				}
			})
		})
	}
}

// spreadLoad runs callers through rt for dur, each calling again as soon
// as its call ends or, with batch, all of them at once and then again once
// all have ended, and returns the calls that ended in dur's second half.
func spreadLoad(t *testing.T, rt http.RoundTripper, callers int, batch bool, dur time.Duration) int64 {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	start := time.Now()
	time.AfterFunc(dur, cancel)
	var n atomic.Int64
	call := func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://api.test/", nil)
		resp, err := rt.RoundTrip(req)
		if err != nil {
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if time.Since(start) >= dur/2 {
			n.Add(1)
		}
	}
	var wg sync.WaitGroup
	for ctx.Err() == nil {
		for range callers {
			wg.Go(func() {
				for ctx.Err() == nil {
					call()
					if batch {
						return
					}
				}
			})
		}
		wg.Wait()
	}
	return n.Load()
}

// TestSpreadRate: slow start spreads a lane's sends at two limits per
// smoothed latency while its samples grow the limit, not before the first
// sample nor after a sample that grew nothing (+Inf: none for now), and
// never again once slow start is over (0). The pacer lets a spread lane
// send what its pace makes in two timer grains, at least two, at once,
// then one a token's time.
func TestSpreadRate(t *testing.T) {
	s := newLimiter(1, 64, false)
	if r := s.spreadRate(); !math.IsInf(r, 1) || !s.spreading {
		t.Fatalf("before a sample: spread at %v (spreading %v), want +Inf", r, s.spreading)
	}
	now := 400 * time.Millisecond
	s.inUse = s.limit
	s.onSample(now, 400*time.Millisecond, verdict.Served, false, true, 0, 0) // grows to 5
	if r := s.spreadRate(); r != 2*5/0.4 {
		t.Errorf("after a growing sample at 400 ms: spread at %v, want %v", r, 2*5/0.4)
	}
	// The spread lane's sends wait for the round: a sample with requests
	// waiting grows the limit, every slot taken or not.
	s.inUse = 2
	s.onSample(now, 400*time.Millisecond, verdict.Served, false, true, 0, 0)
	if s.limit != 6 {
		t.Errorf("a sample with requests waiting while spread: limit %d, want 6", s.limit)
	}
	s.onSample(now, 400*time.Millisecond, verdict.Served, false, false, 0, 0) // nobody waits
	if r := s.spreadRate(); !math.IsInf(r, 1) || s.limit != 6 {
		t.Errorf("after a sample that grew nothing: spread at %v, limit %d; want +Inf, 6", r, s.limit)
	}
	s.inUse = 2
	s.onSample(now, 400*time.Millisecond, verdict.Served, false, true, 0, 0)
	if s.limit != 6 {
		t.Errorf("a sample with slots free and requests waiting, not spread: limit %d, want 6", s.limit)
	}
	s.onSample(now, 400*time.Millisecond, verdict.Served, false, true, 10, 0) // a rate: slow start ends
	if r := s.spreadRate(); r != 0 || s.spreading {
		t.Errorf("after slow start: spread at %v (spreading %v), want 0", r, s.spreading)
	}
	if p := newLimiter(1, 64, true); p.spreading {
		t.Error("a paced lane spreads its sends")
	}

}
