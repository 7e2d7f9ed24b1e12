package sluiceredis

import (
	"context"
	"log/slog"
	"testing"
	"time"
)

func TestInFlightCapAcrossProcesses(t *testing.T) {
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	b1 := newTokens(t, c, WithInFlight(2, 10*time.Second))
	b2 := newTokens(t, newClient(t, srv.Addr()), WithInFlight(2, 10*time.Second))
	ctx := context.Background()
	zcard := func() int64 { return c.ZCard(ctx, "sluice:{api}:lease").Val() }

	for _, b := range []*Tokens{b1, b2} {
		if w, err := b.Take(ctx, "api", 0, 1); w != 0 || err != nil {
			t.Fatalf("Take under the cap = %v, %v", w, err)
		}
	}
	if n := zcard(); n != 2 {
		t.Fatalf("%d leases held, want 2", n)
	}
	w, err := b1.Take(ctx, "api", 0, 1)
	if err != nil || w <= 0 || w > leasePoll {
		t.Fatalf("Take at the cap = %v, %v; want a wait in (0, %v]", w, err, leasePoll)
	}
	b2.Done("api")
	if n := zcard(); n != 1 {
		t.Fatalf("%d leases held after Done, want 1", n)
	}
	if w, err := b1.Take(ctx, "api", 0, 1); w != 0 || err != nil {
		t.Fatalf("Take after another process's Done = %v, %v", w, err)
	}
	// Done releases only this process's own leases: b2 holds none now.
	b2.Done("api")
	b2.Done("never-taken")
	if n := zcard(); n != 2 {
		t.Fatalf("%d leases held after Done without a lease, want 2", n)
	}
	b1.Done("api")
	b1.Done("api")
	if n := zcard(); n != 0 {
		t.Fatalf("%d leases held after every Done, want 0", n)
	}
}

// TestLeasesOfACrashedProcessExpire: a process that never calls Done (it
// died) holds its leases only until their ttl runs out.
func TestLeasesOfACrashedProcessExpire(t *testing.T) {
	srv := startRedis(t)
	const ttl = 300 * time.Millisecond
	cc := newClient(t, srv.Addr())
	crashed := newTokens(t, cc, WithInFlight(1, ttl))
	alive := newTokens(t, newClient(t, srv.Addr()), WithInFlight(1, ttl))
	ctx := context.Background()
	start := time.Now()
	if w, err := crashed.Take(ctx, "api", 0, 1); w != 0 || err != nil {
		t.Fatalf("Take = %v, %v", w, err)
	}
	// The process dies: its connection goes, and nothing renews its lease.
	// (Done, at the end, stops its renewer, which a dead process has not.)
	cc.Close()
	defer crashed.Done("api")
	var granted time.Duration
	for {
		w, err := alive.Take(ctx, "api", 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		if w == 0 {
			granted = time.Since(start)
			alive.Done("api")
			break
		}
		if time.Since(start) > 10*ttl {
			t.Fatalf("no lease after %v with a ttl of %v", time.Since(start), ttl)
		}
		time.Sleep(w)
	}
	if granted < ttl-10*time.Millisecond {
		t.Errorf("lease granted after %v, before the crashed process's expired (%v)", granted, ttl)
	}
}

// TestReservedTokenCarriesLease: a reserved token takes its lease with it,
// and a reservation nobody came for gives its lease back with the next call.
func TestReservedTokenCarriesLease(t *testing.T) {
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	b := newTokens(t, c, WithInFlight(5, 10*time.Second))
	ctx := context.Background()
	zcard := func() int64 { return c.ZCard(ctx, "sluice:{api}:lease").Val() }
	if w, err := b.Take(ctx, "api", 20, 1); w != 0 || err != nil {
		t.Fatalf("Take = %v, %v", w, err)
	}
	w, err := b.Take(ctx, "api", 20, 1)
	if err != nil || w <= 0 {
		t.Fatalf("Take past the burst = %v, %v; want a reservation", w, err)
	}
	if n := zcard(); n != 2 {
		t.Fatalf("%d leases, want 2 (one granted, one reserved)", n)
	}
	// Nobody asks for the reservation until well past its due time (and
	// past the staleness allowance of max(1/rate, 10ms) = 50ms).
	time.Sleep(w + 200*time.Millisecond)
	if w, err := b.Take(ctx, "api", 20, 1); w != 0 || err != nil {
		t.Fatalf("Take after the reservation went stale = %v, %v; want a fresh token", w, err)
	}
	if n := zcard(); n != 2 {
		t.Fatalf("%d leases, want 2: the stale reservation's lease released, a new one taken", n)
	}
	b.Done("api")
	b.Done("api")
	if n := zcard(); n != 0 {
		t.Fatalf("%d leases after Done for both grants, want 0", n)
	}
}

// TestLeaseRenewedWhileHeld: an attempt that outlasts the lease ttl (a
// streamed response) keeps its place: its process renews the lease every
// third of the ttl, so another process finds the cap full for as long as
// the attempt runs, and gets the place once it is done. The renewer then
// stops.
func TestLeaseRenewedWhileHeld(t *testing.T) {
	srv := startRedis(t)
	const ttl = 600 * time.Millisecond
	c := newClient(t, srv.Addr())
	long := newTokens(t, newClient(t, srv.Addr()), WithInFlight(1, ttl))
	other := newTokens(t, newClient(t, srv.Addr()), WithInFlight(1, ttl))
	ctx := context.Background()
	if w, err := long.Take(ctx, "api", 0, 1); w != 0 || err != nil {
		t.Fatalf("Take = %v, %v", w, err)
	}
	// Three ttls of an attempt in flight.
	if grantedWithin(t, other, "api", 3*ttl) {
		t.Fatalf("another process got the only place while the attempt ran (%d leases in Redis)", c.ZCard(ctx, "sluice:{api}:lease").Val())
	}
	long.Done("api")
	w, err := other.Take(ctx, "api", 0, 1)
	if w != 0 || err != nil {
		t.Fatalf("Take after the attempt was done = %v, %v", w, err)
	}
	other.Done("api")
	for _, b := range []*Tokens{long, other} {
		waitRenewerStops(t, b.backend)
	}
}

// TestLeaseRenewalSurvivesAStall: a renewal that times out (Redis stalled)
// marks Redis down, and the renewer then probes it itself: a process whose
// only attempt is a long stream makes no Take, and its lease must not
// expire once Redis answers again.
func TestLeaseRenewalSurvivesAStall(t *testing.T) {
	srv := startRedis(t)
	const ttl = 600 * time.Millisecond
	c := newClient(t, srv.Addr())
	log := &logs{}
	long := newTokens(t, newClient(t, srv.Addr()), WithInFlight(1, ttl),
		WithTimeout(DefaultTimeout), withProbeEvery(50*time.Millisecond), WithLogger(slog.New(log)))
	other := newTokens(t, newClient(t, srv.Addr()), WithInFlight(1, ttl))
	ctx := context.Background()
	if w, err := long.Take(ctx, "api", 0, 1); w != 0 || err != nil {
		t.Fatalf("Take = %v, %v", w, err)
	}
	// Stall Redis for longer than long's timeout, across one of its
	// renewals (every 200ms).
	if err := c.Do(ctx, "CLIENT", "PAUSE", 300, "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond)
	// One renewal at least fell in the stall's first 250ms and timed out.
	if log.count(slog.LevelWarn) == 0 {
		t.Fatal("no renewal met the stall: the test did not test anything")
	}
	if grantedWithin(t, other, "api", 3*ttl) {
		t.Fatal("another process got the only place while the stream still ran")
	}
	if !healthy(long.backend) {
		t.Error("Redis still marked down in the streaming process")
	}
	long.Done("api")
}

// grantedWithin asks b for a place on key every 20ms (or sooner, as told) for
// d, and reports whether it was granted one, which it then gives back.
func grantedWithin(t *testing.T, b *Tokens, key string, d time.Duration) (granted bool) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); {
		w, err := b.Take(context.Background(), key, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		if w == 0 {
			b.Done(key)
			return true
		}
		time.Sleep(min(w, 20*time.Millisecond))
	}
	return false
}
