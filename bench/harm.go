package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/throttled/throttled/v2"
	"github.com/throttled/throttled/v2/store/memstore"

	"github.com/sluice-go/sluice"
)

// The harm comparison (go run . -harm): for every server, the same sluice
// lane reading the rate-limit headers and ignoring them, so that reading
// them is seen never to serve a lane worse than not reading them. A lane
// ignores the headers through its base RoundTripper, which strips every
// rate-limit field from each response before sluice sees it (see
// stripRateLimit) and keeps the status and Retry-After.

// stripRateLimit is a RoundTripper that removes every rate-limit field
// from the responses of base: X-RateLimit-*, X-Rate-Limit-*, RateLimit,
// RateLimit-Policy, RateLimit-* and anthropic-ratelimit-*. The status and
// Retry-After (and retry-after-ms) are kept.
type stripRateLimit struct{ base http.RoundTripper }

func (s stripRateLimit) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := s.base.RoundTrip(r)
	if err != nil {
		return resp, err
	}
	for k := range resp.Header {
		if isRateLimitField(k) {
			delete(resp.Header, k)
		}
	}
	return resp, nil
}

// isRateLimitField reports whether the header field named k states a rate
// limit (as opposed to when to retry).
func isRateLimitField(k string) bool {
	k = strings.ToLower(k)
	for _, p := range []string{"x-ratelimit", "x-rate-limit", "ratelimit", "anthropic-ratelimit"} {
		if strings.HasPrefix(k, p) {
			return true
		}
	}
	return false
}

// harmClients are the clients of the harm comparison: sluice with no
// WithRate and at R, each reading the headers and ignoring them, and the
// hand-made pair at R.
func harmClients() []client {
	stripped := func(opts func(n int, per time.Duration) []sluice.Option) func(http.RoundTripper, int, time.Duration) (*http.Client, error) {
		return func(base http.RoundTripper, n int, per time.Duration) (*http.Client, error) {
			return sluiceClient(stripRateLimit{base}, opts(n, per)...)
		}
	}
	none := func(int, time.Duration) []sluice.Option { return nil }
	atR := func(n int, per time.Duration) []sluice.Option { return []sluice.Option{sluice.WithRate(n, per)} }
	cs := clients()
	return []client{
		cs[1], // sluice, no WithRate
		{"sluice, no WithRate, headers stripped", stripped(none)},
		cs[0], // sluice at R
		{"sluice at R, headers stripped", stripped(atR)},
		cs[3], // x/time/rate at R + 16 slots
	}
}

// harmModels are the servers of the harm comparison: the real middleware
// and the strict GCRA that states its limit twice.
func harmModels() []model {
	return realModels()
}

// bothHeadersGCRA is a strict GCRA (throttled's, burst 1) at perSec that
// states its limit in both families at once, as some APIs do: the IETF
// RateLimit-Policy `"default";q=R;w=1` and RateLimit `"default";r=N;t=S`
// (S whole seconds until the bucket is full again, rounded up), and
// X-RateLimit-Limit (R), -Remaining and -Reset (the Unix time it is full
// again, rounded up); on a refusal, 429 and Retry-After in whole seconds,
// rounded up.
func bothHeadersGCRA(perSec int) middleware {
	return func(next http.Handler, _ string) (http.Handler, func(), error) {
		st, err := memstore.NewCtx(65536)
		if err != nil {
			return nil, nil, err
		}
		rl, err := throttled.NewGCRARateLimiterCtx(st, throttled.RateQuota{MaxRate: throttled.PerSec(perSec), MaxBurst: 0})
		if err != nil {
			return nil, nil, err
		}
		ceil := func(d time.Duration) int64 { return int64(math.Ceil(d.Seconds())) }
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			limited, res, err := rl.RateLimitCtx(r.Context(), "bench", 1)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			h := w.Header()
			lim, rem := strconv.Itoa(perSec), strconv.Itoa(res.Remaining)
			h.Set("RateLimit-Policy", `"default";q=`+lim+`;w=1`)
			h.Set("RateLimit", `"default";r=`+rem+`;t=`+strconv.FormatInt(ceil(res.ResetAfter), 10))
			h.Set("X-RateLimit-Limit", lim)
			h.Set("X-RateLimit-Remaining", rem)
			h.Set("X-RateLimit-Reset", strconv.FormatInt(int64(math.Ceil(float64(time.Now().Add(res.ResetAfter).UnixNano())/1e9)), 10))
			if limited {
				h.Set("Retry-After", strconv.FormatInt(ceil(res.RetryAfter), 10))
				http.Error(w, "rate limit exceeded", http.StatusTooManyRequests)
				return
			}
			next.ServeHTTP(w, r)
		})
		return h, func() {}, nil
	}
}

// harm runs every harm client against every model, one run at a time,
// and writes the table to out: each cell as in bench, then the
// differences that reading the headers makes.
func harm(ctx context.Context, out, log io.Writer, cfg config, ms []model, cs []client) error {
	cells, err := runAll(ctx, log, cfg, ms, cs)
	if err != nil {
		return err
	}
	writeHarmTable(out, cfg, ms, cs, cells)
	return nil
}

// writeHarmTable writes the harm table: a row per model, a column per
// client, and for each pair of sluice clients (headers read, headers
// stripped) the difference in the measured half's share of R and in
// refusals.
func writeHarmTable(w io.Writer, cfg config, ms []model, cs []client, cells [][]result) {
	fmt.Fprintf(w, "\n%d callers in a closed loop (unless the server names more), %v service latency, %v runs, real loopback; GOMAXPROCS %d, %s/%s, %s.\n",
		cfg.workers, cfg.latency, cfg.d, runtime.GOMAXPROCS(0), runtime.GOOS, runtime.GOARCH, runtime.Version())
	fmt.Fprintf(w, "Each cell: accepted/s ÷ published rate, %% of attempts refused, over the second half; then over the whole run. "+
		"Δ: headers read less headers stripped, in share of R and in points of refusals, second half (whole run).\n\n")
	pairs := harmPairs(cs)
	fmt.Fprintf(w, "| server |")
	for _, c := range cs {
		fmt.Fprintf(w, " %s |", c.name)
	}
	for _, p := range pairs {
		fmt.Fprintf(w, " Δ %s |", cs[p[0]].name)
	}
	fmt.Fprintf(w, "\n|---|%s\n", strings.Repeat("---|", len(cs)+len(pairs)))
	for i, m := range ms {
		fmt.Fprintf(w, "| %s |", m.name)
		for j := range cs {
			fmt.Fprintf(w, " %v |", cells[i][j])
		}
		for _, p := range pairs {
			on, off := cells[i][p[0]], cells[i][p[1]]
			if on.err != nil || off.err != nil {
				fmt.Fprintf(w, " - |")
				continue
			}
			fmt.Fprintf(w, " %+.2f, %+.1f (%+.2f) |", on.ratio-off.ratio, on.refused-off.refused, on.whole-off.whole)
		}
		fmt.Fprintln(w)
	}
}

// harmPairs returns, for each client whose name has a counterpart with
// ", headers stripped" appended, the indices of the two.
func harmPairs(cs []client) [][2]int {
	var ps [][2]int
	for i, c := range cs {
		for j, d := range cs {
			if d.name == c.name+", headers stripped" {
				ps = append(ps, [2]int{i, j})
			}
		}
	}
	return ps
}
