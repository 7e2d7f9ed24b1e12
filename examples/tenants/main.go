// Command tenants shows fairness between tenants: one customer's flood of
// calls does not hold up the others when each call is tagged with
// sluice.WithTenant, and sluice.WithTenantShare caps what one customer may
// hold in flight at the upstream.
//
//	go run ./examples/tenants                # a flood of 500 calls, about 11 s
//	go run ./examples/tenants -scale 1       # 1,000, as in the README, about 21 s
//	go run ./examples/tenants -share 0.1     # a tighter cap in the third run
//
// The scenario is the one of TestTenantFairness and the README's table,
// halved by default: tenant "big" submits 500 calls at t=0; nine small
// tenants submit 10 calls each 0.5 s later; every call is at one priority
// level. The upstream takes 100 ms per call and sluice keeps 20 calls in
// flight (WithConcurrency(20, 20), no rate), so 200 calls a second are
// served. It runs three ways, each with its own embedded upstream (in
// memory, no network) and its own Transport, all three at once:
//
//	one FIFO       no tenant tags: one queue, first come first served
//	turns          calls tagged with WithTenant: tenants take turns at the gate
//	turns + share  tagged, and WithTenantShare(Normal, share): a tenant holds
//	               at most max(1, floor(20 x share)) calls in flight
//
// Every call also carries its tenant in an X-Tenant header, whether or not
// sluice is told, so that the upstream can count how many calls of each
// tenant it serves at once. A call's wait is from the call to its response,
// the upstream's 100 ms included, as in the README's table.
//
// -scale sets the flood: the big tenant submits 1,000 x scale calls and the
// nine arrive at scale x 1 s, so that they find the same share of the
// backlog ahead of them; they still send 10 calls each. The third run is the
// longest: the cap holds even when the big tenant is the only one left, so
// it drains at 5 calls in flight (with share 0.25), not 20.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/stats"
	"github.com/sluice-go/sluice/internal/upstream"
)

// config is what the flags set.
type config struct {
	// Scale multiplies the big tenant's 1,000 calls and the nine's 1 s
	// delay: 1 is TestTenantFairness's scenario.
	Scale float64
	// Share is the big tenant's (and every tenant's) share of the in-flight
	// limit in the third run.
	Share float64
}

func main() {
	cfg := config{Scale: 0.5, Share: 0.25}
	flag.Float64Var(&cfg.Scale, "scale", cfg.Scale, "scales the big tenant's 1,000 calls and the nine's 1 s delay; 1 is the README's scenario (0 < scale <= 5)")
	flag.Float64Var(&cfg.Share, "share", cfg.Share, "the tenant share of the third run (0 < share <= 1)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "tenants:", err)
		os.Exit(1)
	}
}

// The scenario's constants, as in TestTenantFairness.
const (
	bigCalls    = 1000                   // the big tenant's calls, at scale 1
	smallDelay  = time.Second            // when the nine arrive, at scale 1
	smalls      = 9                      // small tenants
	smallCalls  = 10                     // calls per small tenant
	inFlight    = 20                     // sluice's fixed in-flight limit
	serviceTime = 100 * time.Millisecond // the upstream's time per call
)

// mode is one way of running the scenario.
type mode struct {
	name   string
	detail string  // what the run does, printed after its name
	tag    bool    // tag each call with sluice.WithTenant
	share  float64 // WithTenantShare for the level; 0: none
}

func modes(share float64) []mode {
	return []mode{
		{name: "one FIFO", detail: "no tenant tags"},
		{name: "turns", detail: "tagged with WithTenant", tag: true},
		{name: "turns + share", tag: true, share: share, detail: fmt.Sprintf(
			"tagged, WithTenantShare(Normal, %g): at most %d in flight per tenant", share, max(1, int(inFlight*share)))},
	}
}

// tenantResult is what one tenant saw in one run.
type tenantResult struct {
	id     string
	served int
	waits  []time.Duration // from the call to its response
	maxIn  int             // most of its calls the upstream served at once
	doneAt time.Duration   // when its last call was answered, from t=0
}

// result is one run: the big tenant, then the nine in order.
type result struct {
	name    string
	tenants []*tenantResult
}

func (r *result) big() *tenantResult     { return r.tenants[0] }
func (r *result) small() []*tenantResult { return r.tenants[1:] }

func scaledBig(scale float64) int { return max(1, int(math.Round(bigCalls*scale))) }

func scaledDelay(scale float64) time.Duration { return time.Duration(float64(smallDelay) * scale) }

func (c config) validate() error {
	if !(c.Scale > 0 && c.Scale <= 5) { // also refuses NaN
		return fmt.Errorf("-scale %v: must be in (0, 5]", c.Scale)
	}
	if !(c.Share > 0 && c.Share <= 1) {
		return fmt.Errorf("-share %v: must be in (0, 1]", c.Share)
	}
	return nil
}

// run runs the three modes and prints a table for each.
func run(ctx context.Context, cfg config, w io.Writer) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	fmt.Fprintf(w, "Tenant big sends %d calls at t=0; nine small tenants send %d each at t=%v.\n",
		scaledBig(cfg.Scale), smallCalls, scaledDelay(cfg.Scale))
	fmt.Fprintf(w, "One priority level, %d in flight, %v per call at the upstream. Three runs at once...\n\n",
		inFlight, serviceTime)
	start := time.Now()
	results, err := runAll(ctx, cfg)
	if err != nil {
		return err
	}
	ms := modes(cfg.Share)
	for i, r := range results {
		printTable(w, fmt.Sprintf("(%d) %s: %s", i+1, ms[i].name, ms[i].detail), r)
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "Wait: from the call to its response (%v of service included); in flight: counted at the upstream.\n", serviceTime)
	fmt.Fprintf(w, "Look for: in one FIFO the nine wait behind big's backlog. With turns their waits drop to a few\n"+
		"hundred ms and big still gets the slots they leave; with the share big never holds more than its\n"+
		"cap, even alone, so it finishes last.\n")
	fmt.Fprintf(w, "(ran in %v)\n", time.Since(start).Round(100*time.Millisecond))
	return nil
}

// runAll runs the three modes at once, each against its own upstream and
// Transport, and returns their results in the order of modes.
func runAll(ctx context.Context, cfg config) ([]*result, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ms := modes(cfg.Share)
	results := make([]*result, len(ms))
	errs := make([]error, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() { results[i], errs[i] = runOne(ctx, m, cfg.Scale) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return results, nil
}

// runOne runs the scenario once.
func runOne(ctx context.Context, m mode, scale float64) (*result, error) {
	nBig := scaledBig(scale)
	// The big tenant drains at its cap (20, or its share of 20) and the
	// nine's calls add to that; four times as long, and some slack for a
	// loaded machine, bounds the run, so that a stall ends in an error.
	bigCap := inFlight
	if m.share > 0 {
		bigCap = max(1, int(inFlight*m.share))
	}
	expect := time.Duration(nBig)*serviceTime/time.Duration(bigCap) +
		time.Duration(smalls*smallCalls)*serviceTime/inFlight
	ctx, cancel := context.WithTimeout(ctx, 4*expect+10*time.Second)
	defer cancel()

	// upstream.New serves in memory: no socket, and it also runs inside a
	// testing/synctest bubble, where the test runs this on a virtual clock.
	srv := upstream.New(upstream.Config{
		Latency: func(int, *http.Request) time.Duration { return serviceTime },
	})
	defer srv.Close()

	opts := []sluice.Option{sluice.WithConcurrency(inFlight, inFlight)}
	if m.share > 0 {
		opts = append(opts, sluice.WithTenantShare(sluice.Normal, m.share))
	}
	tr, err := sluice.New(srv.Transport(), opts...)
	if err != nil {
		return nil, err
	}
	client := &http.Client{Transport: tr}

	r := &result{name: m.name, tenants: []*tenantResult{{id: "big"}}}
	for i := range smalls {
		r.tenants = append(r.tenants, &tenantResult{id: fmt.Sprintf("small-%d", i)})
	}

	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	t0 := time.Now()
	send := func(tn *tenantResult) {
		wg.Go(func() {
			at := time.Now()
			err := call(ctx, client, srv.URL(), tn.id, m.tag)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if firstErr == nil {
					firstErr = fmt.Errorf("%s: tenant %s: %w", m.name, tn.id, err)
					cancel() // the run is spoilt: stop the rest
				}
				return
			}
			now := time.Now()
			tn.served++
			tn.waits = append(tn.waits, now.Sub(at))
			tn.doneAt = max(tn.doneAt, now.Sub(t0))
		})
	}
	for range nBig {
		send(r.big())
	}
	select {
	case <-time.After(scaledDelay(scale)):
		for _, tn := range r.small() {
			for range smallCalls {
				send(tn)
			}
		}
	case <-ctx.Done():
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", m.name, err)
	}

	maxIn := maxInFlight(srv.Arrivals())
	for _, tn := range r.tenants {
		tn.maxIn = maxIn[tn.id]
	}
	return r, nil
}

// call sends one GET as tenant id and reads the response. The X-Tenant
// header is for the upstream's count; only the context tells sluice, and
// only when tag is set.
func call(ctx context.Context, client *http.Client, url, id string, tag bool) error {
	if tag {
		ctx = sluice.WithTenant(ctx, id)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("X-Tenant", id)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	// Reading to EOF is what frees sluice's slot and lets the connection be
	// reused.
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("upstream: %s", resp.Status)
	}
	return nil
}

// maxInFlight returns, per tenant, the most calls the upstream had in
// service at once. A call that ends at the instant another starts (which
// happens on a synctest bubble's clock) is counted as gone first: the next
// one was sent because it ended.
func maxInFlight(arrivals []upstream.Arrival) map[string]int {
	type event struct {
		at    time.Time
		delta int
	}
	byTenant := map[string][]event{}
	for _, a := range arrivals {
		if a.Started.IsZero() || a.Done.IsZero() {
			continue
		}
		byTenant[a.Tenant] = append(byTenant[a.Tenant], event{a.Started, +1}, event{a.Done, -1})
	}
	out := make(map[string]int, len(byTenant))
	for id, evs := range byTenant {
		slices.SortFunc(evs, func(a, b event) int {
			if c := a.at.Compare(b.at); c != 0 {
				return c
			}
			return a.delta - b.delta // -1 before +1
		})
		n, top := 0, 0
		for _, e := range evs {
			n += e.delta
			top = max(top, n)
		}
		out[id] = top
	}
	return out
}

// printTable prints one run: the big tenant, and the nine as ranges.
func printTable(w io.Writer, title string, r *result) {
	fmt.Fprintln(w, title)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "  tenant\tserved\twait p50\twait p99\tmax in flight\tdone at\t\n")
	b := r.big()
	fmt.Fprintf(tw, "  big\t%d\t%v\t%v\t%d\t%v\t\n", b.served,
		round(stats.Quantile(b.waits, 0.5)), round(stats.Quantile(b.waits, 0.99)), b.maxIn, round(b.doneAt))
	fmt.Fprintf(tw, "  nine small\t%s each\t%s\t%s\t%s\t%s\t\n",
		span(r.small(), func(tn *tenantResult) int { return tn.served }),
		span(r.small(), func(tn *tenantResult) time.Duration { return round(stats.Quantile(tn.waits, 0.5)) }),
		span(r.small(), func(tn *tenantResult) time.Duration { return round(stats.Quantile(tn.waits, 0.99)) }),
		span(r.small(), func(tn *tenantResult) int { return tn.maxIn }),
		span(r.small(), func(tn *tenantResult) time.Duration { return round(tn.doneAt) }))
	tw.Flush()
}

// span shows the range of f over tns as "lo–hi", or one value when all are
// equal.
func span[T int | time.Duration](tns []*tenantResult, f func(*tenantResult) T) string {
	var vs []T
	for _, tn := range tns {
		vs = append(vs, f(tn))
	}
	lo, hi := slices.Min(vs), slices.Max(vs)
	if lo == hi {
		return fmt.Sprint(lo)
	}
	return fmt.Sprintf("%v–%v", lo, hi)
}

// round shows a duration to the 10 ms, enough for 100 ms calls.
func round(d time.Duration) time.Duration { return d.Round(10 * time.Millisecond) }
