// Command priority reproduces, in real time and through sluice, the table of
// a published comparison of priority policies under one shared rate limit,
// prints the published numbers beside the measured ones, and draws a chart
// of the interactive wait over time under each policy.
//
//	go run ./examples/priority                  # 10 s runs, as published
//	go run ./examples/priority -duration 2s     # scaled down 5x
//
// The setup, as published: a limiter grants 100 permits per second; a batch
// of low-priority calls is queued at time zero (1,000, or 300 in the 90/s
// runs); interactive calls arrive at a steady 20 or 90 per second for 10 s.
// Five policies:
//
//	FIFO                   both classes at one level, first come first served
//	strict                 Interactive before Batch, FIFO within each
//	strict (90/s)          the same under heavier interactive load
//	every 5th to batch     WithLowShare(5): the batch gets a floor of 20%
//	aging 2 s              WithAging(2s): a waiting call rises a level per 2 s
//
// Each run has its own embedded upstream (loopback, 100 requests/s with a
// burst of 25) and its own sluice Transport, and the five run at once. A
// call's wait is the time from the call to the moment sluice hands it to
// the base transport.
//
// -duration shortens the runs: with -duration 2s the batches are 200 and
// 60 calls and the aging period 400 ms, every count and backlog-driven wait
// scales by 0.2, and the published figures are shown scaled the same way.
// -out names the chart (.png or .svg).
package main

import (
	"context"
	"flag"
	"fmt"
	"image/color"
	"io"
	"math"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/stats"
	"github.com/sluice-go/sluice/internal/upstream"
)

// config is what the flags set.
type config struct {
	// Duration is how long interactive calls arrive: 10 s as published.
	// Everything else scales with it.
	Duration time.Duration
	// Out is where the chart goes; its extension (.png, .svg) picks the
	// format. Empty: no chart.
	Out string
}

func main() {
	// The chart goes to the temporary directory unless -out says where:
	// an example writes nothing into the checkout it runs from.
	cfg := config{Duration: 10 * time.Second, Out: filepath.Join(os.TempDir(), "sluice-priority-waits.png")}
	flag.DurationVar(&cfg.Duration, "duration", cfg.Duration, "how long interactive calls arrive (published: 10s); counts and backlogs scale with it")
	flag.StringVar(&cfg.Out, "out", cfg.Out, "chart of interactive wait over time (.png or .svg; empty for none)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "priority:", err)
		os.Exit(1)
	}
}

// permitsPerSecond is the shared limit of every run.
const permitsPerSecond = 100

// published is one row of the published table, for a 10 s run.
type published struct {
	p50, p99      time.Duration
	waitsScale    bool // the waits come from a backlog, so they scale with the run
	served, of    int  // interactive calls granted within the run, of those offered; of 0: not published
	batchPermits  int  // batch calls granted within the run
	batchFinished bool // the whole batch was done within the run
}

// scenario is one run.
type scenario struct {
	name      string
	opts      []sluice.Option
	fifo      bool // both classes at one level
	interRate int  // interactive calls per second
	batch     int  // batch calls queued at time zero, for a 10 s run
	aging     time.Duration
	published published
}

var scenarios = []scenario{
	{name: "FIFO", fifo: true, interRate: 20, batch: 1000,
		published: published{p50: 8100 * time.Millisecond, p99: 9990 * time.Millisecond, waitsScale: true, served: 96, of: 200, batchPermits: 996}},
	{name: "strict", interRate: 20, batch: 1000,
		published: published{p50: 1200 * time.Microsecond, p99: 10300 * time.Microsecond, served: 200, of: 200, batchPermits: 797}},
	{name: "strict", interRate: 90, batch: 300,
		published: published{p50: 6200 * time.Microsecond, p99: 10700 * time.Microsecond, batchPermits: 101}},
	{name: "every 5th to batch", opts: []sluice.Option{sluice.WithLowShare(5)}, interRate: 90, batch: 300,
		published: published{p50: 617 * time.Millisecond, p99: 1200 * time.Millisecond, waitsScale: true, batchPermits: 200}},
	{name: "aging 2 s", aging: 2 * time.Second, interRate: 90, batch: 300,
		published: published{p50: 2400 * time.Millisecond, p99: 2800 * time.Millisecond, waitsScale: true, batchPermits: 300, batchFinished: true}},
}

// result is what one run measured.
type result struct {
	sc          scenario
	name        string // sc.name, with the aging period as scaled
	scale       float64
	batch       int
	interWaits  []time.Duration // in arrival order
	interAt     []time.Duration // arrival of each, from the start
	interServed int             // granted within the run
	batchIn     int             // batch calls granted within the run
	batchDoneAt time.Duration   // when the last batch call was granted, if all were
	throttled   uint64          // 429s from the upstream
}

// call is one request's timing. It rides in the request's context; the
// base transport stamps the moment sluice let the first attempt through.
type call struct {
	at, granted time.Time
}

type callKey struct{}

// stamp is the base RoundTripper: the first time a call reaches it, sluice
// has granted it.
type stamp struct{ next http.RoundTripper }

func (s stamp) RoundTrip(req *http.Request) (*http.Response, error) {
	if c, ok := req.Context().Value(callKey{}).(*call); ok && c.granted.IsZero() {
		c.granted = time.Now()
	}
	return s.next.RoundTrip(req)
}

// run runs the five scenarios at once, prints the table, and writes the
// chart to cfg.Out.
func run(ctx context.Context, cfg config, stdout io.Writer) error {
	if cfg.Duration < 100*time.Millisecond {
		return fmt.Errorf("-duration %v: must be at least 100ms", cfg.Duration)
	}
	scale := cfg.Duration.Seconds() / 10
	fmt.Fprintf(stdout, "%d permits/s; a batch queued at t=0, interactive calls arriving for %v", permitsPerSecond, cfg.Duration)
	if scale != 1 {
		fmt.Fprintf(stdout, " (the published runs took 10s: counts and backlog waits below are scaled by %.2g)", scale)
	}
	fmt.Fprintf(stdout, ".\nRunning the five policies at once, each against its own upstream...\n\n")

	results := make([]*result, len(scenarios))
	errs := make([]error, len(scenarios))
	var wg sync.WaitGroup
	for i, sc := range scenarios {
		wg.Go(func() { results[i], errs[i] = runOne(ctx, sc, cfg.Duration, scale) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	printTable(stdout, results, cfg.Duration, scale)
	if cfg.Out != "" {
		if err := chart(results, cfg.Out, cfg.Duration); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "\nchart of the interactive wait over time: %s\n", cfg.Out)
	}
	return nil
}

// runOne runs one scenario in real time.
func runOne(ctx context.Context, sc scenario, d time.Duration, scale float64) (*result, error) {
	// The upstream enforces the limit too, with a burst of 25: a tolerance
	// of a quarter second for requests that reach it bunched up (five runs
	// share the machine), so that what is measured is the policies, not
	// Retry-After pauses.
	srv := upstream.NewTCP(upstream.Config{
		Rate:    permitsPerSecond,
		Burst:   25,
		Latency: func(int, *http.Request) time.Duration { return 2 * time.Millisecond },
	})
	defer srv.Close()
	base := http.DefaultTransport.(*http.Transport).Clone()
	base.MaxIdleConnsPerHost = sluice.DefaultMaxConcurrency
	defer base.CloseIdleConnections()

	// A bucket of 2: a dispatcher timer that fires late can catch up on the
	// next grant instead of losing that time (the published limiter, too,
	// grants on a fixed 10 ms schedule).
	// The seed's policies, each alone: no share for the batch unless the
	// scenario sets one (sluice's default gives it a tenth).
	opts := append([]sluice.Option{sluice.WithRate(permitsPerSecond, time.Second), sluice.WithBurst(2), sluice.WithLowShare(0)}, sc.opts...)
	if sc.aging > 0 {
		opts = append(opts, sluice.WithAging(time.Duration(float64(sc.aging)*scale)))
	}
	tr, err := sluice.New(stamp{base}, opts...)
	if err != nil {
		return nil, err
	}
	client := &http.Client{Transport: tr}
	interLevel, batchLevel := sluice.Interactive, sluice.Batch
	if sc.fifo {
		interLevel, batchLevel = sluice.Normal, sluice.Normal
	}

	send := func(ctx context.Context, c *call, p sluice.Priority) {
		ctx = context.WithValue(sluice.WithPriority(ctx, p), callKey{}, c)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL(), nil)
		if err != nil {
			return
		}
		resp, err := client.Do(req)
		if err != nil {
			return // cancelled: a batch call still waiting when the run ended
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}

	r := &result{sc: sc, name: sc.name, scale: scale, batch: int(math.Round(float64(sc.batch) * scale))}
	if sc.aging > 0 {
		r.name = fmt.Sprintf("aging %v", time.Duration(float64(sc.aging)*scale))
	}
	batchCtx, cancelBatch := context.WithCancel(ctx)
	defer cancelBatch()
	start := time.Now()
	batch := make([]call, r.batch)
	var bwg sync.WaitGroup
	for i := range batch {
		batch[i].at = start
		bwg.Go(func() { send(batchCtx, &batch[i], batchLevel) })
	}
	// The whole batch is queued before the first interactive call.
	for queued(tr) < r.batch && ctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	start = time.Now()

	n := int(math.Round(float64(sc.interRate) * d.Seconds()))
	inter := make([]call, n)
	var iwg sync.WaitGroup
	for i := range inter {
		at := start.Add(time.Duration(i) * time.Second / time.Duration(sc.interRate))
		select {
		case <-time.After(time.Until(at)):
		case <-ctx.Done():
		}
		inter[i].at = time.Now()
		iwg.Go(func() { send(ctx, &inter[i], interLevel) })
	}
	// Every interactive call is served, however long FIFO makes it wait;
	// then the batch calls still waiting are dropped.
	iwg.Wait()
	if rest := time.Until(start.Add(d)); rest > 0 {
		select {
		case <-time.After(rest):
		case <-ctx.Done():
		}
	}
	cancelBatch()
	bwg.Wait()

	end := start.Add(d)
	for _, c := range inter {
		if c.granted.IsZero() {
			continue
		}
		r.interAt = append(r.interAt, c.at.Sub(start))
		r.interWaits = append(r.interWaits, c.granted.Sub(c.at))
		if c.granted.Before(end) {
			r.interServed++
		}
	}
	var last time.Time
	done := 0
	for _, c := range batch {
		if c.granted.IsZero() {
			continue
		}
		done++
		if c.granted.After(last) {
			last = c.granted
		}
		if c.granted.Before(end) {
			r.batchIn++
		}
	}
	if done == r.batch && r.batch > 0 {
		r.batchDoneAt = last.Sub(start)
	}
	for _, l := range tr.Stats().Lanes {
		r.throttled += l.Throttled
	}
	return r, nil
}

// queued returns how many calls the Transport has queued or granted.
func queued(tr *sluice.Transport) int {
	n := 0
	for _, l := range tr.Stats().Lanes {
		for _, lv := range l.Levels {
			n += lv.Queued + int(lv.Granted)
		}
	}
	return n
}

func printTable(w io.Writer, rs []*result, d time.Duration, scale float64) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	defer tw.Flush()
	within := fmt.Sprintf("in %v", d)
	fmt.Fprintf(tw, "policy\tload\tinteractive p50 / p99\tserved %s\tbatch permits %s\tbatch done\t\tpublished: p50 / p99\tserved\tbatch\n", within, within)
	for _, r := range rs {
		sc, pub := r.sc, r.sc.published
		ws := 1.0
		if pub.waitsScale {
			ws = scale
		}
		served := fmt.Sprintf("%d of %d", r.interServed, len(r.interWaits))
		pubServed := "-"
		switch {
		case pub.of > 0 && pub.served == pub.of:
			pubServed = "all"
		case pub.of > 0:
			pubServed = fmt.Sprintf("%d of %d", scaled(pub.served, scale), scaled(pub.of, scale))
		}
		batchDone := "-"
		if r.batchDoneAt > 0 {
			batchDone = fmt.Sprintf("all %d at %v", r.batch, r.batchDoneAt.Round(10*time.Millisecond))
		}
		pubBatch := fmt.Sprint(scaled(pub.batchPermits, scale))
		if pub.batchFinished {
			pubBatch += " (all)"
		}
		fmt.Fprintf(tw, "%s\t%d/s, batch %d\t%v / %v\t%s\t%d\t%s\t\t%v / %v\t%s\t%s\n",
			r.name, sc.interRate, r.batch,
			round(stats.Quantile(r.interWaits, 0.5)), round(stats.Quantile(r.interWaits, 0.99)),
			served, r.batchIn, batchDone,
			round(time.Duration(float64(pub.p50)*ws)), round(time.Duration(float64(pub.p99)*ws)),
			pubServed, pubBatch)
	}
	var throttled uint64
	for _, r := range rs {
		throttled += r.throttled
	}
	fmt.Fprintf(tw, "\n429s from the upstreams: %d. Waits are from the call to sluice's grant; \"served\" counts grants within the run.\n", throttled)
	if scale != 1 {
		fmt.Fprintf(tw, "Published waits that come from a backlog are scaled by %.2g; one permit interval (10 ms) is not.\n", scale)
	}
	fmt.Fprintf(tw, "The published FIFO wait is above what its setup gives: a call waits for the backlog ahead of it, which\n"+
		"drains at %d/s while interactive calls join it, about 6 s at the median for 10 s runs.\n", permitsPerSecond)
}

func scaled(n int, scale float64) int { return int(math.Round(float64(n) * scale)) }

// round shows a duration with about three significant digits.
func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= 10*time.Millisecond:
		return d.Round(100 * time.Microsecond)
	}
	return d.Round(10 * time.Microsecond)
}

// chart plots each run's interactive waits against their arrival time, on
// a log scale, and saves the plot to path (.png or .svg).
func chart(rs []*result, path string, d time.Duration) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Interactive wait under %d permits/s, batch queued at t=0", permitsPerSecond)
	p.X.Label.Text = "interactive call arrives at (s)"
	p.Y.Label.Text = "wait for sluice's grant (ms, log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.X.Min, p.X.Max = 0, d.Seconds()
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	p.Legend.Left = true

	top := 1000.0 / permitsPerSecond
	for i, r := range rs {
		pts := make(plotter.XYs, len(r.interWaits))
		for j := range r.interWaits {
			// The log scale needs a positive value: a grant at once is
			// drawn at 10 µs.
			pts[j].X = r.interAt[j].Seconds()
			pts[j].Y = max(float64(r.interWaits[j])/float64(time.Millisecond), 0.01)
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		l.Color = plotutil.Color(i)
		l.Width = vg.Points(1.2)
		if i >= 5 {
			l.Dashes = plotutil.Dashes(i)
		}
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("%s, %d/s", r.name, r.sc.interRate), l)
		for _, w := range r.interWaits {
			top = max(top, float64(w)/float64(time.Millisecond))
		}
	}
	// A reference line: one permit interval.
	ref, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 1000.0 / permitsPerSecond}, {X: d.Seconds(), Y: 1000.0 / permitsPerSecond}})
	if err != nil {
		return err
	}
	ref.Color = color.Gray{Y: 128}
	ref.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
	p.Add(ref)
	p.Legend.Add("one permit interval", ref)
	// Room above the highest wait for the legend.
	p.Y.Min, p.Y.Max = 0.01, top*50

	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return p.Save(9*vg.Inch, 5*vg.Inch, path)
}
