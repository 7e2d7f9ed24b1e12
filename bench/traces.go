package main

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/go-redis/redis_rate/v10"
)

// Header traces: what each real middleware answers to a short sequence of
// requests paced by the client, recorded for tests that replay them
// (testdata/traces at the repository's root).
//
//	cd bench && go run . -traces ../testdata/traces
//
// A trace is a text file. Lines starting with '#' are comments. Before
// the first record come directives:
//
//	@setup <how the middleware was set up>
//	@published <limit>/<period>     the allowance, as in 10/1s
//	@start <RFC 3339 instant>       the client's clock when the sequence began
//
// Then one record per response, records separated by a blank line: a line
// "<sent> <received> <status>", the instants the request was sent and its
// response's header received, in seconds after @start on the client's
// clock (nanosecond resolution), and the HTTP status code; then the
// response's header fields, one "Name: value" line per value, names in
// canonical form and sorted, values in the order received.
//
// The sequence, one request at a time with no service latency: a burst of
// the limit and five more, back to back; a pause of traceRest; requests
// every half of 1/rate (twice the rate) for a second; then every two
// 1/rate (half the rate) for a second. It ends having met each
// middleware's refusals, its recovery, and its answers at and below the
// rate.
const traceRest = 1200 * time.Millisecond

// A traceModel is a real middleware a trace is recorded from.
type traceModel struct {
	file  string // base name of the trace file
	setup string
	limit int
	per   time.Duration
	redis bool
	mw    middleware
}

// traceRate is the rate the traces are recorded at: low enough that a
// window's refill and a refusal's wait show within a few seconds.
const traceRate = 10

func traceModels() []traceModel {
	return []traceModel{
		{file: "throttled.txt", setup: "throttled/v2 GCRA over memstore, RateQuota{MaxRate: PerSec(10), MaxBurst: 5}",
			limit: traceRate, per: time.Second, mw: throttledGCRA(traceRate, 5)},
		{file: "httprate.txt", setup: "go-chi/httprate LimitBy(10, time.Second, Key(\"*\"))",
			limit: traceRate, per: time.Second, mw: httprateWindow(traceRate, time.Second)},
		{file: "go-limiter.txt", setup: "sethvargo/go-limiter httplimit over memorystore, Tokens 10, Interval 1s",
			limit: traceRate, per: time.Second, mw: goLimiter(traceRate, time.Second)},
		{file: "ulule-limiter.txt", setup: "ulule/limiter/v3 stdlib middleware over the memory store, rate \"10-S\"",
			limit: traceRate, per: time.Second, mw: ululeFormatted(fmt.Sprintf("%d-S", traceRate))},
		{file: "tollbooth.txt", setup: "didip/tollbooth/v8 HTTPMiddleware(NewLimiter(10, nil)), keyed by RemoteAddr",
			limit: traceRate, per: time.Second, mw: tollboothLimit(traceRate)},
		{file: "redis_rate.txt", setup: "go-redis/redis_rate/v10 Allow(PerSecond(10)) on a redis-server, with the bench's headers (see redisRate)",
			limit: traceRate, per: time.Second, redis: true, mw: redisRate(redis_rate.PerSecond(traceRate))},
	}
}

// writeTraces records every trace model into dir.
func writeTraces(dir string, log io.Writer) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, tm := range traceModels() {
		fmt.Fprintf(log, "trace %s ... ", tm.file)
		n, err := writeTrace(filepath.Join(dir, tm.file), tm)
		if err != nil {
			return fmt.Errorf("%s: %w", tm.file, err)
		}
		fmt.Fprintf(log, "%d responses\n", n)
	}
	return nil
}

func writeTrace(path string, tm traceModel) (int, error) {
	var addr string
	if tm.redis {
		rs, err := startRedis()
		if err != nil {
			return 0, err
		}
		defer rs.stop()
		addr = rs.addr
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	h, stop, err := tm.mw(ok, addr)
	if err != nil {
		return 0, err
	}
	defer stop()
	srv := httptest.NewServer(h)
	defer srv.Close()

	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	w := bufio.NewWriter(f)
	start := time.Now()
	fmt.Fprintf(w, "# A header trace of real middleware, written by the bench (cd bench && go run . -traces ../testdata/traces);\n")
	fmt.Fprintf(w, "# the format is described in bench/traces.go.\n")
	fmt.Fprintf(w, "@setup %s\n@published %d/%v\n@start %s\n", tm.setup, tm.limit, tm.per, start.UTC().Format(time.RFC3339Nano))

	interval := tm.per / time.Duration(tm.limit)
	var sends []time.Duration // offsets from start to send at; 0 = at once
	for range tm.limit + 5 {
		sends = append(sends, 0)
	}
	at := traceRest
	sends = append(sends, at)
	for at < traceRest+time.Second {
		at += interval / 2
		sends = append(sends, at)
	}
	for end := at + time.Second; at < end; {
		at += 2 * interval
		sends = append(sends, at)
	}
	c := srv.Client()
	n := 0
	for _, off := range sends {
		if d := time.Until(start.Add(off)); d > 0 {
			time.Sleep(d)
		}
		sent := time.Since(start)
		resp, err := c.Get(srv.URL + "/v1/thing")
		if err != nil {
			return n, err
		}
		received := time.Since(start)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		fmt.Fprintf(w, "\n%.9f %.9f %d\n", sent.Seconds(), received.Seconds(), resp.StatusCode)
		for _, k := range slices.Sorted(maps.Keys(resp.Header)) {
			for _, v := range resp.Header[k] {
				fmt.Fprintf(w, "%s: %s\n", k, v)
			}
		}
		n++
	}
	if err := w.Flush(); err != nil {
		return n, err
	}
	return n, f.Close()
}
