package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/upstream"
	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"
)

// Several limits behind one host, on the real clock over loopback: sluice
// with its defaults beside x/time/rate + semaphore, once with one limiter
// for the host (what a user writes first) and once with one limiter per
// limit, set by hand to each limit's rate (what sluice learns on its own).

// A subScenario is a host with several limits and groups of callers.
type subScenario struct {
	name   string
	limits func() upstream.Limiter
	groups []subGroup
	host   float64 // the one rate of a single limiter for the host
	opts   []sluice.Option
}

// A subGroup is callers in a closed loop on one path, whose limit is rate.
type subGroup struct {
	label   string
	path    string
	paths   func(i int64) string // if set, the path of the group's ith call, each starting with path
	callers int
	rate    float64
	ctx     func(context.Context) context.Context // how sluice is told its sub-limit; nil: learned
}

// A SubRow is one group's figures, second half of a run.
type SubRow struct {
	Scenario, Client, Group string
	Rate, Share             float64 // accepted per second, and ÷ the group's limit
	Refused                 int
	P99                     time.Duration
}

func subScenarios() []subScenario {
	github := subScenario{
		name:   "GitHub core 50/s + search 2.5/s, search exhausted",
		limits: func() upstream.Limiter { return upstream.NewGitHubResources(100, 5, 2*time.Second) },
		groups: []subGroup{
			{label: "core", path: "/repos/o/r/issues/7", callers: 16, rate: 50},
			{label: "search", path: "/search/issues", callers: 4, rate: 2.5},
		},
		host: 50,
		opts: []sluice.Option{sluice.WithRate(60, time.Second)},
	}
	discord := subScenario{
		name: "Discord: one bucket per channel, 5/s each, global 50/s",
		limits: func() upstream.Limiter {
			lim := map[string]upstream.Limiter{}
			for i := range 3 {
				lim[fmt.Sprintf("/channels/%d/messages", 100+i)] = upstream.NewDiscordBucket("41f9a2", 5, time.Second)
			}
			return &upstream.Routes{Route: func(r *http.Request) string { return r.URL.Path },
				Limits: lim, Global: upstream.NewDiscordGlobal(50)}
		},
		groups: []subGroup{
			{label: "channel 1", path: "/channels/100/messages", callers: 4, rate: 5},
			{label: "channel 2", path: "/channels/101/messages", callers: 4, rate: 5},
			{label: "channel 3 (1 caller)", path: "/channels/102/messages", callers: 1, rate: 5},
		},
		host: 15,
	}
	model := func(name string) func(context.Context) context.Context {
		return func(ctx context.Context) context.Context { return sluice.WithSublimit(ctx, name) }
	}
	models := subScenario{
		name: "two models, 40/s and 10/s, named by the caller",
		limits: func() upstream.Limiter {
			return &upstream.Routes{Route: func(r *http.Request) string { return r.URL.Path },
				Limits: map[string]upstream.Limiter{
					"/v1/fast": upstream.NewOpenAI(upstream.OpenAIConfig{Requests: 40, Per: time.Second}),
					"/v1/slow": upstream.NewOpenAI(upstream.OpenAIConfig{Requests: 10, Per: time.Second}),
				}}
		},
		groups: []subGroup{
			{label: "fast model", path: "/v1/fast", callers: 16, rate: 40, ctx: model("fast")},
			{label: "slow model", path: "/v1/slow", callers: 16, rate: 10, ctx: model("slow")},
		},
		host: 50,
	}
	crawler := subScenario{
		name:   crawlerScenario,
		limits: func() upstream.Limiter { return upstream.NewGitHubResources(100, 5, 2*time.Second) },
		groups: []subGroup{
			{label: "core, new repositories", path: "/repos/o/", paths: crawlerPath, callers: 16, rate: 50},
		},
		host: 50,
	}
	return []subScenario{github, discord, models, crawler}
}

// crawlerScenario is the name of the scenario of a crawler that calls a
// new repository each call: every call a route sluice has not filed yet.
const crawlerScenario = "GitHub crawler: core 50/s, a new repository each call"

// crawlerPath is the path of a crawler's ith call: the issues of a new
// repository, named with letters only, so that no segment looks like an
// id and each path is a route of its own.
func crawlerPath(i int64) string {
	repo := strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return 'a' + (r - '0') + 16
		}
		return r
	}, strconv.FormatInt(i, 26))
	return "/repos/o/" + repo + "/issues"
}

// sends reports whether a request to path is one of g's.
func (g subGroup) sends(path string) bool {
	if g.paths != nil {
		return strings.HasPrefix(path, g.path)
	}
	return path == g.path
}

// subClient is a way to call a scenario's groups: do sends one request of
// group g.
type subClient struct {
	name string
	do   func(ctx context.Context, g int, url string) (int, error)
}

func subClients(sc subScenario, base http.RoundTripper) []subClient {
	tr, err := sluice.New(base, append([]sluice.Option{sluice.WithRetry(0)}, sc.opts...)...)
	if err != nil {
		panic(err)
	}
	sl := &http.Client{Transport: tr}
	plain := &http.Client{Transport: base}
	get := func(c *http.Client, ctx context.Context, url string) (int, error) {
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		resp, err := c.Do(req)
		if err != nil {
			return 0, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	pair := func(name string, lims []*rate.Limiter) subClient {
		sem := semaphore.NewWeighted(16)
		return subClient{name, func(ctx context.Context, g int, url string) (int, error) {
			if err := lims[g].Wait(ctx); err != nil {
				return 0, err
			}
			if err := sem.Acquire(ctx, 1); err != nil {
				return 0, err
			}
			defer sem.Release(1)
			return get(plain, ctx, url)
		}}
	}
	one := rate.NewLimiter(rate.Limit(sc.host), 1)
	var shared, each []*rate.Limiter
	for _, g := range sc.groups {
		shared = append(shared, one)
		each = append(each, rate.NewLimiter(rate.Limit(g.rate), 1))
	}
	return []subClient{
		{"sluice", func(ctx context.Context, g int, url string) (int, error) {
			if f := sc.groups[g].ctx; f != nil {
				ctx = f(ctx)
			}
			return get(sl, ctx, url)
		}},
		pair(fmt.Sprintf("x/time/rate %.0f/s for the host", sc.host), shared),
		pair("x/time/rate per limit, by hand", each),
	}
}

// runSublimits runs every scenario with every client whose name has
// prefix in it (all for "") for d each, and returns a row per group.
func runSublimits(d time.Duration, prefix string) []SubRow {
	var rows []SubRow
	for _, sc := range subScenarios() {
		for ci, c := range subClients(sc, nil) {
			if !strings.HasPrefix(c.name, prefix) && !strings.HasPrefix(c.name, "sluice") {
				continue
			}
			srv := upstream.NewTCP(upstream.Config{Limiter: sc.limits(),
				Latency: func(int, *http.Request) time.Duration { return 20 * time.Millisecond }})
			c := subClients(sc, srv.Transport())[ci]
			rows = append(rows, runSubClient(sc, c, srv, d)...)
			srv.Close()
		}
	}
	return rows
}

func runSubClient(sc subScenario, c subClient, srv *upstream.Server, d time.Duration) []SubRow {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	waits := make([][]time.Duration, len(sc.groups))
	calls := make([]atomic.Int64, len(sc.groups))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for gi, g := range sc.groups {
		for range g.callers {
			wg.Go(func() {
				for ctx.Err() == nil {
					path := g.path
					if g.paths != nil {
						path = g.paths(calls[gi].Add(1))
					}
					sent := time.Now()
					status, err := c.do(ctx, gi, srv.URL()+path)
					switch {
					case err != nil || status >= 400:
						select {
						case <-ctx.Done():
						case <-time.After(10 * time.Millisecond):
						}
					case sent.Sub(start) >= d/2:
						mu.Lock()
						waits[gi] = append(waits[gi], time.Since(sent))
						mu.Unlock()
					}
				}
			})
		}
	}
	wg.Wait()
	rows := make([]SubRow, len(sc.groups))
	for gi, g := range sc.groups {
		rows[gi] = SubRow{Scenario: sc.name, Client: c.name, Group: g.label}
	}
	for _, a := range srv.Arrivals() {
		if a.At.Sub(start) < d/2 {
			continue
		}
		for gi, g := range sc.groups {
			if !g.sends(a.Path) {
				continue
			}
			if a.Accepted {
				rows[gi].Rate++
			} else {
				rows[gi].Refused++
			}
		}
	}
	for gi, g := range sc.groups {
		rows[gi].Rate /= (d / 2).Seconds()
		rows[gi].Share = rows[gi].Rate / g.rate
		if w := waits[gi]; len(w) > 0 {
			slices.Sort(w)
			rows[gi].P99 = w[len(w)*99/100]
		}
	}
	return rows
}

// printSublimits prints rows as one table per scenario.
func printSublimits(rows []SubRow) {
	last := ""
	for _, r := range rows {
		if r.Scenario != last {
			fmt.Printf("\n%s\n%-34s %-22s %8s %7s %8s %9s\n", r.Scenario, "client", "group", "rate/s", "share", "refused", "p99")
			last = r.Scenario
		}
		fmt.Printf("%-34s %-22s %8.2f %7.2f %8d %9v\n", r.Client, r.Group, r.Rate, r.Share, r.Refused, r.P99.Round(time.Millisecond))
	}
}
