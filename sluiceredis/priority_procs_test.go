package sluiceredis

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluice-go/sluice"
)

const (
	prioRate    = 100
	prioBurst   = 4
	prioRefresh = time.Second
	prioWorkers = 16
	prioSecs    = 10 // seconds of sending
	// prioFrom is the first second measured: the split must have converged
	// within two refreshes.
	prioFrom = 2
)

// TestSharesPriorityConverges runs four OS processes (this test binary,
// run again as TestSharesPriorityChild) on one key of 100/s: process 0
// keeps 16 Interactive calls waiting, the others 16 Batch calls each, so
// that each wants more than the rate. From the third second on, the
// Interactive process must get the rate less the low share (a tenth, by
// sluice.DefaultLowShare): at least 0.85 of the arrivals every second; the
// fleet at least 0.97 of what a peer sends meanwhile (an x/time/rate
// limiter at the rate, with 16 workers, in this process: a runner that
// stalls stalls both); and the bound must hold.
func TestSharesPriorityConverges(t *testing.T) {
	const n = 4
	srv := startRedis(t)
	up := newRecorder(t, 0)

	// The processes start sending together, once all have started; the
	// peer, in this process, too.
	start := time.Now().Add(3 * time.Second)
	stop := start.Add(prioSecs * time.Second)
	ctx, cancel := context.WithDeadline(context.Background(), stop.Add(30*time.Second))
	defer cancel()
	wait := startChildren(ctx, t, n, "TestSharesPriorityChild", "priority", "",
		fleetEnv(child{redis: srv.Addr(), url: up.url, start: start, stop: stop})...)
	peerCtx, peerStop := context.WithDeadline(context.Background(), stop)
	defer peerStop()
	time.Sleep(time.Until(start))
	lim := rate.NewLimiter(prioRate, prioBurst)
	peerTr := &http.Transport{}
	defer peerTr.CloseIdleConnections()
	var pw sync.WaitGroup
	for range prioWorkers {
		pw.Go(func() {
			for lim.Wait(peerCtx) == nil {
				req, _ := http.NewRequestWithContext(peerCtx, "GET", up.url, nil)
				req.Header.Set("X-Proc", "-1")
				resp, err := peerTr.RoundTrip(req)
				if err != nil {
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	pw.Wait()
	wait()
	if t.Failed() {
		return
	}
	arrivals, who := up.arrivals()
	var (
		inter, all, peer [prioSecs]int
		in               []time.Time
	)
	for k, a := range arrivals {
		s := int(a.Sub(start) / time.Second)
		if a.Before(start) || s >= prioSecs {
			continue
		}
		if who[k] < 0 {
			peer[s]++
			continue
		}
		all[s]++
		if who[k] == 0 {
			inter[s]++
		}
		if s >= prioFrom {
			in = append(in, a)
		}
	}
	slices.SortFunc(in, func(a, b time.Time) int { return a.Compare(b) })
	var line strings.Builder
	for s := range prioSecs {
		fmt.Fprintf(&line, " %d/%d", inter[s], all[s])
	}
	secs := float64(prioSecs - prioFrom)
	peerIn := sum(peer[prioFrom:])
	t.Logf("Interactive/all arrivals each second, 1 Interactive and 3 Batch processes on %d/s, refresh %v:%s", prioRate, prioRefresh, line.String())
	t.Logf("  from second %d: %.3f of the rate (the peer %.3f), Interactive %.3f of the arrivals", prioFrom+1,
		float64(len(in))/secs/prioRate, float64(peerIn)/secs/prioRate, float64(sum(inter[prioFrom:]))/float64(max(len(in), 1)))
	for s := prioFrom; s < prioSecs; s++ {
		if all[s] < peer[s]/2 {
			// The runner stalled the fleet more than the peer: the
			// split of a few arrivals says little. The total below
			// counts this second.
			continue
		}
		if f := float64(inter[s]) / float64(max(all[s], 1)); f < 0.85 {
			t.Errorf("second %d: the Interactive process got %d of %d arrivals (%.2f), under 0.85", s+1, inter[s], all[s], f)
		}
	}
	if got := float64(len(in)) / float64(max(peerIn, 1)); got < 0.97 {
		t.Errorf("from second %d the fleet sent %d, %.3f of the peer's %d, under 0.97", prioFrom+1, len(in), got, peerIn)
	}
	checkBound(t, in, prioRate, prioBurst, n, 250*time.Millisecond, time.Second, 3*time.Second)
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

// TestSharesPriorityChild is one process of TestSharesPriorityConverges;
// run alone it skips.
func TestSharesPriorityChild(t *testing.T) {
	c := readChild(t, "priority")
	start, stop := c.start, c.stop
	proc, url := strconv.Itoa(c.proc), c.url

	b := newBackend(t, newClient(t, c.redis), WithRefresh(prioRefresh))
	defer b.Close()
	tr, err := sluice.New(nil, sluice.WithRate(prioRate, time.Second), sluice.WithBurst(prioBurst),
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

	p := sluice.Batch
	if c.proc == 0 {
		p = sluice.Interactive
	}
	var wg sync.WaitGroup
	for range prioWorkers {
		wg.Go(func() {
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(sluice.WithPriority(ctx, p), "GET", url, nil)
				req.Header.Set("X-Proc", proc)
				resp, err := client.Do(req)
				if err != nil {
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
}
