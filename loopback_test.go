package sluice

import (
	"context"
	"flag"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/upstream"
)

// loopbackRun is how long one iteration of BenchmarkStrictGCRALoopback
// sends: by default long enough for the learning (the first cooldown alone
// is a second) to be a part of the result rather than all of it, short
// enough for three clients to run in half a minute. -sluice.loopback=60s
// matches the virtual-time test's run.
var loopbackRun time.Duration

// loopbackRate is the upstream's limit R. At 50/s a token interval is 20 ms
// and a few milliseconds of loopback jitter are a tenth of it; at 10/s the
// same jitter is a fiftieth (-sluice.loopback.rate=10).
var loopbackRate int

func init() {
	flag.DurationVar(&loopbackRun, "sluice.loopback", 10*time.Second, "how long each BenchmarkStrictGCRALoopback run sends")
	flag.IntVar(&loopbackRate, "sluice.loopback.rate", 50, "the upstream's limit in BenchmarkStrictGCRALoopback, per second")
}

// BenchmarkStrictGCRALoopback is TestLearnFromStrictGCRA in real time over
// loopback TCP, with the machine's own scheduling and network jitter
// instead of injected jitter: an upstream at 50/s with burst 1 (a request
// even 1 ms early is refused) and Retry-After in whole seconds, against
// x/time/rate paced at R, sluice at R and sluice at 2R. One iteration is a
// run of loopbackRun from a fresh upstream and client. It reports what the
// upstream accepted as a share of R, over the run and over its second
// half, and the share of attempts answered 429. A benchmark, not a test,
// because it makes claims about real time on a shared machine.
func BenchmarkStrictGCRALoopback(b *testing.B) {
	r := loopbackRate
	for _, c := range []struct {
		name string
		wrap func(base http.RoundTripper) http.RoundTripper
	}{
		{"rate_at_R", naiveGCRAClient(float64(r))},
		{"sluice_at_R", func(base http.RoundTripper) http.RoundTripper { return mustNew(b, base, WithRate(r, time.Second)) }},
		{"sluice_at_2R", func(base http.RoundTripper) http.RoundTripper { return mustNew(b, base, WithRate(2*r, time.Second)) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			var accepted, rejected, late int
			var cools uint64
			n := 0
			for b.Loop() {
				a, rj, l, cl := loopbackGCRA(float64(r), c.wrap)
				accepted, rejected, late, cools, n = accepted+a, rejected+rj, late+l, cools+cl, n+1
			}
			b.ReportMetric(float64(accepted)/loopbackRun.Seconds()/float64(n)/float64(r), "rate/R")
			b.ReportMetric(float64(late)/(loopbackRun.Seconds()/2)/float64(n)/float64(r), "rate/R-2nd-half")
			b.ReportMetric(100*float64(rejected)/float64(max(1, accepted+rejected)), "429%")
			b.ReportMetric(float64(cools)/float64(n), "cooldowns/run")
		})
	}
}

// loopbackGCRA runs 16 workers through the client wrap makes for
// loopbackRun against a fresh strict upstream at r per second on loopback
// TCP, and returns what it accepted and refused, what it accepted in the
// run's second half, and the client's cooldowns (0 if it is not sluice).
func loopbackGCRA(r float64, wrap func(base http.RoundTripper) http.RoundTripper) (accepted, rejected, late int, cools uint64) {
	srv := upstream.NewTCP(upstream.Config{Rate: r, Burst: 1})
	defer srv.Close()
	rt := wrap(srv.Transport())
	url := srv.URL() + "/"
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), loopbackRun)
	defer cancel()
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
				resp, err := rt.RoundTrip(req)
				if err != nil {
					pause(ctx)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	for _, a := range srv.Arrivals() {
		if a.Accepted && a.At.Sub(start) >= loopbackRun/2 && a.At.Sub(start) < loopbackRun {
			late++
		}
	}
	accepted, rejected = srv.Counts()
	if tr, ok := rt.(*Transport); ok {
		for _, l := range tr.Stats().Lanes {
			cools += l.Cooldowns
		}
	}
	return accepted, rejected, late, cools
}
