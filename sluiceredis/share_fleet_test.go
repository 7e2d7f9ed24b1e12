package sluiceredis

import (
	"context"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/upstream"
)

// A shareFleet is a fleet run in share mode: procs processes (each its own
// Redis client, Backend and Transport, as separate processes would have;
// see TestSharesProcesses for OS processes) against one upstream that logs
// every arrival. Process 0 may send Interactive calls at a Poisson rate
// (interactive per second) and the others Batch calls from workers
// goroutines each; so may process 0 if interactive is 0.
type shareFleet struct {
	procs       int
	rate        float64
	burst       int
	refresh     time.Duration
	run, warm   time.Duration // measured after warm
	interactive float64       // process 0's Poisson rate; 0: it sends Batch too
	workers     int           // Batch workers per process
	redisAddr   string        // "": a redis-server of the test's own
	bopts       []Option
	perToken    bool // Tokens rather than a Backend, to compare
	transports  int  // Transports per process (sharing its Backend); 0: 1
}

type shareResult struct {
	arrivals []time.Time     // in the measured window, every process
	perProc  []int           // arrivals in the measured window
	perTr    map[int]int     // process 0's arrivals in the window, by Transport
	waits    []time.Duration // process 0's Interactive round trips, in the window
	calls    int64           // Redis round trips made by the Backends
	sent     int             // requests answered, in the whole run
	from, to time.Time       // the measured window
}

func (f shareFleet) start(t *testing.T) shareResult {
	t.Helper()
	addr := f.redisAddr
	if addr == "" {
		addr = startRedis(t).Addr()
	}
	var (
		mu   sync.Mutex
		res  = shareResult{perProc: make([]int, f.procs)}
		all  []time.Time
		who  []int
		trOf []int
	)
	res.perTr = map[int]int{}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		p, _ := strconv.Atoi(r.Header.Get("X-Proc"))
		j, _ := strconv.Atoi(r.Header.Get("X-Transport"))
		mu.Lock()
		all = append(all, now)
		who = append(who, p)
		trOf = append(trOf, j)
		mu.Unlock()
		io.WriteString(w, "ok\n")
	}))
	defer up.Close()

	type proc struct {
		trs []*sluice.Transport
		b   interface {
			sluice.Backend
			Close() error
		}
		n *counter
	}
	ps := make([]proc, f.procs)
	for i := range ps {
		c := newClient(t, addr)
		n := countCalls(c)
		ps[i].n = n
		if f.perToken {
			ps[i].b = newTokens(t, c, f.bopts...)
		} else {
			ps[i].b = newBackend(t, c, append([]Option{WithRefresh(f.refresh)}, f.bopts...)...)
		}
		b := ps[i].b
		for range max(f.transports, 1) {
			tr, err := sluice.New(nil, sluice.WithRate(int(f.rate), time.Second), sluice.WithBurst(f.burst),
				sluice.WithBackend(b), sluice.WithRetry(0))
			if err != nil {
				t.Fatal(err)
			}
			ps[i].trs = append(ps[i].trs, tr)
		}
	}
	defer func() {
		for _, p := range ps {
			for _, tr := range p.trs {
				tr.Close()
				tr.CloseIdleConnections()
			}
			if err := p.b.Close(); err != nil {
				t.Error(err)
			}
		}
	}()

	begin := time.Now()
	res.from, res.to = begin.Add(f.warm), begin.Add(f.run)
	// Cancelled at the end rather than given a deadline, which sluice
	// would refuse requests against as the end nears.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	time.AfterFunc(time.Until(res.to), cancel)
	var (
		wg   sync.WaitGroup
		sent sync.Mutex
	)
	send := func(i, j int, p sluice.Priority) (time.Duration, bool) {
		req, _ := http.NewRequestWithContext(sluice.WithPriority(ctx, p), "GET", up.URL, nil)
		req.Header.Set("X-Proc", strconv.Itoa(i))
		req.Header.Set("X-Transport", strconv.Itoa(j))
		start := time.Now()
		resp, err := ps[i].trs[j].RoundTrip(req)
		if err != nil {
			return 0, false
		}
		d := time.Since(start)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		sent.Lock()
		res.sent++
		sent.Unlock()
		return d, true
	}
	for i := range f.procs {
		if i == 0 && f.interactive > 0 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(1, 2))
				var iw sync.WaitGroup
				defer iw.Wait()
				for next := time.Now(); ; {
					next = next.Add(time.Duration(rng.ExpFloat64() / f.interactive * float64(time.Second)))
					if !next.Before(res.to) {
						return
					}
					time.Sleep(time.Until(next))
					iw.Go(func() {
						at := time.Now()
						if d, ok := send(0, 0, sluice.Interactive); ok && at.After(res.from) {
							mu.Lock()
							res.waits = append(res.waits, d)
							mu.Unlock()
						}
					})
				}
			})
			continue
		}
		for w := range f.workers {
			wg.Go(func() {
				for ctx.Err() == nil {
					send(i, w%len(ps[i].trs), sluice.Batch)
				}
			})
		}
	}
	wg.Wait()
	for _, p := range ps {
		res.calls += p.n.n.Load()
	}
	mu.Lock()
	defer mu.Unlock()
	for k, a := range all {
		if a.Before(res.from) || a.After(res.to) {
			continue
		}
		res.arrivals = append(res.arrivals, a)
		res.perProc[who[k]]++
		if who[k] == 0 {
			res.perTr[trOf[k]]++
		}
	}
	slices.SortFunc(res.arrivals, func(a, b time.Time) int { return a.Compare(b) })
	return res
}

func (r shareResult) seconds() float64 { return r.to.Sub(r.from).Seconds() }

// p99 returns the 99th percentile of ds.
func p99(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(math.Ceil(0.99*float64(len(s))))-1)]
}

// checkBound fails t if more than rate x T + burst + procs x slack arrivals
// fall in any window T of ws.
func checkBound(t *testing.T, arrivals []time.Time, rate float64, burst, procs int, ws ...time.Duration) {
	t.Helper()
	for _, w := range ws {
		hop := max(float64(procs), rate*transit.Seconds())
		bound := rate*w.Seconds() + float64(burst) + float64(procs*shareSlack) + hop
		got := upstream.MaxInWindow(arrivals, w)
		t.Logf("  most in any %v: %d, bound rate x T + burst + %d x %d + %.0f = %.0f", w, got, procs, shareSlack, hop, bound)
		if float64(got) > bound {
			t.Errorf("%d arrivals in a window of %v, over rate x T + burst + procs x slack + the hop's = %v", got, w, bound)
		}
	}
}

// shareSlack is the tokens per process a share adds to rate x T + burst
// (see the package doc, "How a Backend leases"): its burst's rounding up to a
// whole token, and the lane's own token of late charging. checkBound adds
// the hop's: the upstream stamps arrivals after a hop between sluice and
// it whose delay varies, by up to transit on a loaded runner (a goroutine
// scheduled late, under the race detector too), which bunches rate x
// transit requests; at least one a process.
const (
	shareSlack = 2
	transit    = 4 * time.Millisecond
)

// TestSharesPriority: one process sends Interactive calls at 40/s and three
// send Batch calls as fast as they are let, sharing 100/s. The Interactive
// process must be served at its demand, the Batch ones share the rest, the
// fleet must keep within its bound and use at least 97% of the rate, and
// the Interactive p99 wait must be within a refresh of what it is alone.
func TestSharesPriority(t *testing.T) {
	const (
		rate    = 100
		burst   = 4
		refresh = time.Second
		demand  = 40.0
	)
	addr := startRedis(t).Addr()
	alone := shareFleet{procs: 1, rate: rate, burst: burst, refresh: refresh, run: 5 * time.Second, warm: time.Second,
		interactive: demand, redisAddr: addr}.start(t)
	fleet := shareFleet{procs: 4, rate: rate, burst: burst, refresh: refresh, run: 14 * time.Second, warm: 4 * time.Second,
		interactive: demand, workers: 8, redisAddr: addr}.start(t)

	secs := fleet.seconds()
	total := len(fleet.arrivals)
	t.Logf("4 processes sharing %d/s (burst %d), refresh %v, measured over %.1fs:", rate, burst, refresh, secs)
	for i, n := range fleet.perProc {
		t.Logf("  process %d (%s): %.1f/s", i, map[bool]string{true: "interactive", false: "batch"}[i == 0], float64(n)/secs)
	}
	t.Logf("  total %.1f/s = %.3f of the rate; Interactive p99 %v in the fleet, %v alone (%d and %d calls)",
		float64(total)/secs, float64(total)/secs/rate, p99(fleet.waits), p99(alone.waits), len(fleet.waits), len(alone.waits))
	if got := float64(fleet.perProc[0]) / secs; got < 0.9*demand {
		t.Errorf("the Interactive process was served %.1f/s of its %v/s", got, demand)
	}
	for i := 1; i < 4; i++ {
		got := float64(fleet.perProc[i]) / secs
		if fair := (rate - demand) / 3; got < 0.5*fair || got > 1.5*fair {
			t.Errorf("batch process %d got %.1f/s, not near its fair %.1f/s", i, got, fair)
		}
	}
	// The target is 0.97 of the rate (measured 0.977-0.982 on two loaded
	// cores without -race; see docs/design.md, "Fleet backend: shares");
	// 0.96 here leaves a point for a runner loaded further. Under -race,
	// whose cost delays the lanes' timers and the Poisson sender's, it
	// measured 0.937-0.975 on two cores: 0.92 there.
	floor := 0.96
	if raceEnabled {
		floor = 0.92
	}
	if float64(total) < floor*rate*secs {
		t.Errorf("the fleet sent %.1f/s, under %.2f of %d/s", float64(total)/secs, floor, rate)
	}
	if p99(fleet.waits) > p99(alone.waits)+refresh {
		t.Errorf("Interactive p99 %v in the fleet, more than a refresh (%v) over %v alone", p99(fleet.waits), refresh, p99(alone.waits))
	}
	checkBound(t, fleet.arrivals, rate, burst, 4, 250*time.Millisecond, time.Second, 3*time.Second)

	// The same fleet taking a token per request, for the figure: priority
	// is decided inside each process only.
	tok := shareFleet{procs: 4, rate: rate, burst: burst, run: 8 * time.Second, warm: 2 * time.Second,
		interactive: demand, workers: 8, redisAddr: addr, perToken: true}.start(t)
	t.Logf("  a token per request instead: Interactive %.1f/s, Batch %.1f, %.1f, %.1f/s; Interactive p99 %v",
		float64(tok.perProc[0])/tok.seconds(), float64(tok.perProc[1])/tok.seconds(), float64(tok.perProc[2])/tok.seconds(),
		float64(tok.perProc[3])/tok.seconds(), p99(tok.waits))
}

// TestSharesCalls measures Redis round trips per request at two rates: a
// few per second per process, whatever the rate.
func TestSharesCalls(t *testing.T) {
	addr := startRedis(t).Addr()
	for _, rate := range []float64{100, 5000} {
		const run, warm = 7 * time.Second, 3 * time.Second
		burst := max(4, int(rate/100))
		// A peer beside the fleet, over the same window: x/time/rate at
		// the rate with 16 workers; a runner that stalls stalls both.
		peer := startPeer(rate, burst, 16, warm, run)
		r := shareFleet{procs: 4, rate: rate, burst: burst, refresh: time.Second,
			run: run, warm: warm, workers: 16, redisAddr: addr}.start(t)
		secs := r.seconds()
		peerGot := peer()
		perReq := float64(r.calls) / float64(r.sent)
		perSec := float64(r.calls) / 4 / run.Seconds()
		t.Logf("%v/s shared by 4: %.3f of the rate (the peer %.3f), %d Redis calls for %d requests = %.4f a request (%.1f a second a process)",
			rate, float64(len(r.arrivals))/secs/rate, peerGot/rate, r.calls, r.sent, perReq, perSec)
		if perSec > 5 {
			t.Errorf("%.1f Redis calls a second a process at %v/s; want a few", perSec, rate)
		}
		// Under -race on two loaded cores the upstream here and 64
		// workers do not reach 5,000/s; the rate of shares is checked at
		// 100/s.
		if got := float64(len(r.arrivals)) / secs; rate == 100 && got < 0.97*peerGot {
			t.Errorf("4 processes with more demand than %v/s sent %.1f/s, under 0.97 of the peer's %.1f/s", rate, got, peerGot)
		}
	}
}

// TestSharesTransports: two Transports of one process share its Backend
// and each gets half of its share; neither takes the other's.
func TestSharesTransports(t *testing.T) {
	r := shareFleet{procs: 2, rate: 100, burst: 4, refresh: 250 * time.Millisecond, run: 5 * time.Second, warm: 2 * time.Second,
		workers: 8, transports: 2}.start(t)
	secs := r.seconds()
	t.Logf("2 processes, 2 Transports each on one Backend, 100/s: process 0's Transports %.1f/s and %.1f/s, process 1 %.1f/s",
		float64(r.perTr[0])/secs, float64(r.perTr[1])/secs, float64(r.perProc[1])/secs)
	for j := range 2 {
		if got := float64(r.perTr[j]) / secs; got < 0.8*25 || got > 1.2*25 {
			t.Errorf("Transport %d of process 0 sent %.1f/s; want about 25/s (a quarter of the rate)", j, got)
		}
	}
	checkBound(t, r.arrivals, 100, 4, 2, 250*time.Millisecond, time.Second)
}

// TestSharesProxy: Redis 5ms away each way (a proxy here) costs nothing in
// either mode: one process reaches 97% of 200/s (token mode under -race:
// 75%), with shares and with a
// token per request (which takes tokens ahead, a few per call), and keeps
// the bound.
func TestSharesProxy(t *testing.T) {
	srv := startRedis(t)
	p := startDelayProxy(t, srv.Addr(), 5*time.Millisecond)
	for _, perToken := range []bool{false, true} {
		r := shareFleet{procs: 1, rate: 200, burst: 4, refresh: time.Second, run: 5 * time.Second, warm: time.Second,
			workers: 16, redisAddr: p.addr(), perToken: perToken}.start(t)
		got := float64(len(r.arrivals)) / r.seconds() / 200
		mode := map[bool]string{false: "shares", true: "a token per request"}[perToken]
		t.Logf("Redis 5ms away each way, one process at 200/s, %s: %.3f of the rate, %.3f Redis calls a request", mode, got, float64(r.calls)/float64(r.sent))
		want := 0.97
		if perToken && raceEnabled {
			// The race detector slows the Redis client's work on every
			// call, and token mode makes a call every few requests: on two
			// cores 0.88-0.965 under -race, 0.99 without, and 0.81 on a
			// runner busy with other packages' tests. The figure that
			// counts is held without -race.
			want = 0.75
		}
		if got < want {
			t.Errorf("%s with Redis 5ms away: %.3f of the rate, want >= %.2f", mode, got, want)
		}
		checkBound(t, r.arrivals, 200, 4, 1, 100*time.Millisecond, time.Second)
	}
}

// TestBodyCloseDoesNotWaitOnRedis: in token mode with WithInFlight, reading
// a response body to its end and closing it gives the lease back without
// waiting for Redis (5ms away each way here): the release runs on a
// goroutine of its own.
func TestBodyCloseDoesNotWaitOnRedis(t *testing.T) {
	srv := startRedis(t)
	p := startDelayProxy(t, srv.Addr(), 5*time.Millisecond)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") }))
	defer up.Close()
	tr, b := transport(t, p.addr(), nil, []Option{WithInFlight(4, 30*time.Second)}, sluice.WithRate(1000, time.Second))
	defer b.Close()
	defer tr.Close()
	defer tr.CloseIdleConnections()
	var closes []time.Duration
	for range 20 {
		req, _ := http.NewRequest("GET", up.URL, nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		// The attempt is done at EOF (or Close, whichever comes first).
		start := time.Now()
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		closes = append(closes, time.Since(start))
	}
	slices.Sort(closes)
	t.Logf("reading the body to EOF and Close, Redis 5ms away: p50 %v, max %v", closes[len(closes)/2], closes[len(closes)-1])
	if closes[len(closes)/2] >= 5*time.Millisecond {
		t.Errorf("reading the body and Close took %v (p50): they wait for Redis", closes[len(closes)/2])
	}
	// Every lease is given back, soon after.
	deadline := time.Now().Add(time.Second)
	for newClient(t, srv.Addr()).ZCard(context.Background(), "sluice:{"+strings.TrimPrefix(up.URL, "http://")+"}:lease").Val() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("leases still held a second after every body was closed")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startPeer starts workers goroutines that send as fast as an x/time/rate
// limiter of r and burst lets them, to an upstream of their own, for run;
// the function it returns waits for them and returns the rate at which
// they sent after warm.
func startPeer(r float64, burst, workers int, warm, run time.Duration) func() float64 {
	var n atomic.Int64
	begin := time.Now()
	from := begin.Add(warm)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if time.Now().After(from) {
			n.Add(1)
		}
		io.WriteString(w, "ok\n")
	}))
	tr := &http.Transport{MaxIdleConnsPerHost: workers}
	ctx, cancel := context.WithDeadline(context.Background(), begin.Add(run))
	lim := rate.NewLimiter(rate.Limit(r), burst)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for lim.Wait(ctx) == nil {
				req, _ := http.NewRequestWithContext(ctx, "GET", up.URL, nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	return func() float64 {
		wg.Wait()
		cancel()
		tr.CloseIdleConnections()
		up.Close()
		return float64(n.Load()) / (run - warm).Seconds()
	}
}
