package sluice

import (
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/internal/stats"
)

// sendKey sends a GET whose lane is key (see byHost) and closes its body.
func sendKey(ctx context.Context, tr *Transport, key string) (int, error) {
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://api.test/", nil)
	req.Host = key
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// Lanes idle past WithLaneIdle are forgotten; a lane with an attempt in
// flight, or cooling down after a Retry-After, is kept until it is idle.
func TestIdleLanesForgotten(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		base := rtFunc(func(req *http.Request) (*http.Response, error) {
			switch req.Host {
			case "busy":
				<-release
			case "cooling":
				return &http.Response{StatusCode: http.StatusTooManyRequests, Body: http.NoBody, Request: req,
					Header: http.Header{"Retry-After": {"300"}}}, nil
			}
			return &http.Response{StatusCode: 200, Body: http.NoBody, Request: req}, nil
		})
		tr := mustNew(t, base, WithKey(byHost), WithRate(10, time.Second), WithRetry(0), WithLaneIdle(time.Minute))
		defer tr.Close()
		for _, k := range []string{"idle", "cooling"} {
			if _, err := sendKey(t.Context(), tr, k); err != nil {
				t.Fatalf("%s: %v", k, err)
			}
		}
		busy := make(chan error)
		go func() {
			_, err := sendKey(t.Context(), tr, "busy")
			busy <- err
		}()
		synctest.Wait()

		has := func(k string) bool {
			_, ok := tr.LaneStats(k)
			return ok
		}
		time.Sleep(30 * time.Second)
		if !has("idle") || !has("busy") || !has("cooling") {
			t.Fatalf("after 30 s (idle 1 min): lanes idle %v, busy %v, cooling %v; want all kept", has("idle"), has("busy"), has("cooling"))
		}
		time.Sleep(2 * time.Minute)
		if has("idle") {
			t.Error("a lane idle for 2.5 min was kept (idle 1 min)")
		}
		if !has("busy") {
			t.Error("a lane with an attempt in flight was forgotten")
		}
		if !has("cooling") {
			t.Error("a lane cooling down (Retry-After 300 s) was forgotten before its cooldown ended")
		}
		close(release)
		if err := <-busy; err != nil {
			t.Fatalf("busy: %v", err)
		}
		// The cooldown ends at 5 min; then both are idle for a minute.
		time.Sleep(5 * time.Minute)
		if has("busy") || has("cooling") {
			t.Errorf("lanes idle past the period kept: busy %v, cooling %v", has("busy"), has("cooling"))
		}
		if n := tr.nLanes.Load(); n != 0 {
			t.Errorf("%d lanes counted, want 0", n)
		}
		if n := len(tr.Stats().Lanes); n != 0 {
			t.Errorf("Stats lists %d lanes, want 0", n)
		}
		// A forgotten key starts a fresh lane.
		if code, err := sendKey(t.Context(), tr, "idle"); err != nil || code != 200 {
			t.Fatalf("idle again: %d, %v", code, err)
		}
		if !has("idle") {
			t.Error("no lane for a key sent again")
		}
	})
}

// WithLaneIdle(0) keeps every lane.
func TestLaneIdleZeroKeeps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, nopBase{}, WithKey(byHost), WithLaneIdle(0))
		if _, err := sendKey(t.Context(), tr, "k"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Hour)
		if _, ok := tr.LaneStats("k"); !ok {
			t.Error("WithLaneIdle(0) forgot a lane")
		}
	})
}

// A request that holds a lane that is forgotten before it acquires (as one
// that looked its lane up just before the sweep did) is sent through the
// key's live lane, and the hot lane is replaced.
func TestForgottenLaneIsNotUsed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, nopBase{}, WithKey(byHost), WithLaneIdle(time.Minute))
		defer tr.Close()
		if _, err := sendKey(t.Context(), tr, "k"); err != nil {
			t.Fatal(err)
		}
		old := tr.lane("k")
		time.Sleep(61 * time.Second) // past the idle period, before the sweep at 90 s
		if !old.forget(time.Minute) {
			t.Fatal("an idle lane was not forgotten")
		}
		req, _ := http.NewRequestWithContext(t.Context(), "GET", "http://api.test/", nil)
		req.Host = "k"
		resp, err := tr.do(old, req, Normal, "")
		if err != nil {
			t.Fatalf("request on a forgotten lane: %v", err)
		}
		resp.Body.Close()
		l := tr.lane("k")
		if l == old || l.isDead() {
			t.Fatal("the forgotten lane is still the key's lane")
		}
		if tr.hot.Load() == old {
			t.Error("the forgotten lane is still the hot lane")
		}
		if ls, ok := tr.LaneStats("k"); !ok || ls.Levels[Normal].Granted != 1 {
			t.Errorf("live lane: %+v, %v; want 1 grant", ls.Levels[Normal].Granted, ok)
		}
		if old.levels[Normal].granted != 1 {
			t.Errorf("forgotten lane granted %d, want only its first request", old.levels[Normal].granted)
		}
	})
}

// Transport.LaneStats reads one lane and creates none; Stats().Lane finds
// one in the snapshot.
func TestLaneStats(t *testing.T) {
	tr := mustNew(t, nopBase{}, WithKey(byHost))
	defer tr.Close()
	for i := range 100 {
		if _, err := sendKey(context.Background(), tr, "k"+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	ls, ok := tr.LaneStats("k42")
	if !ok || ls.Key != "k42" || ls.Levels[Normal].Granted != 1 {
		t.Errorf("LaneStats(k42) = %q, %d grants, %v", ls.Key, ls.Levels[Normal].Granted, ok)
	}
	if _, ok := tr.LaneStats("nope"); ok {
		t.Error("LaneStats of an unknown key found a lane")
	}
	if _, ok := tr.LaneStats("nope"); ok || tr.nLanes.Load() != 100 {
		t.Errorf("LaneStats created a lane: %d lanes", tr.nLanes.Load())
	}
	s := tr.Stats()
	if ls, ok := s.Lane("k7"); !ok || ls.Key != "k7" {
		t.Errorf("Stats().Lane(k7) = %q, %v", ls.Key, ok)
	}
	if _, ok := s.Lane("k999"); ok {
		t.Error("Stats().Lane found an unknown key")
	}
}

func TestWithLaneIdleInvalid(t *testing.T) {
	_, err := New(nil, WithLaneIdle(-time.Second))
	if !errors.Is(err, ErrInvalidOption) || !strings.Contains(err.Error(), "WithLaneIdle(-1s)") {
		t.Errorf("WithLaneIdle(-1s): %v", err)
	}
}

// 100,000 keys left idle give their heap back within seconds, on the real
// clock: the sweep runs on its own, with no request to drive it.
func TestIdleLanesReturnHeap(t *testing.T) {
	if testing.Short() {
		t.Skip("creates 100,000 lanes")
	}
	const n = 100_000
	req, keys := keyedRequests(n)
	heap := func() int64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return int64(ms.HeapAlloc)
	}
	before := heap()
	// The idle time leaves room for a slow, loaded runner to create all
	// lanes before the sweep may forget the first ones.
	tr := mustNew(t, nopBase{}, WithKey(byHost), WithLaneIdle(3*time.Second))
	defer tr.Close()
	for _, k := range keys {
		req.Host = k
		if err := send(tr, req); err != nil {
			t.Fatal(err)
		}
	}
	grown := heap() - before
	alive := tr.nLanes.Load()
	if alive < n/4 || grown/alive < 256 {
		t.Fatalf("%d lanes alive took %d MB: the test measures nothing", alive, grown>>20)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		kept := heap() - before
		if kept <= 10<<20 && tr.nLanes.Load() == 0 {
			t.Logf("heap %d MB with the lanes, %.1f MB kept after they were forgotten", grown>>20, float64(kept)/(1<<20))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s idle, %d lanes and %d MB of heap kept (%d MB with the lanes), want 0 and at most 10 MB",
				tr.nLanes.Load(), kept>>20, grown>>20)
		}
		time.Sleep(100 * time.Millisecond)
	}
	runtime.KeepAlive(keys)
}

// Stats over 100,000 lanes does not stall requests: it holds no lock of
// the Transport while it copies, only each lane's, briefly. Requests on
// one lane are sent one after another, first alone, then while another
// goroutine calls Stats in a loop. Their p99 latency must stay within a
// generous factor of their latency alone; and their number per second
// must stay a good part of what it is alone, which a lock held for the
// copy would bring down to a few requests per Stats call (their p99
// alone would not show it: only the one request caught by each call
// waits). Real clock, ratios only; the best of three runs is compared,
// for a loaded runner (one under the race detector).
func TestStatsDoesNotStall(t *testing.T) {
	if testing.Short() {
		t.Skip("creates 100,000 lanes")
	}
	const n = 100_000
	req, keys := keyedRequests(n)
	tr := mustNew(t, nopBase{}, WithKey(byHost), WithLaneIdle(0))
	defer tr.Close()
	for _, k := range keys {
		req.Host = k
		if err := send(tr, req); err != nil {
			t.Fatal(err)
		}
	}
	hot, _ := http.NewRequest("GET", "http://api.test/", nil)
	hot.Host = "hot"
	type run struct {
		p99, worst time.Duration
		perSec     float64
	}
	// measure sends requests on the hot lane for d, or until more is false
	// if later, and returns their p99 and worst latency and their rate.
	measure := func(d time.Duration, more func() bool) run {
		ds := make([]time.Duration, 0, 1<<16)
		start := time.Now()
		for time.Since(start) < d || more() {
			t0 := time.Now()
			if err := send(tr, hot); err != nil {
				t.Fatal(err)
			}
			ds = append(ds, time.Since(t0))
		}
		return run{stats.Quantile(ds, 0.99), slices.Max(ds), float64(len(ds)) / time.Since(start).Seconds()}
	}
	never := func() bool { return false }
	measure(100*time.Millisecond, never) // warm up

	// Under the race detector a Stats call takes seconds: one run, with
	// one call, is enough to see a stall.
	runs, minCalls := 3, int64(2)
	if raceEnabled {
		runs, minCalls = 1, 1
	}
	var statsTook time.Duration
	best := func(f func() run) run {
		b := run{p99: math.MaxInt64}
		for range runs {
			r := f()
			b = run{min(b.p99, r.p99), min(b.worst, r.worst), max(b.perSec, r.perSec)}
			if b.worst == 0 {
				b.worst = r.worst
			}
		}
		return b
	}
	alone := best(func() run { return measure(500*time.Millisecond, never) })
	with := best(func() run {
		stop := make(chan struct{})
		done := make(chan struct{})
		var calls atomic.Int64
		var took time.Duration
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				if got := len(tr.Stats().Lanes); got != n+1 {
					t.Errorf("Stats listed %d lanes, want %d", got, n+1)
				}
				took = max(took, time.Since(start))
				calls.Add(1)
			}
		}()
		// At least two Stats calls, so one runs wholly within the timing.
		r := measure(500*time.Millisecond, func() bool { return calls.Load() < minCalls })
		close(stop)
		<-done
		statsTook = max(statsTook, took)
		t.Logf("with Stats: %+v; %d Stats calls of up to %v over 100,001 lanes", r, calls.Load(), took.Round(time.Millisecond))
		return r
	})
	t.Logf("requests alone: p99 %v, worst %v, %.0f/s; while Stats runs: p99 %v (%.1fx), worst %v, %.0f/s (%.2f of alone); one Stats call: %v",
		alone.p99, alone.worst, alone.perSec, with.p99, float64(with.p99)/float64(alone.p99), with.worst,
		with.perSec, with.perSec/alone.perSec, statsTook.Round(time.Millisecond))
	if with.p99 > 50*alone.p99 {
		t.Errorf("request p99 latency %v while Stats runs, %.0fx the %v alone: want at most 50x", with.p99, float64(with.p99)/float64(alone.p99), alone.p99)
	}
	if with.perSec < alone.perSec/10 {
		t.Errorf("%.0f requests a second while Stats runs, against %.0f alone: want at least a tenth", with.perSec, alone.perSec)
	}
}
