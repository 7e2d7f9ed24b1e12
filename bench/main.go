package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"runtime"
	"strings"
	"time"
)

func main() {
	serveIfChild()
	var (
		d        = flag.Duration("d", 12*time.Second, "length of each run; the second half is measured")
		workers  = flag.Int("workers", 32, "callers in a closed loop")
		latency  = flag.Duration("latency", 20*time.Millisecond, "service time of an accepted request")
		modelRE  = flag.String("model", "", "run only the models whose name matches this regexp")
		clientRE = flag.String("client", "", "run only the clients whose name matches this regexp")
		short    = flag.Bool("short", false, "smoke run: 2 s, the strict GCRA model only (no token scenario)")
		traces   = flag.String("traces", "", "record the real middleware's header traces into this directory, and run nothing else")
	)
	flag.Parse()
	if *traces != "" {
		if err := writeTraces(*traces, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	cfg := config{d: *d, workers: *workers, latency: *latency}
	if *short {
		cfg.d = 2 * time.Second
		if *modelRE == "" {
			*modelRE = "^strict GCRA burst 1, same headers"
		}
	}
	// The request matrix, then the token-budget table; the regexps select
	// in both, and at least one must select something.
	ms, cs, err := selectRuns(*modelRE, *clientRE)
	ts, tcs, terr := selectTokenRuns(*modelRE, *clientRE)
	if err != nil && terr != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err == nil {
		if err := bench(ctx, os.Stdout, os.Stderr, cfg, ms, cs); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	if terr == nil {
		if err := benchTokens(ctx, os.Stdout, os.Stderr, cfg, ts, tcs); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}

// selectTokenRuns filters the token scenarios and clients by regexp.
func selectTokenRuns(modelRE, clientRE string) ([]tokenScenario, []tokenClient, error) {
	ss, err := matching(tokenScenarios(), func(s tokenScenario) string { return s.name }, "-model", modelRE)
	if err != nil {
		return nil, nil, err
	}
	cs, err := matching(tokenClients(), func(c tokenClient) string { return c.name }, "-client", clientRE)
	if err != nil {
		return nil, nil, err
	}
	if len(ss) == 0 || len(cs) == 0 {
		return nil, nil, fmt.Errorf("no token scenario or no token client matches")
	}
	return ss, cs, nil
}

// selectRuns filters the models and clients by regexp.
func selectRuns(modelRE, clientRE string) ([]model, []client, error) {
	ms, err := matching(models(), func(m model) string { return m.name }, "-model", modelRE)
	if err != nil {
		return nil, nil, err
	}
	cs, err := matching(clients(), func(c client) string { return c.name }, "-client", clientRE)
	if err != nil {
		return nil, nil, err
	}
	if len(ms) == 0 || len(cs) == 0 {
		return nil, nil, fmt.Errorf("no model or no client matches")
	}
	return ms, cs, nil
}

// matching returns the items whose name matches the regexp expr, given
// by the flag opt.
func matching[T any](items []T, name func(T) string, opt, expr string) ([]T, error) {
	re, err := regexp.Compile(expr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", opt, err)
	}
	var out []T
	for _, it := range items {
		if re.MatchString(name(it)) {
			out = append(out, it)
		}
	}
	return out, nil
}

// bench runs every client against every model, one run at a time,
// reporting progress to log, and writes the table to out. It returns the
// cells, models by clients.
func bench(ctx context.Context, out, log io.Writer, cfg config, ms []model, cs []client) error {
	cells := make([][]result, len(ms))
	for i, m := range ms {
		cells[i] = make([]result, len(cs))
		for j, c := range cs {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			fmt.Fprintf(log, "%s | %s ... ", m.name, c.name)
			cells[i][j] = run(ctx, cfg, m, c)
			fmt.Fprintf(log, "%v (%d attempts measured)\n", cells[i][j], cells[i][j].attempts)
		}
	}
	writeTable(out, cfg, ms, cs, cells)
	return nil
}

func writeTable(w io.Writer, cfg config, ms []model, cs []client, cells [][]result) {
	fmt.Fprintf(w, "\n%d callers in a closed loop, %v service latency, second half of %v runs, real loopback; GOMAXPROCS %d, %s/%s, %s.\n",
		cfg.workers, cfg.latency, cfg.d, runtime.GOMAXPROCS(0), runtime.GOOS, runtime.GOARCH, runtime.Version())
	fmt.Fprintf(w, "Each cell: accepted/s ÷ published rate, %% of attempts refused, over the second half; then accepted/s ÷ published rate over the whole run.\n\n")
	fmt.Fprintf(w, "| server |")
	for _, c := range cs {
		fmt.Fprintf(w, " %s |", c.name)
	}
	fmt.Fprintf(w, "\n|---|%s\n", strings.Repeat("---|", len(cs)))
	for i, m := range ms {
		fmt.Fprintf(w, "| %s |", m.name)
		for j := range cs {
			fmt.Fprintf(w, " %v |", cells[i][j])
		}
		fmt.Fprintln(w)
	}
}
