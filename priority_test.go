package sluice

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/internal/stats"
)

// seedRun is one run of the scenario of seeds/000: a lane at 100 permits/s,
// a batch queued at t=0, interactive calls arriving at a steady rate for 10 s.
type seedRun struct {
	name      string
	opts      []Option
	interRate int  // interactive calls per second
	batch     int  // batch calls queued at t=0
	fifo      bool // both classes at one level
	seed      string
}

type seedResult struct {
	interWaits   []time.Duration
	interIn10    int // interactive calls sent within the 10 s
	batchIn10    int // batch calls sent within the 10 s
	batchDoneAt  time.Duration
	statsP99     time.Duration
	interOffered int
}

func (r seedRun) run(t *testing.T) seedResult {
	var res seedResult
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{}
		tr := mustNew(t, base, append([]Option{WithRate(100, time.Second)}, r.opts...)...)
		start := time.Now()
		interLevel, batchLevel := Interactive, Batch
		if r.fifo {
			interLevel, batchLevel = Normal, Normal
		}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for range r.batch {
			wg.Go(func() {
				if err := get(WithPriority(t.Context(), batchLevel), tr, "batch"); err != nil {
					t.Error(err)
				}
				mu.Lock()
				res.batchDoneAt = max(res.batchDoneAt, time.Since(start))
				mu.Unlock()
			})
		}
		synctest.Wait() // the whole batch is queued before the first interactive call
		res.interOffered = 10 * r.interRate
		for i := range res.interOffered {
			time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(r.interRate))))
			wg.Go(func() {
				t0 := time.Now()
				if err := get(WithPriority(t.Context(), interLevel), tr, "interactive"); err != nil {
					t.Error(err)
				}
				mu.Lock()
				res.interWaits = append(res.interWaits, time.Since(t0))
				mu.Unlock()
			})
		}
		wg.Wait()
		base.mu.Lock()
		for _, a := range base.arrivals {
			if a.at.Sub(start) >= 10*time.Second {
				continue
			}
			switch a.class {
			case "batch":
				res.batchIn10++
			case "interactive":
				res.interIn10++
			}
		}
		base.mu.Unlock()
		s, _ := tr.Stats().Lane("api.test")
		res.statsP99 = s.Levels[interLevel].WaitP99
	})
	return res
}

// TestSeedPriorityScenarios reproduces the table of seeds/000 in virtual
// time through the real Transport, and prints it beside the seed's figures.
func TestSeedPriorityScenarios(t *testing.T) {
	// The seed's strict priority: no share reserved for the batch.
	strict := []Option{WithLowShare(0)}
	runs := []seedRun{
		{name: "FIFO", fifo: true, opts: strict, interRate: 20, batch: 1000, seed: "8.1 s / 9.99 s, 96 of 200; batch 996"},
		{name: "strict", opts: strict, interRate: 20, batch: 1000, seed: "1.2 ms / 10.3 ms, 200 of 200; batch 797"},
		{name: "strict", opts: strict, interRate: 90, batch: 300, seed: "6.2 ms / 10.7 ms; batch 101"},
		{name: "every 5th to batch", opts: []Option{WithLowShare(5)}, interRate: 90, batch: 300, seed: "617 ms / 1.2 s; batch 200"},
		{name: "aging 2 s", opts: []Option{WithAging(2 * time.Second), WithLowShare(0)}, interRate: 90, batch: 300, seed: "2.4 s / 2.8 s; batch 300 (done in 4.8 s)"},
	}
	var table strings.Builder
	fmt.Fprintf(&table, "\n%-20s %6s %6s | %-22s %-10s %-12s %-10s | seed (Python, 10 s)\n",
		"policy", "inter", "batch", "inter p50 / p99", "served<10s", "batch<10s", "batch done")
	for _, r := range runs {
		t.Run(fmt.Sprintf("%s/%d-per-s", r.name, r.interRate), func(t *testing.T) {
			res := r.run(t)
			p50, p99 := stats.Quantile(res.interWaits, 0.5), stats.Quantile(res.interWaits, 0.99)
			fmt.Fprintf(&table, "%-20s %4d/s %6d | %9v / %-10v %4d of %-3d %-12d %-10v | %s\n",
				r.name, r.interRate, r.batch, p50.Round(time.Millisecond), p99.Round(time.Millisecond),
				res.interIn10, res.interOffered, res.batchIn10, res.batchDoneAt.Round(time.Millisecond), r.seed)

			if len(res.interWaits) != res.interOffered {
				t.Fatalf("%d of %d interactive calls returned", len(res.interWaits), res.interOffered)
			}
			// Stats agrees with the waits measured by the callers (within its
			// bucket resolution).
			if d := res.statsP99 - p99; d > p99/10+time.Millisecond || -d > p99/10+time.Millisecond {
				t.Errorf("Stats p99 %v, measured %v", res.statsP99, p99)
			}
			switch {
			case r.fifo:
				// The interactive wait tracks the batch backlog: (1000 - 100t)/100 s
				// plus the interactive calls ahead, about 6 s at the median.
				if p50 < 5*time.Second || p50 > 7*time.Second {
					t.Errorf("FIFO interactive p50 %v, want about 6 s", p50)
				}
				if res.interIn10 > 10 {
					t.Errorf("FIFO served %d interactive calls within 10 s, want almost none", res.interIn10)
				}
			case r.interRate == 20:
				if res.interIn10 != 200 || p99 > 11*time.Millisecond {
					t.Errorf("strict: %d of 200 served, p99 %v (want all, <= 11 ms)", res.interIn10, p99)
				}
				if res.batchIn10 < 790 {
					t.Errorf("strict: batch got %d permits, want >= 790", res.batchIn10)
				}
			case r.name == "strict":
				if res.batchIn10 < 90 || res.batchIn10 > 110 {
					t.Errorf("strict at 90/s: batch got %d permits, want about 100", res.batchIn10)
				}
			case r.name == "every 5th to batch":
				if res.batchIn10 < 198 || res.batchIn10 > 202 {
					t.Errorf("low share 5: batch got %d permits, want 200 +- 2", res.batchIn10)
				}
			default: // aging
				if res.batchIn10 != 300 {
					t.Errorf("aging: batch got %d permits in 10 s, want all 300", res.batchIn10)
				}
			}
		})
	}
	t.Log(table.String())
}

// TestDefaultsDoNotStarve: with the defaults, eight Interactive and eight
// Batch workers that always have a call waiting share a lane at 100/s, and
// the batch gets its tenth (DefaultLowShare); with WithLowShare(0) it gets
// almost nothing, as strict priority gives.
func TestDefaultsDoNotStarve(t *testing.T) {
	for _, c := range []struct {
		name     string
		opts     []Option
		min, max int // batch grants of 500
	}{
		{"defaults", nil, 45, 60},
		{"strict", []Option{WithLowShare(0)}, 0, 5},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &fakeBase{latency: 20 * time.Millisecond}
				tr := mustNew(t, base, append([]Option{WithRate(100, time.Second)}, c.opts...)...)
				ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
				defer cancel()
				var wg sync.WaitGroup
				for i := range 16 {
					p, class := Interactive, "interactive"
					if i%2 == 1 {
						p, class = Batch, "batch"
					}
					wg.Go(func() {
						for get(WithPriority(ctx, p), tr, class) == nil {
						}
					})
				}
				wg.Wait()
				var inter, batch int
				base.mu.Lock()
				for _, a := range base.arrivals {
					if a.class == "batch" {
						batch++
					} else {
						inter++
					}
				}
				base.mu.Unlock()
				t.Logf("%s: interactive %d, batch %d", c.name, inter, batch)
				if batch < c.min || batch > c.max {
					t.Errorf("batch got %d of %d grants, want %d..%d", batch, inter+batch, c.min, c.max)
				}
			})
		})
	}
}

// TestDefaultsDoNotStarveTheMiddle: with the defaults, Interactive, Normal
// and Batch workers that always have a call waiting share a lane at
// 100/s: the two levels below Interactive share its tenth, the one that
// has waited longest first, and neither gets none.
func TestDefaultsDoNotStarveTheMiddle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{latency: 20 * time.Millisecond}
		tr := mustNew(t, base, WithRate(100, time.Second))
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		for i := range 24 {
			p := Priority(i % 3)
			wg.Go(func() {
				for get(WithPriority(ctx, p), tr, p.String()) == nil {
				}
			})
		}
		wg.Wait()
		got := map[string]int{}
		base.mu.Lock()
		for _, a := range base.arrivals {
			got[a.class]++
		}
		base.mu.Unlock()
		t.Logf("grants: %v", got)
		if n, b := got[Normal.String()], got[Batch.String()]; n < 15 || b < 15 || n+b > 60 {
			t.Errorf("normal got %d and batch %d of %d grants, want at least 15 each and 60 together",
				n, b, n+b+got[Interactive.String()])
		}
	})
}

// TestLoneWaiterDispatchesItself: a caller alone in the queue waits for its
// token on its own goroutine, with no dispatcher goroutine started and
// woken for it (two scheduler hand-offs a request on a busy machine).
func TestLoneWaiterDispatchesItself(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, nopBase{}, WithRate(10, time.Second))
		defer tr.Close()
		if err := get(t.Context(), tr, ""); err != nil { // takes the token
			t.Fatal(err)
		}
		before := runtime.NumGoroutine()
		done := make(chan error, 1)
		go func() { done <- get(t.Context(), tr, "") }()
		synctest.Wait() // the caller waits for the next token, 100 ms away
		if n := runtime.NumGoroutine() - before; n != 1 {
			t.Errorf("%d goroutines while one caller waits, want 1: the caller alone", n)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}

// TestLowShareCountsInTheEstimate: with Interactive calls backed up, the
// default low share serves a Batch call within about ten grants, and an
// early refusal estimates its wait so: a Batch call with a 3 s deadline
// is served, where counting every Interactive waiter ahead of it refused
// each one at once.
func TestLowShareCountsInTheEstimate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, &fakeBase{latency: 10 * time.Millisecond}, WithRate(10, time.Second))
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		for range 50 {
			wg.Go(func() {
				for ctx.Err() == nil {
					get(WithPriority(ctx, Interactive), tr, "")
				}
			})
		}
		time.Sleep(5 * time.Second) // the Interactive queue is long
		var served, refused int
		for range 20 {
			bctx, bcancel := context.WithTimeout(WithPriority(ctx, Batch), 3*time.Second)
			err := get(bctx, tr, "")
			bcancel()
			switch {
			case err == nil:
				served++
			case errors.Is(err, ErrRejected):
				refused++
				time.Sleep(time.Second)
			}
		}
		cancel()
		wg.Wait()
		if served < 18 || refused > 0 {
			t.Errorf("Batch calls with a 3 s deadline: %d of 20 served, %d refused early", served, refused)
		}
	})
}

// TestAgingCountsInTheEstimate: with WithAging(1s), Batch calls queued
// three seconds ago outrank a fresh Interactive call; an early refusal
// counts them, and refuses the Interactive call whose WithMaxWait (1 s)
// the thirty of them ahead at 10/s exceed, where it counted none and let
// the call wait out its deadline.
func TestAgingCountsInTheEstimate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, &fakeBase{}, WithRate(10, time.Second), WithAging(time.Second), WithMaxWait(Interactive, time.Second))
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		for range 60 {
			wg.Go(func() { get(WithPriority(ctx, Batch), tr, "") })
		}
		time.Sleep(3 * time.Second)
		ictx, icancel := context.WithTimeout(WithPriority(t.Context(), Interactive), 2*time.Second)
		start := time.Now()
		err := get(ictx, tr, "")
		icancel()
		if !errors.Is(err, ErrRejected) || time.Since(start) > 0 {
			t.Errorf("Interactive call behind 30 aged Batch calls: %v after %v, want a refusal at once", err, time.Since(start))
		}
		cancel()
		wg.Wait()
	})
}

// TestLowShareDelaysTheFirstInLine: while Batch calls wait, every tenth
// grant is theirs, and an Interactive call behind 18 others at 10/s is
// granted after 21 grants, not 19: its estimate counts them, and a
// deadline that 1.9 s would fit is refused at once rather than failed at
// its end.
func TestLowShareDelaysTheFirstInLine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, &fakeBase{}, WithRate(10, time.Second))
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		for range 30 {
			wg.Go(func() { get(WithPriority(ctx, Batch), tr, "") })
		}
		synctest.Wait()
		for range 18 {
			wg.Go(func() { get(WithPriority(ctx, Interactive), tr, "") })
		}
		synctest.Wait()
		ictx, icancel := context.WithTimeout(WithPriority(t.Context(), Interactive), 2050*time.Millisecond)
		start := time.Now()
		err := get(ictx, tr, "")
		icancel()
		if !errors.Is(err, ErrRejected) || time.Since(start) != 0 {
			t.Errorf("the 19th Interactive call, 2.05 s deadline: %v after %v, want a refusal at once", err, time.Since(start))
		}
		ictx, icancel = context.WithTimeout(WithPriority(t.Context(), Interactive), 2300*time.Millisecond)
		start = time.Now()
		err = get(ictx, tr, "")
		icancel()
		if err != nil {
			t.Errorf("the 19th Interactive call, 2.3 s deadline: %v after %v, want it served", err, time.Since(start))
		}
		cancel()
		wg.Wait()
	})
}
