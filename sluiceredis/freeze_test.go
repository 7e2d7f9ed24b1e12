package sluiceredis

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/upstream"
)

// The freeze test's numbers. The in-flight cap is what the rate
// needs at the upstream's latency (100/s x 25ms = 2.5) and a place more, so it binds only
// if places are lost: to leases nobody holds. On its fallback each process
// may have floor(4 x 0.25) = 1 in flight, 40/s at that latency, above its
// quarter of the rate.
const (
	freezeProcs   = 4
	freezeRate    = 100
	freezeBurst   = 1
	freezeCap     = 4
	freezeLatency = 25 * time.Millisecond
	freezeWorkers = 8
	freezeBefore  = time.Second
	freezeFor     = 2500 * time.Millisecond
	freezeAfter   = 2 * time.Second
)

// TestFleetFreeze runs freezeProcs OS processes (this binary, re-executed
// as TestFleetFreezeChild), each a Transport with its own Backend on one
// real redis-server, with an in-flight cap, against one upstream here; and
// freezes Redis (SIGSTOP) for freezeFor in the middle. During the freeze
// the fleet stays within rate x T + burst + (processes - 1) in any window
// T (each process on its fallback, a quarter of the rate); from one second
// after Redis resumes it is back at the full rate: the calls that timed
// out during the freeze and ran when Redis resumed hold no places.
func TestFleetFreeze(t *testing.T) {
	srv := startRedis(t)
	up := newRecorder(t, freezeLatency)

	// The processes start sending together, once all have started.
	start := time.Now().Add(1500 * time.Millisecond)
	freeze := start.Add(freezeBefore)
	resume := freeze.Add(freezeFor)
	stop := resume.Add(freezeAfter)
	ctx, cancel := context.WithDeadline(context.Background(), stop.Add(30*time.Second))
	defer cancel()
	wait := startChildren(ctx, t, freezeProcs, "TestFleetFreezeChild", "freeze", "",
		fleetEnv(child{redis: srv.Addr(), url: up.url, start: start, stop: stop})...)
	time.Sleep(time.Until(freeze))
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(resume))
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	wait()
	if t.Failed() {
		return
	}

	arrivals, procOf := up.arrivals()
	// rate returns the fleet's arrivals per second in [from, to), and each
	// process's share of them.
	rate := func(from, to time.Time) (float64, [freezeProcs]float64) {
		var n int
		var per [freezeProcs]float64
		for i, a := range arrivals {
			if !a.Before(from) && a.Before(to) {
				n++
				per[procOf[i]]++
			}
		}
		for i := range per {
			per[i] /= float64(max(n, 1))
		}
		return float64(n) / to.Sub(from).Seconds(), per
	}
	before, perBefore := rate(start.Add(300*time.Millisecond), freeze)
	during, perDuring := rate(freeze, resume)
	after, perAfter := rate(resume.Add(time.Second), stop)
	t.Logf("%d processes sharing %d/s, at most %d in flight (upstream latency %v); Redis frozen for %v:",
		freezeProcs, freezeRate, freezeCap, freezeLatency, freezeFor)
	t.Logf("  before the freeze     %.1f/s = %.3f of the rate, split %.2f", before, before/freezeRate, perBefore)
	t.Logf("  frozen                %.1f/s = %.3f, split %.2f", during, during/freezeRate, perDuring)
	t.Logf("  1s after Redis resumed %.1f/s = %.3f, split %.2f", after, after/freezeRate, perAfter)
	var frozen []time.Time
	for _, a := range arrivals {
		// From the first timeout on, every process is on its fallback.
		if !a.Before(freeze.Add(DefaultTimeout)) && a.Before(resume) {
			frozen = append(frozen, a)
		}
	}
	for _, w := range []time.Duration{10 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond, time.Second} {
		bound := freezeRate*w.Seconds() + freezeBurst + freezeProcs - 1
		got := upstream.MaxInWindow(frozen, w)
		t.Logf("  frozen: most in any %v: %d, bound rate x T + burst + (processes - 1) = %.0f", w, got, bound)
		// One arrival of slack: the upstream timestamps arrivals after a
		// network hop whose delay varies; the budget is kept at the send.
		if float64(got) > bound+1 {
			t.Errorf("%d arrivals in a window of %v while Redis was frozen, over rate x T + burst + (processes - 1) = %.0f", got, w, bound)
		}
	}
	// After the freeze, the fleet is back to its pace before it: 0.85 of
	// it leaves room for a loaded runner (which paced this fleet at
	// 0.91-1.0 of the rate before the freeze under -race on two cores),
	// and is far above what leases nobody holds leave (none: the cap is
	// taken).
	if after < 0.85*before {
		t.Errorf("the fleet sent %.1f/s from 1s after Redis resumed, under 0.85 of its %.1f/s before the freeze", after, before)
	}
	if n := newClient(t, srv.Addr()).ZCard(context.Background(), "sluice:{"+hostOf(up.url)+"}:lease").Val(); n != 0 {
		t.Errorf("%d leases left in Redis after every process closed its Backend: %v", n, newClient(t, srv.Addr()).ZRangeWithScores(context.Background(), "sluice:{"+hostOf(up.url)+"}:lease", 0, -1).Val())
	}
}

// TestFleetFreezeChild is one process of TestFleetFreeze; run alone it
// skips.
func TestFleetFreezeChild(t *testing.T) {
	c := readChild(t, "freeze")
	start, stop := c.start, c.stop
	proc, url := strconv.Itoa(c.proc), c.url

	b, err := NewTokens(newClient(t, c.redis), WithInFlight(freezeCap, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	tr, err := sluice.New(nil, sluice.WithRate(freezeRate, time.Second), sluice.WithBurst(freezeBurst),
		sluice.WithBackend(b), sluice.WithRetry(0))
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: tr}
	defer client.CloseIdleConnections()
	time.Sleep(time.Until(start))
	n, _, errs, first := hammer(stop, tr, url, freezeWorkers, "X-Proc", proc)
	if errs > 0 {
		t.Errorf("%d requests failed, the first with %v", errs, first)
	}
	if c, ok := any(b).(interface{ Close() error }); ok {
		c.Close()
	}
	fmt.Printf("freeze: %d sent, self %s\n", n, b.self)
}
