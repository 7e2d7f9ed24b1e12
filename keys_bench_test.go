package sluice

import (
	"flag"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

var manyKeys string

func init() {
	flag.StringVar(&manyKeys, "sluice.keys", "10000,100000,1000000", "the numbers of distinct keys BenchmarkManyKeys sends, comma-separated")
}

// keyedRequest returns a request whose lane is its Host, and the keys.
func keyedRequests(n int) (*http.Request, []string) {
	req, _ := http.NewRequest("GET", "http://api.test/", nil)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
	}
	return req, keys
}

func byHost(r *http.Request) string { return r.Host }

// BenchmarkManyKeys sends one request for each of n distinct keys (one lane
// each) through one Transport, on an in-memory base, and prints the time per
// new key and the heap the lanes keep (after a GC; the keys' own strings,
// made beforehand, are not counted). Set the sizes with -sluice.keys.
func BenchmarkManyKeys(b *testing.B) {
	type row struct {
		n            int
		total        time.Duration
		heap         int64
		lanes        int
		perKey, lane float64
	}
	var rows []row
	for _, f := range strings.Split(manyKeys, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			b.Fatalf("-sluice.keys: %q is not a positive number", f)
		}
		var r row
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			req, keys := keyedRequests(n)
			for b.Loop() {
				b.StopTimer()
				var ms runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&ms)
				before := int64(ms.HeapAlloc)
				tr := mustNew(b, nopBase{}, WithKey(byHost), WithRate(1e9, time.Second))
				b.StartTimer()
				start := time.Now()
				for _, k := range keys {
					req.Host = k
					if err := send(tr, req); err != nil {
						b.Fatal(err)
					}
				}
				total := time.Since(start)
				b.StopTimer()
				runtime.GC()
				runtime.ReadMemStats(&ms)
				r = row{n: n, total: total, heap: int64(ms.HeapAlloc) - before, lanes: len(tr.Stats().Lanes)}
				runtime.KeepAlive(tr)
				b.StartTimer()
			}
			r.perKey = float64(r.total.Nanoseconds()) / float64(n)
			r.lane = float64(r.heap) / float64(max(r.lanes, 1))
			b.ReportMetric(r.perKey, "ns/key")
			b.ReportMetric(r.lane, "B/lane")
		})
		rows = append(rows, r)
	}
	fmt.Fprintf(os.Stdout, "\n| distinct keys | total time | per new key | heap kept | lanes kept | heap per lane |\n|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(os.Stdout, "| %d | %v | %v | %.1f MB | %d | %.0f B |\n", r.n, r.total.Round(time.Millisecond),
			time.Duration(r.perKey).Round(10*time.Nanosecond), float64(r.heap)/1e6, r.lanes, r.lane)
	}
}

// BenchmarkStats100k measures one Stats call over 100,000 lanes that have
// each served one request.
func BenchmarkStats100k(b *testing.B) {
	req, keys := keyedRequests(100_000)
	tr := mustNew(b, nopBase{}, WithKey(byHost), WithLaneIdle(0))
	defer tr.Close()
	for _, k := range keys {
		req.Host = k
		if err := send(tr, req); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if s := tr.Stats(); len(s.Lanes) != len(keys) {
			b.Fatalf("%d lanes, want %d", len(s.Lanes), len(keys))
		}
	}
}
