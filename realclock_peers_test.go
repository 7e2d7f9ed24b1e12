package sluice

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"
)

// The tests of this file run cases that the synctest tests check in
// virtual time on the real clock over loopback TCP, with sluice beside
// x/time/rate + x/sync/semaphore in the same run against servers of their
// own: the long-holder cases of the adaptive limit
// (TestAdaptiveRareSlowCalls, TestHeldStreamsDoNotStarveQuickCalls) at a
// tenth of their time scale, and early refusal under deadlines. The pair's
// semaphore is as large as sluice's default maximum, so it never binds:
// what the pair serves is what this machine delivers at the rate, which
// sluice must come close to.

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

// bothClients runs f for sluice, at rate r a second with no retries, and
// for the pair at the same time, each against a server and over a
// transport of its own.
func bothClients(t *testing.T, r float64, f func(c *http.Client, url string, sluice bool)) {
	var wg sync.WaitGroup
	for _, sl := range []bool{true, false} {
		wg.Go(func() {
			srv := holdServer(t, 20*time.Millisecond, 3*time.Second, 3*time.Second)
			var tr *Transport
			c := holdClient(t, func(base http.RoundTripper) http.RoundTripper {
				if !sl {
					return newPair(base, r, DefaultMaxConcurrency)
				}
				tr = mustNew(t, base, WithRetry(0), WithRate(int(r), time.Second))
				return tr
			})
			f(c, srv.URL, sl)
			if tr != nil {
				tr.Close()
			}
		})
	}
	wg.Wait()
}

// sideBySide runs scenario for sluice and for the pair (see bothClients),
// up to three times until sluice serves at least share of what the pair
// does, and returns the last rates (per second).
func sideBySide(t *testing.T, r float64, share float64, scenario func(c *http.Client, url string) float64) (s, x float64) {
	for try := range 3 {
		bothClients(t, r, func(c *http.Client, url string, sluice bool) {
			if got := scenario(c, url); sluice {
				s = got
			} else {
				x = got
			}
		})
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

// deadlineCounts are the calls of a run with deadlines: served, refused
// early (an error before half the deadline passed) and failed late (an
// error after it: a wait that came to nothing), Interactive and Batch.
type deadlineCounts struct {
	served, early, late [2]int
}

// lost returns the share of the calls sent (served or failed late) that
// failed late: their tokens were lost to the callers who could have used
// them.
func (c deadlineCounts) lost() float64 {
	late := c.late[0] + c.late[1]
	return float64(late) / float64(max(1, late+c.served[0]+c.served[1]))
}

func (c deadlineCounts) String() string {
	return fmt.Sprintf("served %d+%d, refused early %d+%d, failed late %d+%d (interactive+batch)",
		c.served[0], c.served[1], c.early[0], c.early[1], c.late[0], c.late[1])
}

// TestEarlyRefusalRealClock: at 50/s, 24 Interactive callers with a
// deadline of 300 ms a call, more than the rate can serve in time, beside
// eight Batch callers with 3 s, 20 ms calls. The callers refused come back
// 10 ms later, so the queue stays as long as the deadlines admit, and every
// call admitted is at the margin. A call that would not be answered
// within its deadline is refused at once rather than sent to fail at its
// end, which loses its token to the others: at most half the pair's share
// of the calls sent fail late (x/time/rate refuses early too, when a
// reservation outlasts the deadline, but leaves the call no time), sluice
// serves at least as many calls as the pair, and Batch keeps the share
// WithLowShare leaves it.
func TestEarlyRefusalRealClock(t *testing.T) {
	if testing.Short() {
		t.Skip("real-clock run of about ten seconds")
	}
	const (
		r = 50
		d = 6 * time.Second
	)
	levels := [2]struct {
		p        Priority
		deadline time.Duration
	}{{Interactive, 300 * time.Millisecond}, {Batch, 3 * time.Second}}
	var s, x deadlineCounts
	for try := range 3 {
		bothClients(t, r, func(c *http.Client, url string, sluice bool) {
			// Ended by a cancel, not a deadline: a call's deadline is its own.
			ctx, cancel := context.WithCancel(context.Background())
			defer time.AfterFunc(d, cancel).Stop()
			var mu sync.Mutex
			var got deadlineCounts
			var wg sync.WaitGroup
			for i := range 32 {
				lv := min(i/24, 1)
				wg.Go(func() {
					for ctx.Err() == nil {
						cctx, ccancel := context.WithTimeout(WithPriority(ctx, levels[lv].p), levels[lv].deadline)
						start := time.Now()
						ok := callOK(cctx, c, url+"/quick")
						took := time.Since(start)
						ccancel()
						if ctx.Err() != nil {
							return // the run's end, not the call's deadline
						}
						mu.Lock()
						switch {
						case ok:
							got.served[lv]++
						case took < levels[lv].deadline/2:
							got.early[lv]++
						default:
							got.late[lv]++
						}
						mu.Unlock()
						if !ok && took < levels[lv].deadline/2 {
							time.Sleep(10 * time.Millisecond) // as a caller backs off a refusal
						}
					}
				})
			}
			wg.Wait()
			if sluice {
				s = got
			} else {
				x = got
			}
		})
		t.Logf("run %d: sluice %v; x/time/rate + semaphore %v", try, s, x)
		sServed, xServed := s.served[0]+s.served[1], x.served[0]+x.served[1]
		sLost, xLost := s.lost(), x.lost()
		var fails []string
		if sServed < xServed {
			fails = append(fails, fmt.Sprintf("served %d, fewer than the pair's %d", sServed, xServed))
		}
		if sLost > xLost/2 {
			fails = append(fails, fmt.Sprintf("%.2f of the calls sent failed at their deadlines, over half the pair's %.2f", sLost, xLost))
		}
		// Every tenth grant goes to Batch while it waits: 5/s.
		if b := float64(s.served[1]) / d.Seconds(); b < 0.5*r/DefaultLowShare {
			fails = append(fails, fmt.Sprintf("Batch served at %.1f/s, below half of its low share (%v/s)", b, r/DefaultLowShare))
		}
		if len(fails) == 0 {
			return
		}
		if try == 2 {
			t.Errorf("three runs in a row: %s", strings.Join(fails, "; "))
		}
	}
}
