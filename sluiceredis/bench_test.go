package sluiceredis

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
)

// BenchmarkTake measures one Take against a local redis-server when a token
// is always there: the cost of the script's round trip.
func BenchmarkTake(b *testing.B) {
	for _, leases := range []bool{false, true} {
		name := "gcra"
		var opts []Option
		if leases {
			name = "gcra+lease"
			opts = append(opts, WithInFlight(1<<30, time.Minute))
		}
		b.Run(name, func(b *testing.B) {
			srv := startRedis(b)
			c := newClient(b, srv.Addr())
			be := newTokens(b, c, opts...)
			ctx := context.Background()
			be.Take(ctx, "warm", 1, 1) // loads the script
			n := countCalls(c)
			b.ResetTimer()
			for b.Loop() {
				if w, err := be.Take(ctx, "api", 1e9, 1); w != 0 || err != nil {
					b.Fatalf("Take = %v, %v", w, err)
				}
				be.Done("api")
			}
			b.ReportMetric(float64(n.n.Load())/float64(b.N), "roundtrips/op")
		})
	}
}

// BenchmarkTakeFleet runs four Backends (four processes, to Redis) that
// contend for one budget of 2000/s, each asking as a lane's dispatcher
// does, and reports the Redis round trips per token granted: reserving a
// token that is not yet due keeps it at one, where refusing it would cost
// a call per process per token.
func BenchmarkTakeFleet(b *testing.B) {
	srv := startRedis(b)
	const procs, rate = 4, 2000.0
	var (
		grants atomic.Int64
		wg     sync.WaitGroup
	)
	backends := make([]*Tokens, procs)
	counters := make([]*counter, procs)
	for i := range backends {
		c := newClient(b, srv.Addr())
		backends[i] = newTokens(b, c)
		backends[i].Take(context.Background(), "warm", 1, 1) // loads the script
		counters[i] = countCalls(c)
	}
	b.ResetTimer()
	start := time.Now()
	for _, be := range backends {
		wg.Go(func() {
			for grants.Load() < int64(b.N) {
				w, err := be.Take(context.Background(), "api", rate, 1)
				if err != nil {
					b.Error(err)
					return
				}
				if w > 0 {
					time.Sleep(w)
					continue
				}
				grants.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	var calls int64
	for _, n := range counters {
		calls += n.n.Load()
	}
	b.ReportMetric(float64(calls)/float64(grants.Load()), "roundtrips/grant")
	b.ReportMetric(float64(grants.Load())/elapsed.Seconds(), "grants/s")
}

// nopBackend grants everything at once: what a Backend costs the lane
// besides its own work.
type nopBackend struct{}

func (nopBackend) Take(context.Context, string, float64, int) (time.Duration, error) { return 0, nil }
func (nopBackend) Done(string)                                                       {}
func (nopBackend) Cool(context.Context, string, time.Time) error                     { return nil }

// BenchmarkRoundTrip compares a request through a Transport with a local
// budget, with a Backend that does nothing (the lane's own cost of a
// Backend), and with a Redis Backend, against a local upstream.
func BenchmarkRoundTrip(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer up.Close()
	for _, backend := range []string{"local", "nop", "redis"} {
		b.Run("budget="+backend, func(b *testing.B) {
			opts := []sluice.Option{sluice.WithRate(1e8, time.Second)}
			var n *counter
			if backend == "nop" {
				opts = append(opts, sluice.WithBackend(nopBackend{}))
			}
			if backend == "redis" {
				srv := startRedis(b)
				c := newClient(b, srv.Addr())
				be := newTokens(b, c)
				be.Take(context.Background(), "warm", 1, 1)
				n = countCalls(c)
				opts = append(opts, sluice.WithBackend(be))
			}
			tr, err := sluice.New(nil, opts...)
			if err != nil {
				b.Fatal(err)
			}
			client := &http.Client{Transport: tr}
			defer client.CloseIdleConnections()
			b.ResetTimer()
			for b.Loop() {
				resp, err := client.Get(up.URL)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			if n != nil {
				b.ReportMetric(float64(n.n.Load())/float64(b.N), "roundtrips/op")
			}
		})
	}
}
