package sluiceredis

import (
	"context"
	"testing"
	"time"
)

// TestCoolFarAway: a cooldown centuries away (a Duration would overflow)
// is shared as 24 hours and holds in full here; Redis stays up.
func TestCoolFarAway(t *testing.T) {
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	b1, b2 := newTokens(t, c), newTokens(t, newClient(t, srv.Addr()))
	ctx := context.Background()
	far := time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := b1.Cool(ctx, "api", far); err != nil {
		t.Fatalf("Cool 8000 years away: %v", err)
	}
	if !healthy(b1.backend) {
		t.Fatal("Cool far away marked Redis down")
	}
	w, err := b2.Take(ctx, "api", 10, 1)
	if err != nil || w <= maxCool-time.Minute || w > maxCool {
		t.Errorf("another process's Take = %v, %v; want about %v", w, err, maxCool)
	}
	if w, err := b1.Take(ctx, "api", 10, 1); err != nil || w < 100*365*24*time.Hour {
		t.Errorf("Take in the process that learned it = %v, %v; want the whole cooldown", w, err)
	}
	if ttl := c.PTTL(ctx, "sluice:{api}:cool").Val(); ttl <= maxCool-time.Minute || ttl > maxCool {
		t.Errorf("cooldown key PTTL %v, want about %v", ttl, maxCool)
	}
}

// TestCoolDropsReservations: a cooldown drops the reservations it covers
// and gives back their leases in the same call, so that when it ends the
// process takes no more than the burst the budget has regained.
func TestCoolDropsReservations(t *testing.T) {
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	b := newTokens(t, c, WithInFlight(10, time.Minute))
	ctx := context.Background()
	zcard := func() int64 { return c.ZCard(ctx, "sluice:{api}:lease").Val() }
	const rate, burst = 10, 2
	for i := range burst {
		if w, err := b.Take(ctx, "api", rate, burst); w != 0 || err != nil {
			t.Fatalf("Take %d = %v, %v", i, w, err)
		}
	}
	if w, err := b.Take(ctx, "api", rate, burst); w <= 0 || err != nil {
		t.Fatalf("Take past the burst = %v, %v; want a reservation", w, err)
	}
	if n := zcard(); n != 3 {
		t.Fatalf("%d leases, want 3 (2 granted, 1 reserved)", n)
	}
	if err := b.Cool(ctx, "api", time.Now().Add(300*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if n := zcard(); n != 2 {
		t.Errorf("%d leases after Cool, want 2: the dropped reservation's lease given back", n)
	}
	bg := b.budget("api")
	bg.mu.Lock()
	pending, release := len(bg.pending), len(bg.release)
	bg.mu.Unlock()
	if pending != 0 || release != 0 {
		t.Errorf("%d reservations and %d releases left after Cool, want none", pending, release)
	}
	giveBack(b)
}

// TestCoolBurstAfterCooldown counts the grants right when a cooldown ends:
// no more than the burst, even though a token was reserved before it.
func TestCoolBurstAfterCooldown(t *testing.T) {
	srv := startRedis(t)
	b := newTokens(t, newClient(t, srv.Addr()))
	ctx := context.Background()
	const rate, burst = 10, 2
	for range burst {
		b.Take(ctx, "api", rate, burst)
	}
	if w, err := b.Take(ctx, "api", rate, burst); w <= 0 || err != nil {
		t.Fatalf("Take past the burst = %v, %v; want a reservation", w, err)
	}
	if err := b.Cool(ctx, "api", time.Now().Add(300*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	w, err := b.Take(ctx, "api", rate, burst)
	if err != nil || w <= 0 {
		t.Fatalf("Take during the cooldown = %v, %v", w, err)
	}
	time.Sleep(w)
	grants := 0
	for {
		w, err := b.Take(ctx, "api", rate, burst)
		if err != nil {
			t.Fatal(err)
		}
		if w > 0 {
			break
		}
		grants++
		if grants > 10 {
			t.Fatal("no end to the grants")
		}
	}
	if grants > burst {
		t.Errorf("%d grants at the end of a cooldown, over the burst of %d", grants, burst)
	}
}
