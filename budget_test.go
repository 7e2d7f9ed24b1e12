package sluice

import (
	"context"
	"errors"
	"github.com/sluice-go/sluice/internal/pace"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/internal/verdict"
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
// Seen through the send times of the calls that follow (see
// TestBudgetsFollowServer for the counts).
func TestBudgetFollowsServer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		remaining := "5000"
		base := tokensLeft(&remaining)
		tr := mustNew(t, base, WithBudget("tokens", 6000, time.Minute)) // 100 a second
		start := time.Now()
		// Estimated 3,000; the server says 5,000 remain (it cost 1,000).
		if err := getCost(t.Context(), tr, 3000, ""); err != nil {
			t.Fatal(err)
		}
		// Estimated 1,000; the server says 1,000 remain (it cost 4,000).
		// Sent at once: the lane holds the server's 5,000, where its own
		// count, 3,000, would have made it wait.
		remaining = "1000"
		if err := getCost(t.Context(), tr, 1000, ""); err != nil {
			t.Fatal(err)
		}
		// The lane holds the server's 1,000, not its own 4,000, and learned
		// a margin of 1 (the largest) from the underestimate: 1,000 more
		// need 2,000 held, 10 s away.
		if err := getCost(t.Context(), tr, 1000, ""); err != nil {
			t.Fatal(err)
		}
		want := []time.Duration{0, 0, 10 * time.Second}
		for i, a := range base.times() {
			if d := a.Sub(start); d != want[i] {
				t.Errorf("call %d sent at %v, want %v", i, d, want[i])
			}
		}
	})
}

// TestBudgetsFollowServer: what a response says remains, the part takes,
// less what was granted since the attempt, plus what refilled since it was
// sent: both an overestimate and an underestimate give way to it.
func TestBudgetsFollowServer(t *testing.T) {
	bs := newBudgets([]budgetConfig{{"tokens", 6000, time.Minute}}) // 100 a second
	var left [maxBudgets]int64
	respond := func(now, sent time.Duration, remaining int64, ch *charge) {
		left[0] = remaining
		bs.observe(now, sent, &left, ch, verdict.Points{})
	}
	// Estimated 3,000; the server says 5,000 remain.
	ch := mustCharge(t, &bs, 3000)
	bs.pay(0, ch)
	respond(0, 0, 5000, ch)
	if got := bs.bs[0].b.Level(0); got != 5000 {
		t.Errorf("after an overestimate: %v tokens, want the server's 5000", got)
	}
	// Estimated 1,000; the server says 1,000 remain.
	ch = mustCharge(t, &bs, 1000)
	bs.pay(0, ch)
	respond(0, 0, 1000, ch)
	if got := bs.bs[0].b.Level(0); got != 1000 {
		t.Errorf("after an underestimate: %v tokens, want the server's 1000", got)
	}
	// Sent at 10 s and answered at 11 s, while 500 more were granted: the
	// server's count was taken when it admitted the attempt.
	ch = mustCharge(t, &bs, 200)
	bs.pay(10*time.Second, ch)
	bs.pay(10*time.Second, mustCharge(t, &bs, 500))
	respond(11*time.Second, 10*time.Second, 2000, ch)
	if got := bs.bs[0].b.Level(11 * time.Second); got != 2000+100-500 {
		t.Errorf("after a response a second after its send, 500 granted since: %v tokens, want 1600", got)
	}
}

// mustCharge returns the charge of a call costing n of the first budget.
func mustCharge(t *testing.T, bs *budgets, n float64) *charge {
	t.Helper()
	ch, over := bs.chargeOf(&cost{name: bs.name(0), n: n})
	if ch == nil || over != nil {
		t.Fatalf("charge of %v: %v, over %v", n, ch, over)
	}
	return ch
}

// TestReport: the caller reports what a call really cost, from its body:
// the lane refunds what the estimate took beyond it. Seen through the
// send times of the calls that follow (see TestBudgetsAdjust for the
// count).
func TestReport(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{}
		tr := mustNew(t, base, WithBudget("tokens", 6000, time.Minute)) // 100 a second
		start := time.Now()
		req, _ := http.NewRequestWithContext(WithCost(t.Context(), "tokens", 4000), "GET", "http://api.test/", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		tr.Report(resp, "tokens", 1500)
		tr.Report(resp, "points", 1) // a budget the lane does not have
		tr.Report(nil, "tokens", 1)  // no response
		tr.Report(&http.Response{}, "tokens", 1)
		other, _ := http.NewRequestWithContext(WithCost(t.Context(), "tokens", 4000), "GET", "http://other.test/", nil)
		tr.Report(&http.Response{Request: other}, "tokens", 0) // a lane that does not exist
		// 4,500 are held: a call of 4,500 goes at once, and 100 more then
		// take a second.
		if err := getCost(t.Context(), tr, 4500, ""); err != nil {
			t.Fatal(err)
		}
		if err := getCost(t.Context(), tr, 100, ""); err != nil {
			t.Fatal(err)
		}
		want := []time.Duration{0, 0, time.Second}
		for i, a := range base.times() {
			if d := a.Sub(start); d != want[i] {
				t.Errorf("call %d sent at %v, want %v (after reporting 1500 of an estimated 4000, 4500 held)", i, d, want[i])
			}
		}
	})
}

// TestBudgetsAdjust: an actual cost below the estimate is refunded, one
// above it charged, within the bucket's size.
func TestBudgetsAdjust(t *testing.T) {
	bs := newBudgets([]budgetConfig{{"tokens", 6000, time.Minute}, {"points", 10, time.Second}})
	ch := mustCharge(t, &bs, 4000)
	bs.pay(0, ch)
	bs.answered(ch)
	if i := bs.index("points"); i != 1 {
		t.Fatalf("index(points) = %d, want 1", i)
	}
	if i := bs.index("requests"); i != -1 {
		t.Fatalf("index of a budget it does not have = %d, want -1", i)
	}
	bs.adjust(0, 0, 4000, 1500)
	if got := bs.bs[0].b.Level(0); got != 4500 {
		t.Errorf("after reporting 1500 of an estimated 4000: %v tokens, want 4500", got)
	}
	bs.adjust(0, 0, 1000, 2000)
	if got := bs.bs[0].b.Level(0); got != 3500 {
		t.Errorf("after reporting 2000 of an estimated 1000: %v tokens, want 3500", got)
	}
	bs.adjust(0, 0, 5000, 0)
	if got := bs.bs[0].b.Level(0); got != 6000 {
		t.Errorf("after a refund past the size: %v tokens, want the size, 6000", got)
	}
}

// TestBudgetOvertaken: an attempt granted earlier reaches the server after
// one granted later (here it is held on its way), so the later one's
// response states a count that does not include it yet. The lane must
// keep the earlier attempt's cost taken, not take the server's count as
// if it were paid: before, it held 9,000 tokens where the server would
// have 5,000 once the held attempt arrived, and sent what it then refused.
// Seen through a call the server could not pay, which the lane must not
// send (see TestBudgetsOvertaken for the counts).
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
		send := func(ctx context.Context, cost int, held bool) error {
			req, _ := http.NewRequestWithContext(WithCost(ctx, "tokens", cost), "GET", "http://api.test/", nil)
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
		// 6,000 tokens, more than the server's 5,000 once both attempts
		// are in: refused at once for a deadline the budget's refill (2.8
		// a second) overruns, where holding 9,000 the lane sent it.
		unpayable := func(when string) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			var rej *RejectedError
			if err := send(ctx, 6000, false); !errors.As(err, &rej) || rej.Reason != ReasonDeadline {
				t.Errorf("%s: a call of 6,000 tokens the server cannot pay: %v, want refused for its deadline", when, err)
			}
		}
		held := make(chan error)
		go func() { held <- send(t.Context(), 4000, true) }()
		synctest.Wait() // granted and held on its way to the server
		if err := send(t.Context(), 1000, false); err != nil {
			t.Fatal(err)
		}
		unpayable("after a later attempt's response while an earlier one is on its way")
		close(hold)
		if err := <-held; err != nil {
			t.Fatal(err)
		}
		unpayable("after both responses")
	})
}

// TestBudgetsOvertaken: a response to an attempt granted after one not
// answered yet counts the earlier one as taken, and teaches no margin;
// once every charge is answered none is counted unanswered.
func TestBudgetsOvertaken(t *testing.T) {
	bs := newBudgets([]budgetConfig{{"tokens", 10000, time.Hour}})
	var left [maxBudgets]int64
	early, late := mustCharge(t, &bs, 4000), mustCharge(t, &bs, 1000)
	bs.pay(0, early)
	bs.pay(0, late)
	// The later attempt reaches the server first: 9,000 remain.
	left[0] = 9000
	bs.observe(0, 0, &left, late, verdict.Points{})
	if got := bs.bs[0].b.Level(0); got > 5000 {
		t.Errorf("after a later attempt's response while an earlier one is on its way: %v tokens, want at most the 5,000 the server will hold", got)
	}
	if m := bs.bs[0].margin; m != 0 {
		t.Errorf("margin %v learned from a response with an earlier attempt unanswered, want 0", m)
	}
	left[0] = 5000
	bs.observe(0, 0, &left, early, verdict.Points{})
	if got := bs.bs[0].b.Level(0); got > 5000 {
		t.Errorf("after both responses: %v tokens, want at most the server's 5,000", got)
	}
	if out, unanswered := bs.bs[0].out, len(bs.out); out != 0 || unanswered != 0 {
		t.Errorf("after every response: %v tokens in %d charges still counted unanswered, want none", out, unanswered)
	}
}

// The margin for underestimates covers the cost of a request and that of
// the attempts still unanswered, each of which may also have cost more
// than its estimate, within the bucket's size.
func TestBudgetNeedCoversUnanswered(t *testing.T) {
	b := budget{b: pace.NewBucket(0, 10000, 0), margin: 0.5, out: 4000}
	if got := b.need(1000); got != 1000+0.5*(1000+4000) {
		t.Errorf("need(1000) with margin 0.5 and 4,000 unanswered = %v, want 3500", got)
	}
	b.out = 40000
	if got := b.need(1000); got != 10000 {
		t.Errorf("need(1000) with 40,000 unanswered = %v, want the bucket's size, 10000", got)
	}
}

// TestBudgetsCharge: a charge holds the newest cost of each budget the
// part has; a cost above a budget's size is refused, costs of budgets it
// does not have and zero costs are nothing, and no budgets charge nothing.
func TestBudgetsCharge(t *testing.T) {
	bs := newBudgets([]budgetConfig{{"input", 1000, time.Second}, {"output", 100, time.Second}})
	costs := &cost{"output", 50, &cost{"points", 1e9, &cost{"input", 300, &cost{"output", 1e6, nil}}}}
	ch, over := bs.chargeOf(costs)
	if over != nil || ch == nil || ch.cost[0] != 300 || ch.cost[1] != 50 {
		t.Errorf("charge of input 300, output 50 (newest), points: %+v, over %v", ch, over)
	}
	// A charge of nothing still marks what was granted before it.
	if ch, over := bs.chargeOf(&cost{"input", 0, &cost{"points", 5, nil}}); ch == nil || ch.cost[0] != 0 || ch.cost[1] != 0 || over != nil {
		t.Errorf("charge of nothing: %+v, over %v, want a charge of zeros", ch, over)
	}
	big := &cost{"output", 101, nil}
	if ch, over := bs.chargeOf(&cost{"input", 1000, big}); ch != nil || over != big {
		t.Errorf("charge of output 101 of 100: %+v, over %v, want refused for it", ch, over)
	}
	var none budgets
	if !none.empty() || none.len() != 0 || !none.full(0) || !none.canPay(0, nil) || none.payDelay(0, nil) != 0 || none.wait(0, Batch, nil, 0, &[numLevels]int{}) != 0 {
		t.Error("no budgets: not empty, not full, or something to pay")
	}
	if ch, over := none.chargeOf(costs); ch != nil || over != nil {
		t.Errorf("no budgets charge %+v, over %v", ch, over)
	}
	if bs.empty() || bs.len() != 2 || bs.name(1) != "output" {
		t.Errorf("two budgets: empty %v, len %d, name(1) %q", bs.empty(), bs.len(), bs.name(1))
	}
}

// TestBudgetsPayAndRepay: a charge is paid when every budget holds it,
// waits for the slowest to refill, and is given back whole when the
// attempt is not sent.
func TestBudgetsPayAndRepay(t *testing.T) {
	bs := newBudgets([]budgetConfig{{"input", 1000, time.Second}, {"output", 100, time.Second}})
	first, _ := bs.chargeOf(&cost{"input", 800, &cost{"output", 20, nil}})
	second, _ := bs.chargeOf(&cost{"input", 100, &cost{"output", 90, nil}})
	if !bs.canPay(0, first) {
		t.Fatal("full budgets cannot pay 800 and 20")
	}
	bs.pay(0, first)
	if bs.canPay(0, second) || bs.full(0) {
		t.Fatal("80 output tokens left pay 90, or the budgets are still full")
	}
	// 10 output tokens at 100 a second: 100 ms.
	if d := bs.payDelay(0, second); d != 100*time.Millisecond {
		t.Errorf("payDelay = %v, want 100ms for the output budget", d)
	}
	if !bs.canPay(100*time.Millisecond, second) {
		t.Error("cannot pay when payDelay said")
	}
	bs.repay(50*time.Millisecond, first)
	if len(bs.out) != 0 || bs.bs[0].sent != 0 || bs.bs[1].sent != 0 {
		t.Errorf("after repaying: %d charges unanswered, sent %v and %v, want none", len(bs.out), bs.bs[0].sent, bs.bs[1].sent)
	}
	if !bs.full(50 * time.Millisecond) {
		t.Errorf("after repaying the only charge: %v and %v held, want full", bs.bs[0].b.Level(50*time.Millisecond), bs.bs[1].b.Level(50*time.Millisecond))
	}
	bs.answered(first) // no longer unanswered: nothing
	if bs.bs[0].out != 0 {
		t.Errorf("a charge answered twice: %v unanswered", bs.bs[0].out)
	}
}

// TestBudgetsQueuedWait: the wait estimated for a new waiter counts the
// costs queued at its level and above, not below, less what is held.
func TestBudgetsQueuedWait(t *testing.T) {
	bs := newBudgets([]budgetConfig{{"tokens", 100, time.Second}})
	bs.pay(0, mustCharge(t, &bs, 100)) // empty
	batch, inter := mustCharge(t, &bs, 50), mustCharge(t, &bs, 30)
	bs.queue(Batch, batch, 1)
	bs.queue(Interactive, inter, 1)
	ch := mustCharge(t, &bs, 20)
	if d := bs.wait(0, Normal, ch, 1, &[numLevels]int{1, 0, 1}); d != 500*time.Millisecond {
		t.Errorf("Normal behind 30 Interactive: wait %v, want 500ms (50 tokens)", d)
	}
	if d := bs.wait(0, Batch, ch, 2, &[numLevels]int{1, 0, 1}); d != time.Second {
		t.Errorf("Batch behind 30 Interactive and 50 Batch: wait %v, want 1s", d)
	}
	if d := bs.wait(200*time.Millisecond, Batch, ch, 2, &[numLevels]int{1, 0, 1}); d != 800*time.Millisecond {
		t.Errorf("Batch, 20 tokens held: wait %v, want 800ms", d)
	}
	bs.queue(Batch, batch, -1)
	if d := bs.wait(0, Batch, ch, 1, &[numLevels]int{1, 0, 0}); d != 500*time.Millisecond {
		t.Errorf("after the Batch waiter left: wait %v, want 500ms", d)
	}
}

// TestBudgetsUnansweredBound: charges whose answers are never observed are
// dropped oldest first past maxOut, and a long backlog is not kept once
// answered.
func TestBudgetsUnansweredBound(t *testing.T) {
	bs := newBudgets([]budgetConfig{{"tokens", 1e9, time.Second}})
	chs := make([]*charge, maxOut+1)
	for i := range chs {
		chs[i] = mustCharge(t, &bs, 1)
		bs.pay(0, chs[i])
	}
	if len(bs.out) != maxOut || bs.out[0] != chs[1] || bs.bs[0].out != maxOut {
		t.Fatalf("%d charges unanswered (%v tokens), first %p, want %d, the oldest dropped", len(bs.out), bs.bs[0].out, bs.out[0], maxOut)
	}
	for _, ch := range chs {
		bs.answered(ch)
	}
	if bs.out != nil || bs.bs[0].out != 0 {
		t.Errorf("after every answer: %d charges (cap %d), %v tokens unanswered, want none kept", len(bs.out), cap(bs.out), bs.bs[0].out)
	}
}

// TestBudgetsShared: budgets shared through a Leaser start empty and do
// not refill; they spend what the Leaser grants, say what they want, and
// pass a server's count on brought to the time they are asked instead of
// taking it as their own.
func TestBudgetsShared(t *testing.T) {
	bs := newBudgets([]budgetConfig{{"tokens", 6000, time.Minute}}) // 100 a second
	bs.joinFleet()
	ch := mustCharge(t, &bs, 1000)
	if bs.canPay(time.Minute, ch) {
		t.Fatal("a shared budget paid before any grant")
	}
	bs.queue(Batch, ch, 1)
	d := bs.demand(time.Minute, ch)
	if len(d) != 1 || d[0].Name != "tokens" || d[0].Size != 6000 || d[0].Per != time.Minute || d[0].Level != 0 ||
		d[0].Queued[Batch] != 1000 || d[0].Need != 1000 || d[0].Seen != 0 {
		t.Fatalf("demand before a grant: %+v", d)
	}
	bs.share(time.Minute, []BudgetShare{{Add: 1500, Rate: 50, Margin: 0.1}})
	if need := 1000 + 0.1*1000; !bs.canPay(time.Minute, ch) || bs.bs[0].need(1000) != need {
		t.Fatalf("granted 1500 with margin 0.1: need %v, want %v", bs.bs[0].need(1000), need)
	}
	// 1,000 queued and 1,000 of its own, each with the margin: 2,200;
	// 1,500 held.
	if got := bs.wait(time.Minute, Batch, ch, 1, &[numLevels]int{0, 0, 1}); got != 14*time.Second {
		t.Errorf("wait for 1100 queued and 1100 needed (margin 0.1) with 1500 held at 50 a second: %v, want 14s", got)
	}
	bs.queue(Batch, ch, -1)
	bs.pay(time.Minute, ch)
	// Ten seconds later nothing refilled; the server said 3,000 remain
	// of the attempt sent at a minute, answered at 70 s, and 200 more were
	// granted meanwhile.
	bs.pay(65*time.Second, mustCharge(t, &bs, 200))
	var left [maxBudgets]int64
	left[0] = 3000
	bs.observe(70*time.Second, time.Minute, &left, ch, verdict.Points{})
	if got := bs.bs[0].b.Level(70 * time.Second); got != 300 {
		t.Errorf("after a response: %v held, want the 300 granted and not spent", got)
	}
	d = bs.demand(71*time.Second, nil)
	// 3,000 + the 11 s refill since the send, less the 200 granted since.
	if d[0].Seen != 1 || d[0].Server != 3000+1100-200 || d[0].Spent != 1200 || d[0].Unanswered != 200 {
		t.Errorf("demand after a server count: %+v", d[0])
	}
	if !bs.full(0) {
		t.Error("a shared budget keeps its lane from being forgotten")
	}
}

// TestBudgetWaitWokenByWhatChangesIt: a dispatcher that sleeps until the
// budget holds its first waiter's cost is woken by what changes that
// wait: a request that needs less of the budget, or none, and comes
// first; and tokens given back by Report. Without the wake-ups each would
// wait for the sleep to end, 30 s here.
func TestBudgetWaitWokenByWhatChangesIt(t *testing.T) {
	for _, c := range []string{"a cheaper request comes first", "Report gives tokens back"} {
		t.Run(c, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := mustNew(t, nopBase{}, WithBudget("tokens", 100, time.Minute))
				ctx := t.Context()
				req, _ := http.NewRequestWithContext(WithCost(ctx, "tokens", 100), http.MethodGet, "http://api.test/x", nil)
				first, err := tr.RoundTrip(req) // spends the whole budget
				if err != nil {
					t.Fatal(err)
				}
				first.Body.Close()
				var wg sync.WaitGroup
				defer wg.Wait()
				start := time.Now()
				var waited atomic.Int64
				wg.Go(func() { // 50 tokens: 30 s away
					if err := getCost(ctx, tr, 50, ""); err != nil {
						t.Error(err)
					}
					waited.Store(int64(time.Since(start)))
				})
				synctest.Wait()
				time.Sleep(time.Second)
				if c == "Report gives tokens back" {
					tr.Report(first, "tokens", 10) // 90 back
					synctest.Wait()
					if d := time.Duration(waited.Load()); d == 0 || d > 2*time.Second {
						t.Errorf("a request that 90 tokens given back can pay for still waits (%v)", d)
					}
					return
				}
				sent := time.Now()
				if err := get(WithPriority(ctx, Interactive), tr, ""); err != nil {
					t.Fatal(err)
				}
				if d := time.Since(sent); d > time.Second {
					t.Errorf("an Interactive request that costs nothing waited %v behind a Normal one's refill", d)
				}
			})
		})
	}
}

// TestBudgetCountOfACallWithoutCost: a call that carries no cost (a list
// of models, say) is answered with the server's count, as every OpenAI
// response is. The count is taken less what is not answered yet, not less
// every cost the lane ever granted: after 12,000 tokens spent over three
// minutes, a full server bucket lets the next call go at once.
func TestBudgetCountOfACallWithoutCost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		remaining := 6000
		base := &fakeBase{answer: func(req *http.Request) *http.Response {
			mu.Lock()
			defer mu.Unlock()
			remaining -= int(CostFrom(req.Context(), "tokens"))
			resp := answerWith(0, 200)(nil)
			resp.Header.Set("X-Ratelimit-Limit-Tokens", "6000")
			resp.Header.Set("X-Ratelimit-Remaining-Tokens", strconv.Itoa(remaining))
			resp.Header.Set("X-Ratelimit-Reset-Tokens", "1m0s")
			return resp
		}}
		tr := mustNew(t, base, WithBudget("tokens", 6000, time.Minute)) // 100 a second
		for range 3 {
			if err := getCost(t.Context(), tr, 4000, ""); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Minute)
			mu.Lock()
			remaining = 6000 // the server's bucket is full again
			mu.Unlock()
		}
		if err := get(t.Context(), tr, ""); err != nil { // no cost: the server says 6,000 remain
			t.Fatal(err)
		}
		start := time.Now()
		if err := getCost(t.Context(), tr, 1000, ""); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d > 0 {
			t.Errorf("a call of 1,000 tokens waited %v with the server's bucket full", d)
		}
	})
}

// tokensLeft answers every request with a 200 that says *remaining tokens
// are left, as OpenAI's headers do, the budget resetting in 10 s.
func tokensLeft(remaining *string) *fakeBase {
	return &fakeBase{answer: func(*http.Request) *http.Response {
		resp := answerWith(0, 200)(nil)
		resp.Header.Set("X-Ratelimit-Remaining-Tokens", *remaining)
		resp.Header.Set("X-Ratelimit-Reset-Tokens", "10s")
		return resp
	}}
}

// TestBudgetWaitCountsTenantTurns: tenants take turns within a level, so
// a new tenant's call waits for one turn of each tenant with waiters, not
// for every cost they queued. Budget 1,000 tokens a second, emptied;
// tenant A queues five 1,000-token calls; tenant B's 100-token call, with
// a deadline of 3 s, is served after A's first, at 1.1 s.
func TestBudgetWaitCountsTenantTurns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, &fakeBase{}, WithBudget("tokens", 1000, time.Second))
		a := WithTenant(t.Context(), "A")
		if err := getCost(a, tr, 1000, "first"); err != nil { // empties the budget
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for range 5 {
			wg.Go(func() { getCost(a, tr, 1000, "A") })
			synctest.Wait()
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(WithTenant(t.Context(), "B"), 3*time.Second)
		defer cancel()
		err := getCost(ctx, tr, 100, "B")
		if took := time.Since(start); err != nil || took > 1100*time.Millisecond {
			t.Errorf("B's call behind five of A's: %v after %v, want it served at 1.1s", err, took)
		}
		wg.Wait()
	})
}

// TestBudgetWaitCountsAgedWaiters: with aging, Batch waiters that have
// waited long enough rank ahead of a new Normal call, which then waits for
// their tokens too: behind 3,000 tokens of them at 100 a second, a call
// with a deadline of 8 s is refused at once, not failed at its deadline.
func TestBudgetWaitCountsAgedWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, &fakeBase{}, WithBudget("tokens", 1000, 10*time.Second), WithAging(time.Second))
		if err := getCost(t.Context(), tr, 1000, "first"); err != nil { // empties the budget
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		bctx := WithPriority(t.Context(), Batch)
		for range 3 {
			wg.Go(func() { getCost(bctx, tr, 1000, "batch") })
			synctest.Wait()
		}
		time.Sleep(5 * time.Second) // the Batch waiters now rank ahead of a new Normal one
		start := time.Now()
		ctx, cancel := context.WithTimeout(t.Context(), 8*time.Second)
		defer cancel()
		err := getCost(ctx, tr, 100, "normal")
		if took := time.Since(start); !errors.Is(err, ErrRejected) || took != 0 {
			t.Errorf("Normal call behind 3,000 aged Batch tokens (30 s), deadline 8 s: %v after %v, want refused at once", err, took)
		}
		wg.Wait()
	})
}

// TestLowShareTurnWaitsForItsBudgetAlone: a lane at 10/s with a budget of
// 1,000 tokens a minute, emptied by a first call. A Batch call costing
// 1,000 tokens waits a minute for the budget; thirty Interactive calls
// that cost no tokens queue behind nothing they need. With the default low
// share the 10th grant is the Batch call's turn; it cannot pay, and goes
// to the Interactive calls meanwhile: they are all sent in 3 s, as with
// WithLowShare(0), not held the minute behind the Batch call's budget.
func TestLowShareTurnWaitsForItsBudgetAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{}
		tr := mustNew(t, base, WithRate(10, time.Second), WithBudget("tokens", 1000, time.Minute))
		if err := getCost(t.Context(), tr, 1000, "first"); err != nil { // empties the budget
			t.Fatal(err)
		}
		start := time.Now()
		var wg sync.WaitGroup
		wg.Go(func() { getCost(WithPriority(t.Context(), Batch), tr, 1000, "batch") })
		synctest.Wait()
		var mu sync.Mutex
		var last time.Duration
		for range 30 {
			wg.Go(func() {
				if err := getCost(WithPriority(t.Context(), Interactive), tr, 0, "interactive"); err != nil {
					t.Error(err)
				}
				mu.Lock()
				last = max(last, time.Since(start))
				mu.Unlock()
			})
		}
		wg.Wait()
		t.Logf("the 30 Interactive calls done after %v", last)
		if last > 4*time.Second {
			t.Errorf("30 Interactive calls that cost nothing took %v at 10/s, held behind a Batch call's budget wait", last)
		}
	})
}
