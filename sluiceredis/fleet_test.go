package sluiceredis

import (
	"context"
	"fmt"
	"slices"
	"strconv"
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
	up := newRecorder(t, 0)

	// The processes start sending together, once all have started.
	start := time.Now().Add(2 * time.Second)
	stop := start.Add(fleetRun)
	ctx, cancel := context.WithDeadline(context.Background(), stop.Add(30*time.Second))
	defer cancel()
	reports := startChildren(ctx, t, fleetProcs, "TestFleetChild", "fleet", "fleet: ",
		fleetEnv(child{redis: srv.Addr(), url: up.url, start: start, stop: stop})...)()
	if t.Failed() {
		return
	}

	arrivals, who := up.arrivals()
	perProc := make([]int, fleetProcs)
	for _, p := range who {
		if p >= 0 && p < fleetProcs {
			perProc[p]++
		}
	}
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
		t.Logf("  process %d: %d arrivals (%s)", i, perProc[i], reports[i])
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
		if perProc[i] == 0 {
			t.Errorf("process %d sent nothing", i)
		}
	}
}

// TestFleetChild is one process of TestFleetProcesses; run alone it skips.
func TestFleetChild(t *testing.T) {
	c := readChild(t, "fleet")
	start, stop := c.start, c.stop
	proc, url := strconv.Itoa(c.proc), c.url

	// A second, not DefaultTimeout: one slow call on a busy machine would
	// send this process to its fallback, whose budget comes on top of the
	// shared one and breaks the bound checked.
	b := newTokens(t, newClient(t, c.redis), WithTimeout(time.Second))
	tr, err := sluice.New(nil, sluice.WithRate(fleetRate, time.Second), sluice.WithBurst(fleetBurst),
		sluice.WithBackend(b), sluice.WithRetry(0))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(start))
	sent, _, _, _ := hammer(stop, tr, url, fleetWorkers, "X-Proc", proc)
	fmt.Printf("fleet: %d sent\n", sent)
}
