package sluiceredis

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// TestDoneGivesBackStaleLeases: a reservation nobody came for gives its
// lease back with the next Done, when no Take follows.
func TestDoneGivesBackStaleLeases(t *testing.T) {
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	b := newTokens(t, c, WithInFlight(5, time.Minute))
	ctx := context.Background()
	zcard := func() int64 { return c.ZCard(ctx, "sluice:{api}:lease").Val() }
	if w, err := b.Take(ctx, "api", 20, 1); w != 0 || err != nil {
		t.Fatalf("Take = %v, %v", w, err)
	}
	w, err := b.Take(ctx, "api", 20, 1)
	if err != nil || w <= 0 {
		t.Fatalf("Take past the burst = %v, %v; want a reservation", w, err)
	}
	// Well past the reservation's staleness allowance of 50ms.
	time.Sleep(w + 200*time.Millisecond)
	b.Done("api")
	if n := zcard(); n != 0 {
		t.Errorf("%d leases after Done with a stale reservation, want 0", n)
	}
}

// TestReleasesAreBounded: a long outage can queue more releases than one
// script call can take (Lua's unpack fails beyond about 8000); they go a
// bounded number per call.
func TestReleasesAreBounded(t *testing.T) {
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	b := newTokens(t, c, WithInFlight(5, time.Minute))
	ctx := context.Background()
	bg := b.budget("api")
	const queued = 10000
	for i := range queued {
		bg.release = append(bg.release, "gone:"+strconv.Itoa(i))
	}
	for i := 1; i <= 3; i++ {
		if w, err := b.Take(ctx, "api", 0, 1); w != 0 || err != nil {
			t.Fatalf("Take with %d releases queued = %v, %v", queued, w, err)
		}
		bg.mu.Lock()
		left := len(bg.release)
		bg.mu.Unlock()
		if left != queued-i*maxRelease {
			t.Fatalf("%d releases left after %d Takes, want %d", left, i, queued-i*maxRelease)
		}
	}
	if !healthy(b.backend) {
		t.Error("Redis marked down")
	}
	giveBack(b)
}
