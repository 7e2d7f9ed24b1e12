package sluiceredis

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/upstream"
)

// The fleet budget test's numbers: a token budget per second rather than
// per minute, so that a short run sees many periods; a request rate that
// never binds; calls of 100 to 8,000 tokens.
const (
	budgetProcs   = 3
	budgetTokens  = 200000 // tokens per budgetPer, for the whole fleet
	budgetPer     = 2 * time.Second
	budgetReqs    = 10000
	budgetWorkers = 16
	budgetRun     = 24 * time.Second
	budgetLatency = 20 * time.Millisecond
	// budgetOther is the part of the budget spent beside the fleet, by a
	// caller on the same API key that does not use sluice.
	budgetOther = 0.2
)

// TestBudgetsFleet runs budgetProcs OS processes (this test binary, run
// again as TestBudgetsFleetChild), each with a Transport with
// WithBudget("tokens", ...) on one Backend key, against an OpenAI-style
// server here that enforces the token budget for all of them and says
// what remains of it (x-ratelimit-remaining-tokens). Each process runs
// budgetWorkers callers in a closed loop, a quarter Interactive, with
// calls of 100 to 8,000 tokens estimated within ±30%; beside them, a
// caller here that does not use sluice spends budgetOther of the budget,
// which the fleet learns of only from the server's counts. Over the second
// half of the run the server must accept at least 0.95 of the budget from
// all of them, and refuse at most 1% of the fleet's attempts.
func TestBudgetsFleet(t *testing.T) {
	srv := startRedis(t)
	per := float64(budgetTokens) / budgetPer.Seconds()
	up := upstream.NewTCP(upstream.Config{
		Limiter: upstream.NewOpenAI(upstream.OpenAIConfig{Requests: budgetReqs, Tokens: budgetTokens, Per: budgetPer}),
		Latency: func(int, *http.Request) time.Duration { return budgetLatency },
	})
	defer up.Close()

	start := time.Now().Add(3 * time.Second)
	c := child{redis: srv.Addr(), url: up.URL(), start: start, from: start.Add(budgetRun / 2), stop: start.Add(budgetRun)}
	ctx, cancel := context.WithDeadline(context.Background(), c.stop.Add(30*time.Second))
	defer cancel()
	wait := startChildren(ctx, t, budgetProcs, "TestBudgetsFleetChild", "budgets", "budgets: ", fleetEnv(c)...)

	// The other caller: calls of 1,000 tokens at budgetOther of the
	// budget, from the start to the stop.
	time.Sleep(time.Until(c.start))
	const otherCost = 1000
	lim := rate.NewLimiter(rate.Limit(budgetOther*per/otherCost), 1)
	otherCtx, otherStop := context.WithDeadline(ctx, c.stop)
	defer otherStop()
	otherTr := &http.Transport{}
	defer otherTr.CloseIdleConnections()
	for lim.Wait(otherCtx) == nil {
		req, _ := http.NewRequestWithContext(otherCtx, "POST", c.url, nil)
		req.Header.Set(upstream.CostTokensHeader, strconv.Itoa(otherCost))
		req.Header.Set("X-Class", strconv.Itoa(otherCost))
		req.Header.Set("X-Tenant", "other")
		if resp, err := otherTr.RoundTrip(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	reports := wait()
	if t.Failed() {
		return
	}
	var sent, refused, tokens, other int
	byProc := make([]int, budgetProcs)
	for _, a := range up.Arrivals() {
		if a.At.Before(c.from) || a.At.After(c.stop) || !a.Accepted && a.Tenant == "other" {
			continue
		}
		cost, err := strconv.Atoi(a.Class)
		if err != nil {
			t.Fatalf("X-Class %q: %v", a.Class, err)
		}
		if a.Tenant == "other" {
			other += cost
			tokens += cost
			continue
		}
		sent++
		if !a.Accepted {
			refused++
			continue
		}
		tokens += cost
		if p, err := strconv.Atoi(a.Tenant); err == nil && p >= 0 && p < budgetProcs {
			byProc[p] += cost
		}
	}
	secs := c.stop.Sub(c.from).Seconds()
	share := float64(tokens) / (per * secs)
	t.Logf("%d processes sharing %d tokens per %v, calls of 100-8,000 tokens estimated within ±30%%, beside a caller spending %.2f of it, over the last %.0fs:",
		budgetProcs, budgetTokens, budgetPer, budgetOther, secs)
	for i := range budgetProcs {
		t.Logf("  process %d: %.3f of the budget (%s)", i, float64(byProc[i])/(per*secs), reports[i])
	}
	t.Logf("  the other caller: %.3f of the budget", float64(other)/(per*secs))
	t.Logf("  all: %.3f of the budget; %d of the fleet's %d attempts refused", share, refused, sent)
	if share < 0.95 {
		t.Errorf("the fleet spent %.3f of the budget, want >= 0.95", share)
	}
	if share > 1.05 {
		t.Errorf("the fleet spent %.3f of the budget: the server cannot have accepted it", share)
	}
	if float64(refused) > 0.01*float64(sent) {
		t.Errorf("%d of %d attempts refused, want <= 1%%", refused, sent)
	}
	for i, n := range byProc {
		if float64(n) < 0.12*per*secs {
			t.Errorf("process %d spent %.3f of the budget, under 0.12 of it", i, float64(n)/(per*secs))
		}
	}
}

// TestBudgetsFleetChild is one process of TestBudgetsFleet; run alone it
// skips.
func TestBudgetsFleetChild(t *testing.T) {
	c := readChild(t, "budgets")
	b := newBackend(t, newClient(t, c.redis))
	defer b.Close()
	tr, err := sluice.New(nil, sluice.WithRate(budgetReqs, budgetPer), sluice.WithBudget("tokens", budgetTokens, budgetPer),
		sluice.WithConcurrency(1, 64), sluice.WithBackend(b), sluice.WithRetry(0))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	client := &http.Client{Transport: tr}
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithDeadline(context.Background(), c.stop)
	defer cancel()
	time.Sleep(time.Until(c.start))

	var (
		wg             sync.WaitGroup
		mu             sync.Mutex
		sent, refusals int
	)
	for w := range budgetWorkers {
		p := sluice.Batch
		if w%4 == 0 {
			p = sluice.Interactive
		}
		rnd := rand.New(rand.NewPCG(uint64(c.proc), uint64(w)))
		wg.Go(func() {
			for ctx.Err() == nil {
				cost := 100 + rnd.IntN(7901)
				est := int(float64(cost) * (0.7 + 0.6*rnd.Float64()))
				req, _ := http.NewRequestWithContext(sluice.WithCost(sluice.WithPriority(ctx, p), "tokens", est), "POST", c.url, nil)
				req.Header.Set(upstream.CostTokensHeader, strconv.Itoa(cost))
				req.Header.Set("X-Class", strconv.Itoa(cost))
				req.Header.Set("X-Tenant", strconv.Itoa(c.proc))
				resp, err := client.Do(req)
				if err != nil {
					continue // the deadline
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				sent++
				if resp.StatusCode == http.StatusTooManyRequests {
					refusals++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	fmt.Printf("budgets: %d sent, %d refused\n", sent, refusals)
}
