package sluiceredis

import (
	"context"
	"slices"
	"testing"
	"time"
)

// TestTakeAhead: one take.lua call takes up to want tokens, the first due
// now and the others at one interval each after it, as far as the horizon,
// each with a lease of its own under the cap.
func TestTakeAhead(t *testing.T) {
	srv := startRedis(t)
	c := newClient(t, srv.Addr())
	ctx := context.Background()
	k := newKeys(DefaultPrefix, "api")
	// 100/s, burst 1: an interval of 10ms; a horizon of 25ms takes the
	// tokens due at 0, 10 and 20ms.
	st, waits, err := runTake(ctx, c, k, takeArgs{rate: 100, burst: 1, want: 8, horizon: 25 * time.Millisecond}, nil)
	if err != nil || st != taken || len(waits) != 3 {
		t.Fatalf("take of 8 within 25ms at 100/s = %v, %v, %v; want taken, 3 waits", st, waits, err)
	}
	for i, w := range waits {
		if want := time.Duration(i) * 10 * time.Millisecond; w < want-time.Millisecond || w > want {
			t.Errorf("token %d due in %v, want %v (less the time since)", i, w, want)
		}
	}
	// The state moved three intervals: the next token is 30ms on.
	st, waits, err = runTake(ctx, c, k, takeArgs{rate: 100, burst: 1}, nil)
	if err != nil || st != reserved || len(waits) != 1 || waits[0] < 25*time.Millisecond {
		t.Fatalf("take after three = %v, %v, %v; want a reservation about 30ms on", st, waits, err)
	}

	// Under a cap of 3 with none held, at most 3, each with its lease.
	k = newKeys(DefaultPrefix, "capped")
	st, waits, err = runTake(ctx, c, k, takeArgs{rate: 1000, burst: 10, leases: 3, leaseTTL: time.Minute,
		member: "p:1", want: 8, horizon: time.Second, self: "p"}, nil)
	if err != nil || st != taken || len(waits) != 3 {
		t.Fatalf("take of 8 under a cap of 3 = %v, %v, %v; want 3 taken", st, waits, err)
	}
	got, _ := c.ZRange(ctx, k.lease(), 0, -1).Result()
	if len(got) != 3 || got[0] != "p:1" && got[1] != "p:1" && got[2] != "p:1" {
		t.Errorf("leases %v, want p:1, p:1.1, p:1.2", got)
	}
	for i := range 3 {
		if c.ZScore(ctx, k.lease(), memberN("p:1", i)).Err() != nil {
			t.Errorf("lease %q not held", memberN("p:1", i))
		}
	}
}

// TestTakersKeepTheirTokens: a token reserved for one taker (a Transport's
// lane) is not handed to another taker of the same Backend and key, who
// asks Redis for its own instead.
func TestTakersKeepTheirTokens(t *testing.T) {
	srv := startRedis(t)
	b := newTokens(t, newClient(t, srv.Addr()))
	bg := b.budget("api")
	now := time.Now()
	type taker struct{ string }
	a, o := &taker{"a"}, &taker{"o"}
	if w := bg.apply(now, now.Add(-time.Millisecond), taken, []time.Duration{0, 0, 10 * time.Millisecond}, nil, "", 100, a); w != 0 {
		t.Fatalf("apply of three tokens, the first due now = %v; want it", w)
	}
	bg.mu.Lock()
	defer bg.mu.Unlock()
	if _, ok := bg.takeLocal(now, o); ok {
		t.Fatal("another taker was answered from a's reservations")
	}
	if w, ok := bg.takeLocal(now, a); !ok || w != 0 {
		t.Fatalf("a's token due now = %v, %v; want it", w, ok)
	}
	if w, ok := bg.takeLocal(now, a); !ok || w <= 0 {
		t.Fatalf("a's token due later = %v, %v; want a wait", w, ok)
	}
	if _, ok := bg.takeLocal(now, o); ok {
		t.Fatal("another taker was answered from a's reservation")
	}
	// A taker that is gone (its Transport closed) is forgotten.
	if bg.paces[a] == nil {
		t.Fatal("a's pace not kept")
	}
	bg.prune(now.Add(paceIdle + time.Second))
	if len(bg.paces) != 0 || len(bg.pending) != 0 {
		t.Errorf("%d paces and %d reservations left after paceIdle", len(bg.paces), len(bg.pending))
	}
}

// TestOneLateTokenPerTaker: a taker may send one token after its
// theoretical arrival time (a late wake-up), as when a call took one
// token, but not several: its other late tokens are dropped, and their
// leases queued for release. Tokens not late are kept.
func TestOneLateTokenPerTaker(t *testing.T) {
	srv := startRedis(t)
	b := newTokens(t, newClient(t, srv.Addr()))
	bg := b.budget("api")
	sent := time.Now()
	now := sent.Add(time.Millisecond)
	a := new(int)
	// Four tokens due now, whose theoretical times are 0, 1, 2 and 20ms
	// after the call; the fifth due in 10ms.
	waits := []time.Duration{0, 0, 0, 0, 10 * time.Millisecond}
	lates := []time.Duration{0, time.Millisecond, 2 * time.Millisecond, 20 * time.Millisecond, 30 * time.Millisecond}
	bg.apply(now, sent, reserved, waits, lates, "m", 100, a) // the first is handed out, late by 1ms: alone
	bg.mu.Lock()
	defer bg.mu.Unlock()
	defer func() { bg.held = nil }()        // no attempt was sent: nothing to be Done
	later := sent.Add(5 * time.Millisecond) // tokens 1 and 2 are late now
	if w, ok := bg.takeLocal(later, a); !ok || w != 0 {
		t.Fatalf("a late token = %v, %v; want it (one late token is allowed)", w, ok)
	}
	// Token 2 was late too: dropped. Token 3 is not late: kept, then 4.
	if len(bg.pending) != 2 || bg.pending[0].lease != "m.3" || bg.pending[1].lease != "m.4" {
		t.Fatalf("reservations left %+v; want m.3 and m.4", bg.pending)
	}
	if !slices.Equal(bg.release, []string{"m.2"}) {
		t.Errorf("leases to release %v; want m.2", bg.release)
	}
}

// TestPaceWant: a taker granted about one token per round trip asks for
// more than one, and one that sends rarely takes one at a time.
func TestPaceWant(t *testing.T) {
	const horizon = 21 * time.Millisecond // two round trips of 10ms, and 1ms
	var p pace
	start := time.Now()
	for i := range 20 {
		p.grant(start.Add(time.Duration(i) * 11 * time.Millisecond))
	}
	if n := p.want(horizon); n < 2 {
		t.Errorf("a token every 11ms, horizon %v: want %d; more than one", horizon, n)
	}
	var slow pace
	for i := range 20 {
		slow.grant(start.Add(time.Duration(i) * 100 * time.Millisecond))
	}
	if n := slow.want(horizon); n != 1 {
		t.Errorf("a token every 100ms, horizon %v: want %d; one", horizon, n)
	}
	if n := (*pace)(nil).want(horizon); n != 1 {
		t.Errorf("no grant yet: want %d; one", n)
	}
}

// TestTokensTransports: in token mode, two Transports of one process share
// its Backend and each gets half of its part of the rate: neither sends
// tokens the other reserved. (Shares: TestSharesTransports.)
func TestTokensTransports(t *testing.T) {
	r := shareFleet{procs: 2, rate: 100, burst: 4, run: 5 * time.Second, warm: 2 * time.Second,
		workers: 8, transports: 2, perToken: true}.start(t)
	secs := r.seconds()
	t.Logf("token mode, 2 processes, 2 Transports each on one Backend, 100/s: process 0's Transports %.1f/s and %.1f/s, process 1 %.1f/s; %.3f of the rate",
		float64(r.perTr[0])/secs, float64(r.perTr[1])/secs, float64(r.perProc[1])/secs, float64(len(r.arrivals))/secs/100)
	a, b := float64(r.perTr[0]), float64(r.perTr[1])
	if min(a, b) < 0.88*max(a, b) {
		t.Errorf("process 0's Transports sent %.1f/s and %.1f/s: uneven", a/secs, b/secs)
	}
	checkBound(t, r.arrivals, 100, 4, 2, 250*time.Millisecond, time.Second)
}

// TestTokensCalls: in token mode a request costs about one Redis call
// (a little more: a reservation dropped costs its call), fewer where a
// lane takes ahead (a high rate), and the fleet keeps its bound (taking
// ahead broke it at 5,000/s, 575 in 100ms, before a taker could send only
// one late token).
func TestTokensCalls(t *testing.T) {
	addr := startRedis(t).Addr()
	for _, rate := range []float64{100, 5000} {
		burst := max(4, int(rate/100))
		r := shareFleet{procs: 4, rate: rate, burst: burst, run: 5 * time.Second, warm: 2 * time.Second,
			workers: 16, redisAddr: addr, perToken: true}.start(t)
		secs := r.seconds()
		perReq := float64(r.calls) / float64(r.sent)
		t.Logf("token mode, %v/s shared by 4: %.3f of the rate, %.3f Redis calls a request", rate, float64(len(r.arrivals))/secs/rate, perReq)
		if perReq > 1.1 {
			t.Errorf("%.3f Redis calls a request at %v/s; want about one at most", perReq, rate)
		}
		if rate == 5000 && perReq > 0.8 {
			t.Errorf("%.3f Redis calls a request at %v/s: lanes do not take ahead", perReq, rate)
		}
		checkBound(t, r.arrivals, rate, burst, 4, 100*time.Millisecond, time.Second)
	}
}
