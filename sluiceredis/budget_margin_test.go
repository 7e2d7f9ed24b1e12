package sluiceredis

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/upstream"
)

// TestBudgetMarginFromANewState: budget.lua as processes a and b call it
// when Redis has just created a budget's state (here at the fleet's start,
// as after a loss), its level guessed full. Neither a's count, which
// corrects the guess, nor b's, which meets b coming back with what it
// held (a's count took that for the fleet's level), teaches the margin;
// a count a lease after the state was created corrects it, and the next
// teaches again.
func TestBudgetMarginFromANewState(t *testing.T) {
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	ctx := context.Background()
	key := []string{"t:{k}:budget:tokens"}
	const lease = 300 * time.Millisecond
	// One refresh of process id, of a budget of 10,000 a day (nothing
	// refills in the test's time): it holds held and spent spent since its
	// last refresh; server < 0: no server count. It returns the margin.
	run := func(id string, held, spent, server float64) float64 {
		t.Helper()
		f := func(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
		srvArg := ""
		if server >= 0 {
			srvArg = f(server)
		}
		v, err := budgetScript.Run(ctx, c, key, id, lease.Microseconds(), time.Minute.Microseconds(),
			10000, f(10000.0/86400), f(held), 0, 0, 0, f(spent), srvArg).StringSlice()
		if err != nil || len(v) != 3 {
			t.Fatalf("budget.lua: %v %v", v, err)
		}
		m, _ := strconv.ParseFloat(v[2], 64)
		return m
	}
	check := func(what string, got, want float64) {
		t.Helper()
		if got < want-0.01 || got > want+0.01 {
			t.Errorf("%s: margin %.4f, want %.2f", what, got, want)
		}
	}
	// The fleet has 6,000: a holds 1,000, b 3,000, and 2,000 nobody holds.
	check("a's count of 6,000 against the 10,000 guessed", run("a", 1000, 500, 6000), 0)
	check("b's count of 6,000, b back with its 3,000", run("b", 3000, 500, 6000), 0)
	time.Sleep(lease)
	run("b", 3000, 0, -1)
	check("a's count a lease after", run("a", 1000, 0, 6000), 0)
	// a spends its 1,000, which cost 1,500: 500 underestimated.
	check("a's next count, 500 under 1,000 spent", run("a", 0, 1000, 4500), 0.5)
}

// marginOf reads the fleet's margin of budget "tokens" of key "api" (the
// "=" state's third field); -1 if none.
func marginOf(t *testing.T, addr string) float64 {
	t.Helper()
	s, err := newClient(t, addr).HGet(context.Background(), budgetKey(newKeys(DefaultPrefix, "api"), "tokens"), "=").Result()
	if err != nil {
		return -1
	}
	f, _ := strconv.ParseFloat(strings.Fields(s)[2], 64)
	return f
}

// flusher is a go-redis hook that, once armed, empties Redis (FLUSHALL,
// through flush) just before the next budget.lua call of one budget that
// passes a server count and something spent, and records when.
type flusher struct {
	flush *redis.Client
	armed atomic.Bool
	at    atomic.Pointer[time.Time]
}

func (f *flusher) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f *flusher) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if callsScript(cmd, ":budget:") && fmt.Sprint(args[len(args)-1]) != "" && fmt.Sprint(args[len(args)-2]) != "0" &&
			f.armed.CompareAndSwap(true, false) {
			f.flush.FlushAll(ctx)
			now := time.Now()
			f.at.Store(&now)
		}
		return next(ctx, cmd)
	}
}

func (f *flusher) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestBudgetMarginAfterRedisLosesIt: two processes send calls of a third
// of a shared budget of 3,000 tokens a second, estimated exactly, to an
// OpenAI-style server that says what remains of it. Redis loses every key
// (FLUSHALL) just before a process passes a server count; it then guesses
// the budget full and knows of neither process, and the counts that
// correct that teach the fleet no margin. (A margin of 1 would have each
// process hold two calls' worth before it sends, more than the two can
// hold at once: the fleet would stop, and with no answers left to count,
// keep the margin.) The fleet spends as much in a window well after the
// loss as before it.
//
// Only one answer in four says what remains. budget.lua compares a count
// with what the other process held at its last refresh, which misses a
// call it may have sent since: beside the spending between two counts a
// call apart, that call alone would teach a margin of 1; beside four
// calls, a third at most.
func TestBudgetMarginAfterRedisLosesIt(t *testing.T) {
	const (
		refresh = 100 * time.Millisecond
		size    = 3000
		per     = time.Second
		cost    = size / 3
		window  = 2 * time.Second
	)
	srv := startRedis(t)
	up := upstream.New(upstream.Config{
		Limiter: upstream.NewOpenAI(upstream.OpenAIConfig{Requests: 100000, Tokens: size, Per: per}),
		Latency: func(int, *http.Request) time.Duration { return 20 * time.Millisecond },
	})
	defer up.Close()
	var answers atomic.Int64
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := up.Transport().RoundTrip(r)
		if err == nil && answers.Add(1)%4 != 0 {
			for _, h := range []string{"limit", "remaining", "reset"} {
				resp.Header.Del("x-ratelimit-" + h + "-tokens")
			}
		}
		return resp, err
	})
	loss := &flusher{flush: newClient(t, srv.Addr())}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 2 {
		c := newClient(t, srv.Addr())
		c.AddHook(loss)
		b := newBackend(t, c, WithRefresh(refresh))
		defer b.Close()
		tr, err := sluice.New(base, sluice.WithRate(100000, per), sluice.WithBudget("tokens", size, per),
			sluice.WithBackend(b), sluice.WithRetry(0), sluice.WithKey(func(*http.Request) string { return "api" }))
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		for range 4 {
			wg.Go(func() {
				for ctx.Err() == nil {
					req, _ := http.NewRequestWithContext(sluice.WithCost(ctx, "tokens", cost), "POST", up.URL(), nil)
					req.Header.Set(upstream.CostTokensHeader, strconv.Itoa(cost))
					if resp, err := tr.RoundTrip(req); err == nil {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				}
			})
		}
	}
	defer wg.Wait()
	defer cancel()
	// spent is what the server accepted a second over [from, to).
	spent := func(from, to time.Time) float64 {
		n := 0
		for _, a := range up.Arrivals() {
			if a.Accepted && !a.At.Before(from) && a.At.Before(to) {
				n += cost
			}
		}
		return float64(n) / to.Sub(from).Seconds()
	}

	time.Sleep(window / 2)
	from := time.Now()
	time.Sleep(window)
	before, m0 := spent(from, time.Now()), marginOf(t, srv.Addr())
	loss.armed.Store(true)
	for wait := time.Now(); loss.at.Load() == nil; time.Sleep(time.Millisecond) {
		if time.Since(wait) > 2*window {
			t.Fatalf("no server count passed in %v: %.0f tokens/s before, margin %.4f", 2*window, before, m0)
		}
	}
	lost := *loss.at.Load()
	time.Sleep(window)
	from = time.Now()
	time.Sleep(window)
	after, m1 := spent(from, time.Now()), marginOf(t, srv.Addr())
	t.Logf("before the loss: %.0f tokens/s, margin %.4f; from %v after it: %.0f/s (%.2f of before), margin %.4f",
		before, m0, from.Sub(lost).Round(time.Millisecond), after, after/before, m1)
	if after < before/2 {
		t.Errorf("the fleet spent %.0f tokens/s well after Redis lost the budget, %.2f of the %.0f/s before: margin %.4f (%.4f before)",
			after, after/before, before, m1, m0)
	}
}
