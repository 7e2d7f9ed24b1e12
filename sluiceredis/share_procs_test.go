package sluiceredis

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
)

// TestSharesProcesses runs fleets of OS processes (this test binary, run
// again as TestSharesChild) in share mode on one Redis and one key: process
// 0 sends Interactive calls at 40/s, the others Batch calls as fast as they
// are let, together above the rate. The Interactive process must be served
// at its demand, the fleet must keep within rate x T + burst + procs x
// shareSlack and the hop's slack in every window T (see checkBound), and
// the Batch processes share the rest.
func TestSharesProcesses(t *testing.T) {
	for _, n := range []int{4, 16} {
		t.Run(strconv.Itoa(n), func(t *testing.T) { sharesProcesses(t, n) })
	}
}

const (
	procsRate    = 100
	procsBurst   = 4
	procsDemand  = 40.0
	procsRefresh = time.Second
)

func sharesProcesses(t *testing.T, n int) {
	srv := startRedis(t)
	up := newRecorder(t, 0)

	// Processes start together, once all have started (16 take a while
	// under -race); the first seconds are the shares settling.
	start := time.Now().Add(3 * time.Second)
	from, stop := start.Add(4*time.Second), start.Add(14*time.Second)
	ctx, cancel := context.WithDeadline(context.Background(), stop.Add(30*time.Second))
	defer cancel()
	reports := startChildren(ctx, t, n, "TestSharesChild", "shares", "shares: ",
		fleetEnv(child{redis: srv.Addr(), url: up.url, start: start, from: from, stop: stop})...)()
	if t.Failed() {
		return
	}
	arrivals, who := up.arrivals()
	per := make([]int, n)
	var in []time.Time
	for k, a := range arrivals {
		if !a.Before(from) && !a.After(stop) {
			in = append(in, a)
			per[who[k]]++
		}
	}
	slices.SortFunc(in, func(a, b time.Time) int { return a.Compare(b) })
	secs := stop.Sub(from).Seconds()
	t.Logf("%d processes sharing %d/s (burst %d), refresh %v, measured over %.0fs:", n, procsRate, procsBurst, procsRefresh, secs)
	batch := 0
	for i := range n {
		if i > 0 {
			batch += per[i]
		}
		t.Logf("  process %d: %.1f/s (%s)", i, float64(per[i])/secs, reports[i])
	}
	t.Logf("  total %.1f/s = %.3f of the rate", float64(len(in))/secs, float64(len(in))/secs/procsRate)
	if got := float64(per[0]) / secs; got < 0.9*procsDemand {
		t.Errorf("the Interactive process was served %.1f/s of its %v/s", got, procsDemand)
	}
	fair := (procsRate - procsDemand) / float64(n-1)
	for i := 1; i < n; i++ {
		if got := float64(per[i]) / secs; got < 0.4*fair {
			t.Errorf("batch process %d got %.1f/s, under 0.4 of its fair %.1f/s", i, got, fair)
		}
	}
	if float64(len(in)) < 0.9*procsRate*secs {
		t.Errorf("the fleet sent %.1f/s, under 90%% of %d/s", float64(len(in))/secs, procsRate)
	}
	checkBound(t, in, procsRate, procsBurst, n, 250*time.Millisecond, time.Second, 3*time.Second)
}

// TestSharesChild is one process of TestSharesProcesses; run alone it skips.
func TestSharesChild(t *testing.T) {
	c := readChild(t, "shares")
	start, from, stop := c.start, c.from, c.stop
	proc, url := strconv.Itoa(c.proc), c.url

	b := newBackend(t, newClient(t, c.redis), WithRefresh(procsRefresh))
	defer b.Close()
	tr, err := sluice.New(nil, sluice.WithRate(procsRate, time.Second), sluice.WithBurst(procsBurst),
		sluice.WithBackend(b), sluice.WithRetry(0))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	client := &http.Client{Transport: tr}
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	time.AfterFunc(time.Until(stop), cancel)
	time.Sleep(time.Until(start))

	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		sent  int
		waits []time.Duration
	)
	do := func(p sluice.Priority) {
		req, _ := http.NewRequestWithContext(sluice.WithPriority(ctx, p), "GET", url, nil)
		req.Header.Set("X-Proc", proc)
		at := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return
		}
		d := time.Since(at)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		mu.Lock()
		sent++
		if p == sluice.Interactive && at.After(from) {
			waits = append(waits, d)
		}
		mu.Unlock()
	}
	if c.proc == 0 {
		rng := rand.New(rand.NewPCG(1, 2))
		for next := time.Now(); ; {
			next = next.Add(time.Duration(rng.ExpFloat64() / procsDemand * float64(time.Second)))
			if !next.Before(stop) {
				break
			}
			time.Sleep(time.Until(next))
			wg.Go(func() { do(sluice.Interactive) })
		}
	} else {
		for range 8 {
			wg.Go(func() {
				for ctx.Err() == nil {
					do(sluice.Batch)
				}
			})
		}
	}
	wg.Wait()
	if c.proc == 0 {
		fmt.Printf("shares: %d sent, Interactive p99 %v over %d\n", sent, p99(waits).Round(time.Millisecond), len(waits))
	} else {
		fmt.Printf("shares: %d sent\n", sent)
	}
}
