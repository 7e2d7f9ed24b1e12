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
)

// TestBudgetsFleet runs budgetProcs OS processes (this test binary, run
// again as TestBudgetsFleetChild), each with a Transport with
// WithBudget("tokens", ...) on one Backend key, against an OpenAI-style
// server here that enforces the token budget for all of them and says
// what remains of it (x-ratelimit-remaining-tokens). Each process runs
// budgetWorkers callers in a closed loop, a quarter Interactive, with
// calls of 100 to 8,000 tokens estimated within ±30%. Over the second
// half of the run the server must accept at least 0.95 of the budget, and
// refuse at most 1% of the attempts.
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
	reports := startChildren(ctx, t, budgetProcs, "TestBudgetsFleetChild", "budgets", "budgets: ", fleetEnv(c)...)()
	if t.Failed() {
		return
	}
	var sent, refused, tokens int
	byProc := make([]int, budgetProcs)
	for _, a := range up.Arrivals() {
		if a.At.Before(c.from) || a.At.After(c.stop) {
			continue
		}
		sent++
		if !a.Accepted {
			refused++
			continue
		}
		cost, err := strconv.Atoi(a.Class)
		if err != nil {
			t.Fatalf("X-Class %q: %v", a.Class, err)
		}
		tokens += cost
		if p, err := strconv.Atoi(a.Tenant); err == nil && p >= 0 && p < budgetProcs {
			byProc[p] += cost
		}
	}
	secs := c.stop.Sub(c.from).Seconds()
	share := float64(tokens) / (per * secs)
	t.Logf("%d processes sharing %d tokens per %v, calls of 100-8,000 tokens estimated within ±30%%, over the last %.0fs:", budgetProcs, budgetTokens, budgetPer, secs)
	for i := range budgetProcs {
		t.Logf("  process %d: %.3f of the budget (%s)", i, float64(byProc[i])/(per*secs), reports[i])
	}
	t.Logf("  fleet: %.3f of the budget; %d of %d attempts refused", share, refused, sent)
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
		if float64(n) < 0.15*per*secs {
			t.Errorf("process %d spent %.3f of the budget, under 0.15 of it", i, float64(n)/(per*secs))
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
