// Command signals measures, on the real clock over loopback, what sluice
// does with signals beyond a rate (an overloaded server's fast 529s,
// GitHub's secondary limit stated only in a 403's body, a cold start
// against go-chi/httprate's headers, a cold start against a server that
// states nothing but 429s) beside x/time/rate + x/sync/semaphore and
// failsafe-go's adaptive limiter in the same run, and prints a table for
// each.
//
//	cd bench && go run ./cmd/signals
package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"time"

	"github.com/failsafe-go/failsafe-go/adaptivelimiter"
	"github.com/go-chi/httprate"
	"github.com/sluice-go/sluice"
	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"
)

// A client is one way of calling a URL: sluice or the hand-made pair.
type client struct {
	name string
	do   func(ctx context.Context, url string) (int, error)
}

// sluiceClient returns sluice with opts, and no retries.
func sluiceClient(name string, opts ...sluice.Option) client {
	tr, err := sluice.New(nil, append([]sluice.Option{sluice.WithRetry(0)}, opts...)...)
	if err != nil {
		panic(err)
	}
	c := &http.Client{Transport: tr}
	return client{name, func(ctx context.Context, url string) (int, error) {
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		resp, err := c.Do(req)
		if err != nil {
			return 0, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}}
}

// pairClient returns x/time/rate at r (burst 1) with slots semaphore slots.
func pairClient(r float64, slots int64) client {
	lim := rate.NewLimiter(rate.Limit(r), 1)
	sem := semaphore.NewWeighted(slots)
	c := &http.Client{}
	return client{fmt.Sprintf("x/time/rate %.0f/s + %d slots", r, slots), func(ctx context.Context, url string) (int, error) {
		if err := lim.Wait(ctx); err != nil {
			return 0, err
		}
		if err := sem.Acquire(ctx, 1); err != nil {
			return 0, err
		}
		defer sem.Release(1)
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		resp, err := c.Do(req)
		if err != nil {
			return 0, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}}
}

// failsafeClient returns failsafe-go's adaptive limiter with its defaults
// (limits 1 to 200 from 20), its permits awaited, behind x/time/rate at r
// (burst 1), or no rate if r is 0. A permit is recorded when the body is
// read, dropped when the call fails.
func failsafeClient(r float64) client {
	name := "failsafe-go adaptive limiter"
	var lim *rate.Limiter
	if r > 0 {
		lim = rate.NewLimiter(rate.Limit(r), 1)
		name = fmt.Sprintf("x/time/rate %.0f/s + %s", r, name)
	}
	al := adaptivelimiter.NewBuilder[*http.Response]().Build()
	c := &http.Client{}
	return client{name, func(ctx context.Context, url string) (int, error) {
		if lim != nil {
			if err := lim.Wait(ctx); err != nil {
				return 0, err
			}
		}
		p, err := al.AcquirePermit(ctx)
		if err != nil {
			return 0, err
		}
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		resp, err := c.Do(req)
		if err != nil {
			p.Drop()
			return 0, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		p.Record()
		return resp.StatusCode, nil
	}}
}

// A rec is a response's status and when it came, from the run's start.
type rec struct {
	at     time.Duration
	status int
}

// loop runs workers that call url through c as fast as it lets them for
// d, and returns what came back.
func loop(c client, url string, workers int, d time.Duration) []rec {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(d, cancel)
	start := time.Now()
	var mu sync.Mutex
	var out []rec
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				s, err := c.do(ctx, url)
				if err != nil {
					if ctx.Err() == nil {
						time.Sleep(time.Millisecond)
					}
					continue
				}
				mu.Lock()
				out = append(out, rec{time.Since(start), s})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return out
}

// overload measures a server that answers 529 at once beyond 8 calls in it.
func overload() {
	var in atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if in.Add(1) > 8 {
			in.Add(-1)
			w.WriteHeader(529)
			io.WriteString(w, `{"type":"error","error":{"type":"overloaded_error"}}`)
			return
		}
		time.Sleep(50 * time.Millisecond)
		in.Add(-1)
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	fmt.Println("\n## Overload: a loopback server that answers 529 at once beyond 8 calls in it, 50 ms otherwise (capacity 160/s); 64 callers, 8 s, second half")
	fmt.Println("| client | served/s | 529s |\n|---|---|---|")
	for _, c := range []client{
		sluiceClient("sluice at 1,000/s", sluice.WithRate(1000, time.Second)),
		sluiceClient("sluice, no WithRate"),
		pairClient(1000, 16),
		pairClient(1000, 64),
		failsafeClient(0),
		failsafeClient(1000),
	} {
		rs := loop(c, srv.URL, 64, 8*time.Second)
		ok, bad := 0, 0
		for _, r := range rs {
			if r.at < 4*time.Second {
				continue
			}
			if r.status == 200 {
				ok++
			} else {
				bad++
			}
		}
		fmt.Printf("| %s | %.0f | %.1f%% |\n", c.name, float64(ok)/4, 100*float64(bad)/float64(ok+bad))
	}
}

// secondary measures GitHub's secondary limit stated only in a body.
func secondary() {
	var hit atomic.Int64   // when the first refusal was sent, in Unix nanoseconds; 0: none yet
	var after atomic.Int64 // requests that came after it
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("X-RateLimit-Limit", "5000")
		h.Set("X-RateLimit-Remaining", "4000")
		h.Set("X-RateLimit-Reset", fmt.Sprint(time.Now().Add(time.Hour).Unix()))
		h.Set("X-RateLimit-Resource", "core")
		if f := hit.Load(); f != 0 {
			after.Add(1)
			w.WriteHeader(403)
			io.WriteString(w, `{"message":"You have exceeded a secondary rate limit. Please wait a few minutes before you try again."}`)
			return
		}
		if r.URL.Query().Get("trip") != "" {
			hit.CompareAndSwap(0, time.Now().UnixNano())
			w.WriteHeader(403)
			io.WriteString(w, `{"message":"You have exceeded a secondary rate limit. Please wait a few minutes before you try again."}`)
			return
		}
		io.WriteString(w, "{}")
	}))
	defer srv.Close()
	fmt.Println("\n## GitHub's secondary limit stated only in a 403's body (quota left, no Retry-After): requests that reach the server after the first such 403, in a 5 s run, 8 callers at 50/s")
	fmt.Println("| client | requests after the first secondary 403 |\n|---|---|")
	for _, c := range []client{
		sluiceClient("sluice at 50/s", sluice.WithRate(50, time.Second)),
		pairClient(50, 8),
		failsafeClient(50),
	} {
		hit.Store(0)
		after.Store(0)
		c.do(context.Background(), srv.URL+"?trip=1")
		after.Store(0)
		loop(c, srv.URL, 8, 5*time.Second)
		fmt.Printf("| %s | %d |\n", c.name, after.Load())
	}
}

// coldStart measures the first seconds against httprate's headers.
func coldStart() {
	h := httprate.LimitBy(50, time.Second, httprate.Key("*"))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(400 * time.Millisecond)
			io.WriteString(w, "ok")
		}))
	fmt.Println("\n## Cold start: go-chi/httprate 50 per 1 s window (its X-RateLimit-* headers), 400 ms calls, 32 callers, first 6 s from a cold client")
	fmt.Println("| client | accepted ÷ (6 s x 50/s) | refused |\n|---|---|---|")
	for _, c := range []client{
		sluiceClient("sluice, no WithRate"),
		sluiceClient("sluice at 50/s", sluice.WithRate(50, time.Second)),
		pairClient(50, 32),
		failsafeClient(0),
		failsafeClient(50),
	} {
		srv := httptest.NewServer(h) // fresh window state per client
		rs := loop(c, srv.URL, 32, 6*time.Second)
		srv.Close()
		ok, bad := 0, 0
		for _, r := range rs {
			if r.status == 200 {
				ok++
			} else {
				bad++
			}
		}
		fmt.Printf("| %s | %.2f | %d |\n", c.name, float64(ok)/300, bad)
	}
}

// quiet429 measures a cold start against a server that allows 50 calls a
// second (a bucket of 20) and states nothing but a 429 beyond them: no
// rate-limit header, no Retry-After. Its calls take 400 ms for 6 s, then
// 40 ms for 6 s.
func quiet429() {
	fmt.Println("\n## Cold start, no headers: a loopback server allowing 50/s (a bucket of 20), a bare 429 beyond; calls of 400 ms for 6 s, then 40 ms for 6 s; 64 callers")
	fmt.Println("| client | accepted ÷ (6 s x 50/s), first 6 s | next 6 s | refused |\n|---|---|---|---|")
	for _, c := range []client{
		sluiceClient("sluice, no WithRate"),
		sluiceClient("sluice at 50/s", sluice.WithRate(50, time.Second)),
		pairClient(50, 32),
		failsafeClient(0),
		failsafeClient(50),
	} {
		fmt.Printf("| %s | %s |\n", c.name, runQuiet429(c))
	}
}

// quietResult is what the server of runQuiet429 accepted in each phase
// and refused over both.
type quietResult struct {
	ok      [2]int64
	refused int64
}

// share returns what the server accepted in phase i as a share of 6 s at
// its 50/s.
func (r quietResult) share(i int) float64 { return float64(r.ok[i]) / 300 }

// refusedShare returns the share of attempts the server refused.
func (r quietResult) refusedShare() float64 {
	return float64(r.refused) / float64(max(1, r.ok[0]+r.ok[1]+r.refused))
}

func (r quietResult) String() string {
	return fmt.Sprintf("%.2f | %.2f | %d (%.1f%%)", r.share(0), r.share(1), r.refused, 100*r.refusedShare())
}

// runQuiet429 runs c with 64 callers for 12 s against a fresh loopback
// server of quiet429's.
func runQuiet429(c client) quietResult {
	lim := rate.NewLimiter(50, 20)
	start := time.Now()
	var ok [2]atomic.Int64
	var bad atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !lim.Allow() {
			bad.Add(1)
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		phase, d := 0, 400*time.Millisecond
		if time.Since(start) >= 6*time.Second {
			phase, d = 1, 40*time.Millisecond
		}
		ok[phase].Add(1)
		time.Sleep(d)
		io.WriteString(w, "ok")
	}))
	loop(c, srv.URL, 64, 12*time.Second)
	srv.Close()
	return quietResult{ok: [2]int64{ok[0].Load(), ok[1].Load()}, refused: bad.Load()}
}

func main() {
	overload()
	secondary()
	coldStart()
	quiet429()
}
