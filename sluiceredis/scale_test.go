package sluiceredis_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/sluiceredis"
	"github.com/sluice-go/sluice/sluiceredis/internal/redistest"
	"github.com/sluice-go/sluice/sluiceredis/internal/scale"
)

// TestScale is cmd/scale at CI size (16 processes, 2,000 keys, a refresh
// of half a second): processes on one key make about one round trip a
// refresh each, and none once it is idle; a process's idle keys cost no
// call (at most two a second, however many), and its busy keys one script
// run a refresh each, many to a round trip; a request to an idle key gets
// a share within a refresh; Redis's CPU for idle keys is a small part of
// that for busy ones.
func TestScale(t *testing.T) {
	srv := redistest.Start(t)
	const refresh = 500 * time.Millisecond
	perRefresh := float64(time.Second / refresh)
	run := func(name string, cfg scale.Config) scale.Result {
		t.Helper()
		cfg.Addr, cfg.Refresh, cfg.Warm, cfg.Run = srv.Addr(), refresh, 5*refresh, 4*refresh
		if cfg.Busy < cfg.Keys {
			cfg.Wakes = 3
		}
		r, err := scale.Measure(context.Background(), cfg)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		t.Logf("%s: %.2f round trips and %.2f script runs a second per process, Redis %.3f cores, an idle key's first share within %v",
			name, r.Calls, r.Scripts, r.CPU, r.Wake.Round(time.Millisecond))
		if cfg.Wakes > 0 && r.Wake > refresh {
			t.Errorf("%s: a request to an idle key waited %v for a share, over a refresh (%v)", name, r.Wake, refresh)
		}
		return r
	}
	r := run("16 processes, one key, busy", scale.Config{Procs: 16, Keys: 1, Busy: 1, Shared: true})
	if r.Calls > 2*perRefresh || r.Scripts < 0.5*perRefresh {
		t.Errorf("16 busy processes on one key: %.2f round trips and %.2f scripts a second each, want about %v", r.Calls, r.Scripts, perRefresh)
	}
	r = run("16 processes, one key, idle", scale.Config{Procs: 16, Keys: 1, Shared: true})
	if r.Calls > 0.2 {
		t.Errorf("16 idle processes on one key: %.2f round trips a second each, want none", r.Calls)
	}
	idle := run("one process, 2,000 keys, idle", scale.Config{Procs: 1, Keys: 2000})
	if idle.Calls > 2 {
		t.Errorf("2,000 idle keys: %.2f round trips a second, want at most 2", idle.Calls)
	}
	busy := run("one process, 2,000 keys, busy", scale.Config{Procs: 1, Keys: 2000, Busy: 2000})
	if want := 2000 * perRefresh; busy.Scripts < 0.8*want || busy.Scripts > 1.3*want {
		t.Errorf("2,000 busy keys: %.0f script runs a second, want about one a key a refresh (%.0f)", busy.Scripts, want)
	}
	if busy.Calls > busy.Scripts/16 {
		t.Errorf("2,000 busy keys: %.0f round trips a second for %.0f scripts: not batched", busy.Calls, busy.Scripts)
	}
	if idle.CPU > busy.CPU/5 {
		t.Errorf("Redis used %.3f cores for 2,000 idle keys, over a fifth of the %.3f for busy ones", idle.CPU, busy.CPU)
	}
}

// TestParkedKeyServes: a Transport's lane on a key idle long enough to be
// parked (its share given back, no Redis call) sends its next request at
// once (a share of nothing holds one token), and its key is leased a share
// again within a few refreshes, so that the request after waits no longer.
func TestParkedKeyServes(t *testing.T) {
	srv := redistest.Start(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	const refresh = 100 * time.Millisecond
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	defer c.Close()
	var calls atomic.Int64
	c.AddHook(countHook{&calls})
	b, err := sluiceredis.New(c, sluiceredis.WithRefresh(refresh))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	tr, err := sluice.New(nil, sluice.WithRate(100, time.Second), sluice.WithBackend(b))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	get := func() time.Duration {
		t.Helper()
		req, _ := http.NewRequest("GET", up.URL, nil)
		at := time.Now()
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return time.Since(at)
	}
	get()
	time.Sleep(10 * refresh) // parked after three idle refreshes
	before := calls.Load()
	time.Sleep(10 * refresh)
	idleCalls := calls.Load() - before
	first := get()
	time.Sleep(3 * refresh)
	woke := calls.Load() - before - idleCalls
	second := get()
	t.Logf("%d Redis calls in 10 idle refreshes; then a request waited %v, %d calls within 3 refreshes, and the next request waited %v",
		idleCalls, first.Round(time.Millisecond), woke, second.Round(time.Millisecond))
	if idleCalls > 1 {
		t.Errorf("%d Redis calls in 10 refreshes of an idle key", idleCalls)
	}
	if woke == 0 {
		t.Error("a parked key that sent a request was not refreshed within 3 refreshes")
	}
	if first > 5*refresh || second > 5*refresh {
		t.Errorf("requests to a parked key waited %v and %v, over five refreshes", first, second)
	}
}

// countHook counts a client's round trips.
type countHook struct{ n *atomic.Int64 }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(1); return next(ctx, cmds) }
}
