package sluiceredis

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/upstream"
)

// The fleet test's numbers. Demand (fleetWorkers per process) exceeds the
// rate, so the processes contend for every token.
const (
	fleetProcs   = 3
	fleetRate    = 40 // per second, for the whole fleet
	fleetBurst   = 2
	fleetRun     = 3 * time.Second
	fleetWorkers = 8
)

// TestFleetProcesses runs fleetProcs OS processes (this test binary,
// re-executed as TestFleetChild), each with its own sluice.Transport and
// Backend on one Redis and one key, against one upstream here that counts
// arrivals. Together they must keep within rate x T + burst in every window
// T, and use at least 95% of the rate.
func TestFleetProcesses(t *testing.T) {
	srv := startRedis(t)

	var (
		mu       sync.Mutex
		arrivals []time.Time
		perProc  = map[string]int{}
	)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		mu.Lock()
		arrivals = append(arrivals, now)
		perProc[r.Header.Get("X-Proc")]++
		mu.Unlock()
		io.WriteString(w, "ok\n")
	}))
	defer up.Close()

	// The processes start sending together, once all have started.
	start := time.Now().Add(2 * time.Second)
	stop := start.Add(fleetRun)
	ctx, cancel := context.WithDeadline(context.Background(), stop.Add(30*time.Second))
	defer cancel()
	reports := startChildren(ctx, t, fleetProcs, "TestFleetChild", "fleet", "fleet: ",
		"FLEET_REDIS="+srv.Addr(),
		"FLEET_URL="+up.URL,
		"FLEET_START="+strconv.FormatInt(start.UnixNano(), 10),
		"FLEET_STOP="+strconv.FormatInt(stop.UnixNano(), 10))()
	if t.Failed() {
		return
	}

	mu.Lock()
	defer mu.Unlock()
	slices.SortFunc(arrivals, func(a, b time.Time) int { return a.Compare(b) })
	var in []time.Time
	for _, a := range arrivals {
		if !a.Before(start) && !a.After(stop) {
			in = append(in, a)
		}
	}
	total := len(in)
	want := fleetRate * fleetRun.Seconds()
	t.Logf("%d processes sharing %d/s (burst %d) for %v:", fleetProcs, fleetRate, fleetBurst, fleetRun)
	for i := range fleetProcs {
		t.Logf("  process %d: %d arrivals (%s)", i, perProc[strconv.Itoa(i)], reports[i])
	}
	t.Logf("  total %d = %.3f x rate x time", total, float64(total)/want)
	if float64(total) < 0.95*want {
		t.Errorf("the fleet sent %d in %v, under 95%% of %v", total, fleetRun, want)
	}
	for _, w := range []time.Duration{250 * time.Millisecond, time.Second} {
		bound := fleetRate*w.Seconds() + fleetBurst
		got := upstream.MaxInWindow(arrivals, w)
		t.Logf("  most in any %v: %d, bound rate x T + burst = %.0f", w, got, bound)
		// One arrival of slack: the upstream timestamps arrivals after a
		// network hop whose delay varies; the budget is kept at the send.
		if float64(got) > bound+1 {
			t.Errorf("%d arrivals in a window of %v, over rate x T + burst = %v", got, w, bound)
		}
	}
	for i := range fleetProcs {
		if perProc[strconv.Itoa(i)] == 0 {
			t.Errorf("process %d sent nothing", i)
		}
	}
}

// TestFleetChild is one process of TestFleetProcesses; run alone it skips.
func TestFleetChild(t *testing.T) {
	if os.Getenv(childEnv) != "fleet" {
		t.Skip("a child of TestFleetProcesses")
	}
	env := func(k string) int64 {
		v, err := strconv.ParseInt(os.Getenv(k), 10, 64)
		if err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		return v
	}
	start, stop := time.Unix(0, env("FLEET_START")), time.Unix(0, env("FLEET_STOP"))
	proc, url := os.Getenv("FLEET_PROC"), os.Getenv("FLEET_URL")

	// A second, not DefaultTimeout: one slow call on a busy machine would
	// send this process to its fallback, whose budget comes on top of the
	// shared one and breaks the bound checked.
	b := newTokens(t, newClient(t, os.Getenv("FLEET_REDIS")), WithTimeout(time.Second))
	tr, err := sluice.New(nil, sluice.WithRate(fleetRate, time.Second), sluice.WithBurst(fleetBurst),
		sluice.WithBackend(b), sluice.WithRetry(0))
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: tr}
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithDeadline(context.Background(), stop)
	defer cancel()
	time.Sleep(time.Until(start))

	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		sent int
	)
	for range fleetWorkers {
		wg.Go(func() {
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
				req.Header.Set("X-Proc", proc)
				resp, err := client.Do(req)
				if err != nil {
					continue // the deadline
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				sent++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	fmt.Printf("fleet: %d sent\n", sent)
}
