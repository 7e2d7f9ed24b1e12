package sluice

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluice-go/sluice/internal/stats"
	"github.com/sluice-go/sluice/internal/upstream"
)

// pacingRun is how long each cell of BenchmarkPacing sends.
var pacingRun time.Duration

func init() {
	flag.DurationVar(&pacingRun, "sluice.pacing", 3*time.Second, "how long each BenchmarkPacing cell sends")
}

// rateBase is x/time/rate's Wait in front of a base: the peer a lane's
// pacing is measured against.
type rateBase struct {
	lim  *rate.Limiter
	base http.RoundTripper
}

func (r rateBase) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := r.lim.Wait(req.Context()); err != nil {
		return nil, err
	}
	return r.base.RoundTrip(req)
}

// stampBase records when each request reached it, on the real clock.
type stampBase struct {
	mu sync.Mutex
	at []time.Time
}

func (s *stampBase) RoundTrip(req *http.Request) (*http.Response, error) {
	now := time.Now()
	s.mu.Lock()
	s.at = append(s.at, now)
	s.mu.Unlock()
	return &http.Response{StatusCode: 200, Body: http.NoBody, Request: req}, nil
}

// paceRun sends through rt from callers goroutines that always have a
// request waiting, for d, and returns how many requests the base saw in the
// run's second half, per second, every arrival time, and the process's CPU
// time per second of the run.
func paceRun(rt func(base http.RoundTripper) http.RoundTripper, callers int, d time.Duration) (float64, []time.Time, float64) {
	base := &stampBase{}
	tr := rt(base)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	start, cpu0 := time.Now(), cpuTime()
	for range callers {
		wg.Go(func() {
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, "GET", "http://api.test/", nil)
				if resp, err := tr.RoundTrip(req); err == nil {
					resp.Body.Close()
				}
			}
		})
	}
	time.Sleep(d)
	cpu := cpuTime() - cpu0
	cancel()
	wg.Wait()
	base.mu.Lock()
	defer base.mu.Unlock()
	from, to := start.Add(d/2), start.Add(d)
	n := 0
	for _, a := range base.at {
		if !a.Before(from) && a.Before(to) {
			n++
		}
	}
	return float64(n) / (d / 2).Seconds(), base.at, cpu.Seconds() / d.Seconds()
}

// cpuTime returns the CPU time the process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func sluicePacer(r float64, burst int, opts ...Option) func(http.RoundTripper) http.RoundTripper {
	return func(base http.RoundTripper) http.RoundTripper {
		tr, err := New(base, append([]Option{WithRate(int(r), time.Second), WithBurst(burst), WithConcurrency(1, 1024)}, opts...)...)
		if err != nil {
			panic(err)
		}
		return tr
	}
}

func ratePacer(r float64, burst int) func(http.RoundTripper) http.RoundTripper {
	return func(base http.RoundTripper) http.RoundTripper {
		return rateBase{rate.NewLimiter(rate.Limit(r), burst), base}
	}
}

// spin keeps n goroutines busy on the CPUs until stop is closed: the
// loaded machine of a service that does other work.
func spin(n int, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	var sink atomic.Uint64
	for range n {
		wg.Go(func() {
			x := uint64(1)
			for {
				select {
				case <-stop:
					sink.Add(x)
					return
				default:
				}
				for range 1000 {
					x = x*6364136223846793005 + 1
				}
			}
		})
	}
	return &wg
}

// BenchmarkPacing measures the rate a backlogged lane achieves on the real
// clock, side by side with x/time/rate's Wait at the same rate and burst,
// for rates from 1/s to 10,000/s, bursts 1 and 10, and 1, 4 and 64 callers,
// idle and with two goroutines spinning on the CPUs. It prints the table:
// achieved ÷ R for sluice and x/time/rate; for each, the most requests in a
// window of T (0, 1, 10 or 100 token times: the one nearest the bound, or
// furthest over it) against the bound rate x T + burst + 1; the process's
// CPU seconds per second for each. The metric is the lowest sluice ÷
// x/time/rate ratio.
// -sluice.pacing sets each cell's length (default 3s; a few minutes in all).
func BenchmarkPacing(b *testing.B) {
	for b.Loop() {
		worst := 2.0
		fmt.Printf("%-6s %-5s %-7s %-4s | %7s %7s %6s | %-11s %-11s | %5s %5s\n",
			"R", "burst", "callers", "load", "sluice", "xrate", "ratio", "win/bound", "xwin/bound", "cpu", "xcpu")
		for _, load := range pacingLoads() {
			for _, r := range pacingRates() {
				for _, burst := range []int{1, 10} {
					for _, callers := range []int{1, 4, 64} {
						d := pacingRun
						if r < 10 {
							d = max(d, 6*time.Second)
						}
						stop := make(chan struct{})
						wg := spin(load, stop)
						s, at, cpu := paceRun(sluicePacer(r, burst), callers, d)
						x, xat, xcpu := paceRun(ratePacer(r, burst), callers, d)
						close(stop)
						wg.Wait()
						win, bound := worstWindow(at, r, burst)
						xwin, xbound := worstWindow(xat, r, burst)
						ratio := s / x
						worst = min(worst, ratio)
						fmt.Printf("%-6.0f %-5d %-7d %-4d | %7.3f %7.3f %6.3f | %5d/%-5d %5d/%-5d | %5.2f %5.2f\n",
							r, burst, callers, load, s/r, x/r, ratio,
							win, bound, xwin, xbound, cpu, xcpu)
					}
				}
			}
		}
		b.ReportMetric(worst, "worst-ratio")
	}
}

// pacingLoads returns how many goroutines spin beside each run:
// SLUICE_PACING_LOADS (comma-separated) if set, else 0 and 2.
func pacingLoads() []int {
	var ns []int
	for _, f := range strings.Split(os.Getenv("SLUICE_PACING_LOADS"), ",") {
		if n, err := strconv.Atoi(f); err == nil && n >= 0 {
			ns = append(ns, n)
		}
	}
	if len(ns) == 0 {
		return []int{0, 2}
	}
	return ns
}

// pacingRates returns the rates BenchmarkPacing runs: SLUICE_PACING_RATES
// (comma-separated) if set, else 1/s to 10,000/s.
func pacingRates() []float64 {
	v := os.Getenv("SLUICE_PACING_RATES")
	if v == "" {
		return []float64{1, 20, 100, 500, 2000, 5000, 10000}
	}
	var rs []float64
	for _, f := range strings.Split(v, ",") {
		if r, err := strconv.ParseFloat(f, 64); err == nil && r > 0 {
			rs = append(rs, r)
		}
	}
	return rs
}

// worstWindow returns, over the windows T of 0, 1, 10 and 100 token
// intervals, the arrivals in the window of length T holding the most, and
// the bound rate x T + burst + 1 for that T, for the window where the
// arrivals come closest to (or go furthest over) the bound.
func worstWindow(at []time.Time, r float64, burst int) (got, bound int) {
	margin := -1 << 30
	for _, k := range []float64{0, 1, 10, 100} {
		w := time.Duration(k / r * float64(time.Second))
		n := upstream.MaxInWindow(at, w+1)
		lim := int(r*w.Seconds()) + burst + 1
		if n-lim > margin {
			margin, got, bound = n-lim, n, lim
		}
	}
	return got, bound
}

// TestPacingRealClock: a backlogged lane hands out its configured rate on
// the real clock, at a low and a high rate, within a few percent of
// x/time/rate in the same run. The synctest tests check the schedule
// exactly; this checks that late timers and scheduler delays do not cost
// the lane its rate. A loaded runner can steal a run's CPU for longer than
// one token's time, which the lane then loses (see pace.Pacer.Take): the best of
// eight runs is compared, where a lane that loses its lateness (charging
// each token at its wake-up) fails every one.
func TestPacingRealClock(t *testing.T) {
	if testing.Short() {
		t.Skip("real-clock run of a few seconds")
	}
	for _, c := range []struct {
		r       float64
		burst   int
		callers int
	}{
		{100, 1, 64},
		{2000, 1, 64},
		{2000, 10, 4},
	} {
		t.Run(fmt.Sprintf("R=%v/burst=%d/callers=%d", c.r, c.burst, c.callers), func(t *testing.T) {
			const d = 2 * time.Second
			var s, x float64
			// A loaded runner (other packages' tests run beside this one)
			// can steal a whole run's CPU: up to eight runs, the first at
			// the mark ends it. The garbage of the tests before (lanes by
			// the thousand) is collected first, so that its collection
			// does not fall in a run.
			for try := range 8 {
				runtime.GC()
				var at []time.Time
				s, at, _ = paceRun(sluicePacer(c.r, c.burst), c.callers, d)
				x, _, _ = paceRun(ratePacer(c.r, c.burst), c.callers, d)
				t.Logf("run %d: sluice %.3f R, x/time/rate %.3f R", try, s/c.r, x/c.r)
				// Ten token times of slack over the whole run: a run must
				// not get ahead of its schedule.
				if lim := c.r*d.Seconds() + float64(c.burst) + 10; float64(len(at)) > lim {
					t.Fatalf("%d requests in %v, over %v", len(at), d, lim)
				}
				if s >= 0.95*min(x, c.r) {
					return
				}
			}
			t.Errorf("sluice achieved %.1f/s, below 0.95 of x/time/rate's %.1f/s (R %v), eight runs in a row", s, x, c.r)
		})
	}
}

// TestBoundRealClock: on the real clock, with 2,000 goroutines of mixed
// priorities, a fifth of them cancelled while they wait, the lane hands out
// at most rate x T + burst + 1 grants in any window T (the hand-off times,
// seen by testHookGrant), and the base sees them within scheduling jitter
// of that: a granted goroutine must still be scheduled to send, which on a
// loaded runner under -race takes milliseconds.
func TestBoundRealClock(t *testing.T) {
	if testing.Short() {
		t.Skip("real-clock run of a few seconds")
	}
	for _, c := range []struct {
		r     int
		burst int
	}{{500, 1}, {1000, 5}} {
		t.Run(fmt.Sprintf("R=%d/burst=%d", c.r, c.burst), func(t *testing.T) {
			base := &stampBase{}
			tr := mustNew(t, base, WithRate(c.r, time.Second), WithBurst(c.burst), WithConcurrency(1, 4096))
			// The grants sent: a grant that raced with its context's end
			// is given back unsent (testHookRefund). Only this Transport's:
			// a lane another test left may still grant.
			var mu sync.Mutex
			granted := map[time.Duration]int{}
			testHookGrant = func(l *lane, at time.Duration) {
				if l.cfg != &tr.cfg {
					return
				}
				mu.Lock()
				granted[at]++
				mu.Unlock()
			}
			testHookRefund = func(l *lane, at time.Duration) {
				if l.cfg != &tr.cfg {
					return
				}
				mu.Lock()
				granted[at]--
				mu.Unlock()
			}
			defer func() { testHookGrant, testHookRefund = nil, nil }()
			var wg sync.WaitGroup
			var sent atomic.Int64
			for i := range 2000 {
				wg.Go(func() {
					ctx := WithPriority(t.Context(), Priority(i%numLevels))
					if i%5 == 4 {
						var cancel context.CancelFunc
						ctx, cancel = context.WithTimeout(ctx, time.Duration(i)*time.Millisecond)
						defer cancel()
					}
					if get(ctx, tr, "") == nil {
						sent.Add(1)
					}
				})
			}
			wg.Wait()
			base.mu.Lock()
			at := base.at
			base.mu.Unlock()
			l := tr.lane("api.test")
			var grants []time.Time
			for d, n := range granted {
				for range n {
					grants = append(grants, l.clk.timeOf(d))
				}
			}
			if int(sent.Load()) != len(at) {
				t.Fatalf("%d requests succeeded, base saw %d", sent.Load(), len(at))
			}
			if len(at) < 1600 || len(grants) != len(at) {
				t.Fatalf("%d of 2000 sent, %d grants", len(at), len(grants))
			}
			for _, w := range []time.Duration{0, time.Millisecond, 10 * time.Millisecond, 100 * time.Millisecond, time.Second} {
				limit := int(float64(c.r)*w.Seconds()) + c.burst + 1
				got := upstream.MaxInWindow(grants, w+1)
				t.Logf("window %v: at most %d grants (bound %d), %d arrivals at the base", w, got, limit, upstream.MaxInWindow(at, w+1))
				if got > limit {
					t.Errorf("window %v: %d grants, bound rate x T + burst + 1 = %d", w, got, limit)
				}
			}
		})
	}
}

// TestSeedPriorityRealClock is the seed's strict-priority scenario on the
// real clock: 100/s, 1,000 batch calls queued at t=0, interactive calls at
// 20/s for 10 s. In 10 s the lane serves its 1,000 permits (give or take
// one), interactive calls all go first, and the batch gets the rest. The
// best of two runs counts, for
// a loaded runner (see TestPacingRealClock).
func TestSeedPriorityRealClock(t *testing.T) {
	if testing.Short() {
		t.Skip("real-clock run of 10 s")
	}
	var inter, batch int
	for try := range 2 {
		var waits []time.Duration
		inter, batch, waits = seedRealClock(t)
		t.Logf("run %d, in 10 s: %d served, %d interactive of 200 (p50 %v, p99 %v), %d batch",
			try, inter+batch, inter, stats.Quantile(waits, 0.5), stats.Quantile(waits, 0.99), batch)
		if inter+batch >= 990 && inter >= 199 && batch >= 790 {
			return
		}
	}
	t.Errorf("in 10 s: %d served (want about 1,000), %d of 200 interactive, %d batch (want >= 790)", inter+batch, inter, batch)
}

// seedRealClock runs the scenario of TestSeedPriorityRealClock once and
// returns the interactive and batch calls served in its 10 s, and the
// interactive calls' waits.
func seedRealClock(t *testing.T) (inter, batch int, waits []time.Duration) {
	base := &fakeBase{}
	tr := mustNew(t, base, WithRate(100, time.Second))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	for range 1000 {
		wg.Go(func() { get(WithPriority(ctx, Batch), tr, "batch") })
	}
	for {
		s, _ := tr.Stats().Lane("api.test")
		if s.Levels[Batch].Queued+int(s.Levels[Batch].Granted) == 1000 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	var mu sync.Mutex
	for i := range 200 {
		time.Sleep(time.Until(start.Add(time.Duration(i) * 50 * time.Millisecond)))
		wg.Go(func() {
			t0 := time.Now()
			if err := get(WithPriority(ctx, Interactive), tr, "interactive"); err != nil && ctx.Err() == nil {
				t.Error(err)
			}
			mu.Lock()
			waits = append(waits, time.Since(t0))
			mu.Unlock()
		})
	}
	time.Sleep(time.Until(start.Add(10 * time.Second)))
	cancel()
	wg.Wait()
	base.mu.Lock()
	defer base.mu.Unlock()
	for _, a := range base.arrivals {
		if a.at.Sub(start) >= 10*time.Second {
			continue
		}
		switch a.class {
		case "batch":
			batch++
		case "interactive":
			inter++
		}
	}
	return inter, batch, waits
}
