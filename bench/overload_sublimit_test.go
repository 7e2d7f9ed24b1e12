package main

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

	"github.com/sluice-go/sluice"
	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"
)

// overloadCapacity is how many calls the overload server holds at once,
// and overloadLatency how long it takes over each: 160 calls a second.
const (
	overloadCapacity = 8
	overloadLatency  = 50 * time.Millisecond
)

// The ways the overload server says it is full: Anthropic's 529, a
// gateway's 503 (neither with Retry-After), and a 200 event stream whose
// first event is an overloaded_error.
const (
	overload529 = iota
	overload503
	overloadStream
)

var overloadModes = []string{"529", "503 without Retry-After", "stream's first event"}

// overloadServer holds overloadCapacity calls at a time, each for
// overloadLatency, and answers a call beyond them at once as mode says.
// It records when it served or refused each call.
type overloadServer struct {
	mode int
	in   atomic.Int64

	mu              sync.Mutex
	served, refused []time.Time
}

func (s *overloadServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.in.Add(1) > overloadCapacity {
		s.in.Add(-1)
		s.mu.Lock()
		s.refused = append(s.refused, time.Now())
		s.mu.Unlock()
		switch s.mode {
		case overload529:
			w.WriteHeader(529)
			io.WriteString(w, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`)
		case overload503:
			http.Error(w, "upstream overloaded", http.StatusServiceUnavailable)
		case overloadStream:
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n")
		}
		return
	}
	time.Sleep(overloadLatency)
	s.in.Add(-1)
	if s.mode == overloadStream {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "event: message_start\ndata: {\"type\":\"message_start\"}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	} else {
		io.WriteString(w, `{"type":"message"}`)
	}
	s.mu.Lock()
	s.served = append(s.served, time.Now())
	s.mu.Unlock()
}

// count returns the calls served and refused from from on.
func (s *overloadServer) count(from time.Time) (served, refused int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range s.served {
		if !t.Before(from) {
			served++
		}
	}
	for _, t := range s.refused {
		if !t.Before(from) {
			refused++
		}
	}
	return served, refused
}

// overloadCell is one client's run: calls served a second in the
// measured half, and the share of the calls the server saw there that
// it refused.
type overloadCell struct {
	rate, refused float64
}

func (c overloadCell) String() string {
	return fmt.Sprintf("%.0f/s (%.2f of capacity), %.1f%% refused", c.rate, c.rate/overloadServed(), 100*c.refused)
}

// overloadServed is what the overload server serves a second at most.
func overloadServed() float64 { return overloadCapacity / overloadLatency.Seconds() }

// runOverload runs 64 callers in a closed loop for d against a fresh
// overload server of mode, through the RoundTripper that client makes on
// the server's own transport (a caller whose call failed tries again a
// millisecond later), and measures the second half. Every call names the
// sub-limit "model-a", as a caller names the model it calls.
func runOverload(mode int, d time.Duration, client func(base http.RoundTripper) http.RoundTripper) overloadCell {
	srv := &overloadServer{mode: mode}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	rt := client(hs.Client().Transport)
	if c, ok := rt.(interface{ Close() error }); ok {
		defer c.Close()
	}
	ctx, cancel := context.WithCancel(sluice.WithSublimit(context.Background(), "model-a"))
	defer time.AfterFunc(d, cancel).Stop()
	start := time.Now()
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for ctx.Err() == nil {
				ok := false
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL+"/v1/messages", nil)
				resp, err := rt.RoundTrip(req)
				if err == nil {
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					ok = resp.StatusCode == http.StatusOK && !strings.Contains(string(b), "overloaded_error")
				}
				if !ok && ctx.Err() == nil {
					time.Sleep(time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	served, refused := srv.count(start.Add(d / 2))
	cell := overloadCell{rate: float64(served) / (d / 2).Seconds()}
	if served+refused > 0 {
		cell.refused = float64(refused) / float64(served+refused)
	}
	return cell
}

// pairTripper is the hand-written peer: x/time/rate waited on for each
// call (WaitN by cost, if set, else 1), then a slot of a semaphore held
// until the body is closed.
type pairTripper struct {
	base http.RoundTripper
	lim  *rate.Limiter
	cost func(context.Context) int
	sem  *semaphore.Weighted
}

func (p *pairTripper) RoundTrip(r *http.Request) (*http.Response, error) {
	n := 1
	if p.cost != nil {
		n = p.cost(r.Context())
	}
	if err := p.lim.WaitN(r.Context(), n); err != nil {
		return nil, err
	}
	return sendHeld(p.sem, p.base, r)
}

// TestSublimitOverloadBesidePair: a loopback server (an in-process
// httptest.Server: it only counts the calls in it) holds 8 calls at a
// time for 50 ms each, 160 a second, and answers a call beyond them at
// once that it is overloaded: with a 529, with a 503 without Retry-After,
// or with a 200 event stream whose first event is an overloaded_error.
// 64 callers in a closed loop name a sub-limit (WithSublimit, as a caller
// names a model); 4 s runs, the second half measured, one client after
// the other in the same run.
//
// An overload is of the server's capacity, which the host's in-flight
// limit bounds: sluice at 1,000/s cuts the host's limit and sees at most
// 20% of the calls the server sees refused, and serves at least 0.75 of
// what x/time/rate at 1,000/s + 8 slots serves, a semaphore set by hand
// to the server's capacity, which sluice is not told: a cut takes its
// limit to 0.75 of what was in flight, under the server's 8, and it
// climbs back a slot a second (about 0.87 of the pair). Were the
// overload read by the sub-limit, which bounds no slots, as a pause, the
// host's limit would stay uncut: the same pair with 64 slots, a limit
// never cut, runs beside them and must be refused more than twice the
// bound (it is refused about 84%), or the server did not overload and
// the test says nothing. Up to three runs; the first within the bounds
// ends a mode.
func TestSublimitOverloadBesidePair(t *testing.T) {
	if testing.Short() {
		t.Skip("real-clock runs of about 36 s")
	}
	const (
		d          = 4 * time.Second
		maxRefused = 0.2
	)
	sl := func(base http.RoundTripper) http.RoundTripper {
		tr, err := sluice.New(base, sluice.WithRate(1000, time.Second), sluice.WithRetry(0))
		if err != nil {
			panic(err)
		}
		return tr
	}
	pair := func(slots int64) func(http.RoundTripper) http.RoundTripper {
		return func(base http.RoundTripper) http.RoundTripper {
			return &pairTripper{base: base, lim: rate.NewLimiter(1000, 1), sem: semaphore.NewWeighted(slots)}
		}
	}
	var table strings.Builder
	for mode, name := range overloadModes {
		t.Run(name, func(t *testing.T) {
			var fail string
			for try := range 3 {
				s := runOverload(mode, d, sl)
				x := runOverload(mode, d, pair(overloadCapacity))
				u := runOverload(mode, d, pair(64))
				fmt.Fprintf(&table, "| %s | %d | %v | %v | %v |\n", name, try, s, x, u)
				t.Logf("run %d: sluice %v; x/time/rate + 8 slots %v; x/time/rate + 64 slots %v", try, s, x, u)
				if u.refused <= 2*maxRefused {
					t.Fatalf("x/time/rate + 64 slots: %v, at most twice the bound of %.0f%%: the server did not overload", u, 100*maxRefused)
				}
				fail = ""
				if s.rate < 0.75*x.rate || s.refused > maxRefused {
					fail = fmt.Sprintf("sluice %v; x/time/rate + 8 slots %v: want at least 0.75 of its rate, at most %.0f%% refused",
						s, x, 100*maxRefused)
				}
				if fail == "" {
					return
				}
			}
			t.Errorf("three runs in a row; the last: %s", fail)
		})
	}
	t.Logf("%v runs, second half; served/s (÷ the server's %.0f/s), share of the calls the server saw refused:\n"+
		"| overload | run | sluice at 1,000/s, sub-limit named | x/time/rate 1,000/s + 8 slots | x/time/rate 1,000/s + 64 slots (never cut) |\n|---|---|---|---|---|\n%s",
		d, overloadServed(), table.String())
}
