package sluice

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"
)

// replyBase answers from memory with a small JSON body, as an API does: the
// cost measured on top of it is the client's.
type replyBase struct{}

func (replyBase) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader(`{"ok":true}`)),
		ContentLength: 11, Request: req}, nil
}

// costPath is one way of making a request that waits for nothing: what a
// caller writes, from an http.Client call to the body read to EOF and
// closed.
type costPath struct {
	name string
	do   func(*http.Request) error
}

// costPaths returns the realistic fast path of three clients over base:
// the bare client, sluice, and x/time/rate's Wait with an
// x/sync/semaphore slot held until the body is closed, as written by hand.
// The limits are too high to make anyone wait.
func costPaths(tb testing.TB, base http.RoundTripper, opts ...Option) []costPath {
	bare := &http.Client{Transport: base}
	sl := &http.Client{Transport: mustNew(tb, base, append([]Option{WithRate(1e9, time.Second), WithBurst(1 << 30)}, opts...)...)}
	lim := rate.NewLimiter(1e9, 1<<30)
	sem := semaphore.NewWeighted(DefaultMaxConcurrency)
	return []costPath{
		{"bare", func(req *http.Request) error { return drain(bare.Do(req)) }},
		{"sluice", func(req *http.Request) error { return drain(sl.Do(req)) }},
		{"rate+semaphore", func(req *http.Request) error {
			ctx := req.Context()
			if err := lim.Wait(ctx); err != nil {
				return err
			}
			if err := sem.Acquire(ctx, 1); err != nil {
				return err
			}
			defer sem.Release(1)
			return drain(bare.Do(req))
		}},
	}
}

// drain reads a response's body to EOF and closes it, as a caller does.
func drain(resp *http.Response, err error) error {
	if err != nil {
		return err
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	return resp.Body.Close()
}

// costRequest is a request with a context that can end, as callers pass
// (a server's request context, a timeout).
func costRequest(tb testing.TB) *http.Request {
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, "GET", "http://api.test/v1/thing", nil)
	if err != nil {
		tb.Fatal(err)
	}
	return req
}

// BenchmarkRoundTrip measures the realistic fast path (see costPaths): a
// request whose token and slot are free, through an http.Client, with a
// cancellable context and a body read to EOF and closed, beside the bare
// client and the hand-made pair, serially and from parallel goroutines.
func BenchmarkRoundTrip(b *testing.B) {
	req := costRequest(b)
	for _, p := range costPaths(b, replyBase{}) {
		b.Run(p.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := p.do(req); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(p.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := p.do(req); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// costRounds measures each path of paths in rounds interleaved rounds of n
// requests from each of g goroutines, and returns, per path, the median
// over rounds of its time divided by that of paths[ref] in the same round,
// and its allocations per request. Interleaving and the median keep a
// loaded machine's drift out of the ratio.
func costRounds(tb testing.TB, paths []costPath, ref, rounds, n, g int) (ratio, allocs []float64) {
	req := costRequest(tb)
	per := make([][]float64, len(paths))
	allocs = make([]float64, len(paths))
	for i, p := range paths {
		allocs[i] = testing.AllocsPerRun(1000, func() {
			if err := p.do(req); err != nil {
				tb.Fatal(err)
			}
		})
	}
	d := make([]time.Duration, len(paths))
	for range rounds {
		for i, p := range paths {
			d[i] = timeRequests(tb, p, req, n, g)
		}
		for i := range paths {
			per[i] = append(per[i], float64(d[i])/float64(d[ref]))
		}
	}
	ratio = make([]float64, len(paths))
	for i := range paths {
		slices.Sort(per[i])
		ratio[i] = per[i][len(per[i])/2]
	}
	return ratio, allocs
}

// timeRequests returns how long g goroutines take to make n requests each
// through p.
func timeRequests(tb testing.TB, p costPath, req *http.Request, n, g int) time.Duration {
	var wg sync.WaitGroup
	start := time.Now()
	for range g {
		wg.Go(func() {
			for range n {
				if err := p.do(req); err != nil {
					tb.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start)
}

func TestCostPrint(t *testing.T) {
	paths := costPaths(t, replyBase{})
	for _, g := range []int{1, 8} {
		ratio, allocs := costRounds(t, paths, 2, 15, 20000/g, g)
		for i, p := range paths {
			t.Logf("g=%d %-16s %.2f x pair  %.0f allocs", g, p.name, ratio[i], allocs[i])
		}
	}
}
