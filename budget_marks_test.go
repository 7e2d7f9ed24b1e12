package sluice

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/internal/verdict"
)

// tokenCountServer models an OpenAI-style token budget that
// refills slowly (an hour): each arrival takes its X-Cost; one that costs
// more than what remains is refused (429, an overspend). Every answer
// states what remains. A request with X-Hold waits on hold[name] after
// its arrival has been counted (the server's count is taken at arrival,
// as the lane assumes: see budgets.points).
type tokenCountServer struct {
	mu        sync.Mutex
	remaining int
	refused   int
	hold      map[string]chan struct{}
}

func (s *tokenCountServer) RoundTrip(req *http.Request) (*http.Response, error) {
	cost, _ := strconv.Atoi(req.Header.Get("X-Cost"))
	s.mu.Lock()
	status := 200
	if cost > s.remaining {
		s.refused++
		status = http.StatusTooManyRequests
	} else {
		s.remaining -= cost
	}
	left := s.remaining
	ch := s.hold[req.Header.Get("X-Hold")]
	s.mu.Unlock()
	if ch != nil {
		<-ch
	}
	h := http.Header{}
	h.Set("X-Ratelimit-Limit-Tokens", "10000")
	h.Set("X-Ratelimit-Remaining-Tokens", strconv.Itoa(left))
	h.Set("X-Ratelimit-Reset-Tokens", "1h0m0s")
	return &http.Response{StatusCode: status, Header: h, Body: http.NoBody, Request: req}, nil
}

// sendTokens sends a GET costing cost tokens (also told the server in X-Cost),
// held at the server on hold[held] if held is not "".
func sendTokens(ctx context.Context, tr http.RoundTripper, cost int, held string) (*http.Response, error) {
	req, _ := http.NewRequestWithContext(WithCost(ctx, "tokens", cost), "GET", "http://api.test/v1/chat", nil)
	req.Header.Set("X-Cost", strconv.Itoa(cost))
	if held != "" {
		req.Header.Set("X-Hold", held)
	}
	resp, err := tr.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
	}
	return resp, err
}

// laneLevel returns what lane key of tr holds of its first budget now.
func laneLevel(tr *Transport, key string) float64 {
	l := tr.find(key)
	l.lock()
	defer l.unlock()
	return l.budgets.bs[0].b.Level(l.clk.tick())
}

// TestBudgetRepayKeepsLaterMarks: A (4,000) and B (1,000) are
// granted; A is not sent and given back. The server, which had 3,000
// spent by others, counts B only and says 6,000 remain, with nothing
// granted since B and nothing unanswered: the lane holds 6,000. The give
// back moves what B counts as granted since it unless B's mark moves too
// (the lane held 10,000).
func TestBudgetRepayKeepsLaterMarks(t *testing.T) {
	bs := newBudgets([]budgetConfig{{"tokens", 10000, time.Hour}})
	a, b := mustCharge(t, &bs, 4000), mustCharge(t, &bs, 1000)
	bs.pay(0, a)
	bs.pay(0, b)
	bs.repay(0, a) // A was not sent
	var left [maxBudgets]int64
	left[0] = 6000
	bs.observe(0, 0, &left, b, verdict.Points{})
	if got := bs.bs[0].b.Level(0); got > 6000 {
		t.Errorf("after B's response (6,000 remain, nothing granted since, nothing unanswered): lane holds %v, want the server's 6000", got)
	}
}

// TestBudgetDroppedSublimitGrant: TestBudgetRepayKeepsLaterMarks through
// the Transport. A call that names a sub-limit (a model) takes its budget's
// cost there, then waits for the host's slot; cancelled while it waits,
// its cost is given back (repay). A call granted after it is answered
// with the server's count, and the lane then holds more than the server:
// it sends a call the server refuses.
func TestBudgetDroppedSublimitGrant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &tokenCountServer{remaining: 10000, hold: map[string]chan struct{}{"a": make(chan struct{})}}
		tr := mustNew(t, srv, WithConcurrency(1, 1), WithRetry(0), WithBudget("tokens", 10000, time.Hour))
		defer tr.Close()
		ctx := WithSublimit(t.Context(), "gpt-4o")
		var wg sync.WaitGroup
		defer wg.Wait()
		wg.Go(func() { sendTokens(ctx, tr, 1000, "a") }) // A: holds the host's only slot
		synctest.Wait()
		bctx, cancelB := context.WithCancel(ctx)
		wg.Go(func() { // B: 4,000 taken on the sub-limit, waits for the host's slot
			if _, err := sendTokens(bctx, tr, 4000, ""); !errors.Is(err, context.Canceled) {
				t.Errorf("B: %v, want cancelled", err)
			}
		})
		synctest.Wait()
		wg.Go(func() { // C: 1,000 taken on the sub-limit after B's
			if resp, err := sendTokens(ctx, tr, 1000, ""); err != nil || resp.StatusCode != 200 {
				t.Errorf("C: %v", err)
			}
		})
		synctest.Wait()
		cancelB() // B is given back: never sent
		synctest.Wait()
		close(srv.hold["a"]) // A answered (9,000 remain), then C is sent (8,000)
		wg.Wait()
		sub := "api.test" + subSep + "gpt-4o"
		if got := laneLevel(tr, sub); got > 8000 {
			t.Errorf("the sub-limit holds %v tokens after C's answer, the server 8000", got)
		}
		// 9,000 tokens: more than the server holds, no more than the lane
		// thinks it holds. The lane must not send it (it would wait for
		// the server's refill: an hour).
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		resp, err := sendTokens(dctx, tr, 9000, "")
		if err == nil && resp.StatusCode == http.StatusTooManyRequests {
			t.Errorf("sent a call of 9,000 tokens with the server at 8,000: refused by the server (%d overspends)", srv.refused)
		}
	})
}

// TestBudgetPointsKeepLaterMarks: queries A and B of 100
// points each are granted, A then B. A's answer: it cost 10, 990 remain
// (B not arrived yet). B arrives (890) and its answer says 890 remain,
// nothing granted since, nothing unanswered: the lane holds 890. A's
// actual cost moves what B counts as granted since it unless B's mark
// moves too (the lane held 980).
func TestBudgetPointsKeepLaterMarks(t *testing.T) {
	bs := newBudgets([]budgetConfig{{"points", 1000, 20 * time.Second}}) // 50 a second
	a, b := mustCharge(t, &bs, 100), mustCharge(t, &bs, 100)
	bs.pay(0, a)
	bs.pay(0, b)
	var left [maxBudgets]int64
	left[0] = -1
	bs.observe(0, 0, &left, a, verdict.Points{Stated: true, Requested: 100, Actual: 10, Max: 1000, Available: 990, Restore: 50})
	if got := bs.bs[0].b.Level(0); got != 890 {
		t.Fatalf("after A's answer: %v points, want 890 (990 less B's 100 granted since)", got)
	}
	left[0] = -1
	bs.observe(0, 0, &left, b, verdict.Points{Stated: true, Requested: 100, Actual: 100, Max: 1000, Available: 890, Restore: 50})
	if got := bs.bs[0].b.Level(0); got > 890 {
		t.Errorf("after B's answer (890 available, nothing since, nothing unanswered): lane holds %v points, want the server's 890", got)
	}
}

// TestBudgetPanickingBaseAnswersCharge: the base panics on a call of
// 5,000 tokens (the server never saw it). Its charge is taken as answered:
// left unanswered (up to 4,096 later charges), every later server count
// would be taken less those 5,000, and a lane whose server holds 9,000
// would hold 4,000 and make a call of 6,000 wait for the refill.
func TestBudgetPanickingBaseAnswersCharge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &tokenCountServer{remaining: 10000}
		base := rtFunc(func(req *http.Request) (*http.Response, error) {
			if req.Header.Get("X-Panic") != "" {
				panic("base transport panics")
			}
			return srv.RoundTrip(req)
		})
		tr := mustNew(t, base, WithRetry(0), WithBudget("tokens", 10000, time.Hour))
		defer tr.Close()
		func() {
			defer func() { recover() }()
			req, _ := http.NewRequestWithContext(WithCost(t.Context(), "tokens", 5000), "GET", "http://api.test/v1/chat", nil)
			req.Header.Set("X-Panic", "1")
			tr.RoundTrip(req)
		}()
		for range 3 { // ordinary calls, answered with the server's count
			if _, err := sendTokens(t.Context(), tr, 300, ""); err != nil {
				t.Fatal(err)
			}
		}
		srv.mu.Lock()
		server := srv.remaining
		srv.mu.Unlock()
		if got := laneLevel(tr, "api.test"); got < float64(server)-1 {
			t.Errorf("lane holds %v tokens, the server %d: the panicked call's 5,000 are still counted unanswered", got, server)
		}
		start := time.Now()
		if _, err := sendTokens(t.Context(), tr, 6000, ""); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("a call of 6,000 tokens waited %v with the server holding %d", d, server)
		}
	})
}

// TestBudgetCostlessCallOvertaken: X (no cost: a list of models) reaches
// the server when 10,000 remain and is answered late; meanwhile A (6,000)
// is sent and answered (4,000 remain). X's answer then says 10,000, a
// count that A overtook: the lane keeps 4,000, and waits rather than send
// a call of 6,000 that the server would refuse.
func TestBudgetCostlessCallOvertaken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &tokenCountServer{remaining: 10000, hold: map[string]chan struct{}{"x": make(chan struct{})}}
		tr := mustNew(t, srv, WithRetry(0), WithBudget("tokens", 10000, time.Hour))
		defer tr.Close()
		done := make(chan struct{})
		go func() {
			defer close(done)
			req, _ := http.NewRequestWithContext(t.Context(), "GET", "http://api.test/v1/models", nil)
			req.Header.Set("X-Hold", "x")
			if resp, err := tr.RoundTrip(req); err == nil {
				resp.Body.Close()
			}
		}()
		synctest.Wait()
		if _, err := sendTokens(t.Context(), tr, 6000, ""); err != nil {
			t.Fatal(err)
		}
		close(srv.hold["x"])
		<-done
		if got := laneLevel(tr, "api.test"); got > 4000+1 {
			t.Errorf("lane holds %v tokens, the server 4000", got)
		}
		dctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if resp, err := sendTokens(dctx, tr, 6000, ""); err == nil && resp.StatusCode == http.StatusTooManyRequests {
			t.Errorf("sent a call of 6,000 tokens with the server at 4,000: refused by the server")
		}
	})
}

// TestBudgetReportAfterServerCount: the server takes a call's 4,000
// estimate and says 6,000 remain; the caller then reports that it used
// 1,000. The server's count holds the call's cost as the server charged
// it: Report changes nothing, where a refund on top of the count would
// leave the lane at 9,000.
func TestBudgetReportAfterServerCount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &tokenCountServer{remaining: 10000}
		tr := mustNew(t, srv, WithRetry(0), WithBudget("tokens", 10000, time.Hour))
		defer tr.Close()
		resp, err := sendTokens(t.Context(), tr, 4000, "")
		if err != nil {
			t.Fatal(err)
		}
		tr.Report(resp, "tokens", 1000)
		if got := laneLevel(tr, "api.test"); got > 6000+1 {
			t.Errorf("after the server's count (6,000) and Report: lane holds %v tokens", got)
		}
	})
}

// TestBudgetCostRefusalNamesSize: a cost over a budget's size is refused
// at once, and the error names the size.
func TestBudgetCostRefusalNamesSize(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, &fakeBase{}, WithBudget("tokens", 6000, time.Minute))
		err := getCost(t.Context(), tr, 6001, "")
		if err == nil || !strings.Contains(err.Error(), "6000") {
			t.Errorf("refusal of 6,001 of a 6,000 budget: %q does not name the size", err)
		}
	})
}

// TestBudgetDeclinedLeaser: a lane whose Leaser declines it takes its
// tokens with Take, and keeps its budgets as its own. A budget of 1,000
// tokens an hour; three calls of 1,000 tokens each with a second's
// deadline: only the first is sent, the others need the refill.
func TestBudgetDeclinedLeaser(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{}
		d := &fakeLeaser{memBackend: *newMemBackend(), decline: true}
		tr := mustNew(t, base, WithBackend(d), WithRetry(0), WithBudget("tokens", 1000, time.Hour))
		defer tr.Close()
		for range 3 {
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			getCost(ctx, tr, 1000, "")
			cancel()
		}
		synctest.Wait()
		if n := len(base.times()); n != 1 {
			t.Errorf("%d calls of 1,000 tokens sent within a second on a budget of 1,000 an hour, want 1", n)
		}
	})
}

// TestBudgetShopifyOverlappingQueries: TestBudgetPointsKeepLaterMarks
// through the Transport, against shopifyBase (Shopify's bucket of 1,000
// points restoring 50 a second). Two queries overlap (500 and 400 points
// requested; 150 and 160 actual); once both are answered the server's
// bucket holds about 700 points, and so does the lane: it does not send a
// query of 900 points, which would be throttled. Without the first's
// refund moving the second's mark, the lane held its full 1,000.
func TestBudgetShopifyOverlappingQueries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &shopifyBase{size: 1000, restore: 50, latency: 150 * time.Millisecond, level: 1000}
		tr := mustNew(t, base, WithRate(20, time.Second), WithBudget("points", 1000, 20*time.Second), WithRetry(0))
		defer tr.Close()
		query := func(c int) {
			req, _ := http.NewRequestWithContext(WithCost(t.Context(), "points", c), "POST", "https://shop.test/admin/api/2025-01/graphql.json", nil)
			req.Header.Set("X-Query-Cost", strconv.Itoa(c))
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
		}
		var wg sync.WaitGroup
		wg.Go(func() { query(500) })
		synctest.Wait()
		wg.Go(func() { query(400) })
		wg.Wait()
		base.mu.Lock()
		base.fill(time.Now())
		server := base.level
		base.mu.Unlock()
		if got := laneLevel(tr, "shop.test"); got > server+1 {
			t.Errorf("after both answers the lane holds %v points, the server's bucket %.0f", got, server)
		}
		query(900)
		base.mu.Lock()
		defer base.mu.Unlock()
		if base.throttled != 0 {
			t.Errorf("a query of 900 points sent with the bucket at %.0f: %d throttled", server, base.throttled)
		}
	})
}
