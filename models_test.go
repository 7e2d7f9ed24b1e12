package sluice

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/internal/upstream"
)

// modelRun is one client against one server model of internal/upstream in
// virtual time: 32 callers in a closed loop, 20 ms service time, the second
// half of the run measured from the server's record.
type modelRun struct {
	accepted, refused int     // in the second half
	share             float64 // accepted/s ÷ the model's rate, second half
}

func runModel(t *testing.T, m func() upstream.Model, dur time.Duration, hdr http.Header, opts ...Option) modelRun {
	var res modelRun
	synctest.Test(t, func(t *testing.T) {
		// A bubble's clock starts in 2000, before the 1e9 seconds that
		// tell a Unix time from a delay in a reset header: move past it
		// (at once, in virtual time).
		time.Sleep(time.Until(time.Unix(1_700_000_000, 0)))
		mod := m()
		srv := upstream.New(upstream.Config{Limiter: mod, Latency: func(int, *http.Request) time.Duration { return 20 * time.Millisecond }})
		defer srv.Close()
		tr := mustNew(t, srv.Transport(), opts...)
		start := time.Now()
		ctx, cancel := context.WithTimeout(t.Context(), dur)
		defer cancel()
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() {
				for ctx.Err() == nil {
					req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL()+"/", nil)
					for k, v := range hdr {
						req.Header[k] = v
					}
					resp, err := tr.RoundTrip(req)
					if err != nil {
						pause(ctx)
						continue
					}
					resp.Body.Close()
					if resp.StatusCode >= 400 {
						pause(ctx)
					}
				}
			})
		}
		wg.Wait()
		for _, a := range srv.Arrivals() {
			if a.At.Sub(start) < dur/2 {
				continue
			}
			if a.Accepted {
				res.accepted++
			} else {
				res.refused++
			}
		}
		res.share = float64(res.accepted) / (dur / 2).Seconds() / mod.Rate()
	})
	return res
}

// TestServerModels guards the server models' targets in virtual time, for every
// server model, with sluice at the published rate R, with no rate, and at
// 2R: at least 0.95 of the published rate in the steady state with at most
// 1% of attempts refused (strict GCRA: 0.90 at R, 0.85 otherwise, 2%).
// The bench module measures every model on real loopback beside the peers.
func TestServerModels(t *testing.T) {
	costs := http.Header{upstream.CostTokensHeader: {"100"}, upstream.CostInputTokensHeader: {"100"}, upstream.CostOutputTokensHeader: {"50"}}
	type model struct {
		name   string
		make   func() upstream.Model
		n      int
		per    time.Duration
		hdr    http.Header
		strict bool
	}
	models := []model{
		{"OpenAI buckets", func() upstream.Model {
			return upstream.NewOpenAI(upstream.OpenAIConfig{Requests: 50, Tokens: 10000, Per: time.Second})
		}, 50, time.Second, costs, false},
		{"Anthropic buckets", func() upstream.Model {
			return upstream.NewAnthropic(upstream.AnthropicConfig{Requests: 50, InputTokens: 10000, OutputTokens: 5000, Per: time.Second})
		}, 50, time.Second, costs, false},
		{"IETF bucket 50/s burst 10", func() upstream.Model {
			return upstream.NewIETF(upstream.IETFConfig{Quota: 50, Window: time.Second, Burst: 10})
		}, 50, time.Second, nil, false},
		{"GCRA burst 10", func() upstream.Model { return upstream.NewGCRA(upstream.GCRAConfig{Rate: 50, Burst: 10}) }, 50, time.Second, nil, false},
		{"sliding window 50/s", func() upstream.Model {
			return upstream.NewSlidingWindow(upstream.SlidingWindowConfig{Limit: 50, Window: time.Second})
		}, 50, time.Second, nil, false},
		{"GitHub primary 50/s", func() upstream.Model {
			return upstream.NewGitHub(upstream.GitHubConfig{Limit: 50, Window: time.Second})
		}, 50, time.Second, nil, false},
		{"strict GCRA", func() upstream.Model { return upstream.NewGCRA(upstream.GCRAConfig{Rate: 50, Burst: 1}) }, 50, time.Second, nil, true},
		{"strict GCRA, no headers", func() upstream.Model {
			return upstream.NewGCRA(upstream.GCRAConfig{Rate: 50, Burst: 1, NoHeaders: true})
		}, 50, time.Second, nil, true},
	}
	var table strings.Builder
	fmt.Fprintf(&table, "\n%-28s %-16s %-16s %-16s\n", "server", "at R", "no rate", "at 2R")
	for _, m := range models {
		row := fmt.Sprintf("%-28s", m.name)
		for _, c := range []struct {
			name string
			opts []Option
		}{
			{"at R", []Option{WithRate(m.n, m.per)}},
			{"no rate", nil},
			{"at 2R", []Option{WithRate(2*m.n, m.per)}},
		} {
			t.Run(m.name+"/"+c.name, func(t *testing.T) {
				res := runModel(t, m.make, 30*time.Second, m.hdr, c.opts...)
				refused := float64(res.refused) / float64(max(1, res.accepted+res.refused))
				row += fmt.Sprintf(" %.2f, %4.1f%%     ", res.share, 100*refused)
				want, maxRefused := 0.95, 0.01
				if m.strict {
					want, maxRefused = 0.85, 0.02
					if c.name == "at R" {
						want = 0.90
					}
				}
				if res.share < want || refused > maxRefused {
					t.Errorf("%.3f of the rate, %.1f%% refused; want >= %.2f, <= %.0f%%", res.share, 100*refused, want, 100*maxRefused)
				}
			})
		}
		fmt.Fprintln(&table, row)
	}
	t.Log(table.String())
}
