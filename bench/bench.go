// Command bench measures HTTP clients of rate-limited APIs against server
// models that enforce their limits themselves and publish them the way
// real APIs and middlewares do (internal/upstream), on the real clock over
// loopback TCP, and prints a markdown table: for each model and client,
// accepted requests per second divided by the published rate, and the
// share of attempts the server refused, over the second half of each run.
//
//	cd bench && go run .              # every model x every client, 12 s each
//	cd bench && go run . -short       # a 2 s smoke run of one model
//	cd bench && go run . -d 20s -model gcra -client sluice
//	cd bench && go run . -traces ../testdata/traces   # header traces of the real middleware
//	cd bench && go run . -harm -d 20s                 # headers read beside headers stripped
//
// It lives in its own module so that the peers' dependencies (failsafe-go)
// stay out of the library's go.mod; its module path is under sluice's, so
// it may import sluice/internal/upstream.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/failsafe-go/failsafe-go/ratelimiter"
	"github.com/hashicorp/go-retryablehttp"
	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/upstream"
)

// A model is a server configuration: its limiter and the allowance a
// client is told (Limit per Per).
type model struct {
	name  string
	limit int                   // the published allowance: limit per per
	per   time.Duration         //
	make  func() upstream.Model // a project model; nil for real middleware
	// mw, if set, is real middleware (see realModels) serving the model
	// instead of make; redis says it needs a redis-server.
	mw    middleware
	redis bool
	// header, if set, is added to every request (token costs).
	header http.Header
	// workers, if > 0, is the number of callers for this server instead
	// of the run's.
	workers int
	// penalty, if > 0, starts a GitHub secondary-limit penalty of that
	// length at the start of the measured half.
	penalty time.Duration
}

// models returns the project's server models, then the real middleware.
func models() []model {
	return append(projectModels(), realModels()...)
}

// projectModels returns the server models of internal/upstream.
func projectModels() []model {
	costs := http.Header{
		upstream.CostTokensHeader:       {"100"},
		upstream.CostInputTokensHeader:  {"100"},
		upstream.CostOutputTokensHeader: {"50"},
	}
	return []model{
		{name: "GitHub primary: fixed 1 s window, epoch reset, 50/s", limit: 50, per: time.Second,
			make: func() upstream.Model {
				return upstream.NewGitHub(upstream.GitHubConfig{Limit: 50, Window: time.Second})
			}},
		{name: "GitHub secondary: 403 + Retry-After: 3 in the 2nd half, quota 500/10 s far from used", limit: 500, per: 10 * time.Second,
			penalty: 3 * time.Second,
			make: func() upstream.Model {
				return upstream.NewGitHub(upstream.GitHubConfig{Limit: 500, Window: 10 * time.Second})
			}},
		{name: "OpenAI: buckets of 50 req/s and 10k tok/s (100 a request), reset = until full", limit: 50, per: time.Second, header: costs,
			make: func() upstream.Model {
				return upstream.NewOpenAI(upstream.OpenAIConfig{Requests: 50, Tokens: 10000, Per: time.Second})
			}},
		{name: "Anthropic: buckets of 50 req/s, 10k in + 5k out tok/s, reset = RFC 3339 when full", limit: 50, per: time.Second, header: costs,
			make: func() upstream.Model {
				return upstream.NewAnthropic(upstream.AnthropicConfig{Requests: 50, InputTokens: 10000, OutputTokens: 5000, Per: time.Second})
			}},
		{name: "IETF RateLimit over a bucket, burst 10, 20/s", limit: 20, per: time.Second,
			make: func() upstream.Model {
				return upstream.NewIETF(upstream.IETFConfig{Quota: 20, Window: time.Second, Burst: 10})
			}},
		{name: "IETF RateLimit over a bucket, burst 10, 50/s", limit: 50, per: time.Second,
			make: func() upstream.Model {
				return upstream.NewIETF(upstream.IETFConfig{Quota: 50, Window: time.Second, Burst: 10})
			}},
		{name: "GCRA burst 10, X-RateLimit-* reset in whole s (throttled), 50/s", limit: 50, per: time.Second,
			make: func() upstream.Model { return upstream.NewGCRA(upstream.GCRAConfig{Rate: 50, Burst: 10}) }},
		{name: "strict GCRA burst 1, same headers, 50/s", limit: 50, per: time.Second,
			make: func() upstream.Model { return upstream.NewGCRA(upstream.GCRAConfig{Rate: 50, Burst: 1}) }},
		{name: "strict GCRA burst 1, no X-RateLimit-*, 50/s", limit: 50, per: time.Second,
			make: func() upstream.Model {
				return upstream.NewGCRA(upstream.GCRAConfig{Rate: 50, Burst: 1, NoHeaders: true})
			}},
		{name: "sliding-window counter (httprate), 50 per 1 s", limit: 50, per: time.Second,
			make: func() upstream.Model {
				return upstream.NewSlidingWindow(upstream.SlidingWindowConfig{Limit: 50, Window: time.Second})
			}},
	}
}

// A client makes the http.Client under test for a model's allowance.
type client struct {
	name string
	make func(base http.RoundTripper, limit int, per time.Duration) (*http.Client, error)
}

func clients() []client {
	return []client{
		{"sluice at R", func(base http.RoundTripper, n int, per time.Duration) (*http.Client, error) {
			return sluiceClient(base, sluice.WithRate(n, per))
		}},
		{"sluice, no WithRate", func(base http.RoundTripper, _ int, _ time.Duration) (*http.Client, error) {
			return sluiceClient(base)
		}},
		{"sluice at 2R", func(base http.RoundTripper, n int, per time.Duration) (*http.Client, error) {
			return sluiceClient(base, sluice.WithRate(2*n, per))
		}},
		{"x/time/rate at R + 16 slots", func(base http.RoundTripper, n int, per time.Duration) (*http.Client, error) {
			return &http.Client{Transport: &rateSem{
				base: base,
				lim:  rate.NewLimiter(rate.Limit(float64(n)/per.Seconds()), 1),
				sem:  semaphore.NewWeighted(16),
			}}, nil
		}},
		{"go-retryablehttp (default)", func(base http.RoundTripper, _ int, _ time.Duration) (*http.Client, error) {
			rc := retryablehttp.NewClient() // 4 retries, backoff 1-30 s honouring Retry-After on 429/503
			rc.Logger = nil
			rc.HTTPClient.Transport = base
			return rc.StandardClient(), nil
		}},
		{"failsafe-go at R + retries", func(base http.RoundTripper, n int, per time.Duration) (*http.Client, error) {
			// Retry outside, rate limiter inside: every attempt takes a
			// permit. The retry policy retries 429 and 5xx twice, waiting
			// for Retry-After (failsafehttp.DelayFunc) when it is given.
			rl := ratelimiter.NewSmoothBuilder[*http.Response](uint(n), per).WithMaxWaitTime(time.Minute).Build()
			rp := failsafehttp.NewRetryPolicyBuilder().Build()
			return &http.Client{Transport: failsafehttp.NewRoundTripper(base, rp, rl)}, nil
		}},
	}
}

func sluiceClient(base http.RoundTripper, opts ...sluice.Option) (*http.Client, error) {
	tr, err := sluice.New(base, opts...)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: tr}, nil
}

// rateSem is the pair most code composes by hand: x/time/rate (burst 1)
// then a 16-slot semaphore held until the body is closed. No retries.
type rateSem struct {
	base http.RoundTripper
	lim  *rate.Limiter
	sem  *semaphore.Weighted
}

func (t *rateSem) RoundTrip(r *http.Request) (*http.Response, error) {
	if err := t.lim.Wait(r.Context()); err != nil {
		return nil, err
	}
	return sendHeld(t.sem, t.base, r)
}

// sendHeld sends r through base holding one of sem's slots until the
// response body is done, as a hand-built in-flight bound does.
func sendHeld(sem *semaphore.Weighted, base http.RoundTripper, r *http.Request) (*http.Response, error) {
	if err := sem.Acquire(r.Context(), 1); err != nil {
		return nil, err
	}
	resp, err := base.RoundTrip(r)
	if err != nil {
		sem.Release(1)
		return nil, err
	}
	resp.Body = &releaseBody{ReadCloser: resp.Body, release: func() { sem.Release(1) }}
	return resp, nil
}

type releaseBody struct {
	io.ReadCloser
	once    sync.Once
	release func()
}

func (b *releaseBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(b.release)
	return err
}

// config is one bench run's shape.
type config struct {
	d       time.Duration // length of each run; the second half is measured
	workers int           // callers in a closed loop
	latency time.Duration // service time of an accepted request
}

// result is one (model, client) cell.
type result struct {
	ratio     float64 // accepted/s in the measured half ÷ published rate
	whole     float64 // accepted/s over the whole run ÷ published rate
	refused   float64 // % of attempts in the measured half refused
	attempts  int     // in the measured half
	inPenalty int     // requests sent during a GitHub secondary penalty
	err       error
}

func (r result) String() string {
	if r.err != nil {
		return "error: " + r.err.Error()
	}
	s := fmt.Sprintf("%.2f, %.1f%% (whole run %.2f)", r.ratio, r.refused, r.whole)
	if r.inPenalty >= 0 {
		s += fmt.Sprintf(", %d sent in the penalty", r.inPenalty)
	}
	return s
}

// run measures one client against one model, served by a child process
// (see startRemote).
func run(ctx context.Context, cfg config, m model, c client) result {
	srv, err := startRemote(m, cfg.latency)
	if err != nil {
		return result{err: err}
	}
	defer srv.close()
	hc, err := c.make(srv.tr, m.limit, m.per)
	if err != nil {
		return result{err: err}
	}

	start := time.Now()
	mid, end := start.Add(cfg.d/2), start.Add(cfg.d)
	ctx, cancel := context.WithDeadline(ctx, end)
	defer cancel()

	res := result{inPenalty: -1}
	var wg sync.WaitGroup
	var triggerErr error
	if m.penalty > 0 {
		res.inPenalty = 0
		wg.Go(func() {
			select {
			case <-time.After(time.Until(mid.Add(500 * time.Millisecond))):
				triggerErr = srv.trigger(m.penalty)
			case <-ctx.Done():
			}
		})
	}
	workers := cfg.workers
	if m.workers > 0 {
		workers = m.workers
	}
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.url+"/v1/thing", nil)
				if err != nil {
					return
				}
				for k, v := range m.header {
					req.Header[k] = v
				}
				resp, err := hc.Do(req)
				if err != nil {
					if ctx.Err() == nil && !errors.Is(err, context.Canceled) {
						time.Sleep(10 * time.Millisecond) // don't spin on a broken client
					}
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	wg.Wait()

	if triggerErr != nil {
		return result{err: triggerErr}
	}
	arrivals, err := srv.arrivals()
	if err != nil {
		return result{err: err}
	}
	var accepted, total, acceptedAll int
	for _, a := range arrivals {
		if a.Accepted && !a.At.Before(start) && a.At.Before(end) {
			acceptedAll++
		}
		if a.At.Before(mid) || !a.At.Before(end) {
			continue
		}
		total++
		if a.Accepted {
			accepted++
		}
	}
	res.attempts = total
	res.ratio = float64(accepted) / end.Sub(mid).Seconds() / m.rate()
	res.whole = float64(acceptedAll) / end.Sub(start).Seconds() / m.rate()
	if total > 0 {
		res.refused = 100 * float64(total-accepted) / float64(total)
	}
	if res.inPenalty == 0 {
		if res.inPenalty, err = srv.penaltyArrivals(); err != nil {
			return result{err: err}
		}
	}
	if cl, ok := hc.Transport.(interface{ CloseIdleConnections() }); ok {
		cl.CloseIdleConnections()
	}
	return res
}

// rate is the model's published rate in requests per second.
func (m model) rate() float64 {
	if m.make != nil {
		return m.make().Rate()
	}
	return float64(m.limit) / m.per.Seconds()
}
