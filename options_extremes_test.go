package sluice

import (
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// TestHugePeriodKeepsRate: A rate of one request per (almost) 292 years is legal. The documented
// bound, rate x T + burst + 1, allows 2 requests in an hour. A dispatcher
// that sleeps for a token and is woken early (a release, with a few
// attempts in flight) computes when the token is due as a Duration that
// overflows, and grants at once.
func TestHugePeriodKeepsRate(t *testing.T) {
	for _, c := range []struct {
		name string
		opts []Option
	}{
		{"MaxInt64", []Option{WithRate(1, time.Duration(math.MaxInt64))}},
		{"200y-headroom0.5", []Option{WithRate(1, 200*365*24*time.Hour), WithHeadroom(0.5)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &fakeBase{latency: 10 * time.Millisecond}
				tr := mustNew(t, base, append(c.opts, WithConcurrency(8, 8))...)
				defer tr.Close()
				ctx, cancel := context.WithCancel(t.Context())
				var wg sync.WaitGroup
				for range 20 {
					wg.Go(func() {
						for ctx.Err() == nil {
							get(ctx, tr, "")
						}
					})
				}
				time.Sleep(time.Hour)
				cancel()
				wg.Wait()
				if n := len(base.times()); n > 2 {
					t.Errorf("1 per %s: %d requests sent within an hour, bound rate x T + burst + 1 = 2", c.name, n)
				}
			})
		})
	}
}

// TestHugeMaxRetryAfterKeepsCooldown: WithMaxRetryAfter(math.MaxInt64) ("no cap") is legal. A 429 whose
// Retry-After asks for a wait too long for a Duration (it saturates) must
// pause the lane, not be lost to an overflow of now + wait: the lane then
// sends on at once.
func TestHugeMaxRetryAfterKeepsCooldown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{answer: answerWith(3, 429, "Retry-After: 99999999999")}
		tr := mustNew(t, base, WithRetry(0), WithMaxRetryAfter(time.Duration(math.MaxInt64)))
		defer tr.Close()
		tr.lane("api.test")
		time.Sleep(time.Second) // the lane's clock must not read 0, where now + wait does not overflow
		for range 3 {
			ctx, cancel := context.WithTimeout(t.Context(), time.Hour)
			get(ctx, tr, "")
			cancel()
		}
		if n := len(base.times()); n > 1 {
			t.Errorf("%d requests sent; want the lane paused after the first 429", n)
		}
	})
}

// TestBudgetDemandSaturates: A Leaser reads what a lane wants of each budget: legal budgets of a
// huge size or period must not reach it as negative numbers.
func TestBudgetDemandSaturates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeLeaser{memBackend: *newMemBackend()}
		tr := mustNew(t, &okBase{}, WithRate(10, time.Second), WithBackend(f), WithRetry(0),
			WithBudget("slow", 1, time.Duration(math.MaxInt64)), WithBudget("big", math.MaxInt, 3000*time.Hour))
		defer tr.Close()
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		get(ctx, tr, "")
		ds := f.demands()
		if len(ds) != 1 {
			t.Fatalf("%d demands", len(ds))
		}
		for _, b := range ds[0].Budgets {
			if b.Size <= 0 || b.Per <= 0 {
				t.Errorf("budget %q: demand Size %d, Per %v; want both positive", b.Name, b.Size, b.Per)
			}
		}
	})
}

// TestSlowRateNotRaisedBy429: WithRate(100, 24h) is a daily limit; one 429 must not raise the lane's
// pace to the feedback's floor of one request per 100 s (864 a day): the
// bound rate x T + burst + 1 holds after a refusal too.
func TestSlowRateNotRaisedBy429(t *testing.T) {
	for _, per := range []time.Duration{time.Hour, 24 * time.Hour} {
		t.Run(per.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const n = 100
				base := &fakeBase{answer: answerWith(1, 429, "Retry-After: 1")}
				tr := mustNew(t, base, WithRate(n, per), WithRetry(0))
				defer tr.Close()
				ctx, cancel := context.WithCancel(t.Context())
				var wg sync.WaitGroup
				for range 4 {
					wg.Go(func() {
						for ctx.Err() == nil {
							get(ctx, tr, "")
						}
					})
				}
				const T = time.Hour
				time.Sleep(T)
				cancel()
				wg.Wait()
				sent := len(base.times())
				if bound := float64(n)*T.Seconds()/per.Seconds() + 1 + 1; float64(sent) > bound {
					t.Errorf("WithRate(%d, %v): %d sent in %v after a 429, bound rate x T + burst + 1 = %.1f", n, per, sent, T, bound)
				}
			})
		})
	}
}

// TestKeyWithNULIsNoSublimit: A key is any string WithKey returns; one that holds "\x00" must not
// alias the lane of a sub-limit (whose key is host + "\x00" + name), which
// has no rate of its own: requests under that key would go unpaced.
func TestKeyWithNULIsNoSublimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{}
		key := func(r *http.Request) string { return strings.TrimPrefix(r.URL.Path, "/") }
		tr := mustNew(t, base, WithRate(1, time.Second), WithKey(key), WithRetry(0))
		defer tr.Close()
		send := func(ctx context.Context, path string) {
			req, err := http.NewRequestWithContext(ctx, "GET", "http://api.test/"+path, nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp, err := tr.RoundTrip(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
		send(WithSublimit(t.Context(), "m"), "a") // makes the lane "a" and its sub-limit "m"
		start := len(base.times())
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		for range 100 {
			send(ctx, "a%00m") // its key is "a\x00m"
		}
		if n := len(base.times()) - start; n > 12 {
			t.Errorf("key %q at 1/s: %d sent in 10 s; its requests went through the sub-limit's unpaced lane", "a\x00m", n)
		}
	})
}

// TestStatsKeepsNoIdleLane: Reading Stats (as a metrics exporter does every scrape) is no use of a
// lane: an idle lane must still be forgotten after WithLaneIdle.
func TestStatsKeepsNoIdleLane(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, nopBase{}, WithKey(byHost), WithLaneIdle(time.Minute))
		defer tr.Close()
		for _, k := range []string{"a", "b"} {
			if _, err := sendKey(t.Context(), tr, k); err != nil {
				t.Fatal(err)
			}
		}
		for range 60 { // ten minutes, a scrape every 10 s
			time.Sleep(10 * time.Second)
			tr.Stats()
		}
		if n := tr.nLanes.Load(); n != 0 {
			t.Errorf("%d lanes idle for 10 min (WithLaneIdle 1 min) kept: Stats counts as a use", n)
		}
	})
}

// TestLeaserKeepsNoIdleLane: A Leaser asks every lane for its demand, and grants it shares, on its
// own schedule, idle or not: that is no use of the lane either.
func TestLeaserKeepsNoIdleLane(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeLeaser{memBackend: *newMemBackend()}
		tr := mustNew(t, &okBase{}, WithRate(10, time.Second), WithBackend(f), WithRetry(0), WithLaneIdle(time.Minute))
		defer tr.Close()
		f.grantAll(Share{Rate: 10, Burst: 1, InFlight: -1})
		go f.grantAll(Share{Rate: 10, Burst: 1, InFlight: -1})
		errc := make(chan error)
		go func() { errc <- get(t.Context(), tr, "") }()
		synctest.Wait()
		f.grantAll(Share{Rate: 10, Burst: 1, InFlight: -1})
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		for range 60 { // ten minutes, a refresh every 10 s
			time.Sleep(10 * time.Second)
			f.demands()
			f.grantAll(Share{Rate: 10, Burst: 1, InFlight: -1})
		}
		if n := tr.nLanes.Load(); n != 0 {
			t.Errorf("%d lanes idle for 10 min (WithLaneIdle 1 min) kept: the Leaser's refreshes count as a use", n)
		}
	})
}

// TestRateUnderflowRefused: WithRate and WithSublimitRate with a
// headroom so small that n/per x headroom underflows to 0 leave the lane
// (or sub-limit) unpaced, since a rate of 0 means "no rate" (1 an hour
// configured, 400 a second sent): New refuses the combination.
func TestRateUnderflowRefused(t *testing.T) {
	for _, c := range []struct {
		opts []Option
		want string
	}{
		{[]Option{WithRate(1, time.Hour), WithHeadroom(5e-324)}, "WithRate(1, 1h0m0s)"},
		{[]Option{WithSublimitRate("m", 1, time.Hour), WithHeadroom(5e-324)}, `WithSublimitRate("m", 1, 1h0m0s)`},
	} {
		_, err := New(nil, c.opts...)
		if !errors.Is(err, ErrInvalidOption) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New = %v; want an invalid option naming %s", err, c.want)
		}
	}
}
