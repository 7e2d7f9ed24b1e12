package sluice

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"
)

// replyBase answers from memory with a small JSON body, as an API does: the
// cost measured on top of it is the client's.
type replyBase struct{}

func (replyBase) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Header: replyHeader, Body: &replyBody{r: strings.NewReader(`{"ok":true}`)},
		ContentLength: 11, Request: req}, nil
}

// replyHeader is what an API's response says besides its rate limits.
var replyHeader = http.Header{
	"Content-Type":   {"application/json"},
	"Content-Length": {"11"},
	"Date":           {"Thu, 03 Dec 2026 12:00:00 GMT"},
	"Server":         {"api"},
	"X-Request-Id":   {"req_0123456789abcdef"},
	"Vary":           {"Accept-Encoding"},
}

// replyBody reads and closes as net/http's response bodies do, with no
// WriteTo method: io.Copy reads it through a buffer.
type replyBody struct{ r *strings.Reader }

func (b *replyBody) Read(p []byte) (int, error) { return b.r.Read(p) }
func (b *replyBody) Close() error               { return nil }

// costPath is one way of making a request that waits for nothing: what a
// caller writes, from an http.Client call to the body read to EOF and
// closed.
type costPath struct {
	name string
	do   func(*http.Request) error
}

// costPaths returns the realistic fast path of the clients compared over
// base: the bare client, sluice (with and without a no-op Observer), and
// x/time/rate's Wait with an x/sync/semaphore slot held until the body is
// closed, as written by hand. The limits are too high to make anyone wait.
func costPaths(tb testing.TB, base http.RoundTripper) []costPath {
	bare := &http.Client{Transport: base}
	sl := &http.Client{Transport: mustNew(tb, base, WithRate(1e9, time.Second), WithBurst(1<<30))}
	otr := mustNew(tb, base, WithRate(1e9, time.Second), WithBurst(1<<30),
		WithObserver(ObserverFunc(func(context.Context, Event) {})))
	tb.Cleanup(func() { otr.WaitEvents(context.Background()) })
	obs := &http.Client{Transport: otr}
	lim := rate.NewLimiter(1e9, 1<<30)
	sem := semaphore.NewWeighted(DefaultMaxConcurrency)
	return []costPath{
		{"bare", func(req *http.Request) error { return drain(bare.Do(req)) }},
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
		{"sluice", func(req *http.Request) error { return drain(sl.Do(req)) }},
		{"sluice+observer", func(req *http.Request) error { return drain(obs.Do(req)) }},
	}
}

// Indexes in costPaths.
const (
	costBare = iota
	costPair
	costSluice
	costObserved
)

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

// costRequests returns g requests with contexts that can end (a server's
// request context, a timeout), as callers pass: all to one host, or with
// lanes, each to a host of its own.
func costRequests(tb testing.TB, g int, lanes bool) []*http.Request {
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	reqs := make([]*http.Request, g)
	for i := range reqs {
		host := "api.test"
		if lanes {
			host = fmt.Sprintf("api%d.test", i)
		}
		req, err := http.NewRequestWithContext(ctx, "GET", "http://"+host+"/v1/thing", nil)
		if err != nil {
			tb.Fatal(err)
		}
		reqs[i] = req
	}
	return reqs
}

// costShapes are the ways the paths are driven: one goroutine, and eight
// on one lane and on eight lanes. max and maxObserved bound sluice's time
// in TestFastPathCost, without and with a no-op Observer, divided by the
// hand-made pair's, with room for a loaded machine: the ratios sit near
// 1.0 and move by up to a fifth from run to run on two busy cores. A busy
// lane hands out most grants without its lock (see docs/design.md, "Cost
// under contention"); one that takes it for every grant costs 1.4 to 1.7
// times the pair from eight goroutines on one lane, and fails that bound.
var costShapes = []struct {
	name             string
	g                int
	lanes            bool
	max, maxObserved float64
}{
	{"serial", 1, false, 1.3, 1.45},
	{"8 goroutines, 1 lane", 8, false, 1.3, 1.45},
	{"8 goroutines, 8 lanes", 8, true, 1.3, 1.45},
}

// BenchmarkRoundTrip measures the realistic fast path (see costPaths): a
// request whose token and slot are free, through an http.Client, with a
// cancellable context and a body read to EOF and closed, beside the bare
// client and the hand-made pair, from one goroutine and from parallel
// ones on one lane and on one lane each.
func BenchmarkRoundTrip(b *testing.B) {
	for _, sh := range costShapes {
		for _, p := range costPaths(b, replyBase{}) {
			b.Run(sh.name+"/"+p.name, func(b *testing.B) {
				reqs := costRequests(b, sh.g, sh.lanes)
				b.ReportAllocs()
				if sh.g == 1 {
					for b.Loop() {
						if err := p.do(reqs[0]); err != nil {
							b.Fatal(err)
						}
					}
					return
				}
				var next atomic.Int32
				b.SetParallelism(max(1, sh.g/runtime.GOMAXPROCS(0)))
				b.RunParallel(func(pb *testing.PB) {
					req := reqs[int(next.Add(1)-1)%len(reqs)]
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
}

// costRounds measures every path in rounds interleaved rounds of n
// requests from each of the shape's goroutines, and returns, per path, the
// median over rounds of its time divided by that of the hand-made pair in
// the same round. Interleaving and the median keep a loaded machine's
// drift out of the ratio.
func costRounds(tb testing.TB, paths []costPath, reqs []*http.Request, rounds, n int) []float64 {
	per := make([][]float64, len(paths))
	d := make([]time.Duration, len(paths))
	for range rounds {
		for i, p := range paths {
			d[i] = timeRequests(tb, p, reqs, n)
		}
		for i := range paths {
			per[i] = append(per[i], float64(d[i])/float64(d[costPair]))
		}
	}
	ratio := make([]float64, len(paths))
	for i := range paths {
		slices.Sort(per[i])
		ratio[i] = per[i][len(per[i])/2]
	}
	return ratio
}

// timeRequests returns how long a goroutine for each of reqs takes to make
// n requests with it through p.
func timeRequests(tb testing.TB, p costPath, reqs []*http.Request, n int) time.Duration {
	var wg sync.WaitGroup
	start := time.Now()
	for _, req := range reqs {
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

// TestFastPathCost: sluice's realistic fast path (see costPaths) allocates
// exactly one object more than the bare client (the body wrapper), and
// costs at most its shape's bound times the hand-made pair's time (see
// costShapes), from one goroutine and from eight, on one lane and on
// eight. With -v it prints the table the README's "Cost" section shows.
func TestFastPathCost(t *testing.T) {
	if raceEnabled {
		t.Skip("timing and allocations under the race detector say nothing of the fast path; .ci/run runs this test without it")
	}
	paths := costPaths(t, replyBase{})
	req := costRequests(t, 1, false)[0]
	allocs := make([]float64, len(paths))
	for i, p := range paths {
		allocs[i] = testing.AllocsPerRun(2000, func() {
			if err := p.do(req); err != nil {
				t.Fatal(err)
			}
		})
	}
	for _, i := range []int{costSluice, costObserved} {
		if extra := allocs[i] - allocs[costBare]; extra != 1 {
			t.Errorf("%s: %v allocations a request over the bare client's %v, want 1", paths[i].name, extra, allocs[costBare])
		}
	}
	var tab strings.Builder
	fmt.Fprintf(&tab, "| | %s | allocs over bare |\n| --- |", strings.Join(shapeNames(), " | "))
	for range costShapes {
		tab.WriteString(" --- |")
	}
	tab.WriteString(" --- |\n")
	ratios := make([][]float64, len(costShapes))
	for j, sh := range costShapes {
		// A loaded runner can slow one path's rounds more than another's:
		// up to three tries, the first within the bounds ends it.
		for try := range 3 {
			ratios[j] = costRounds(t, paths, costRequests(t, sh.g, sh.lanes), 15, 20000/sh.g)
			over := ""
			for i, max := range map[int]float64{costSluice: sh.max, costObserved: sh.maxObserved} {
				if r := ratios[j][i]; r > max {
					over += fmt.Sprintf("; %s: %.2f x the hand-made pair's time, want at most %.2f", paths[i].name, r, max)
				}
			}
			if over == "" {
				break
			}
			if try == 2 {
				t.Errorf("%s, three tries%s", sh.name, over)
			}
		}
	}
	for i, p := range paths {
		fmt.Fprintf(&tab, "| %s |", p.name)
		for j := range costShapes {
			fmt.Fprintf(&tab, " %.2f |", ratios[j][i])
		}
		fmt.Fprintf(&tab, " %+.0f |\n", allocs[i]-allocs[costBare])
	}
	t.Logf("time ÷ the hand-made pair's, median of 15 interleaved rounds:\n%s", tab.String())
}

func shapeNames() []string {
	var s []string
	for _, sh := range costShapes {
		s = append(s, sh.name)
	}
	return s
}
