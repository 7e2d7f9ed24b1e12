package sluiceredis

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/internal/upstream"
)

// onFallback returns Tokens that serve every Take on "api" from their local
// fallback for the next hour: Redis is down (client points nowhere), and
// no probe falls due. The fallback is local, so the test can run in a
// synctest bubble.
func onFallback(t *testing.T, opts ...Option) *Tokens {
	t.Helper()
	c := newClient(t, "127.0.0.1:1")
	b, err := NewTokens(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	h := &b.budget("api").health
	h.down, h.next = true, time.Now().Add(time.Hour)
	return b
}

// fallbackFleet runs procs Backends on their fallbacks, each taking tokens
// for a lane of rate and burst as a dispatcher does (sleeping the wait it
// is told), all starting at the same instant, as processes that lost Redis
// together do, for run. It returns the grants' times.
func fallbackFleet(t *testing.T, procs int, rate float64, burst int, run time.Duration) []time.Time {
	t.Helper()
	var (
		mu       sync.Mutex
		arrivals []time.Time
		wg       sync.WaitGroup
	)
	start := time.Now()
	for range procs {
		b := onFallback(t)
		wg.Go(func() {
			for time.Since(start) < run {
				w, err := b.Take(context.Background(), "api", rate, burst)
				if err != nil {
					t.Errorf("Take on the fallback: %v", err)
					return
				}
				if w > 0 {
					time.Sleep(w)
					continue
				}
				mu.Lock()
				arrivals = append(arrivals, time.Now())
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.SortFunc(arrivals, func(a, b time.Time) int { return a.Compare(b) })
	return arrivals
}

// strictRefusals counts the arrivals a strict limiter (GCRA at rate, burst
// 1: a request a moment early is refused, and a refusal costs nothing)
// would refuse.
func strictRefusals(arrivals []time.Time, rate float64) int {
	interval := time.Duration(float64(time.Second) / rate)
	var tat time.Time
	refused := 0
	for _, a := range arrivals {
		if a.Before(tat) {
			refused++
			continue
		}
		tat = a.Add(interval)
	}
	return refused
}

// TestFallbackDesynchronises: processes that fall back at the same instant
// must not send in step. Each runs at the fallback share of the rate; in
// step, four processes at a quarter of 100/s send four requests at once
// every 40ms. That keeps, just, within rate x T + burst + (processes - 1)
// in any window T, which is checked too; what is wrong with it is that
// three arrivals in four come at the same instant as another, and an
// upstream that smooths its limit (GCRA with a small burst) refuses them.
// Desynchronised, few arrivals come on each other's heels.
func TestFallbackDesynchronises(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			procs = 4
			rate  = 100.0
			burst = 1
			run   = 10 * time.Second
		)
		arrivals := fallbackFleet(t, procs, rate, burst, run)
		// The same instant in a bubble is the same instant: a gap under
		// a tenth of an interval is two processes in step.
		close := 0
		for i := 1; i < len(arrivals); i++ {
			if arrivals[i].Sub(arrivals[i-1]) < time.Duration(float64(time.Second)/rate/10) {
				close++
			}
		}
		closeShare := float64(close) / float64(max(len(arrivals)-1, 1))
		refused := strictRefusals(arrivals, rate)
		t.Logf("%d processes on the fallback (share %v of %v/s) for %v: %d arrivals (%.3f of the rate); %.1f%% of gaps under %v; a strict limiter at the rate would refuse %.1f%%",
			procs, DefaultFallbackShare, rate, run, len(arrivals), float64(len(arrivals))/(rate*run.Seconds()),
			100*closeShare, time.Duration(float64(time.Second)/rate/10), 100*float64(refused)/float64(len(arrivals)))
		for _, w := range []time.Duration{time.Millisecond, 10 * time.Millisecond, 40 * time.Millisecond,
			100 * time.Millisecond, time.Second} {
			bound := rate*w.Seconds() + burst + procs - 1
			got := upstream.MaxInWindow(arrivals, w)
			t.Logf("  most in any %v: %d, bound rate x T + burst + (processes - 1) = %.1f", w, got, bound)
			if float64(got) > bound {
				t.Errorf("%d arrivals in a window of %v, over rate x T + burst + (processes - 1) = %.1f", got, w, bound)
			}
		}
		// In step, three gaps in four are 0. Desynchronised at random, two
		// processes may still start close and take a while to drift
		// apart: 3,000 runs gave 1.8-29% (median 7%).
		if closeShare > 0.4 {
			t.Errorf("%.1f%% of the fleet's arrivals come within a tenth of an interval of the one before: the processes run in step", 100*closeShare)
		}
		if float64(len(arrivals)) < 0.9*rate*run.Seconds() {
			t.Errorf("%d arrivals in %v, under 90%% of %v/s: the fallback gives away too much", len(arrivals), run, rate)
		}
	})
}
