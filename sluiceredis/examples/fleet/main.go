// Command fleet shows several processes sharing one API budget through
// Redis with sluiceredis.
//
//	cd sluiceredis && go run ./examples/fleet
//
// It simulates a fleet in one program: -procs sluice Transports, each with
// its own Redis client and sluiceredis.Backend (leasing shares; -tokens:
// sluiceredis.Tokens, a token per request) as a separate process would
// have, all configured with the API's published rate and all calling one
// embedded upstream (an httptest server) that enforces that rate with 429s.
// Every process wants more than the whole rate. Without a shared budget
// each would send the full rate and the upstream would refuse all but a
// 1/procs share of it; with one they split the rate between them and the
// upstream refuses (almost) nothing. At the end it prints each process's
// share and the total against the limit.
//
// It needs a Redis. -redis ADDR uses one; without it the program starts a
// redis-server of its own on a free port if the binary is installed
// (apt-get install redis-server), or else runs miniredis, an in-process
// Redis fake whose Lua supports what sluiceredis's script uses (EVALSHA,
// TIME), in the program itself. -miniredis forces the fake.
//
// Flags:
//
//	-procs 4        simulated processes
//	-rate 50        the upstream's limit and every process's WithRate, per second
//	-burst 10       the upstream's burst: a fleet that leases shares sends
//	                up to burst + 2 per process at once; -tokens, up to 1
//	-duration 5s    how long the processes send
//	-workers 8      concurrent requests each process keeps waiting
//	-redis ADDR     an existing Redis (host:port)
//	-miniredis      use the in-process fake even when redis-server is installed
//	-tokens         sluiceredis.NewTokens instead of sluiceredis.New
//	-timeout 50ms   sluiceredis.WithTimeout: a call slower than this sends a
//	                process to its local fallback budget for a second
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/upstream"
	"github.com/sluice-go/sluice/sluiceredis"
)

type config struct {
	Procs     int
	Rate      int
	Burst     int // the upstream's burst
	Duration  time.Duration
	Workers   int
	Redis     string        // address of an existing Redis; "" to start one
	MiniRedis bool          // use miniredis even if redis-server is installed
	Timeout   time.Duration // sluiceredis.WithTimeout; 0: DefaultTimeout
	Tokens    bool          // sluiceredis.NewTokens rather than New
}

// result is what one simulated process achieved.
type result struct {
	OK, Refused int64 // 2xx answers and 429s
}

// summary is what the run achieved.
type summary struct {
	Store   string // which Redis was used
	Procs   []result
	Elapsed time.Duration
	// Accepted and Refused are counted by the upstream.
	Accepted, Refused int
}

func main() {
	cfg := config{}
	flag.IntVar(&cfg.Procs, "procs", 4, "simulated processes")
	flag.IntVar(&cfg.Rate, "rate", 50, "the upstream's limit and every process's WithRate, per second")
	flag.IntVar(&cfg.Burst, "burst", 10, "the upstream's burst")
	flag.DurationVar(&cfg.Duration, "duration", 5*time.Second, "how long the processes send")
	flag.IntVar(&cfg.Workers, "workers", 8, "concurrent requests per process")
	flag.StringVar(&cfg.Redis, "redis", "", "an existing Redis, host:port (default: start one)")
	flag.BoolVar(&cfg.MiniRedis, "miniredis", false, "use the in-process Redis fake")
	flag.DurationVar(&cfg.Timeout, "timeout", sluiceredis.DefaultTimeout, "bound on each Redis call (sluiceredis.WithTimeout)")
	flag.BoolVar(&cfg.Tokens, "tokens", false, "take a token per request (sluiceredis.NewTokens) rather than lease shares")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config, out io.Writer) (summary, error) {
	var sum summary
	if cfg.Procs < 1 || cfg.Rate < 1 || cfg.Burst < 1 || cfg.Workers < 1 || cfg.Duration <= 0 || cfg.Timeout < 0 {
		return sum, errors.New("-procs, -rate, -burst, -workers, -duration and -timeout must be positive")
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = sluiceredis.DefaultTimeout
	}
	addr, store, closeStore, err := openStore(cfg)
	if err != nil {
		return sum, err
	}
	defer closeStore()
	sum.Store = store

	up := upstream.NewTCP(upstream.Config{Rate: float64(cfg.Rate), Burst: cfg.Burst})
	defer up.Close()
	fmt.Fprintf(out, "%d processes, each with WithRate(%d, time.Second), share one budget in %s;\n",
		cfg.Procs, cfg.Rate, store)
	fmt.Fprintf(out, "the upstream allows %d/s and refuses the excess with 429. Running for %v...\n\n",
		cfg.Rate, cfg.Duration)

	// Every process is set up before any starts sending, so that an error
	// returns with no goroutine running.
	trs := make([]http.RoundTripper, cfg.Procs)
	for i := range trs {
		// Each process has its own client and Backend; only Redis and
		// the key (the upstream's host) are shared.
		rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		defer rdb.Close()
		var b interface {
			sluice.Backend
			Close() error
		}
		var err error
		if cfg.Tokens {
			b, err = sluiceredis.NewTokens(rdb, sluiceredis.WithTimeout(cfg.Timeout))
		} else {
			b, err = sluiceredis.New(rdb, sluiceredis.WithTimeout(cfg.Timeout))
		}
		if err != nil {
			return sum, err
		}
		// Closed after the Transport: a Backend gives its shares back.
		defer b.Close()
		tr, err := sluice.New(up.Transport(), sluice.WithRate(cfg.Rate, time.Second),
			sluice.WithBackend(b), sluice.WithRetry(0))
		if err != nil {
			return sum, err
		}
		defer tr.Close()
		trs[i] = tr
	}

	ctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	sum.Procs = make([]result, cfg.Procs)
	var wg sync.WaitGroup
	start := time.Now()
	for i, tr := range trs {
		wg.Go(func() { sum.Procs[i] = send(ctx, tr, up.URL(), cfg.Workers) })
	}
	wg.Wait()
	sum.Elapsed = time.Since(start)
	sum.Accepted, sum.Refused = up.Counts()
	report(out, cfg, sum)
	return sum, nil
}

// send keeps workers requests waiting in tr until ctx ends.
func send(ctx context.Context, tr http.RoundTripper, url string, workers int) result {
	var (
		ok, refused atomic.Int64
		wg          sync.WaitGroup
	)
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					if ctx.Err() == nil {
						// A refusal before the deadline (the wait would
						// outlast it): yield rather than spin.
						time.Sleep(10 * time.Millisecond)
					}
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusTooManyRequests {
					refused.Add(1)
				} else {
					ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return result{OK: ok.Load(), Refused: refused.Load()}
}

func report(out io.Writer, cfg config, sum summary) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "process\taccepted\t429s\tshare of the limit")
	limit := float64(cfg.Rate) * sum.Elapsed.Seconds()
	var total result
	for i, r := range sum.Procs {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%.1f%%\n", i+1, r.OK, r.Refused, 100*float64(r.OK)/limit)
		total.OK += r.OK
		total.Refused += r.Refused
	}
	fmt.Fprintf(tw, "total\t%d\t%d\t%.1f%%\n", total.OK, total.Refused, 100*float64(total.OK)/limit)
	tw.Flush()
	fmt.Fprintf(out, "\nlimit %d/s x %.2fs = %.0f requests; the fleet sent %.1f/s (%.1f%% of the limit),\n",
		cfg.Rate, sum.Elapsed.Seconds(), limit, float64(total.OK)/sum.Elapsed.Seconds(), 100*float64(total.OK)/limit)
	fmt.Fprintf(out, "and the upstream refused %d of %d (without a shared budget each process would send\n",
		sum.Refused, sum.Accepted+sum.Refused)
	fmt.Fprintf(out, "%d/s, %d/s in all, and about %.0f%% of it would be refused).\n",
		cfg.Rate, cfg.Rate*cfg.Procs, 100*(1-1/float64(cfg.Procs)))
}
