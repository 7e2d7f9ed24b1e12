package sluiceredis

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// run calls Take as a lane's dispatcher does until stop, and returns the
// grants and the longest single Take.
func run(t *testing.T, b *Tokens, rate float64, stop time.Time) (grants int, longest time.Duration) {
	t.Helper()
	for time.Now().Before(stop) {
		start := time.Now()
		w, err := b.Take(context.Background(), "api", rate, 1)
		longest = max(longest, time.Since(start))
		if err != nil {
			t.Fatalf("Take: %v", err)
		}
		if w > 0 {
			time.Sleep(min(w, time.Until(stop)+time.Millisecond))
			continue
		}
		grants++
		b.Done("api")
	}
	return grants, longest
}

// TestFallbackWhileRedisIsDown kills Redis under a running budget: Take
// keeps granting at the fallback share without waiting on the dead server,
// logs the outage once, probes at most once per interval, and returns to
// the shared budget when Redis is back on the same port.
func TestFallbackWhileRedisIsDown(t *testing.T) {
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	calls := countCalls(c)
	log := new(logs)
	const (
		rate  = 40.0
		share = 0.5
		probe = 250 * time.Millisecond
	)
	b := newTokens(t, c, WithTimeout(DefaultTimeout), WithLogger(slog.New(log)), WithFallbackShare(share),
		withProbeEvery(probe))

	n, _ := run(t, b, rate, time.Now().Add(500*time.Millisecond))
	if n < 15 || n > 22 {
		t.Fatalf("%d grants in 0.5s at %v/s with Redis up", n, rate)
	}

	srv.Stop()
	const down = 2 * time.Second
	before := calls.n.Load()
	n, longest := run(t, b, rate, time.Now().Add(down))
	want := rate * share * down.Seconds() // 40
	if float64(n) < 0.7*want || float64(n) > want+3 {
		t.Errorf("%d grants in %v with Redis down, want about %v (%v of %v/s)", n, down, want, share, rate)
	}
	if longest > time.Second {
		t.Errorf("a Take took %v with Redis down; the timeout is %v", longest, DefaultTimeout)
	}
	if probes := calls.n.Load() - before; probes > int64(down/probe)+2 {
		t.Errorf("%d Redis calls in %v down, want at most one per %v", probes, down, probe)
	}
	t.Logf("Redis down %v: %d grants (fallback budget %v/s), longest Take %v, %d Redis calls",
		down, n, rate*share, longest, calls.n.Load()-before)
	if w := log.count(slog.LevelWarn); w != 1 {
		t.Errorf("%d warnings logged for one outage, want 1", w)
	}

	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	n, _ = run(t, b, rate, time.Now().Add(time.Second))
	// Up to a probe interval at the fallback share, then the full rate.
	t.Logf("Redis back: %d grants in the next second (rate %v/s)", n, rate)
	if float64(n) < 0.7*rate {
		t.Errorf("%d grants in the second after Redis came back, want about %v", n, rate)
	}
	if i := log.count(slog.LevelInfo); i != 1 {
		t.Errorf("%d recoveries logged, want 1", i)
	}
	if c.Exists(context.Background(), "sluice:{api}:tat").Val() != 1 {
		t.Error("no budget in the restarted Redis: the Backend did not go back to it")
	}
}

func TestRefuseWhenRedisIsDown(t *testing.T) {
	c := newClient(t, deadAddr(t))
	calls := countCalls(c)
	b := newTokens(t, c, WithTimeout(DefaultTimeout), WithFallbackShare(0))
	for i := range 3 {
		w, err := b.Take(context.Background(), "api", 10, 1)
		if !errors.Is(err, ErrUnavailable) || !strings.HasPrefix(err.Error(), "sluiceredis: ") || w != 0 {
			t.Fatalf("Take %d with Redis down and no fallback = %v, %v; want ErrUnavailable", i, w, err)
		}
	}
	if n := calls.n.Load(); n != 1 {
		t.Errorf("%d calls to a dead Redis within the probe interval, want 1", n)
	}
	err := b.Cool(context.Background(), "api", time.Now().Add(time.Minute))
	if !errors.Is(err, ErrUnavailable) {
		t.Errorf("Cool with Redis down: %v, want ErrUnavailable", err)
	}
}

// TestStalledRedisCostsOneTimeout pauses Redis (it accepts connections and
// never answers): each call gives up at the timeout, and calls within the
// probe interval do not wait at all.
func TestStalledRedisCostsOneTimeout(t *testing.T) {
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	b := newTokens(t, c, WithTimeout(DefaultTimeout), WithInFlight(3, time.Minute))
	ctx := context.Background()
	if w, err := b.Take(ctx, "api", 100, 1); w != 0 || err != nil {
		t.Fatalf("Take = %v, %v", w, err)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	defer srv.Resume()

	start := time.Now()
	b.Done("api") // the release meets the stall and gives up
	done := time.Since(start)
	if done > time.Second {
		t.Errorf("Done took %v on a stalled Redis", done)
	}
	start = time.Now()
	w, err := b.Take(ctx, "api", 100, 1)
	take := time.Since(start)
	if err != nil || take > time.Second {
		t.Errorf("Take on a stalled Redis = %v, %v after %v; want the fallback within the timeout", w, err, take)
	}
	t.Logf("stalled Redis: Done returned after %v, the next Take after %v (timeout %v)", done, take, DefaultTimeout)
	// The backend knows Redis is down now: the local cooldown still holds.
	if err := b.Cool(ctx, "api", time.Now().Add(time.Minute)); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Cool on a stalled Redis: %v, want ErrUnavailable", err)
	}
	if w, err := b.Take(ctx, "api", 100, 1); err != nil || w < 50*time.Second {
		t.Errorf("Take after a local Cool = %v, %v; want about a minute", w, err)
	}
}
