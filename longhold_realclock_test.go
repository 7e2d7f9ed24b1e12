package sluice

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"
)

// The tests of this file run the long-holder cases of the adaptive limit
// (TestAdaptiveRareSlowCalls, TestHeldStreamsDoNotStarveQuickCalls) on the
// real clock over loopback TCP, a tenth of their time scale, with sluice
// beside x/time/rate + x/sync/semaphore in the same run against servers of
// their own. The pair's semaphore is as large as sluice's default maximum,
// so it never binds: what the pair serves is what this machine delivers at
// the rate, which sluice must come close to.

// pairTransport is what users write by hand: x/time/rate's Wait, then an
// x/sync/semaphore slot held until the response body is closed.
type pairTransport struct {
	base http.RoundTripper
	lim  *rate.Limiter
	sem  *semaphore.Weighted
}

func newPair(base http.RoundTripper, r float64, slots int64) *pairTransport {
	return &pairTransport{base: base, lim: rate.NewLimiter(rate.Limit(r), 1), sem: semaphore.NewWeighted(slots)}
}

func (p *pairTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	if err := p.lim.Wait(ctx); err != nil {
		return nil, err
	}
	if err := p.sem.Acquire(ctx, 1); err != nil {
		return nil, err
	}
	resp, err := p.base.RoundTrip(req)
	if err != nil {
		p.sem.Release(1)
		return nil, err
	}
	resp.Body = &pairBody{ReadCloser: resp.Body, release: sync.OnceFunc(func() { p.sem.Release(1) })}
	return resp, nil
}

type pairBody struct {
	io.ReadCloser
	release func()
}

func (b *pairBody) Close() error {
	err := b.ReadCloser.Close()
	b.release()
	return err
}

// holdServer serves /quick in quick, /slow in slow, and /stream as an
// event stream whose headers come at once and whose two events come
// interval apart; every wait ends with the request.
func holdServer(t *testing.T, quick, slow, interval time.Duration) *httptest.Server {
	wait := func(r *http.Request, d time.Duration) bool {
		select {
		case <-time.After(d):
			return true
		case <-r.Context().Done():
			return false
		}
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/quick":
			if wait(r, quick) {
				io.WriteString(w, "ok")
			}
		case "/slow":
			if wait(r, slow) {
				io.WriteString(w, "ok")
			}
		case "/stream":
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			for range 2 {
				if !wait(r, interval) {
					return
				}
				io.WriteString(w, "data: {}\n\n")
				w.(http.Flusher).Flush()
			}
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// holdClient returns a client over a loopback transport of its own, which
// keeps enough idle connections for the callers.
func holdClient(t *testing.T, wrap func(http.RoundTripper) http.RoundTripper) *http.Client {
	base := &http.Transport{MaxIdleConnsPerHost: 128}
	t.Cleanup(base.CloseIdleConnections)
	return &http.Client{Transport: wrap(base)}
}

// callOK makes a call to url and reads its body to its end; it reports
// whether the call was served.
func callOK(ctx context.Context, c *http.Client, url string) bool {
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return false
	}
	resp, err := c.Do(req)
	if err != nil {
		return false
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return err == nil && resp.StatusCode == http.StatusOK
}

// sideBySide runs scenario for sluice and for the pair at the same time,
// up to three times until sluice serves at least share of what the pair
// does, and returns the last rates (per second).
func sideBySide(t *testing.T, r float64, share float64, scenario func(c *http.Client, url string) float64) (s, x float64) {
	for try := range 3 {
		var wg sync.WaitGroup
		wg.Go(func() {
			srv := holdServer(t, 20*time.Millisecond, 3*time.Second, 3*time.Second)
			var tr *Transport
			c := holdClient(t, func(base http.RoundTripper) http.RoundTripper {
				tr = mustNew(t, base, WithRetry(0), WithRate(int(r), time.Second))
				return tr
			})
			s = scenario(c, srv.URL)
			tr.Close()
		})
		wg.Go(func() {
			srv := holdServer(t, 20*time.Millisecond, 3*time.Second, 3*time.Second)
			c := holdClient(t, func(base http.RoundTripper) http.RoundTripper {
				return newPair(base, r, DefaultMaxConcurrency)
			})
			x = scenario(c, srv.URL)
		})
		wg.Wait()
		t.Logf("run %d: sluice %.1f/s, x/time/rate + semaphore %.1f/s, at %v/s", try, s, x, r)
		if s >= share*x {
			return s, x
		}
	}
	t.Errorf("sluice served %.1f/s, below %.2f of x/time/rate + semaphore's %.1f/s, three runs in a row", s, share, x)
	return s, x
}

// measure runs callers until warm plus d have passed and returns how many
// calls per second counted in the last d.
func measure(callers []func(ctx context.Context, count *atomic.Int64), warm, d time.Duration) float64 {
	ctx, cancel := context.WithCancel(context.Background())
	var n atomic.Int64
	var wg sync.WaitGroup
	for _, c := range callers {
		wg.Go(func() { c(ctx, &n) })
	}
	time.Sleep(warm)
	from := n.Load()
	time.Sleep(d)
	got := float64(n.Load()-from) / d.Seconds()
	cancel()
	wg.Wait()
	return got
}

// TestRareSlowCallsRealClock: one call in twenty takes 3 s, the others
// 20 ms, and 60 callers keep a lane at 100/s backed up (about 17 calls in
// flight by Little's law). The lane serves its rate, as the pair does.
func TestRareSlowCallsRealClock(t *testing.T) {
	if testing.Short() {
		t.Skip("real-clock run of about twenty seconds")
	}
	const r = 100
	s, _ := sideBySide(t, r, 0.85, func(c *http.Client, url string) float64 {
		var calls atomic.Int64
		callers := make([]func(context.Context, *atomic.Int64), 60)
		for i := range callers {
			callers[i] = func(ctx context.Context, served *atomic.Int64) {
				for ctx.Err() == nil {
					path := "/quick"
					if calls.Add(1)%20 == 0 {
						path = "/slow"
					}
					if callOK(ctx, c, url+path) {
						served.Add(1)
					}
				}
			}
		}
		// The first slow calls end after 3 s: measured after them.
		return measure(callers, 4*time.Second, 6*time.Second)
	})
	if s < 0.8*r {
		t.Errorf("sluice served %.1f/s, below 0.8 of its rate (%v/s)", s, r)
	}
}

// TestHeldStreamsRealClock: six held streams of 6 s each (see HoldStream)
// beside four callers of 20 ms calls, at 100/s. The quick calls keep the
// rate the streams leave, as they do through the pair.
func TestHeldStreamsRealClock(t *testing.T) {
	if testing.Short() {
		t.Skip("real-clock run of about twenty seconds")
	}
	const r = 100
	sideBySide(t, r, 0.85, func(c *http.Client, url string) float64 {
		var callers []func(context.Context, *atomic.Int64)
		for range 4 {
			callers = append(callers, func(ctx context.Context, quick *atomic.Int64) {
				for ctx.Err() == nil {
					if callOK(ctx, c, url+"/quick") {
						quick.Add(1)
					}
				}
			})
		}
		for range 6 {
			callers = append(callers, func(ctx context.Context, _ *atomic.Int64) {
				for ctx.Err() == nil {
					callOK(HoldStream(ctx), c, url+"/stream")
				}
			})
		}
		return measure(callers, 2*time.Second, 6*time.Second)
	})
}
