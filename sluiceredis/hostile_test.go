package sluiceredis

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The Backend and Tokens against what Redis may hold or answer that their
// scripts never write: a share.lua answer out of bounds, a cooldown far in
// the future; two orderings of calls that lost track of leases; and a
// Redis that stalls while the lanes go.

// forger replaces the answer of every share.lua call with reply, while set.
type forger struct{ reply atomic.Pointer[[]any] }

func (f *forger) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *forger) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (f *forger) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if r := f.reply.Load(); r != nil && err == nil && callsScript(cmd, ":shares") {
			cmd.(*redis.Cmd).SetVal(*r)
		}
		return err
	}
}

// TestShareAnswersOutOfBounds: a share.lua answer (from a corrupted entry,
// a foreign script under the same SHA, a proxy) of a rate of +Inf, a rate
// far over the key's, or places beyond an int or under -1 grants the lane
// no more than the key's rate (100/s) and its cap (4). Each was taken as
// it came: an unbounded rate, or no cap on what is in flight.
func TestShareAnswersOutOfBounds(t *testing.T) {
	const refresh = 100 * time.Millisecond
	for _, tc := range []struct {
		name  string
		reply []any
	}{
		{"rate inf", []any{"inf", int64(4), int64(1), int64(0), "100", int64(4), int64(4), int64(0), int64(1)}},
		{"rate over the key's", []any{"1e12", int64(4), int64(1), int64(0), "100", int64(4), int64(4), int64(0), int64(1)}},
		{"places 1e300", []any{"50", "1e300", int64(1), int64(0), "100", int64(4), int64(4), int64(0), int64(1)}},
		{"places -5", []any{"50", int64(-5), int64(1), int64(0), "100", int64(4), int64(4), int64(0), int64(1)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := startRedis(t)
			c := newClient(t, srv.Addr())
			f := &forger{}
			f.reply.Store(&tc.reply)
			c.AddHook(f)
			a := newBackend(t, c, WithRefresh(refresh), WithInFlight(4, time.Minute))
			defer a.Close()
			la := joinLane(t, a, "api", batch100)
			time.Sleep(3 * refresh)
			g := la.last().s
			if !(g.Rate <= 100) || g.InFlight < 0 || g.InFlight > 4 {
				t.Errorf("%s: lane granted rate %v, in flight %v (key: 100/s, cap 4)", tc.name, g.Rate, g.InFlight)
			}
		})
	}
}

// leasesIn counts the leases of key in Redis.
func leasesIn(t *testing.T, c *redis.Client, key string) int64 {
	t.Helper()
	n, err := c.ZCard(context.Background(), newKeys(DefaultPrefix, key).lease()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestTokensFallbackGrantsEndFirst: a's Tokens (a cap of 4 in flight)
// grant 2 attempts from the fallback while Redis is cut, then, Redis back,
// 4 with leases. When the first 2 end, no lease of the 4 still in flight
// is given back: Redis counts them while they last, and b is granted no
// place over the cap, however long a's workers keep going. (A Done gave
// back the newest entry, a lease, and the fallback's entries stayed at
// the bottom: 6 in flight under a cap of 4.)
func TestTokensFallbackGrantsEndFirst(t *testing.T) {
	srv := startRedis(t)
	ca := newClient(t, srv.Addr())
	cut := cutCalls(ca)
	opts := []Option{WithInFlight(4, time.Minute), WithFallbackShare(0.5), withProbeEvery(20 * time.Millisecond)}
	a := newTokens(t, ca, opts...)
	b := newTokens(t, newClient(t, srv.Addr()), opts...)
	ctx := context.Background()
	take := func(tk *Tokens, what string) {
		t.Helper()
		for i := 0; ; i++ {
			w, err := tk.Take(ctx, "api", 0, 1)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if w == 0 {
				return
			}
			if i > 200 {
				t.Fatalf("%s: not granted", what)
			}
			time.Sleep(w)
		}
	}
	cut.cut.Store(true)
	take(a, "fallback 1")
	take(a, "fallback 2") // the fallback's cap: 2
	cut.cut.Store(false)
	time.Sleep(30 * time.Millisecond) // a probe is due
	for i := range 4 {
		take(a, fmt.Sprint("leased ", i))
	}
	// The 2 fallback attempts end; a's 4 leased ones are still in flight.
	a.Done("api")
	a.Done("api")
	gotB := 0
	for range 2 {
		if w, err := b.Take(ctx, "api", 0, 1); err == nil && w == 0 {
			gotB++
		}
	}
	// a's workers go on: an attempt ends, another starts, 10 times.
	for range 10 {
		a.Done("api")
		take(a, "a again")
	}
	if actual := 4 + gotB; actual > 4 {
		t.Errorf("%d attempts in flight under a cap of 4 (b granted %d); Redis counts %d leases", actual, gotB, leasesIn(t, newClient(t, srv.Addr()), "api"))
	}
	for range gotB {
		b.Done("api")
	}
	giveBack(a)
}

// TestTokensCloseGivesBackANewBudget: a Take for a key this process has
// not used yet has entered (Close waits for it) but not looked its budget
// up when Close begins. The lease it takes is given back by Close, not
// left in Redis until its ttl. (Go's mutex hands off in FIFO order once a
// waiter has waited 1ms: the Take gets b.mu for enter, Close gets it next,
// the Take's budget lookup after.)
func TestTokensCloseGivesBackANewBudget(t *testing.T) {
	srv := startRedis(t)
	tk, err := NewTokens(newClient(t, srv.Addr()), WithTimeout(time.Second), WithInFlight(4, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	tk.mu.Lock()
	type res struct {
		w   time.Duration
		err error
	}
	took := make(chan res, 1)
	go func() {
		w, err := tk.Take(context.Background(), "fresh", 0, 1)
		took <- res{w, err}
	}()
	time.Sleep(5 * time.Millisecond)
	closed := make(chan error, 1)
	go func() { closed <- tk.Close() }()
	time.Sleep(5 * time.Millisecond)
	// Unlocked and at once locked again: the Take, woken, loses the mutex
	// after waiting over 1ms, which puts it in starvation (FIFO) mode.
	tk.mu.Unlock()
	tk.mu.Lock()
	time.Sleep(5 * time.Millisecond)
	tk.mu.Unlock()
	r := <-took
	cerr := <-closed
	if n := leasesIn(t, newClient(t, srv.Addr()), "fresh"); r.err == nil && r.w == 0 && cerr == nil && n > 0 {
		t.Errorf("Close returned nil, and the lease of the Take under way is held in Redis (%d) until its ttl", n)
	}
}

// TestTokensCooldownOutOfBounds: the cooldown key of a budget holds a time
// no cool.lua writes (at most a day ahead): one far in the future,
// written by hand or by another tool. A Take waits no more than a day, and
// once the key is fixed (deleted), the next is granted: the process kept
// no cooldown of its own, where it kept that one and never asked Redis
// again until it restarted.
func TestTokensCooldownOutOfBounds(t *testing.T) {
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	tk := newTokens(t, c)
	ctx := context.Background()
	k := newKeys(DefaultPrefix, "api")
	if err := c.Set(ctx, k[1], "1e18", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if w, err := tk.Take(ctx, "api", 100, 4); err != nil || w > maxCool {
		t.Errorf("with a cooldown far in the future: wait %v, %v; want at most %v", w, err, maxCool)
	}
	if err := c.Del(ctx, k[1]).Err(); err != nil {
		t.Fatal(err)
	}
	if w, err := tk.Take(ctx, "api", 100, 4); err != nil || w > time.Second {
		t.Errorf("after the cooldown key was deleted: wait %v, %v; want a grant", w, err)
	}
	giveBack(tk)
}

// TestCloseWithRedisStalled: 128 keys, one lane each; every lane goes and
// Redis stalls. The refresher gives the gone keys' shares back with
// calls bounded by one timeout a batch, so Close, called meanwhile, waits
// for a few timeouts, not one a key (64 of them, 3.5 s here, before).
func TestCloseWithRedisStalled(t *testing.T) {
	const refresh = 100 * time.Millisecond
	const timeout = 50 * time.Millisecond
	srv := startRedis(t)
	a := newBackend(t, newClient(t, srv.Addr()), WithRefresh(refresh), WithTimeout(timeout))
	var lanes []*shareLane
	for i := range 128 {
		lanes = append(lanes, joinLane(t, a, fmt.Sprint("k", i), batch100))
	}
	time.Sleep(3 * refresh)
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	defer srv.Resume()
	for _, l := range lanes {
		l.mu.Lock()
		l.gone = true
		l.mu.Unlock()
	}
	time.Sleep(refresh + 20*time.Millisecond) // the round that finds them gone has begun
	start := time.Now()
	a.Close()
	if d := time.Since(start); d > 20*timeout {
		t.Errorf("Close took %v with a timeout of %v", d.Round(time.Millisecond), timeout)
	}
}
