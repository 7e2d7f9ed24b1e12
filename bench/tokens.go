package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/stats"
	"github.com/sluice-go/sluice/internal/upstream"
)

// A tokenScenario is a server that enforces a request budget and token
// budgets (OpenAI's one, or Anthropic's input and output), driven with
// calls of mixed cost: 100 to 8,000 tokens each (Anthropic: that much
// input and a tenth of it as output), the caller's estimate within ±30%
// of the true cost, every fourth caller Interactive and the rest Batch.
// The budgets are per second, so a run of seconds sees many periods.
type tokenScenario struct {
	name      string
	anthropic bool
	reqs      int // requests per second
	toks      int // tokens (Anthropic: input tokens) per second
}

func tokenScenarios() []tokenScenario {
	return []tokenScenario{
		{name: "OpenAI mixed costs: 600 req/s, 60k tok/s, calls of 100-8,000 tokens estimated ±30%", reqs: 600, toks: 60000},
		{name: "Anthropic mixed costs: 600 req/s, 60k in + 12k out tok/s, calls of 100-8,000 input tokens estimated ±30%", anthropic: true, reqs: 600, toks: 60000},
	}
}

// budgets returns the scenario's token budgets, by sluice's names.
func (s tokenScenario) budgets() map[string]int {
	if s.anthropic {
		return map[string]int{"input-tokens": s.toks, "output-tokens": s.toks / 5}
	}
	return map[string]int{"tokens": s.toks}
}

// A tokenClient makes the RoundTripper under test for a scenario. The
// request's estimated costs are on its context, as sluice.WithCost puts
// them (sluice.CostFrom reads them back for the peers).
type tokenClient struct {
	name string
	make func(base http.RoundTripper, s tokenScenario) (http.RoundTripper, error)
}

func tokenClients() []tokenClient {
	return []tokenClient{
		{"sluice (WithBudget, WithCost)", func(base http.RoundTripper, s tokenScenario) (http.RoundTripper, error) {
			opts := []sluice.Option{sluice.WithRate(s.reqs, time.Second), sluice.WithConcurrency(1, 64)}
			for name, n := range s.budgets() {
				opts = append(opts, sluice.WithBudget(name, n, time.Second))
			}
			return sluice.New(base, opts...)
		}},
		{"x/time/rate WaitN per budget + 16 slots", func(base http.RoundTripper, s tokenScenario) (http.RoundTripper, error) {
			lims := map[string]*rate.Limiter{}
			for name, n := range s.budgets() {
				// A period's worth of burst, as the server's bucket holds.
				lims[name] = rate.NewLimiter(rate.Limit(n), n)
			}
			return &rateWaitN{
				base: base,
				reqs: rate.NewLimiter(rate.Limit(s.reqs), 1),
				lims: lims,
				sem:  semaphore.NewWeighted(16),
			}, nil
		}},
	}
}

// rateWaitN is what a careful user builds from the peers: x/time/rate for
// requests, one x/time/rate limiter per token budget waited on with WaitN
// by the call's estimate, and a 16-slot semaphore held until the body is
// closed. It serves every priority alike.
type rateWaitN struct {
	base http.RoundTripper
	reqs *rate.Limiter
	lims map[string]*rate.Limiter
	sem  *semaphore.Weighted
}

func (t *rateWaitN) RoundTrip(r *http.Request) (*http.Response, error) {
	ctx := r.Context()
	if err := t.reqs.Wait(ctx); err != nil {
		return nil, err
	}
	for name, lim := range t.lims {
		if err := lim.WaitN(ctx, sluice.CostFrom(ctx, name)); err != nil {
			return nil, err
		}
	}
	return sendHeld(t.sem, t.base, r)
}

// tokenCallers is how many callers a token run has: the token budget, not
// the callers, binds.
const tokenCallers = 16

// tokenResult is one (scenario, client) cell.
type tokenResult struct {
	tokenShare         float64 // true tokens served in the measured half ÷ the token budget
	refused            float64 // % of attempts in the measured half refused
	attempts           int     // in the measured half
	interP99, batchP99 time.Duration
	err                error
}

func (r tokenResult) String() string {
	if r.err != nil {
		return "error: " + r.err.Error()
	}
	return fmt.Sprintf("%.2f, %.1f%%, p99 wait %v / %v", r.tokenShare, r.refused,
		r.interP99.Round(time.Millisecond), r.batchP99.Round(time.Millisecond))
}

// runTokens measures one client against one token scenario. Tokens are
// counted when a call is served (a batch call may wait long), in the
// second half; the binding budget is the first (OpenAI's tokens,
// Anthropic's input tokens).
func runTokens(ctx context.Context, cfg config, s tokenScenario, c tokenClient) tokenResult {
	var lim upstream.Model
	if s.anthropic {
		lim = upstream.NewAnthropic(upstream.AnthropicConfig{Requests: s.reqs, InputTokens: s.toks, OutputTokens: s.toks / 5, Per: time.Second})
	} else {
		lim = upstream.NewOpenAI(upstream.OpenAIConfig{Requests: s.reqs, Tokens: s.toks, Per: time.Second})
	}
	srv := upstream.NewTCP(upstream.Config{
		Limiter: lim,
		Latency: func(int, *http.Request) time.Duration { return cfg.latency },
	})
	defer srv.Close()
	rt, err := c.make(srv.Transport(), s)
	if err != nil {
		return tokenResult{err: err}
	}
	if cl, ok := rt.(interface{ Close() error }); ok {
		defer cl.Close()
	}

	start := time.Now()
	mid, end := start.Add(cfg.d/2), start.Add(cfg.d)
	ctx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	var mu sync.Mutex
	tokens := 0
	waits := map[sluice.Priority][]time.Duration{}
	var wg sync.WaitGroup
	for w := range tokenCallers {
		p := sluice.Batch
		if w%4 == 0 {
			p = sluice.Interactive
		}
		rnd := rand.New(rand.NewPCG(uint64(w), 7))
		wg.Go(func() {
			for ctx.Err() == nil {
				cost := 100 + rnd.IntN(7901)
				est := int(float64(cost) * (0.7 + 0.6*rnd.Float64()))
				cctx := sluice.WithPriority(ctx, p)
				req, err := http.NewRequestWithContext(cctx, http.MethodPost, srv.URL()+"/v1/messages", nil)
				if err != nil {
					return
				}
				if s.anthropic {
					req = req.WithContext(sluice.WithCost(sluice.WithCost(cctx, "input-tokens", est), "output-tokens", est/10))
					req.Header.Set(upstream.CostInputTokensHeader, strconv.Itoa(cost))
					req.Header.Set(upstream.CostOutputTokensHeader, strconv.Itoa(cost/10))
				} else {
					req = req.WithContext(sluice.WithCost(cctx, "tokens", est))
					req.Header.Set(upstream.CostTokensHeader, strconv.Itoa(cost))
				}
				t0 := time.Now()
				resp, err := rt.RoundTrip(req)
				if err != nil {
					if ctx.Err() == nil {
						time.Sleep(10 * time.Millisecond) // don't spin on a refusal
					}
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				done := time.Now()
				if resp.StatusCode == http.StatusOK && !done.Before(mid) && done.Before(end) {
					mu.Lock()
					tokens += cost
					waits[p] = append(waits[p], done.Sub(t0)-cfg.latency)
					mu.Unlock()
				}
				if resp.StatusCode >= 400 && ctx.Err() == nil {
					time.Sleep(10 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()

	var res tokenResult
	refused := 0
	for _, a := range srv.Arrivals() {
		if a.At.Before(mid) || !a.At.Before(end) {
			continue
		}
		res.attempts++
		if !a.Accepted {
			refused++
		}
	}
	if res.attempts > 0 {
		res.refused = 100 * float64(refused) / float64(res.attempts)
	}
	res.tokenShare = float64(tokens) / end.Sub(mid).Seconds() / float64(s.toks)
	res.interP99 = stats.Quantile(waits[sluice.Interactive], 0.99)
	res.batchP99 = stats.Quantile(waits[sluice.Batch], 0.99)
	return res
}

// benchTokens runs every token client against every token scenario and
// writes their table to out.
func benchTokens(ctx context.Context, out, log io.Writer, cfg config, ss []tokenScenario, cs []tokenClient) error {
	cells := make([][]tokenResult, len(ss))
	for i, s := range ss {
		cells[i] = make([]tokenResult, len(cs))
		for j, c := range cs {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			fmt.Fprintf(log, "%s | %s ... ", s.name, c.name)
			cells[i][j] = runTokens(ctx, cfg, s, c)
			fmt.Fprintf(log, "%v (%d attempts measured)\n", cells[i][j], cells[i][j].attempts)
		}
	}
	fmt.Fprintf(out, "\nToken budgets: %d callers in a closed loop (every fourth Interactive), %v service latency, second half of %v runs, real loopback.\n",
		tokenCallers, cfg.latency, cfg.d)
	fmt.Fprintf(out, "Each cell: tokens served/s ÷ the token budget, %% of attempts refused, p99 wait of Interactive / Batch calls.\n\n")
	fmt.Fprintf(out, "| server |")
	for _, c := range cs {
		fmt.Fprintf(out, " %s |", c.name)
	}
	fmt.Fprintf(out, "\n|---|")
	for range cs {
		fmt.Fprintf(out, "---|")
	}
	fmt.Fprintln(out)
	for i, s := range ss {
		fmt.Fprintf(out, "| %s |", s.name)
		for j := range cs {
			fmt.Fprintf(out, " %v |", cells[i][j])
		}
		fmt.Fprintln(out)
	}
	return nil
}
