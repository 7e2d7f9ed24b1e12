// Command fanout is sluice's main demo: it fans a few thousand calls out
// through a sluice Transport with sluice.ForEach, at the full published rate
// of an API and no faster, and shows what happened.
//
//	go run ./examples/fanout
//
// Without flags it needs no set-up and no network: it starts an embedded
// upstream (an httptest server on loopback) that behaves like a real
// provider. It publishes a limit of 100 requests per second with a burst of
// 5 and a per-minute quota announced in IETF RateLimit / RateLimit-Policy
// headers, answers with a latency that varies from tens of milliseconds to
// over a second, and refuses what exceeds its limit with 429 and a
// Retry-After. The items have mixed priorities: one in ten Interactive, three
// in ten Normal, the rest Batch.
//
// A progress bar shows the rate and the ETA; at the end (or at Ctrl-C) a
// summary shows the achieved rate against the published limit, the 429s,
// retries and cooldowns, the in-flight limit, and the wait per priority.
//
// Flags:
//
//	-n 2500        items to fan out
//	-rate 100      the published limit, requests per second
//	-burst 0       sluice's token bucket size (0: 2 for the embedded
//	               upstream, whose published burst is 5; sluice's default,
//	               1, for -url)
//	-limit 0       what the embedded upstream really allows per second
//	               (0: the published limit); set it lower, e.g. -limit 80,
//	               to watch sluice obey 429s and Retry-After
//	-url URL       call a real API instead of the embedded upstream: GET URL
//	               for each item, with {item} replaced by the item's number
//	-progress      show the progress bar (default: when stdout is a terminal)
//	-status ADDR   serve sluice's live status page (package sluicestatus) at
//	               ADDR, e.g. -status 127.0.0.1:8080, and print its address;
//	               the page stays up after the summary until Ctrl-C
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"iter"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
	"golang.org/x/term"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/upstream"
	"github.com/sluice-go/sluice/sluicestatus"
)

// config is what the flags set.
type config struct {
	Items    int     // items to fan out
	Rate     int     // the published limit, requests per second
	Burst    int     // sluice's burst (WithBurst); 0: 2 for the embedded upstream, sluice's default for -url
	Limit    float64 // what the embedded upstream enforces per second; 0: Rate
	URL      string  // a real API to call instead of the embedded upstream
	Progress bool    // show a live progress bar (needs a terminal)

	// Latency is the embedded upstream's median latency; the latencies
	// spread around it (log-normal), from about a fifth of it to ten times.
	Latency time.Duration
	// Report is how often a line of progress is printed when there is no
	// progress bar; 0 prints none.
	Report time.Duration

	// Status is the address to serve the status page at; "" serves none.
	// Linger keeps it up after the summary until ctx ends.
	Status string
	Linger bool
	// statusInterval is the page's sampling interval (0: sluicestatus's
	// default); statusUp, if set, is called with the page's URL once it
	// is served. Both are for tests.
	statusInterval time.Duration
	statusUp       func(url string)
}

func defaultConfig() config {
	return config{Items: 2500, Rate: 100, Latency: 120 * time.Millisecond, Report: 5 * time.Second}
}

func main() {
	cfg := defaultConfig()
	flag.IntVar(&cfg.Items, "n", cfg.Items, "items to fan out")
	flag.IntVar(&cfg.Rate, "rate", cfg.Rate, "the published limit, requests per second")
	flag.IntVar(&cfg.Burst, "burst", cfg.Burst, "sluice's token bucket size (0: 2 for the embedded upstream, sluice's default for -url)")
	flag.Float64Var(&cfg.Limit, "limit", cfg.Limit, "what the embedded upstream really allows per second (0: -rate)")
	flag.StringVar(&cfg.URL, "url", cfg.URL, "GET this URL for each item instead of starting an embedded upstream ({item} is replaced by the item number)")
	flag.DurationVar(&cfg.Latency, "latency", cfg.Latency, "the embedded upstream's median latency")
	cfg.Progress = term.IsTerminal(int(os.Stdout.Fd()))
	flag.BoolVar(&cfg.Progress, "progress", cfg.Progress, "show a progress bar (default: when stdout is a terminal)")
	flag.StringVar(&cfg.Status, "status", cfg.Status, "serve the live status page at this address, e.g. 127.0.0.1:8080 (it stays up after the summary until Ctrl-C)")
	flag.Parse()
	cfg.Linger = cfg.Status != ""

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, cfg, os.Stdout)
	switch {
	case errors.Is(err, context.Canceled) && ctx.Err() != nil:
		os.Exit(130) // interrupted: the summary so far is printed
	case err != nil:
		fmt.Fprintln(os.Stderr, "fanout:", err)
		os.Exit(1)
	}
}

// upstreamBurst is the embedded upstream's published burst.
const upstreamBurst = 5

// priorityOf spreads the items over the levels: one in ten Interactive,
// three in ten Normal, the rest Batch.
func priorityOf(item int) sluice.Priority {
	switch item % 10 {
	case 0:
		return sluice.Interactive
	case 1, 4, 7:
		return sluice.Normal
	}
	return sluice.Batch
}

// latencies returns the embedded upstream's service time for its n-th
// accepted request: log-normal around median, within [median/5, 10 x median].
func latencies(median time.Duration) func(n int, _ *http.Request) time.Duration {
	return func(n int, _ *http.Request) time.Duration {
		r := rand.New(rand.NewPCG(uint64(n), 0x5eed))
		f := math.Exp(0.6 * r.NormFloat64())
		return time.Duration(float64(median) * max(0.2, min(f, 10)))
	}
}

// tally counts what the items did, by priority.
type tally struct {
	ok, failed [3]atomic.Int64
	statuses   sync.Map // status code -> *atomic.Int64, for the failures
}

func (t *tally) done() (ok, failed int64) {
	for p := range 3 {
		ok += t.ok[p].Load()
		failed += t.failed[p].Load()
	}
	return ok, failed
}

// run fans cfg.Items calls out through a sluice Transport and writes the
// progress and a summary to stdout. When ctx is cancelled it stops, prints
// the summary so far, and returns ctx's error.
func run(ctx context.Context, cfg config, stdout io.Writer) error {
	if cfg.Items < 0 || cfg.Rate <= 0 || cfg.Burst < 0 {
		return fmt.Errorf("-n and -burst must be >= 0 and -rate > 0 (got %d, %d, %d)", cfg.Items, cfg.Burst, cfg.Rate)
	}
	target, describe := cfg.URL, ""
	var srv *upstream.Server
	if target == "" {
		limit := cfg.Limit
		if limit <= 0 {
			limit = float64(cfg.Rate)
		}
		// The upstream tolerates bursts of 5. sluice uses 2 of them: a
		// bucket of 2 absorbs the dispatcher's timer lateness (with 1, a
		// grant that comes late loses that time for good), and the other 3
		// are a margin for requests that reach the server bunched up.
		if cfg.Burst == 0 {
			cfg.Burst = 2
		}
		// Two limits, as real providers have: a per-second rate with a
		// small burst, enforced with 429 and Retry-After, and a per-minute
		// quota announced in RateLimit headers on every response.
		srv = upstream.NewTCP(upstream.Config{
			Rate:         limit,
			Burst:        upstreamBurst,
			Quota:        cfg.Rate * 60,
			PolicyWindow: time.Minute,
			Latency:      latencies(cfg.Latency),
		})
		defer srv.Close()
		target = srv.URL() + "/items/{item}"
		describe = fmt.Sprintf("an embedded upstream at %s that publishes %d requests/s (burst %d)", srv.URL(), cfg.Rate, upstreamBurst)
		if limit != float64(cfg.Rate) {
			describe += fmt.Sprintf(" but allows only %g/s", limit)
		}
		describe += fmt.Sprintf(",\na %d/min quota in RateLimit headers, latency %v median (%v to %v), and 429 + Retry-After beyond its limit",
			cfg.Rate*60, cfg.Latency, cfg.Latency/5, cfg.Latency*10)
	} else {
		describe = fmt.Sprintf("%s, paced to %d requests/s", cfg.URL, cfg.Rate)
	}
	opts := []sluice.Option{sluice.WithRate(cfg.Rate, time.Second)}
	if cfg.Burst > 0 {
		opts = append(opts, sluice.WithBurst(cfg.Burst))
	}

	// The base transport keeps enough idle connections for what sluice lets
	// be in flight; http.DefaultTransport keeps 2 per host and would open
	// and close a connection for almost every request.
	base := http.DefaultTransport.(*http.Transport).Clone()
	base.MaxIdleConnsPerHost = sluice.DefaultMaxConcurrency
	defer base.CloseIdleConnections()
	sends := &sendClock{next: base}

	tr, err := sluice.New(sends, opts...)
	if err != nil {
		return err
	}
	client := &http.Client{Transport: tr}

	fmt.Fprintf(stdout, "sluice fan-out: %d items through sluice.ForEach, to %s.\n", cfg.Items, describe)
	if cfg.Status != "" {
		stopStatus, err := serveStatus(cfg, tr, stdout)
		if err != nil {
			return err
		}
		defer stopStatus()
	}

	var tl tally
	prog := newProgress(cfg, tr, stdout)
	start := time.Now()
	err = sluice.ForEach(ctx, tr, count(cfg.Items), func(ctx context.Context, item int) error {
		p := priorityOf(item)
		url := strings.ReplaceAll(target, "{item}", strconv.Itoa(item))
		req, err := http.NewRequestWithContext(sluice.WithPriority(ctx, p), http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			// The first error ends the fan-out (errgroup semantics); the
			// Transport has already retried what could be retried.
			return fmt.Errorf("item %d: %w", item, err)
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil {
			return fmt.Errorf("item %d: %w", item, err)
		}
		if resp.StatusCode >= 300 {
			// Still failing after sluice's retries: counted, not fatal.
			tl.failed[p].Add(1)
			c, _ := tl.statuses.LoadOrStore(resp.StatusCode, new(atomic.Int64))
			c.(*atomic.Int64).Add(1)
		} else {
			tl.ok[p].Add(1)
		}
		prog.increment()
		return nil
	})
	wall := time.Since(start)
	prog.finish(err != nil)

	interrupted := ctx.Err() != nil
	summarize(stdout, cfg, tr, srv, sends, &tl, prog, wall, interrupted)
	if interrupted {
		return ctx.Err()
	}
	if cfg.Status != "" && cfg.Linger {
		fmt.Fprintln(stdout, "\nthe status page is still up; Ctrl-C to exit")
		<-ctx.Done()
	}
	return err
}

// serveStatus serves sluicestatus's page for tr at cfg.Status and prints
// its address; the func it returns stops the server and the page's sampler.
func serveStatus(cfg config, tr *sluice.Transport, stdout io.Writer) (stop func(), err error) {
	var opts []sluicestatus.Option
	if cfg.statusInterval > 0 {
		opts = append(opts, sluicestatus.WithInterval(cfg.statusInterval))
	}
	page, err := sluicestatus.New(tr, opts...)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Status)
	if err != nil {
		page.Close()
		return nil, fmt.Errorf("-status: %w", err)
	}
	srv := &http.Server{Handler: page, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ln) // returns at Close
	}()
	url := "http://" + ln.Addr().String() + "/"
	fmt.Fprintf(stdout, "status page: %s\n", url)
	if cfg.statusUp != nil {
		cfg.statusUp(url)
	}
	return func() {
		srv.Close()
		<-done
		page.Close()
	}, nil
}

// count yields 0, 1, ..., n-1, one at a time: ForEach takes items as it can
// start them, so a sequence need not be materialized.
func count(n int) iter.Seq[int] {
	return func(yield func(int) bool) {
		for i := range n {
			if !yield(i) {
				return
			}
		}
	}
}

// progress shows a live bar on a terminal, or a line every cfg.Report
// otherwise, and samples the Transport for the peak number in flight.
type progress struct {
	bar  *mpb.Bar
	p    *mpb.Progress
	done atomic.Int64
	peak atomic.Int64 // the most attempts in flight at once, sampled
	// printed is whether anything was written since the header.
	printed atomic.Bool
	last    time.Time // of the previous increment, for the bar's EWMA
	mu      sync.Mutex
	stop    chan struct{}
	wg      sync.WaitGroup
	total   int
}

func newProgress(cfg config, tr *sluice.Transport, stdout io.Writer) *progress {
	pr := &progress{stop: make(chan struct{}), last: time.Now(), total: cfg.Items}
	if cfg.Progress {
		// WithAutoRefresh: when -progress is asked for on a pipe, draw
		// there too (mpb draws only on terminals by default).
		pr.p = mpb.New(mpb.WithOutput(stdout), mpb.WithWidth(40), mpb.WithRefreshRate(200*time.Millisecond), mpb.WithAutoRefresh())
		pr.printed.Store(true)
		pr.bar = pr.p.AddBar(int64(cfg.Items),
			mpb.PrependDecorators(
				decor.Name("items ", decor.WCSyncSpaceR),
				decor.CountersNoUnit("%d / %d", decor.WCSyncWidth),
			),
			mpb.AppendDecorators(
				decor.Percentage(decor.WC{W: 5}),
				decor.Name("  "),
				// The summary gives the rate over the run; the bar gives the
				// recent one, which means nothing once the last calls drain.
				decor.OnComplete(decor.EwmaSpeed(nil, "%.1f/s", 60), ""),
				decor.Name("  ETA "),
				decor.OnComplete(decor.EwmaETA(decor.ET_STYLE_GO, 60), "done"),
				decor.Any(func(decor.Statistics) string {
					s := laneTotals(tr.Stats())
					return fmt.Sprintf("  in flight %d/%d  429s %d", s.InFlight, s.Limit, s.Throttled)
				}),
			),
		)
	}
	pr.wg.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		lastReport := time.Now()
		for {
			select {
			case <-pr.stop:
				return
			case now := <-tick.C:
				pr.peak.Store(max(pr.peak.Load(), int64(laneTotals(tr.Stats()).InFlight)))
				if pr.bar == nil && cfg.Report > 0 && now.Sub(lastReport) >= cfg.Report {
					lastReport = now
					s := laneTotals(tr.Stats())
					fmt.Fprintf(stdout, "  %d / %d items, in flight %d, 429s %d\n", pr.done.Load(), cfg.Items, s.InFlight, s.Throttled)
					pr.printed.Store(true)
				}
			}
		}
	})
	return pr
}

func (pr *progress) increment() {
	pr.done.Add(1)
	if pr.bar == nil {
		return
	}
	// Items finish concurrently: the EWMA is fed the time between
	// completions, so that its speed is the completion rate. mpb's EWMA
	// updates are not safe for concurrent use: mu serializes them.
	pr.mu.Lock()
	defer pr.mu.Unlock()
	now := time.Now()
	pr.bar.EwmaIncrement(now.Sub(pr.last))
	pr.last = now
}

func (pr *progress) finish(aborted bool) {
	close(pr.stop)
	pr.wg.Wait()
	if pr.bar != nil {
		if aborted || pr.done.Load() < int64(pr.total) {
			pr.bar.Abort(false)
		}
		pr.p.Wait()
		// p.Wait flushes the bar's last frame; a blank line follows it.
	}
}

// laneTotals adds up the lanes of a snapshot (the demo uses one).
func laneTotals(s sluice.Stats) sluice.LaneStats {
	var t sluice.LaneStats
	for _, l := range s.Lanes {
		t.InFlight += l.InFlight
		t.Limit += l.Limit
		t.Throttled += l.Throttled
		t.Retries += l.Retries
		t.RetriesDenied += l.RetriesDenied
		t.Cooldowns += l.Cooldowns
		t.Latency = max(t.Latency, l.Latency)
		for p := range l.Levels {
			t.Levels[p].Granted += l.Levels[p].Granted
			t.Levels[p].WaitP50 = max(t.Levels[p].WaitP50, l.Levels[p].WaitP50)
			t.Levels[p].WaitP99 = max(t.Levels[p].WaitP99, l.Levels[p].WaitP99)
		}
	}
	return t
}

// summarize prints the summary table.
func summarize(w io.Writer, cfg config, tr *sluice.Transport, srv *upstream.Server, sends *sendClock, tl *tally, pr *progress, wall time.Duration, interrupted bool) {
	s := laneTotals(tr.Stats())
	ok, failed := tl.done()
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	defer tw.Flush()

	if pr.printed.Load() {
		fmt.Fprintln(tw)
	}
	if interrupted {
		fmt.Fprintf(tw, "interrupted: the summary so far\n")
	}
	items := fmt.Sprintf("%d done", ok+failed)
	if failed > 0 {
		items += fmt.Sprintf(" (%d failed:%s)", failed, statusList(&tl.statuses))
	}
	fmt.Fprintf(tw, "items\t%s of %d\n", items, cfg.Items)
	fmt.Fprintf(tw, "wall time\t%v\n", wall.Round(10*time.Millisecond))
	rate := float64(ok+failed) / wall.Seconds()
	fmt.Fprintf(tw, "achieved rate\t%.1f/s of the published %d/s (%.0f%%)", rate, cfg.Rate, 100*rate/float64(cfg.Rate))
	if n, r := sends.rate(); n > 1 {
		// The wall time also holds the first response's latency and the
		// last one's: the pace of the sends is what the limit governs.
		fmt.Fprintf(tw, "; %.1f/s from the first send to the last", r)
	}
	fmt.Fprintln(tw)
	if srv != nil {
		acc, rej := srv.Counts()
		fmt.Fprintf(tw, "429s\t%d (the upstream accepted %d requests and refused %d)\n", s.Throttled, acc, rej)
	} else {
		fmt.Fprintf(tw, "429s\t%d\n", s.Throttled)
	}
	fmt.Fprintf(tw, "retries\t%d (%d refused by the retry budget)\n", s.Retries, s.RetriesDenied)
	fmt.Fprintf(tw, "cooldowns\t%d (pauses of the lane for Retry-After or an exhausted quota)\n", s.Cooldowns)
	fmt.Fprintf(tw, "in-flight limit\t%d (peak in flight %d", s.Limit, pr.peak.Load())
	if s.Latency > 0 {
		fmt.Fprintf(tw, ", smoothed latency %v", s.Latency.Round(time.Millisecond))
	}
	fmt.Fprintln(tw, ")")
	fmt.Fprintln(tw)
	fmt.Fprintf(tw, "priority\titems\twait p50\twait p99\n")
	for p := sluice.Interactive; p <= sluice.Batch; p++ {
		lv := s.Levels[p]
		fmt.Fprintf(tw, "%v\t%d\t%v\t%v\n", p, tl.ok[p].Load()+tl.failed[p].Load(), round(lv.WaitP50), round(lv.WaitP99))
	}
}

// sendClock is the base RoundTripper's front: it sees every attempt sluice
// sends, retries included, and notes the first and last send.
type sendClock struct {
	next        http.RoundTripper
	mu          sync.Mutex
	n           int
	first, last time.Time
}

func (c *sendClock) RoundTrip(req *http.Request) (*http.Response, error) {
	now := time.Now()
	c.mu.Lock()
	if c.n == 0 {
		c.first = now
	}
	c.n++
	c.last = now
	c.mu.Unlock()
	return c.next.RoundTrip(req)
}

// rate returns the attempts sent and their pace from the first to the last.
func (c *sendClock) rate() (n int, perSecond float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n < 2 {
		return c.n, 0
	}
	return c.n, float64(c.n-1) / c.last.Sub(c.first).Seconds()
}

func statusList(m *sync.Map) string {
	var b strings.Builder
	m.Range(func(k, v any) bool {
		fmt.Fprintf(&b, " %d x %d", v.(*atomic.Int64).Load(), k)
		return true
	})
	return b.String()
}

// round shows a wait with three significant digits or so.
func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(100 * time.Microsecond)
	}
	return d.Round(time.Microsecond)
}
