package sluice

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// getCost sends a GET through tr that costs n tokens.
func getCost(ctx context.Context, tr http.RoundTripper, n int, class string) error {
	return get(WithCost(ctx, "tokens", n), tr, class)
}

// TestBudgetPacesByCost: a budget of 6,000 tokens a minute (100/s, held
// in a bucket of 6,000) lets six 1,000-token calls go at once, then one
// every 10 s: the request rate is not what binds.
func TestBudgetPacesByCost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{}
		tr := mustNew(t, base, WithRate(600, time.Minute), WithBudget("tokens", 6000, time.Minute))
		start := time.Now()
		for range 9 {
			if err := getCost(t.Context(), tr, 1000, ""); err != nil {
				t.Fatal(err)
			}
		}
		want := []time.Duration{0, 100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond,
			400 * time.Millisecond, 500 * time.Millisecond, 10 * time.Second, 20 * time.Second, 30 * time.Second}
		for i, a := range base.times() {
			// The sixth call is paced by requests (10/s), the seventh by
			// tokens: 1,000 more tokens take 10 s from the first call.
			if d := a.Sub(start); d != want[i] {
				t.Errorf("call %d sent at %v, want %v", i, d, want[i])
			}
		}
	})
}

// TestBudgetCostTooLarge: a cost above the budget's size can never be
// paid: refused at once, as x/time/rate's WaitN refuses n above its burst.
func TestBudgetCostTooLarge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, &fakeBase{}, WithBudget("tokens", 6000, time.Minute))
		start := time.Now()
		err := getCost(t.Context(), tr, 6001, "")
		var rej *RejectedError
		if !errors.As(err, &rej) || rej.Reason != ReasonCost || rej.Budget != "tokens" || rej.Cost != 6001 || !errors.Is(err, ErrRejected) {
			t.Fatalf("cost 6001 of a 6000 budget: %v", err)
		}
		if time.Since(start) != 0 {
			t.Errorf("refused after %v, want at once", time.Since(start))
		}
		s, _ := tr.Stats().Lane("api.test")
		if s.Levels[Normal].Refused[ReasonCost] != 1 {
			t.Errorf("Refused[cost] = %d, want 1", s.Levels[Normal].Refused[ReasonCost])
		}
		// A budget the lane does not have costs nothing.
		if err := get(WithCost(t.Context(), "points", 1e6), tr, ""); err != nil {
			t.Errorf("cost of an unknown budget: %v", err)
		}
	})
}

// TestBudgetOrderAndCancel: waiters for the budget are served in priority
// order; a cancelled waiter gives back nothing it did not take and is not
// sent; a deadline that the budget's wait overruns is refused at once.
func TestBudgetOrderAndCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{}
		tr := mustNew(t, base, WithBudget("tokens", 1000, time.Second))
		if err := getCost(t.Context(), tr, 1000, "first"); err != nil { // empties the budget
			t.Fatal(err)
		}
		// Queued in this order: batch, a batch that will be cancelled,
		// interactive. 1,000 tokens refill per second.
		var wg sync.WaitGroup
		ctx, cancel := context.WithCancel(t.Context())
		wg.Go(func() { getCost(WithPriority(t.Context(), Batch), tr, 500, "batch") })
		synctest.Wait()
		wg.Go(func() {
			if err := getCost(WithPriority(ctx, Batch), tr, 900, "cancelled"); !errors.Is(err, context.Canceled) {
				t.Errorf("cancelled waiter: %v", err)
			}
		})
		synctest.Wait()
		wg.Go(func() { getCost(WithPriority(t.Context(), Interactive), tr, 500, "interactive") })
		synctest.Wait()
		// Wants 1,000 tokens within 100 ms: the queue ahead needs 1.9 s.
		dctx, dcancel := context.WithTimeout(WithPriority(t.Context(), Batch), 100*time.Millisecond)
		var rej *RejectedError
		if err := getCost(dctx, tr, 100, "deadline"); !errors.As(err, &rej) || rej.Reason != ReasonDeadline {
			t.Errorf("waiter whose deadline the budget overruns: %v", err)
		}
		dcancel()
		cancel()
		wg.Wait()
		var order []string
		for _, a := range base.arrivals {
			order = append(order, a.class)
		}
		if got := len(order); got != 3 || order[1] != "interactive" || order[2] != "batch" {
			t.Fatalf("sent %v, want first, interactive, batch", order)
		}
		// Interactive after 0.5 s, batch after 1 s: the cancelled waiter's
		// 900 tokens were never taken.
		if d := base.arrivals[2].at.Sub(base.arrivals[0].at); d != time.Second {
			t.Errorf("batch sent %v after the first call, want 1s", d)
		}
	})
}

// TestBudgetFollowsServer: what the server says remains of a budget of the
// same name replaces the lane's estimate, less what the lane sent since:
// estimates that were too high give their excess back, too low take it.
func TestBudgetFollowsServer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		remaining := "5000"
		base := &fakeBase{answer: func(*http.Request) *http.Response {
			resp := answerWith(0, 200)(nil)
			resp.Header.Set("X-Ratelimit-Remaining-Tokens", remaining)
			resp.Header.Set("X-Ratelimit-Reset-Tokens", "10s")
			return resp
		}}
		tr := mustNew(t, base, WithBudget("tokens", 6000, time.Minute))
		l := tr.lane("api.test")
		tokens := func() float64 {
			l.mu.Lock()
			defer l.mu.Unlock()
			return l.budgets[0].b.advance(l.tick())
		}
		// Estimated 3,000; the server says 5,000 remain (it cost 1,000).
		if err := getCost(t.Context(), tr, 3000, ""); err != nil {
			t.Fatal(err)
		}
		if got := tokens(); got != 5000 {
			t.Errorf("after an overestimate: %v tokens, want the server's 5000", got)
		}
		remaining = "1000"
		if err := getCost(t.Context(), tr, 1000, ""); err != nil {
			t.Fatal(err)
		}
		if got := tokens(); got != 1000 {
			t.Errorf("after an underestimate: %v tokens, want the server's 1000", got)
		}
	})
}

// TestReport: the caller reports what a call really cost, from its body:
// the lane refunds what the estimate took beyond it.
func TestReport(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{}
		tr := mustNew(t, base, WithBudget("tokens", 6000, time.Minute))
		req, _ := http.NewRequestWithContext(WithCost(t.Context(), "tokens", 4000), "GET", "http://api.test/", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		tr.Report(resp, "tokens", 1500)
		l := tr.lane("api.test")
		l.mu.Lock()
		got := l.budgets[0].b.advance(l.tick())
		l.mu.Unlock()
		if got != 4500 {
			t.Errorf("after reporting 1500 of an estimated 4000: %v tokens, want 4500", got)
		}
	})
}

// TestBudgetOvertaken: an attempt granted earlier reaches the server after
// one granted later (here it is held on its way), so the later one's
// response states a count that does not include it yet. The lane must
// keep the earlier attempt's cost taken, not take the server's count as
// if it were paid: before, it held 9,000 tokens where the server would
// have 5,000 once the held attempt arrived, and sent what it then refused.
func TestBudgetOvertaken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		remaining := 10000
		hold := make(chan struct{})
		base := rtFunc(func(req *http.Request) (*http.Response, error) {
			if req.Header.Get("X-Hold") != "" {
				<-hold
			}
			cost, _ := strconv.Atoi(req.Header.Get("X-Cost"))
			mu.Lock()
			remaining -= cost
			h := http.Header{}
			h.Set("X-Ratelimit-Limit-Tokens", "10000")
			h.Set("X-Ratelimit-Remaining-Tokens", strconv.Itoa(remaining))
			h.Set("X-Ratelimit-Reset-Tokens", "1m0s")
			mu.Unlock()
			return &http.Response{StatusCode: 200, Header: h, Body: http.NoBody, Request: req}, nil
		})
		tr := mustNew(t, base, WithBudget("tokens", 10000, time.Hour))
		defer tr.Close()
		send := func(cost int, held bool) error {
			req, _ := http.NewRequestWithContext(WithCost(t.Context(), "tokens", cost), "GET", "http://api.test/", nil)
			req.Header.Set("X-Cost", strconv.Itoa(cost))
			if held {
				req.Header.Set("X-Hold", "1")
			}
			resp, err := tr.RoundTrip(req)
			if err == nil {
				resp.Body.Close()
			}
			return err
		}
		l := tr.lane("api.test")
		tokens := func() float64 {
			l.mu.Lock()
			defer l.mu.Unlock()
			return l.budgets[0].b.advance(l.tick())
		}
		held := make(chan error)
		go func() { held <- send(4000, true) }()
		synctest.Wait() // granted and held on its way to the server
		if err := send(1000, false); err != nil {
			t.Fatal(err)
		}
		if got := tokens(); got > 5000 {
			t.Errorf("after a later attempt's response while an earlier one is on its way: %v tokens, want at most the 5,000 the server will hold", got)
		}
		close(hold)
		if err := <-held; err != nil {
			t.Fatal(err)
		}
		if got := tokens(); got > 5000 {
			t.Errorf("after both responses: %v tokens, want at most the server's 5,000", got)
		}
		l.mu.Lock()
		out, unanswered := l.budgets[0].out, len(l.out)
		l.mu.Unlock()
		if out != 0 || unanswered != 0 {
			t.Errorf("after every response: %v tokens in %d charges still counted unanswered, want none", out, unanswered)
		}
	})
}

// The margin for underestimates covers the cost of a request and that of
// the attempts still unanswered, each of which may also have cost more
// than its estimate, within the bucket's size.
func TestBudgetNeedCoversUnanswered(t *testing.T) {
	b := budget{b: bucket{burst: 10000}, margin: 0.5, out: 4000}
	if got := b.need(1000); got != 1000+0.5*(1000+4000) {
		t.Errorf("need(1000) with margin 0.5 and 4,000 unanswered = %v, want 3500", got)
	}
	b.out = 40000
	if got := b.need(1000); got != 10000 {
		t.Errorf("need(1000) with 40,000 unanswered = %v, want the bucket's size, 10000", got)
	}
}
