package sluiceredis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestNewRejectsBadOptions(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: deadAddr(t), ContextTimeoutEnabled: true})
	defer c.Close()
	for _, tc := range []struct {
		opt  Option
		want string // in the error
	}{
		{WithPrefix("a{b"), `WithPrefix("a{b")`},
		{WithTimeout(0), "WithTimeout(0s)"},
		{WithTimeout(-time.Second), "WithTimeout(-1s)"},
		{WithFallbackShare(-0.1), "WithFallbackShare(-0.1)"},
		{WithFallbackShare(1.5), "WithFallbackShare(1.5)"},
		{WithInFlight(0, time.Second), "WithInFlight(0, 1s)"},
		{WithInFlight(3, 0), "WithInFlight(3, 0s)"},
		{WithLogger(nil), "WithLogger(nil)"},
		{nil, "nil Option"},
	} {
		_, err := NewTokens(c, tc.opt)
		if !errors.Is(err, ErrInvalidOption) || !strings.Contains(err.Error(), tc.want) ||
			!strings.HasPrefix(err.Error(), "sluiceredis: ") {
			t.Errorf("NewTokens(%s): err = %v, want ErrInvalidOption naming %s", tc.want, err, tc.want)
		}
	}
	if _, err := NewTokens(c, WithPrefix("app:"), WithTimeout(time.Second), WithFallbackShare(0),
		WithInFlight(1, time.Minute)); err != nil {
		t.Errorf("New with good options: %v", err)
	}
	if _, err := NewTokens(nil); err == nil {
		t.Error("NewTokens(nil): no error")
	}
}

func TestNewRequiresContextTimeouts(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: deadAddr(t)})
	defer c.Close()
	_, err := NewTokens(c)
	if err == nil || !strings.Contains(err.Error(), "ContextTimeoutEnabled") {
		t.Fatalf("NewTokens(client without ContextTimeoutEnabled): err = %v, want one naming it", err)
	}
}

// TestTakeSharesBudget checks GCRA across two Backends (two processes, as
// far as Redis can tell): the burst, then reservations queued one interval
// apart across both, each costing one round trip and answered locally after.
func TestTakeSharesBudget(t *testing.T) {
	srv := startRedis(t)
	c1, c2 := newClient(t, srv.Addr()), newClient(t, srv.Addr())
	n1 := countCalls(c1)
	b1, b2 := newTokens(t, c1), newTokens(t, c2)
	ctx := context.Background()
	// rate 4/s: the interval and the staleness allowance (max(1/rate,
	// 10ms)) are long enough for a slow machine's scheduling not to matter.
	const rate, interval = 4, 250 * time.Millisecond

	for i := range 3 { // burst 3
		if w, err := b1.Take(ctx, "api", rate, 3); w != 0 || err != nil {
			t.Fatalf("Take %d of the burst = %v, %v; want 0, nil", i, w, err)
		}
	}
	// The burst is spent: the next token is due one interval after the
	// first was taken, and is reserved for b1.
	w1, err := b1.Take(ctx, "api", rate, 3)
	if err != nil || w1 <= 0 || w1 > interval {
		t.Fatalf("Take past the burst = %v, %v; want a wait in (0, %v]", w1, err, interval)
	}
	// b2 cannot have that token: it gets the one after, an interval later
	// (less the time between the two calls).
	w2, err := b2.Take(ctx, "api", rate, 3)
	if err != nil || w2 <= w1 || w2 > w1+interval+10*time.Millisecond {
		t.Fatalf("second process's Take = %v, %v; want about %v + %v", w2, err, w1, interval)
	}
	// Asking again before the reservation is due answers from it, with no
	// round trip, and so does taking it when it is due. (The wait runs
	// from b1's reply, so sleeping what Take says always lands on or after
	// the due time.)
	calls := n1.n.Load()
	for i := 0; ; i++ {
		w, err := b1.Take(ctx, "api", rate, 3)
		if err != nil || w > w1 {
			t.Fatalf("Take %d waiting for the reservation = %v, %v; want a wait <= %v", i, w, err, w1)
		}
		if w == 0 {
			break
		}
		if i == 10 {
			t.Fatalf("reservation not granted after %d Takes, last wait %v", i+1, w)
		}
		time.Sleep(w)
	}
	if got := n1.n.Load() - calls; got != 0 {
		t.Errorf("answering from a reservation cost %d round trips, want 0", got)
	}
}

func TestTakeOneRoundTripPerGrant(t *testing.T) {
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	b := newTokens(t, c)
	b.Take(context.Background(), "warm", 1, 1) // loads the script: EVALSHA, then EVAL
	n := countCalls(c)
	// At 50/s a reservation is dropped when its taker oversleeps by more
	// than 20ms, which costs a round trip without a grant: allowed for
	// one grant in ten, on a busy machine. Refusing tokens not yet due
	// instead of reserving them would cost two round trips per grant.
	grants := takeUntil(t, b, "api", 50, 1, time.Now().Add(600*time.Millisecond))
	if len(grants) < 10 {
		t.Fatalf("%d grants in 600ms at 50/s", len(grants))
	}
	// The last call may have reserved a token the loop stopped before using.
	if calls := n.n.Load(); calls > int64(len(grants))+1+int64(len(grants))/10 {
		t.Errorf("%d round trips for %d grants, want at most one each", calls, len(grants))
	}
}

func TestCoolIsShared(t *testing.T) {
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	b1, b2 := newTokens(t, c), newTokens(t, newClient(t, srv.Addr()))
	ctx := context.Background()

	// Waits are checked against a cooldown of 2s from below by 1s, which
	// leaves a slow machine a second between the calls.
	const cool = 2 * time.Second
	if err := b1.Cool(ctx, "api", time.Now().Add(cool)); err != nil {
		t.Fatal(err)
	}
	w, err := b2.Take(ctx, "api", 100, 1)
	if err != nil || w <= cool/2 || w > cool {
		t.Fatalf("Take during another process's cooldown = %v, %v; want about %v", w, err, cool)
	}
	// An earlier end is ignored.
	if err := b2.Cool(ctx, "api", time.Now().Add(50*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if w, err := b2.Take(ctx, "other", 0, 1); w != 0 || err != nil {
		t.Fatalf("Take on a key without cooldown = %v, %v", w, err)
	}
	// Unpaced budgets obey cooldowns too.
	if w, err := newTokens(t, c).Take(ctx, "api", 0, 1); w <= cool/2 || err != nil {
		t.Fatalf("unpaced Take during a cooldown = %v, %v; want about %v", w, err, cool)
	}
	if ttl := c.PTTL(ctx, "sluice:{api}:cool").Val(); ttl <= cool/2 || ttl > cool {
		t.Errorf("cooldown key PTTL = %v, want it to expire with the cooldown", ttl)
	}
	// w runs from b2's reply, after Redis's clock read the cooldown's end.
	time.Sleep(w + 5*time.Millisecond)
	if w, err := b1.Take(ctx, "api", 100, 1); w != 0 || err != nil {
		t.Fatalf("Take after the cooldown = %v, %v; want 0, nil", w, err)
	}
	if err := b1.Cool(ctx, "api", time.Now().Add(-time.Second)); err != nil {
		t.Errorf("Cool in the past: %v", err)
	}
}

func TestKeysAreTaggedAndExpire(t *testing.T) {
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	bc := newClient(t, srv.Addr())
	b := newTokens(t, bc, WithPrefix("app:"), WithInFlight(4, 200*time.Millisecond))
	ctx := context.Background()
	if w, err := b.Take(ctx, "api.example.com", 20, 1); w != 0 || err != nil {
		t.Fatalf("Take = %v, %v", w, err)
	}
	// The process goes away with its lease held: its client is closed, so
	// nothing renews the lease. (Done, at the end, stops the renewer.)
	bc.Close()
	defer b.Done("api.example.com")
	keys, err := c.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"app:{api.example.com}:tat": true, "app:{api.example.com}:lease": true}
	if len(keys) != len(want) || !want[keys[0]] || !want[keys[1]] {
		t.Fatalf("keys = %q, want %v", keys, want)
	}
	for k := range want {
		if ttl := c.PTTL(ctx, k).Val(); ttl <= 0 || ttl > 200*time.Millisecond {
			t.Errorf("PTTL %s = %v, want (0, 200ms]: idle budgets vanish", k, ttl)
		}
	}
	time.Sleep(250 * time.Millisecond)
	if n := c.Exists(ctx, "app:{api.example.com}:tat", "app:{api.example.com}:lease").Val(); n != 0 {
		t.Errorf("%d keys left after their expiry", n)
	}
}

func TestUnpacedTakesWithoutGCRA(t *testing.T) {
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	b := newTokens(t, c)
	for range 50 {
		if w, err := b.Take(context.Background(), "api", 0, 1); w != 0 || err != nil {
			t.Fatalf("unpaced Take = %v, %v", w, err)
		}
	}
	if n := c.Exists(context.Background(), "sluice:{api}:tat").Val(); n != 0 {
		t.Error("an unpaced budget wrote GCRA state")
	}
}

func TestTakeHonoursCallerContext(t *testing.T) {
	srv := startRedis(t)
	b := newTokens(t, newClient(t, srv.Addr()))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.Take(ctx, "api", 1, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("Take with a cancelled context: %v", err)
	}
}

// TestBudgetsOfIdleKeysDropped: a process that takes tokens for many keys,
// one after another, keeps the budgets of the keys in use, not of every
// key it ever took from; a key still cooling down keeps its budget.
func TestBudgetsOfIdleKeysDropped(t *testing.T) {
	srv := startRedis(t)
	tk := newTokens(t, newClient(t, srv.Addr()))
	ctx := context.Background()
	if err := tk.Cool(ctx, "cooling", time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	const keys = 10 * minSweep
	for i := range keys {
		if _, err := tk.Take(ctx, fmt.Sprintf("key-%d", i), 1000, 10); err != nil {
			t.Fatal(err)
		}
	}
	tk.mu.Lock()
	n := len(tk.budgets)
	_, cooling := tk.budgets["cooling"]
	tk.mu.Unlock()
	if n > 3*minSweep {
		t.Errorf("%d budgets kept after %d keys taken from one at a time, want at most %d", n, keys, 3*minSweep)
	}
	if !cooling {
		t.Error("the budget of a key that cools down for an hour was dropped")
	}
}
